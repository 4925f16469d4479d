"""Who hears about a search: its approvers when a winner waits, its author when it ends, earlier
commenters when someone comments; never the person who acted, never someone who opted out."""

from __future__ import annotations

import dataclasses

import pytest
from django.conf import settings as django_settings
from django.core import mail

from runtime_app.models import WebhookDelivery
from runtime_app.notifications import notification_setting_update, webhook_create
from search_app import services
from search_app.notifications import approvers_of
from tests.search_app.runs import frozen, run_inline

pytestmark = pytest.mark.django_db(transaction=True)
NOTHING_ADMITTED = {"cand_001": "tests", "cand_002": "tests"}  # both edit the tests: NONE


@pytest.fixture
def config(settings):
    def change(**values):
        settings.CONFIG = dataclasses.replace(django_settings.CONFIG, **values)
    return change


@pytest.fixture
def addresses(personas, approver):
    """Everyone has an email address (and the defaults: every topic on)."""
    for user in (personas.owner, personas.member, personas.outsider, approver):
        user.email = f"{user.username}@example.com"
        user.save()


@pytest.fixture
def team_webhook(personas, config):
    config(webhook_allow_loopback=True)
    webhook, _ = webhook_create(personas.owner, personas.alpha, "team", "http://127.0.0.1:9/hook",
                                "a-shared-secret-of-the-team")
    return webhook


def inbox() -> dict[str, list[str]]:
    """Each address's subjects, in order."""
    found: dict[str, list[str]] = {}
    for message in mail.outbox:
        for address in message.to:
            found.setdefault(address.split("@")[0], []).append(message.subject)
    return found


def test_a_winner_awaiting_approval_is_told_to_those_who_may_approve_it_and_its_end_to_its_author(
        addresses, team_webhook, finished, personas, approver):
    search, _, _ = finished
    received = inbox()
    assert list(received) == ["approver", "owner"]  # not member (no approver role), not outsider
    label = f"[Crucible] {search.search_id} ({search.name})"
    assert received["approver"] == [f"{label}: cand_002 awaits your approval"]
    # The author may not approve their own winner (CRUCIBLE_SELF_APPROVAL=false): told it finished.
    assert received["owner"] == [f"{label} finished: winner cand_002"]
    approval_mail = next(m for m in mail.outbox if m.to == ["approver@example.com"])
    assert f"/searches/{search.search_id}/candidates/cand_002/" in approval_mail.body
    # The team's webhook hears of it once, not once per audience.
    deliveries = WebhookDelivery.objects.filter(webhook=team_webhook)
    told = [(d.kind, d.payload["crucible"]["topic"]) for d in deliveries]
    assert told == [("search.finished", "approval_waiting")]


def test_who_may_approve_follows_the_approval_rule(finished, personas, approver, config):
    search, _, _ = finished
    assert approvers_of(search) == [approver]
    config(self_approval=True)
    assert approvers_of(search) == [personas.owner, approver]


def test_an_author_who_turned_finished_searches_off_is_not_told(personas, approver, tmp_path, data_dir):
    notification_setting_update(personas.owner, email_address="owner@example.com", email=True,
                                approval_waiting=True, search_done=False, replies=True)
    search = frozen(personas, tmp_path, NOTHING_ADMITTED, population=2, rounds=[2, 1])
    run = run_inline(personas, search)
    assert run.outcome == "NONE"
    assert inbox() == {}


def test_a_search_ending_with_none_is_told_to_its_author(addresses, personas, tmp_path, data_dir):
    search = frozen(personas, tmp_path, NOTHING_ADMITTED, population=2, rounds=[2, 1])
    assert run_inline(personas, search).outcome == "NONE"
    assert inbox() == {"owner": [f"[Crucible] {search.search_id} ({search.name}) finished with NONE"]}


def test_a_cancelled_search_is_told_to_its_author_but_not_to_who_cancelled_it(addresses, personas, tmp_path,
                                                                              data_dir):
    search = frozen(personas, tmp_path, {"cand_001": 4, "cand_002": 5}, population=2, rounds=[2, 1])
    services.search_start(personas.owner, search, enqueue=False)
    services.search_cancel(personas.member, search)
    services.search_run_inline(search)
    assert inbox() == {"owner": [f"[Crucible] {search.search_id} ({search.name}) was cancelled"]}
    mail.outbox.clear()
    # The author cancelling their own search hears nothing of it.
    own = frozen(personas, tmp_path, {"cand_001": 4, "cand_002": 5}, population=2, rounds=[2, 1])
    services.search_start(personas.owner, own, enqueue=False)
    services.search_cancel(personas.owner, own)
    services.search_run_inline(own)
    assert inbox() == {}


def test_a_comment_is_told_to_earlier_commenters_and_the_author_never_to_who_wrote_it(
        addresses, finished, personas, approver):
    search, winner, _ = finished
    mail.outbox.clear()
    services.comment_add(personas.owner, winner, "Why a cache here?")
    assert inbox() == {}  # the author wrote it: nobody else has taken part yet
    services.comment_add(personas.member, winner, "Because the loop recomputes it.")
    assert list(inbox()) == ["owner"]
    mail.outbox.clear()
    services.comment_add(approver, winner, "Fine by me.", path="code/answer.py")
    received = inbox()
    assert sorted(received) == ["member", "owner"]
    expected = f"[Crucible] approver commented on cand_002 of {search.search_id} on code/answer.py"
    assert received["owner"] == [expected]
    assert "Fine by me." in mail.outbox[0].body


def test_a_reply_is_told_to_the_threads_participants_only(addresses, finished, personas, approver):
    search, winner, _ = finished
    thread = services.comment_add(personas.member, winner, "Is this loop bounded?")
    services.comment_add(personas.owner, winner, "Unrelated: nice names.")
    mail.outbox.clear()
    reply = services.comment_add(approver, winner, "Yes, by n.", reply_to=thread.pk)
    received = inbox()
    assert list(received) == ["member"]  # the thread's author; the owner only wrote elsewhere
    assert received["member"] == [f"[Crucible] approver replied to thread #{thread.pk} on cand_002 "
                                  f"of {search.search_id}"]
    mail.outbox.clear()
    services.comment_add(personas.member, winner, "Thanks.", reply_to=thread.pk)
    assert list(inbox()) == ["approver"] and reply.pk


def test_someone_who_turned_replies_off_is_not_told_of_comments(addresses, finished, personas):
    _, winner, _ = finished
    notification_setting_update(personas.owner, email_address="owner@example.com", email=True,
                                approval_waiting=True, search_done=True, replies=False)
    mail.outbox.clear()
    services.comment_add(personas.member, winner, "Looks good.")
    assert inbox() == {}
