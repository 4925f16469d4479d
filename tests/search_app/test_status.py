"""One status per search and candidate (search_app/status.py): every word from the rows alone,
then the same label on the list, the search page, the candidate page, the API and the CLI."""

from __future__ import annotations

import html
import io
import re

import pytest
from django.core.management import call_command

from runtime_app.status import StatusWord
from search_app import services
from search_app.models import Approval, Candidate, Merge, SearchRun, Spec, Step
from search_app.status import Tally, candidate_status, search_status, spec_status
from tests.helpers import login
from tests.search_app.helpers import patch_write
from tests.search_app.runs import frozen


def run(**fields) -> SearchRun:
    values = {"status": SearchRun.Status.RUNNING, "phase": SearchRun.Phase.ROUNDS, "round_index": 0,
              "outcome": "", "reason": "", **fields}
    return SearchRun(**values)


def finished(**fields) -> SearchRun:
    return run(status=SearchRun.Status.FINISHED, phase=SearchRun.Phase.DONE, **fields)


WINNER = {"outcome": SearchRun.WINNER, "winner_id": 7}


# ---- every word, from the rows alone


@pytest.mark.parametrize(("the_run", "facts", "label"), [
    (None, {}, "frozen (not started)"),
    (run(), {"started": False, "rounds": [4, 2, 1]}, "running (queued)"),
    (run(round_index=1), {"rounds": [4, 2, 1]}, "running (round 2 of 3)"),
    (run(phase=SearchRun.Phase.REPLAY), {}, "running (replaying the winner)"),
    (run(phase=SearchRun.Phase.REVIEW), {}, "running (review)"),
    (run(phase=SearchRun.Phase.REVISE), {}, "running (revising after changes requested)"),
    (run(status=SearchRun.Status.CANCELLING), {}, "running (cancelling)"),
    (run(status=SearchRun.Status.CANCELLING, outcome=SearchRun.NONE), {}, "running (stopping)"),
    (finished(**WINNER), {"tally": Tally(approvals=1, required=2)}, "awaiting approval (1 of 2 approvals)"),
    (finished(**WINNER), {"tally": Tally(approvals=1, required=2, changes_by=["ann"])},
     "changes requested (by ann)"),
    (finished(**WINNER), {"tally": Tally(approvals=2, required=2)},
     "approved (2 of 2 approvals; ready to merge)"),
    (finished(**WINNER), {"tally": Tally(approvals=2, required=2), "merge_branch": "crucible/faster"},
     "merged (crucible/faster)"),
    (finished(outcome=SearchRun.NONE, reason="no candidate survived round 0"), {},
     "NONE (no candidate survived round 0)"),
    (finished(outcome=SearchRun.NONE, reason="stopped: gate `make` cannot start"), {},
     "failed (stopped: gate `make` cannot start)"),
    (finished(outcome=SearchRun.NONE, reason="round 1 could not be measured: lost"), {},
     "failed (round 1 could not be measured: lost)"),
    (finished(outcome=SearchRun.NONE, reason="the review step did not finish"), {},
     "failed (the review step did not finish)"),
    (run(status=SearchRun.Status.CANCELLED, phase=SearchRun.Phase.DONE, reason="cancelled by a person"), {},
     "cancelled (cancelled by a person)"),
])
def test_a_search_has_one_status_for_each_state_of_its_run(the_run, facts, label):
    assert search_status(the_run, **facts).label == label


def test_every_word_of_the_vocabulary_is_reached_by_some_subject():
    reached = {
        spec_status(2, True).word, search_status(None).word, search_status(run()).word,
        *(search_status(finished(**WINNER), tally=tally, merge_branch=branch).word for tally, branch in (
            (Tally(0, 1), None), (Tally(0, 1, ["ann"]), None), (Tally(1, 1), None), (Tally(1, 1), "b"))),
        search_status(finished(outcome="NONE", reason="x")).word,
        search_status(finished(outcome="NONE", reason="stopped: x")).word,
        search_status(run(status=SearchRun.Status.CANCELLED)).word,
        candidate_status(Candidate(pk=3, number=3, state=Candidate.State.ELIMINATED), finished()).word,
        candidate_status(Candidate(pk=0, number=0, state=Candidate.State.ALIVE), finished()).word,
    }
    assert reached == set(StatusWord)


def test_a_spec_is_drafting_with_its_latest_version():
    assert spec_status(3, False).label == "drafting (v3, invalid)"
    assert spec_status(None, None).label == "drafting (nothing saved yet)"


def test_a_long_reason_is_cut_in_the_label_and_kept_whole_in_the_detail():
    reason = "stopped: " + "x" * 300
    status = search_status(finished(outcome=SearchRun.NONE, reason=reason))
    assert status.detail == reason and len(status.label) < 110 and status.label.endswith("…)")


@pytest.mark.parametrize(("candidate", "the_run", "facts", "label"), [
    (Candidate(pk=3, number=3, state=Candidate.State.QUEUED), None, {},
     "frozen (its search has not started)"),
    (Candidate(pk=3, number=3, state=Candidate.State.WRITING), run(), {}, "running (writing)"),
    (Candidate(pk=3, number=3, state=Candidate.State.ALIVE, round_reached=1), run(), {},
     "running (alive, round 2)"),
    (Candidate(pk=0, number=0, state=Candidate.State.ALIVE, round_reached=0), run(), {},
     "running (baseline, round 1)"),
    (Candidate(pk=3, number=3, state=Candidate.State.ELIMINATED, reason="gate 1 failed"), run(), {},
     "eliminated (gate 1 failed)"),
    (Candidate(pk=3, number=3, state=Candidate.State.NOT_ADMITTED, reason="not admitted: budget"), run(), {},
     "eliminated (not admitted: budget)"),
    (Candidate(pk=3, number=3, state=Candidate.State.CANCELLED, reason="the search was cancelled"),
     run(status=SearchRun.Status.CANCELLED), {}, "cancelled (the search was cancelled)"),
    (Candidate(pk=7, number=7, state=Candidate.State.WINNER), finished(**WINNER), {"tally": Tally(0, 1)},
     "awaiting approval (0 of 1 approval)"),
    (Candidate(pk=7, number=7, state=Candidate.State.WINNER), finished(**WINNER),
     {"tally": Tally(1, 1), "merge_branch": "crucible/x"}, "merged (crucible/x)"),
    (Candidate(pk=7, number=7, state=Candidate.State.WRITING),
     run(phase=SearchRun.Phase.REVISE, **WINNER), {}, "running (revising after changes requested)"),
    (Candidate(pk=0, number=0, state=Candidate.State.ALIVE), finished(**WINNER), {},
     "finished (the baseline, for comparison)"),
    (Candidate(pk=4, number=4, state=Candidate.State.ALIVE), finished(**WINNER), {},
     "finished (not the winner)"),
])
def test_a_candidate_has_one_status_within_its_search(candidate, the_run, facts, label):
    assert candidate_status(candidate, the_run, **facts).label == label


# ---- the same label on the list, the pages, the API and the CLI, for each state of a search

STATES = ["frozen", "running", "awaiting approval", "changes requested", "approved", "merged", "NONE",
          "failed", "cancelled"]


def search_in(state: str, personas, approver, tmp_path):
    """A search of project alpha put straight into `state` (nothing runs): its rows as the
    runtime leaves them in that state. cand_002 has a real patch and wins where there is a winner."""
    search = frozen(personas, tmp_path, {"cand_001": 4, "cand_002": 9}, repo_name="repo",
                    population=2, rounds=[2, 1])
    if state == "frozen":
        return search
    services.search_start(personas.owner, search, enqueue=False)
    runs = SearchRun.objects.filter(search=search)
    if state == "running":
        services.search_advance(search.pk)
        Step.objects.filter(search=search).update(state="running", started_at=search.created_at)
        return search
    done = {"status": SearchRun.Status.FINISHED, "phase": SearchRun.Phase.DONE}
    if state == "cancelled":
        runs.update(status=SearchRun.Status.CANCELLED, phase=SearchRun.Phase.DONE,
                    reason="cancelled by a person")
        return search
    if state in ("NONE", "failed"):
        reason = ("no candidate survived round 0" if state == "NONE"
                  else "stopped: the gate command `./gate` cannot start: no such file")
        runs.update(outcome=SearchRun.NONE, reason=reason, **done)
        return search
    winner = search.candidates.get(candidate_id="cand_002")
    patch_write(tmp_path / "repo", winner, "def answer():\n    return 9\n")
    Candidate.objects.filter(pk=winner.pk).update(state=Candidate.State.WINNER, reason="winner")
    runs.update(outcome=SearchRun.WINNER, winner=winner, reason="winner", **done)
    if state in ("changes requested", "approved", "merged"):
        decision = "request_changes" if state == "changes requested" else "approve"
        Approval.objects.create(candidate=winner, user=approver, user_name="approver", decision=decision,
                                patch_sha256=winner.patch_sha256)
    if state == "merged":
        Merge.objects.create(search=search, candidate=winner, target=Merge.Target.NEW_BRANCH,
                             branch="crucible/faster-answer", commit_sha="a" * 40,
                             patch_sha256=winner.patch_sha256, merged_by=approver, merged_by_name="approver")
    return search


def badge_text(page: str, element_id: str) -> str:
    found = re.search(rf'<span class="badge [^"]*" id="{element_id}"[^>]*>(.*?)</span></span>', page, re.S)
    assert found, f"no #{element_id} on the page"
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", found.group(1))).split())


@pytest.mark.parametrize("state", STATES)
def test_each_state_reads_the_same_on_the_list_the_pages_the_api_and_the_cli(state, personas, approver,
                                                                             tmp_path, data_dir):
    search = search_in(state, personas, approver, tmp_path)
    client = login(personas.member)
    api = client.get(f"/api/searches/{search.search_id}").json()["status_info"]
    assert api["word"] == state
    label = api["label"]

    listed = [item for item in client.get("/api/searches").json() if item["search_id"] == search.search_id]
    assert listed[0]["status_info"] == api
    rows = html.unescape(client.get("/searches/").content.decode())
    row = rows[rows.index(f'id="row-{search.search_id}"'):]
    cell = re.search(r'<td class="status-cell">(.*?)</td>', row[:row.index("</tr>")], re.S).group(1)
    assert " ".join(re.sub(r"<[^>]+>", "", cell).split()) == label
    page = client.get(f"/searches/{search.search_id}/").content.decode()
    assert badge_text(page, "search-status") == label

    out = io.StringIO()
    call_command("search", "status", search.search_id, "--user", "owner", stdout=out)
    assert f"{search.name}: {label}" in " ".join(out.getvalue().split())

    if state in ("awaiting approval", "changes requested", "approved", "merged"):  # the winner says it too
        candidate = client.get(f"/searches/{search.search_id}/candidates/cand_002/").content.decode()
        assert badge_text(candidate, "candidate-status") == label
        report = client.get(f"/api/searches/{search.search_id}/run").json()
        assert report["status_info"] == api
        assert [c["status_info"]["label"] for c in report["candidates"] if c["candidate_id"] == "cand_002"] \
            == [label]


def test_the_live_update_of_a_search_page_carries_its_new_status(personas, approver, tmp_path, data_dir):
    from runtime_app.models import Event
    from search_app.live import search_live_fragments

    search = search_in("awaiting approval", personas, approver, tmp_path)
    winner = search.candidates.get(candidate_id="cand_002")
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    events = list(Event.objects.filter(subject_type="search", subject_id=search.pk, kind="approval.approve"))
    summary = search_live_fragments(personas.member, search.pk, events)[0]
    assert 'id="search-status" hx-swap-oob="true"' in summary
    assert badge_text(summary, "search-status") == "approved (1 of 1 approval; ready to merge)"


def test_the_spec_drafts_say_drafting(personas):
    Spec.objects.create(project=personas.alpha, title="empty draft", created_by=personas.owner)
    page = html.unescape(login(personas.member).get("/searches/").content.decode())
    specs = page[page.index('id="specs"'):]
    assert "drafting (nothing saved yet)" in " ".join(re.sub(r"<[^>]+>", "", specs).split())
