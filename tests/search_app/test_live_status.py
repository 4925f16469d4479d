"""The search pages stay true while they are open: the baseline's row follows live, a page
opened before the start gets the whole run card, a winner's standing moves from awaiting
approval to approved and merged on every surface, labels name searches and candidates by the
ids people know, a running search shows its elapsed time (and an estimate of the time left once
there is enough to go on), and Cancel asks first."""

from __future__ import annotations

import io
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from runtime_app.models import Event, Receipt
from search_app import selectors, services
from search_app.live import search_live_fragments
from search_app.models import Candidate, SearchRun, Step
from search_app.step_result import StepResult
from tests.helpers import login

pytestmark = pytest.mark.django_db(transaction=True)


def search_events(search, **payload) -> list:
    return list(Event.objects.filter(subject_type="search", subject_id=search.pk, **payload).order_by("id"))


# ---- the baseline row and the run card


def test_the_baseline_row_comes_with_the_events_that_name_it(finished, personas):
    search, _, _ = finished
    events = search_events(search, payload__candidate_id="baseline")
    assert events, "the baseline's gates and scores are announced as its events"
    _, rows = search_live_fragments(personas.member, search.pk, events)
    assert '<tr id="candidate-row-baseline" class="baseline-row state-alive" data-state="alive" ' \
           'hx-swap-oob="true">' in rows
    assert "unchanged baseline" in rows


def test_the_baseline_row_on_the_page_is_the_row_sent_live(finished, personas):
    search, _, _ = finished
    html = login(personas.member).get(f"/searches/{search.search_id}/").content.decode()
    assert '<tr id="candidate-row-baseline" class="baseline-row state-alive" data-state="alive">' in html


def test_a_baseline_that_cannot_be_measured_is_announced_with_its_row(small_search, personas):
    search = small_search
    services.search_start(personas.member, search, enqueue=False)
    # Its evaluation, as the planner makes it once every writer has ended.
    step = Step.objects.create(search=search, candidate=search.candidates.get(number=0), kind="evaluate",
                               round=0)
    services.step_claim(step.pk, "w")
    services.steps._step_record(step.pk, "w", StepResult(error="the runtime fell over"))
    event = search_events(search, payload__candidate_id="baseline")[-1]
    assert event.payload["state"] == "eliminated" and "baseline not measured" in event.payload["reason"]


def test_a_cancelled_search_names_every_row_it_settled(small_search, personas):
    search = small_search
    services.search_start(personas.member, search, enqueue=False)
    services.search_cancel(personas.member, search)
    services.search_advance(search.pk)
    cancelled = search_events(search, kind="search.cancelled")[-1]
    assert set(cancelled.payload["candidate_ids"]) == {"baseline", "cand_001", "cand_002"}
    _, rows = search_live_fragments(personas.member, search.pk, [cancelled])
    assert rows.count('data-state="cancelled"') == 3


def test_a_page_opened_before_the_start_gets_the_whole_run_card_with_the_start(finished, personas):
    """Its funnel, plot and table did not exist: swapping them alone would find no target."""
    search, _, _ = finished
    started = search_events(search, kind="search.started")
    (card,) = search_live_fragments(personas.member, search.pk, started)
    assert card.lstrip().startswith('<section class="card run" id="run" hx-swap-oob="true">')
    for part in ('id="run-summary"', 'id="run-funnel"', 'id="score-plot"', 'id="candidate-row-baseline"',
                 'id="candidate-row-cand_001"'):
        assert part in card
    # Inside the card nothing is a swap of its own; later batches swap only the parts.
    assert card.count("hx-swap-oob") == 1
    later = search_events(search, payload__candidate_id="cand_001")
    summary, _ = search_live_fragments(personas.member, search.pk, later)
    assert 'id="run"' not in summary and 'id="run-funnel"' in summary


def test_live_pages_drop_swaps_whose_target_the_page_does_not_show(finished, personas):
    html = login(personas.member).get(f"/searches/{finished[0].search_id}/").content.decode()
    assert 'hx-ext="ws,live-oob"' in html


# ---- awaiting approval, approved, merged


def run_card(html: str) -> str:
    """The run card of a search page (the activity log below it keeps what was said then)."""
    return html.split('id="run"', 1)[1].split('id="event-log"', 1)[0]


def cli_status(search) -> str:
    out = io.StringIO()
    call_command("search", "status", search.search_id, "--user", "owner", stdout=out)
    return " ".join(out.getvalue().split())


def test_a_winner_awaits_approval_until_someone_approves_then_says_approved_then_merged(finished, approver,
                                                                                      personas):
    search, winner, _ = finished
    member = login(personas.member)
    api = f"/api/searches/{search.search_id}/run"

    assert "awaiting human approval" in winner.reason
    assert member.get(api).json()["winner_status"] == "awaiting approval"
    assert "plan-search: awaiting approval (0 of 1 approval) — winner cand_002" in cli_status(search)

    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    winner.refresh_from_db()
    assert winner.reason.endswith("approved by approver; ready to merge")
    assert SearchRun.objects.get(search=search).reason == winner.reason
    report = member.get(api).json()
    assert report["winner_status"] == "approved" and "awaiting" not in report["reason"]
    assert [c["reason"] for c in report["candidates"] if c["candidate_id"] == "cand_002"] == [winner.reason]
    assert "plan-search: approved (1 of 1 approval; ready to merge) — winner cand_002" in cli_status(search)
    page = run_card(member.get(f"/searches/{search.search_id}/").content.decode())
    assert 'id="winner-status">approved</span>' in page and "awaiting" not in page
    detail = member.get(f"/searches/{search.search_id}/candidates/cand_002/").content.decode()
    assert "approved by approver" in detail and "awaiting" not in detail
    assert 'id="winner-status">approved</span>' in detail
    # The approval is an event naming the winner, so open pages swap its row and the summary.
    approved = search_events(search, kind="approval.approve")
    summary, rows = search_live_fragments(personas.member, search.pk, approved)
    assert 'id="winner-status">approved</span>' in summary and "approved by approver" in rows

    services.merge_create(approver, search)
    winner.refresh_from_db()
    assert "merged onto crucible/" in winner.reason and "awaiting" not in winner.reason
    report = member.get(api).json()
    assert report["winner_status"] == "merged" and "merged onto" in report["reason"]
    assert re.search(r"plan-search: merged \(crucible/[^)]+\) — winner cand_002", cli_status(search))
    page = run_card(member.get(f"/searches/{search.search_id}/").content.decode())
    assert 'id="winner-status">merged</span>' in page and "awaiting" not in page
    detail = member.get(f"/searches/{search.search_id}/candidates/cand_002/").content.decode()
    assert "merged onto" in detail and "awaiting" not in detail
    assert 'id="winner-status">merged</span>' in detail
    merged = search_events(search, kind="search.merged")
    summary, rows = search_live_fragments(personas.member, search.pk, merged)
    assert 'id="winner-status">merged</span>' in summary and "merged onto" in rows


def test_a_request_for_changes_and_a_withdrawal_move_the_standing_back(finished, approver, personas):
    search, winner, _ = finished
    services.approval_record(approver, winner, "request_changes", winner.patch_sha256, "rename it")
    winner.refresh_from_db()
    assert winner.reason.endswith("changes requested by approver")
    assert selectors.run_summary(search)["winner_status"] == "changes requested"
    services.approvals_withdraw(personas.owner, approver, reason="left the team")
    winner.refresh_from_db()
    assert winner.reason.endswith("awaiting human approval")
    assert selectors.run_summary(search)["winner_status"] == "awaiting approval"


# ---- labels


def test_the_activity_log_names_the_search_by_its_id_never_its_database_id(finished, personas):
    search, _, _ = finished
    html = login(personas.member).get(f"/searches/{search.search_id}/").content.decode()
    assert f'<span class="event-subject">alpha · {search.search_id}</span>' in html
    assert f"search {search.pk}<" not in html


def test_a_receipt_names_its_candidate_and_search(finished, personas):
    search, winner, _ = finished
    receipt = Receipt.objects.filter(subject_type="candidate", subject_id=winner.pk).first()
    html = login(personas.member).get(f"/receipts/{receipt.pk}/").content.decode()
    assert f"cand_002 of {search.search_id}" in html and f"candidate {winner.pk}<" not in html


# ---- elapsed time, the estimate, and Cancel


def test_a_finished_run_says_how_long_it_took(finished, personas):
    search, _, _ = finished
    html = login(personas.member).get(f"/searches/{search.search_id}/").content.decode()
    assert "<dt>Took</dt>" in html and 'id="run-eta"' not in html


def test_the_time_left_is_measured_on_this_searchs_finished_steps(small_search, personas):
    """Two candidates in rounds [2, 1]: until a step of each kind to come has finished it says
    so; then a range from those steps' wall durations, with the timeouts' worst case beside it."""
    search = small_search
    run = services.search_start(personas.member, search, enqueue=False)
    now = run.started_at + timedelta(minutes=6)
    timing = selectors.run_timing(search, run, now=now)
    assert timing["elapsed_text"] == "6 min 0 s" and timing["eta_text"].startswith("estimating…")
    assert timing["eta_seconds"] is None
    baseline = search.candidates.get(number=0)
    start = run.started_at
    for candidate in search.candidates.filter(number__gt=0):
        Step.objects.create(search=search, candidate=candidate, kind="generate", round=0, state="done",
                            started_at=start, finished_at=start + timedelta(seconds=60))
    Candidate.objects.filter(search=search, number__gt=0).update(state="evaluating")
    Step.objects.create(search=search, candidate=baseline, kind="evaluate", round=0, state="done",
                        started_at=start, finished_at=start + timedelta(seconds=10))
    Step.objects.create(search=search, candidate=baseline, kind="measure", round=0, state="done",
                        started_at=start, finished_at=start + timedelta(seconds=30),
                        plan={"members": ["baseline", "cand_001", "cand_002"], "blocks": [0, 2]})
    timing = selectors.run_timing(search, run, now=now)
    assert timing["eta_text"].startswith("about ") and " left (" in timing["eta_text"]
    assert timing["time_left"]["worst_case"].startswith("worst case ")
    SearchRun.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(minutes=6))
    html = login(personas.member).get(f"/searches/{search.search_id}/").content.decode()
    assert "<dt>Elapsed</dt>" in html and 'id="run-eta"' in html and "from the spec&#x27;s timeouts" in html


def test_cancel_asks_for_confirmation_before_it_stops_anything(small_search, personas):
    search = small_search
    client = login(personas.member)
    services.search_start(personas.member, search, enqueue=False)
    page = client.get(f"/searches/{search.search_id}/").content.decode()
    assert f'href="/searches/{search.search_id}/cancel/" id="cancel-search"' in page
    confirm = client.get(f"/searches/{search.search_id}/cancel/")
    assert confirm.status_code == 200 and 'id="confirm-cancel"' in confirm.content.decode()
    assert SearchRun.objects.get(search=search).status == "running"  # looking changes nothing
    client.post(f"/searches/{search.search_id}/cancel/")
    assert SearchRun.objects.get(search=search).status in ("cancelling", "cancelled")
