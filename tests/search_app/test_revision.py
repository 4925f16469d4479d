"""Sending a winner back to its writer after changes were requested: the writer answers the
requests and open threads, the revised patch is gated, measured beside the baseline and reviewed,
and waits for approval again — or, if any of that fails, the winner keeps the patch it had. The
same service from the page, the API and the CLI."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from runtime_app import access
from runtime_app.models import AuditEntry, ProjectMembership, Receipt
from search_app import selectors, services
from search_app.models import SearchRun, Step
from search_app.step_result import StepResult
from tests.helpers import login, make_user, text_of
from tests.search_app.runs import fates, frozen, run_inline
from tests.search_app.test_review_api import cli

pytestmark = pytest.mark.django_db(transaction=True)

CHANGES = "Please make it **bigger**."
THREAD = "Is 9 the most it can return?"


def _finished(personas, tmp_path, revised, **spec):
    """A finished search whose winner, cand_002, returns 9; sent back, its writer writes `revised`."""
    search = frozen(personas, tmp_path, {"cand_001": 4, "cand_002": {"value": 9, "revised": revised}},
                    repo_name="repo", population=2, rounds=[2, 1], **spec)
    run = run_inline(personas, search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002", fates(search)
    return search, run.winner


def _changes_requested(search, winner, approver, personas):
    services.comment_add(personas.member, winner, THREAD, "code/answer.py", 2)
    services.approval_record(approver, winner, "request_changes", winner.patch_sha256, CHANGES)


def _revise(user, search, note: str = ""):
    services.search_revise(user, search, note, enqueue=False)
    return services.search_run_inline(search)


def _answer(candidate) -> str:
    return bytes(candidate.patch).decode()


def test_a_revised_winner_answers_the_requests_passes_every_check_again_and_waits_for_approval(
        personas, approver, tmp_path, data_dir):
    search, winner = _finished(personas, tmp_path, 11)
    old_sha = winner.patch_sha256
    _changes_requested(search, winner, approver, personas)

    run = _revise(personas.member, search, "Aim for 11.")
    winner.refresh_from_db()
    assert (run.status, run.outcome, run.phase, run.winner_id) == ("finished", "winner", "done", winner.pk)
    assert "+    return 11" in _answer(winner) and winner.patch_sha256 != old_sha
    assert winner.state == "winner" and winner.reason.endswith("awaiting human approval")
    assert run.reserved_cost_microusd == run.reserved_tokens == 0
    # Gates, blocks beside the baseline and the reviewer, on the revised patch, in that order.
    steps = Step.objects.filter(search=search, candidate=winner, part__gte=services.REVISION_PART)
    assert [s.kind for s in steps.order_by("id")] == ["generate", "replay", "review"]
    replay = steps.get(kind="replay")
    assert replay.result["passed"] and "the revised patch measured 5.5× baseline" in replay.result["why"]
    assert Receipt.objects.filter(pk__in=replay.result["receipts"], label__contains=" gate ").exists()
    assert winner.score == pytest.approx(5.5)
    # The writer was told what the reviewers asked, in their words.
    writer = Receipt.objects.get(pk=steps.get(kind="generate").result["receipts"][-1])
    told = writer.stdout_excerpt
    assert "approver requested changes: Please make it **bigger**." in told
    assert f"on code/answer.py:2, member: {THREAD}" in told and "Aim for 11." in told
    # The request for changes was on the old patch: it no longer blocks, and it needs approval again.
    state = selectors.approval_state(winner)
    assert state["changes_requested"] == [] and not state["mergeable"]
    assert "It needs 1 approval on the current patch" in state["blocker"]
    # The thread on line 2 is outdated against the new patch, like a code host.
    thread = selectors.candidate_threads(winner)[0]
    assert thread["outdated"] and not thread["inline"]
    audit = AuditEntry.objects.get(action="search.revise")
    assert audit.actor_name == "member" and audit.detail == {"revision": 1, "patch_sha256": old_sha}
    kinds = [e["kind"] for e in selectors.candidate_timeline(winner)]
    assert kinds.index("decision") < kinds.index("revision") < kinds.index("refinement") \
        < kinds.index("revised")
    # And approving the revised patch makes it mergeable.
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    assert selectors.approval_state(winner)["mergeable"]


@pytest.mark.parametrize(("revised", "why"), [
    ("broken", "gate 1"),
    (1, "does not beat the baseline"),
    ("same", "its writer kept the patch as it was"),
    ("tests", "patch refused at policy"),
])
def test_a_revision_that_fails_anywhere_leaves_the_winner_with_the_patch_and_decisions_it_had(
        personas, approver, tmp_path, data_dir, revised, why):
    search, winner = _finished(personas, tmp_path, revised)
    old = (bytes(winner.patch), winner.patch_sha256, winner.score)
    _changes_requested(search, winner, approver, personas)

    run = _revise(personas.member, search)
    winner.refresh_from_db()
    assert (run.status, run.outcome, run.winner_id) == ("finished", "winner", winner.pk)
    assert (bytes(winner.patch), winner.patch_sha256, winner.score) == old
    assert winner.state == "winner" and "changes requested by approver" in winner.reason
    # The request for changes is on the patch the winner still has: it stands.
    assert [a.user_name for a in selectors.approval_state(winner)["changes_requested"]] == ["approver"]
    revised_entry = next(e for e in selectors.candidate_timeline(winner) if e["kind"] == "revised")
    assert not revised_entry["passed"] and why in revised_entry["outcome"], revised_entry
    assert f"keeps patch {old[1][:12]}" in revised_entry["outcome"]
    assert run.reserved_cost_microusd == run.reserved_tokens == 0


def test_a_revision_cancelled_leaves_the_winner_as_it_was(personas, approver, tmp_path, data_dir):
    search, winner = _finished(personas, tmp_path, 11)
    old_sha = winner.patch_sha256
    _changes_requested(search, winner, approver, personas)
    services.search_revise(personas.member, search, enqueue=False)
    services.search_cancel(personas.member, search)
    run = services.search_run_inline(search)
    winner.refresh_from_db()
    assert (run.status, run.outcome, winner.state) == ("finished", "winner", "winner")
    assert winner.patch_sha256 == old_sha
    assert "cancelled by a person" in selectors.revisions_of(search)[0].result["revision_outcome"]


def test_while_a_revision_runs_nobody_approves_merges_or_sends_it_back_again(
        personas, approver, tmp_path, data_dir):
    search, winner = _finished(personas, tmp_path, 11)
    _changes_requested(search, winner, approver, personas)
    services.search_revise(personas.member, search, enqueue=False)
    refusals = selectors.decision_refusals(approver, search)
    assert refusals["approve"] == refusals["request_changes"] == selectors.REVISING
    with pytest.raises(ValidationError, match="revising the patch"):
        services.approval_record(approver, winner, "approve", winner.patch_sha256)
    with pytest.raises(ValidationError, match="revising the patch"):
        services.merge_create(approver, search)
    with pytest.raises(ValidationError, match="revising the patch already"):
        services.search_revise(personas.member, search, enqueue=False)
    assert SearchRun.objects.get(search=search).phase == "revise"
    # The winner's page says so, and offers no decision before anyone clicks.
    page = text_of(login(approver).get(f"/searches/{search.search_id}/candidates/cand_002/"))
    assert 'id="revising"' in page and "Its writer is answering the changes requested" in page
    assert '<button type="button" id="approve-button" disabled' in page
    assert f"Approve and Request changes are unavailable to you: {selectors.REVISING}" in page


def test_a_winner_is_sent_back_only_by_an_operator_after_changes_are_requested_and_within_limits(
        personas, approver, tmp_path, data_dir):
    search, winner = _finished(personas, tmp_path, "same", budget="[budget]\nmax_cost_microusd = 1000000\n")
    with pytest.raises(ValidationError, match="Nobody has requested changes"):
        services.search_revise(personas.member, search, enqueue=False)
    _changes_requested(search, winner, approver, personas)
    viewer = make_user("viewer")
    ProjectMembership.objects.create(project=personas.alpha, user=viewer, role=access.VIEWER)
    with pytest.raises(PermissionDenied, match="operator role"):
        services.search_revise(viewer, search, enqueue=False)
    with pytest.raises(ValidationError, match="under 10,000 characters"):
        services.search_revise(personas.member, search, "x" * 10_001, enqueue=False)
    # The budget: a writer reserves its share of one live slot ($1 / 2); $0.60 is spent already.
    SearchRun.objects.filter(search=search).update(spent_cost_microusd=600_000)
    with pytest.raises(ValidationError, match=r"budget cannot cover another writer: \$0.60 spent"):
        services.search_revise(personas.member, search, enqueue=False)
    SearchRun.objects.filter(search=search).update(spent_cost_microusd=0)
    for _ in range(selectors.MAX_REVISIONS):  # the writer keeps its patch: each revision fails
        _revise(personas.member, search)
    with pytest.raises(ValidationError, match="revised it 3 times, the most a search allows"):
        services.search_revise(personas.member, search, enqueue=False)
    assert selectors.revision_refusal(personas.member, search).startswith("Its writer has revised it 3")


def test_a_search_with_no_winner_cannot_be_sent_back(personas, tmp_path, data_dir):
    search = frozen(personas, tmp_path, {"cand_001": "broken", "cand_002": "broken"}, repo_name="repo",
                    population=2, rounds=[2, 1])
    run_inline(personas, search)
    with pytest.raises(ValidationError, match="Only a finished search's winner"):
        services.search_revise(personas.owner, search, enqueue=False)


def test_page_api_and_cli_send_it_back_through_the_same_service_with_the_same_refusals(
        personas, approver, tmp_path, data_dir):
    search, winner = _finished(personas, tmp_path, 11)
    url, api_url = f"/searches/{search.search_id}/revise/", f"/api/searches/{search.search_id}/revise"
    refusal = "Nobody has requested changes to the current patch"
    page = login(personas.member).post(url, {"note": ""}, follow=True)
    assert refusal in text_of(page)
    answer = login(personas.member).post(api_url, {"note": ""}, content_type="application/json")
    assert answer.status_code == 400 and refusal in answer.json()["detail"]
    done = cli(personas.member, "revise", search.search_id)
    assert done.code == 1 and refusal in done.err
    viewer = make_user("viewer")
    ProjectMembership.objects.create(project=personas.alpha, user=viewer, role=access.VIEWER)
    assert login(viewer).post(api_url, {}, content_type="application/json").status_code == 403
    assert "needs the operator role" in text_of(login(viewer).post(url, {"note": ""}, follow=True))

    _changes_requested(search, winner, approver, personas)
    # The candidate page offers it beside the decisions, with a note.
    detail = text_of(login(personas.member).get(f"/searches/{search.search_id}/candidates/cand_002/"))
    assert 'id="revise-button"' in detail and "Send back to its writer" in detail
    assert 'id="revise-unavailable"' not in detail
    shown = text_of(login(viewer).get(f"/searches/{search.search_id}/candidates/cand_002/"))
    assert 'id="revise-unavailable"' in shown and "needs the operator role" in shown
    # The page sends it back and shows the search live; the API refuses a second one while it runs.
    page = login(personas.member).post(url, {"note": "Aim for 11."})
    assert page.status_code == 302 and page["Location"] == f"/searches/{search.search_id}/"
    again = login(personas.member).post(api_url, {"note": ""}, content_type="application/json")
    assert again.status_code == 400 and "revising the patch already" in again.json()["detail"]
    assert SearchRun.objects.get(search=search).phase == "revise"
    services.search_run_inline(search)
    winner.refresh_from_db()
    assert "+    return 11" in _answer(winner)


def test_the_cli_sends_it_back_and_runs_the_revision_to_its_end(personas, approver, tmp_path, data_dir):
    search, winner = _finished(personas, tmp_path, 11)
    _changes_requested(search, winner, approver, personas)
    done = cli(personas.member, "revise", search.search_id, "--note", "Aim for 11.")
    assert done.code == 0, done.err
    assert f"{search.search_id}: revision 1: its writer answers the changes requested" in done.out
    winner.refresh_from_db()
    assert "+    return 11" in _answer(winner) and winner.state == "winner"
    revision = selectors.revisions_of(search)[0]
    assert revision.plan["requested_by"] == "member" and revision.plan["note"] == "Aim for 11."


def test_the_api_answers_202_and_the_run_report_shows_the_revision(personas, approver, tmp_path, data_dir):
    search, winner = _finished(personas, tmp_path, 11)
    _changes_requested(search, winner, approver, personas)
    answer = login(personas.member).post(f"/api/searches/{search.search_id}/revise", {"note": "more"},
                                         content_type="application/json")
    assert answer.status_code == 202
    assert answer.json()["status"] == "running" and "revision 1" in answer.json()["detail"]
    report = login(personas.member).get(f"/api/searches/{search.search_id}/run").json()
    assert report["phase"] == "revise" and report["status"] == "running"


def test_a_revision_whose_writer_cannot_start_leaves_the_winner_and_never_turns_the_search_to_none(
        personas, approver, tmp_path, data_dir, monkeypatch):
    search, winner = _finished(personas, tmp_path, 11)
    old_sha = winner.patch_sha256
    _changes_requested(search, winner, approver, personas)
    # As when the writer's command has vanished from the host since the search ran.
    handler = services.steps._HANDLERS[Step.Kind.GENERATE]
    monkeypatch.setattr(handler, "work", lambda step, context, cancel: StepResult(
        spec_failure="worker.command `python scripts/writer.py` cannot start: exit 127", receipts=[]))
    run = _revise(personas.member, search)
    winner.refresh_from_db()
    assert (run.status, run.outcome, run.winner_id) == ("finished", "winner", winner.pk)
    assert winner.patch_sha256 == old_sha and winner.state == "winner"
    assert "cannot start: exit 127" in selectors.revisions_of(search)[0].result["revision_outcome"]
