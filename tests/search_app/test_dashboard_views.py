"""The search page's live parts, the candidate page, and the approve and merge pages, through HTTP."""

from __future__ import annotations

import re
import subprocess

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runtime_app.models import Event, ProjectMembership
from search_app.live import search_live_fragments
from search_app.models import Approval, Candidate, Merge
from tests.helpers import login, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def page(client: Client, url: str, status: int = 200) -> str:
    response = client.get(url)
    assert response.status_code == status, response.content[:500]
    return response.content.decode()


def test_the_search_page_shows_funnel_plot_and_candidate_table(finished, personas):
    search, winner, _ = finished
    html = page(login(personas.member), f"/searches/{search.search_id}/")
    assert 'id="run-funnel"' in html and "2 → 1" in html
    assert 'id="score-plot"' in html and "<circle" in html and f"/candidates/{winner.candidate_id}/" in html
    assert 'id="candidate-row-cand_001"' in html and 'id="candidate-row-baseline"' in html
    assert "no cost budget" in html


def test_the_candidate_table_sorts_filters_and_pages_and_keeps_it_in_the_url(finished, personas):
    search, _, _ = finished
    client = login(personas.member)
    url = f"/searches/{search.search_id}/candidates/"
    response = client.get(url, {"sort": "-score"}, headers={"HX-Request": "true"})
    html = response.content.decode()
    assert response["HX-Push-Url"] == f"/searches/{search.search_id}/?sort=-score"
    assert html.index("candidate-row-cand_002") < html.index("candidate-row-cand_001")
    html = client.get(url, {"sort": "score"}, headers={"HX-Request": "true"}).content.decode()
    assert html.index("candidate-row-cand_001") < html.index("candidate-row-cand_002")
    html = client.get(url, {"state": "winner"}, headers={"HX-Request": "true"}).content.decode()
    assert "candidate-row-cand_002" in html and "candidate-row-cand_001" not in html
    # Without htmx the same URL leads to the page itself, with the same state.
    location = client.get(url, {"state": "winner"})["Location"]
    assert location == f"/searches/{search.search_id}/?state=winner#candidates"
    bad_queries = ({"sort": "'; drop"}, {"state": "<b>"}, {"page": "-3"}, {"page": "9" * 40},
                   {"sort": "x" * 500})
    for bad in bad_queries:
        assert client.get(url, bad, headers={"HX-Request": "true"}).status_code == 200


def test_the_search_page_and_its_table_use_as_many_queries_for_300_candidates_as_for_3(finished, personas):
    search, _, _ = finished
    client = login(personas.member)
    url, rows = f"/searches/{search.search_id}/", f"/searches/{search.search_id}/candidates/?sort=-score"
    client.get(url)
    with CaptureQueriesContext(connection) as few:
        client.get(url)
    with CaptureQueriesContext(connection) as few_rows:
        client.get(rows, headers={"HX-Request": "true"})
    Candidate.objects.bulk_create([
        Candidate(search=search, candidate_id=f"cand_{n:03d}", number=n, batch=1, state="eliminated",
                  score=n, cost_microusd=n, reason="slower") for n in range(3, 300)])
    with CaptureQueriesContext(connection) as many:
        html = client.get(url).content.decode()
    with CaptureQueriesContext(connection) as many_rows:
        client.get(rows, headers={"HX-Request": "true"})
    assert len(many) == len(few) and len(many_rows) == len(few_rows)
    assert "page 1 of 3" in html


def test_the_candidate_table_shows_costs_in_dollars_with_the_exact_figure_on_hover(finished, personas):
    search, _, _ = finished
    Candidate.objects.filter(search=search, candidate_id="cand_002").update(cost_microusd=1_250_000)
    html = login(personas.member).get(f"/searches/{search.search_id}/candidates/",
                                      headers={"HX-Request": "true"}).content.decode()
    assert '<span title="1250000 µUSD">$1.25</span>' in html
    assert "Cost µUSD" not in html and ">Cost<" in html


def test_live_fragments_swap_the_summary_and_the_rows_the_events_name(finished, personas):
    search, _, _ = finished
    events = list(Event.objects.filter(subject_type="search", subject_id=search.pk,
                                       payload__candidate_id="cand_002"))
    summary, rows = search_live_fragments(personas.member, search.pk, events)
    assert '<div id="run-summary" class="run-summary" hx-swap-oob="true">' in summary
    # Rows travel in a message of their own: a <tr> after a <div> would be dropped by the parser.
    assert rows.lstrip().startswith("<tr ") and "<div" not in rows
    html = rows
    row = '<tr id="candidate-row-cand_002" class="state-winner" data-state="winner" hx-swap-oob="true">'
    assert row in html
    assert "candidate-row-cand_001" not in html


def test_the_candidate_page_shows_diff_files_policy_receipts_and_prompt(finished, personas):
    search, _, _ = finished
    html = page(login(personas.member), f"/searches/{search.search_id}/candidates/cand_002/")
    assert '<script id="patch-data" type="application/json">' in html and "return 9" in html
    assert "code/answer.py" in html and "admitted" in html and "gate 1" in html and "trial block 0" in html
    assert "Shared prefix" in html and "You are cand_002." in html
    assert "unavailable to you: This needs the approver role in alpha (yours is operator)." in html
    assert page(login(personas.member), f"/searches/{search.search_id}/candidates/baseline/")
    page(login(personas.member), f"/searches/{search.search_id}/candidates/cand_999/", 404)
    page(login(personas.outsider), f"/searches/{search.search_id}/candidates/cand_002/", 404)


def test_a_patch_is_passed_as_data_never_as_markup(finished, personas):
    search, winner, _ = finished
    winner.patch = b"diff --git a/x b/x\n+</script><script>alert(1)</script>\n"
    winner.save(update_fields=["patch"])
    html = page(login(personas.member), f"/searches/{search.search_id}/candidates/cand_002/")
    assert "</script><script>alert(1)" not in html
    assert "\\u003C/script\\u003E\\u003Cscript\\u003Ealert(1)" in html


def test_an_approver_confirms_the_hash_then_merges_onto_a_new_branch(finished, approver):
    search, winner, repo = finished
    client = login(approver)
    confirm = page(client, f"/searches/{search.search_id}/candidates/cand_002/decide/?decision=approve")
    assert winner.patch_sha256 in confirm and "replay passed" in confirm
    decide = f"/searches/{search.search_id}/candidates/cand_002/decide/"
    form = {"decision": "approve", "patch_sha256": winner.patch_sha256}
    assert client.post(decide, form).status_code == 302
    assert client.post(decide, form).status_code == 302  # a double submit changes nothing
    assert Approval.objects.count() == 1
    merge_page = page(client, f"/searches/{search.search_id}/merge/")
    assert f"crucible/{search.search_id}" in merge_page and 'id="confirm-merge"' in merge_page
    response = client.post(f"/searches/{search.search_id}/merge/", {"target": "new_branch", "branch": ""})
    assert response.status_code == 302
    merge = Merge.objects.get()
    assert subprocess.run(["git", "-C", str(repo), "rev-parse", f"crucible/{search.search_id}"],
                          capture_output=True, text=True).stdout.strip() == merge.commit_sha
    assert "merged" in page(client, f"/searches/{search.search_id}/")


def test_who_cannot_approve_sees_the_button_disabled_with_the_refusal_the_service_would_give(
        finished, personas, approver):
    from django.core.exceptions import PermissionDenied, ValidationError

    from search_app import services

    search, winner, _ = finished
    candidate_url = f"/searches/{search.search_id}/candidates/cand_002/"
    disabled = '<button type="button" id="approve-button" disabled aria-describedby="decide-unavailable"'
    enabled = '<a class="button" id="approve-button" href="'
    # The owner froze the search: with self-approval off, approving is refused, asking for changes is not.
    froze = ("You froze this search, so someone else must approve its winner (an administrator can "
             "allow it with CRUCIBLE_SELF_APPROVAL=true).")
    owner = login(personas.owner)
    html = page(owner, candidate_url)
    assert disabled in html and f"Approve is unavailable to you: {froze}" in html
    assert 'id="request-changes-button" href="' in html
    html = page(owner, f"/searches/{search.search_id}/")
    assert "Review and decide" in html and f"Approve is unavailable to you: {froze}" in html
    with pytest.raises(ValidationError) as refused:
        services.approval_record(personas.owner, winner, "approve", winner.patch_sha256)
    assert refused.value.messages == [froze]
    # A member without the approver role: both decisions disabled, in the words of the 403.
    no_role = "This needs the approver role in alpha (yours is operator)."
    html = page(login(personas.member), candidate_url)
    assert disabled in html and 'id="request-changes-button" disabled' in html
    assert f"Approve and Request changes are unavailable to you: {no_role}" in html
    assert f"unavailable to you: {no_role}" in page(login(personas.member), f"/searches/{search.search_id}/")
    with pytest.raises(PermissionDenied, match=re.escape(no_role)):
        services.approval_record(personas.member, winner, "approve", winner.patch_sha256)
    # An approver who did not freeze it may decide: enabled links, no reason shown.
    html = page(login(approver), candidate_url)
    assert enabled in html and "unavailable to you" not in html
    html = page(login(approver), f"/searches/{search.search_id}/")
    assert "Review and decide" in html and "unavailable to you" not in html


def test_a_stale_hash_or_a_bad_form_is_a_clear_400(finished, approver):
    search, _, _ = finished
    client = login(approver)
    decide = f"/searches/{search.search_id}/candidates/cand_002/decide/"
    response = client.post(decide, {"decision": "approve", "patch_sha256": "a" * 64})
    assert response.status_code == 400 and "The patch changed since you looked" in response.content.decode()
    response = client.post(decide, {"decision": "ship-it", "patch_sha256": "nope"})
    assert response.status_code == 400 and "not a SHA-256" in response.content.decode()
    response = client.post(f"/searches/{search.search_id}/merge/", {"target": "new_branch"})
    assert response.status_code == 400 and "it has 0" in response.content.decode()
    assert not Approval.objects.exists() and not Merge.objects.exists()


def test_viewers_and_operators_cannot_approve_or_merge_and_outsiders_get_404(finished, personas):
    search, winner, _ = finished
    viewer = make_user("viewer")
    ProjectMembership.objects.create(project=personas.alpha, user=viewer)
    form = {"decision": "approve", "patch_sha256": winner.patch_sha256}
    decide = f"/searches/{search.search_id}/candidates/cand_002/decide/"
    for user in (viewer, personas.member):
        client = login(user)
        assert client.post(decide, form).status_code == 403
        merge = client.post(f"/searches/{search.search_id}/merge/", {"target": "new_branch"})
        assert merge.status_code == 403
        assert '<a class="button" id="approve-button"' not in \
            page(client, f"/searches/{search.search_id}/candidates/cand_002/")
    outsider = login(personas.outsider)
    assert outsider.post(decide, form).status_code == 404
    assert outsider.get(f"/searches/{search.search_id}/merge/").status_code == 404
    assert not Approval.objects.exists() and not Merge.objects.exists()


def test_approve_merge_and_comment_need_csrf(finished, approver):
    search, winner, _ = finished
    client = Client(enforce_csrf_checks=True)
    client.force_login(approver)
    base = f"/searches/{search.search_id}"
    assert client.post(f"{base}/candidates/cand_002/decide/",
                       {"decision": "approve", "patch_sha256": winner.patch_sha256}).status_code == 403
    assert client.post(f"{base}/merge/", {"target": "new_branch"}).status_code == 403
    assert client.post(f"{base}/candidates/cand_002/comment/", {"body": "hi"}).status_code == 403


def test_comments_are_posted_on_a_file_and_bad_ones_come_back_with_the_reason(finished, personas):
    search, _, _ = finished
    client = login(personas.member)
    url = f"/searches/{search.search_id}/candidates/cand_002/comment/"
    assert client.post(url, {"body": "Why 9?", "path": "code/answer.py", "line": "2"}).status_code == 302
    assert "Why 9?" in page(client, f"/searches/{search.search_id}/candidates/cand_002/")
    response = client.post(url, {"body": "x", "path": "../../etc/passwd", "line": "abc"})
    assert response.status_code == 400
    body = response.content.decode()
    assert "Enter a whole number." in body
    response = client.post(url, {"body": "x", "path": "../../etc/passwd"})
    assert response.status_code == 400 and "is not a file this candidate" in response.content.decode()


def test_a_none_search_offers_no_merge(personas, tmp_path, data_dir, approver):
    from tests.search_app.runs import frozen, run_inline

    search = frozen(personas, tmp_path, {"cand_001": "broken", "cand_002": "broken"}, population=2,
                    rounds=[2, 1])
    run_inline(personas, search)
    client = login(approver)
    assert "Merge…" not in page(client, f"/searches/{search.search_id}/")
    merge_page = page(client, f"/searches/{search.search_id}/merge/")
    assert "ended with NONE: there is nothing to merge" in merge_page


def test_a_live_batch_sends_its_fragments_before_the_event_log_that_holds_the_resume_point(
    finished, personas
):
    """A socket that drops mid-batch must leave the page's resume point before the batch, so
    the rows it did not get come again on reconnect."""
    from asgiref.sync import async_to_sync
    from channels.testing import WebsocketCommunicator

    from crucible.asgi import application

    search, _, _ = finished
    cookie = login(personas.member).cookies["sessionid"].value
    # From after the start: a batch with `search.started` sends the whole run card instead.
    started = Event.objects.get(subject_type="search", subject_id=search.pk, kind="search.started").pk

    async def scenario() -> list[str]:
        communicator = WebsocketCommunicator(
            application, f"/ws/events/search/{search.pk}/?last_id={started}",
            headers=[(b"host", b"127.0.0.1"), (b"origin", b"http://127.0.0.1"),
                     (b"cookie", f"sessionid={cookie}".encode())])
        assert (await communicator.connect())[0]
        messages = [await communicator.receive_from(timeout=10) for _ in range(3)]
        await communicator.disconnect()
        return messages

    summary, rows, log = async_to_sync(scenario)()
    assert 'id="run-summary"' in summary and "data-event-id" not in summary
    assert "candidate-row-cand_002" in rows and "data-event-id" not in rows
    assert "data-event-id" in log
