"""The one status of a search and of a candidate (runtime_app/status.py has the words).

The functions named `*_status` are pure: they read the rows handed to them and nothing else.
`search_statuses` and `candidate_statuses` read what those need for a whole list at once (the
run, the merge, the winners' standing approvals), a fixed number of queries whatever its length.

A search: frozen (not started) → running (queued / round 2 of 4 / replaying the winner / review /
revising after changes requested / cancelling) → one of awaiting approval (n of m approvals),
changes requested (by whom), approved (ready to merge), merged (branch), NONE (why), failed (why:
the runtime could not finish it — a command of the spec cannot start, a round could not be
measured, the review did not finish) or cancelled.

A candidate: frozen before its search starts; running (its state) while the search runs it;
eliminated (why) when it fell; the winner has its search's standing (awaiting approval … merged);
cancelled; finished for the baseline, or a survivor that was not chosen, once the search ended."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model

from runtime_app import access
from runtime_app.models import ProjectMembership
from runtime_app.status import Status, StatusWord, status_make
from search_app.models import Approval, Candidate, Merge, Search, SearchRun, Step

# Reasons of a NONE the runtime wrote because it could not finish the search (services/runs.py,
# services/steps.py): a failure to look into, not an answer that no candidate made it.
FAILURE_REASON = re.compile(r"^(stopped: |round \d+ could not be measured|the review step did not finish)")

PHASE_DETAIL: dict[str, str] = {
    SearchRun.Phase.REPLAY: "replaying the winner",
    SearchRun.Phase.REVIEW: "review",
    SearchRun.Phase.REVISE: "revising after changes requested",
}


@dataclass
class Tally:
    """A winner's decisions that count now (selectors.approval_state's rule): approvals on the
    current patch by people who may still decide, and who requested changes. `decided` holds
    each person's standing decision on the current patch (counting or not), by user id."""

    approvals: int = 0
    required: int = 1
    changes_by: list[str] = field(default_factory=list)
    decided: dict[int, str] = field(default_factory=dict)


def _rounds_detail(run: SearchRun, rounds: list[int] | None) -> str:
    total = len(rounds or [])
    current = run.round_index + 1
    return f"round {current} of {total}" if total else f"round {current}"


def winner_status(tally: Tally | None, merge_branch: str | None) -> Status:
    """Where a winner stands with people."""
    if merge_branch is not None:
        return status_make(StatusWord.MERGED, merge_branch)
    tally = tally or Tally(required=settings.CONFIG.required_approvals)
    if tally.changes_by:
        return status_make(StatusWord.CHANGES_REQUESTED, "by " + ", ".join(tally.changes_by))
    counted = f"{tally.approvals} of {tally.required} approval{'s' if tally.required != 1 else ''}"
    if tally.approvals >= tally.required:
        return status_make(StatusWord.APPROVED, f"{counted}; ready to merge")
    return status_make(StatusWord.AWAITING_APPROVAL, counted)


def search_status(run: SearchRun | None, *, started: bool = True, rounds: list[int] | None = None,
                  merge_branch: str | None = None, tally: Tally | None = None) -> Status:
    """A search's status from its run (None: not started), whether any step has begun, its
    spec's rounds, its merge's branch and its winner's tally."""
    if run is None:
        return status_make(StatusWord.FROZEN, "not started")
    if run.status == SearchRun.Status.CANCELLING:
        return status_make(StatusWord.RUNNING, "stopping" if run.outcome == SearchRun.NONE else "cancelling")
    if run.status == SearchRun.Status.RUNNING:
        if run.phase == SearchRun.Phase.ROUNDS:
            return status_make(StatusWord.RUNNING, _rounds_detail(run, rounds) if started else "queued")
        return status_make(StatusWord.RUNNING, PHASE_DETAIL.get(run.phase, str(run.phase)))
    if run.status == SearchRun.Status.CANCELLED:
        return status_make(StatusWord.CANCELLED, run.reason)
    if run.outcome == SearchRun.NONE:
        word = StatusWord.FAILED if FAILURE_REASON.match(run.reason or "") else StatusWord.NONE
        return status_make(word, run.reason)
    if run.outcome == SearchRun.WINNER and run.winner_id is not None:
        return winner_status(tally, merge_branch)
    return status_make(StatusWord.FINISHED, run.reason)  # not reached by the runtime: said plainly


_LIVE_STATES: dict[str, str] = {Candidate.State.QUEUED: "queued", Candidate.State.WRITING: "writing",
                Candidate.State.EVALUATING: "evaluating", Candidate.State.ALIVE: "alive"}


def candidate_status(candidate: Candidate, run: SearchRun | None, *, merge_branch: str | None = None,
                     tally: Tally | None = None) -> Status:
    """A candidate's status within its search's run (None: not started)."""
    if run is None:
        return status_make(StatusWord.FROZEN, "its search has not started")
    is_winner = run.winner_id == candidate.pk and candidate.number > 0
    if is_winner and run.phase == SearchRun.Phase.REVISE and not run.terminal:
        return status_make(StatusWord.RUNNING, PHASE_DETAIL[SearchRun.Phase.REVISE])
    if candidate.state in (Candidate.State.ELIMINATED, Candidate.State.NOT_ADMITTED):
        return status_make(StatusWord.ELIMINATED, candidate.reason or candidate.get_state_display())
    if candidate.state == Candidate.State.CANCELLED:
        return status_make(StatusWord.CANCELLED, candidate.reason)
    if is_winner and run.outcome == SearchRun.WINNER and run.status == SearchRun.Status.FINISHED:
        return winner_status(tally, merge_branch)
    baseline = candidate.number == 0
    if not run.terminal:
        state = _LIVE_STATES.get(candidate.state, candidate.get_state_display())
        where = f"round {candidate.round_reached + 1}" if candidate.round_reached >= 0 else ""
        what = "baseline" if baseline else state
        return status_make(StatusWord.RUNNING, ", ".join(part for part in (what, where) if part))
    if baseline:
        return status_make(StatusWord.FINISHED, "the baseline, for comparison")
    return status_make(StatusWord.FINISHED, candidate.reason or "not the winner")


def spec_status(latest_number: int | None, latest_valid: bool | None) -> Status:
    """A spec is a draft until someone freezes it, and after: each freeze is a search of its own."""
    if not latest_number:
        return status_make(StatusWord.DRAFTING, "nothing saved yet")
    return status_make(StatusWord.DRAFTING, f"v{latest_number}, {'valid' if latest_valid else 'invalid'}")


def spec_statuses_set(specs: list[Any]) -> list[Any]:
    """Each spec of selectors.spec_list_for_user (annotated with its latest version) with `state`."""
    for spec in specs:
        spec.state = spec_status(spec.latest_number, spec.latest_valid)
    return specs


# ---- reading what the functions need, for many at once


def approval_tallies(winners: Iterable[tuple[int, int, str]]) -> dict[int, Tally]:
    """{candidate pk: Tally} for (candidate pk, project id, current patch hash) triples: three
    queries whatever their number. The rule is selectors.approval_state's."""
    winners = list(winners)
    required = settings.CONFIG.required_approvals
    tallies = {pk: Tally(required=required) for pk, _, _ in winners}
    if not winners:
        return tallies
    current = {pk: (project, sha) for pk, project, sha in winners}
    latest: dict[tuple[int, int | None], Any] = {}
    for approval in Approval.objects.filter(candidate_id__in=current).order_by("created_at", "id"):
        latest[(approval.candidate_id, approval.user_id)] = approval
    makers = {user for _, user in latest if user is not None}
    deciders = dict(get_user_model().objects.filter(pk__in=makers, is_active=True)
                    .values_list("pk", "is_superuser"))
    approver_roles = [role for role in access.ROLE_NAMES if access.role_allows(role, access.APPROVER)]
    approvers = set(ProjectMembership.objects.filter(
        user_id__in=makers, project_id__in={project for project, _ in current.values()},
        role__in=approver_roles).values_list("project_id", "user_id"))
    for (candidate_pk, user_pk), approval in latest.items():
        project, sha = current[candidate_pk]
        if user_pk is None or approval.patch_sha256 != sha or approval.withdrawn_at is not None:
            continue
        tally = tallies[candidate_pk]
        tally.decided[user_pk] = approval.decision
        if user_pk not in deciders or not (deciders[user_pk] or (project, user_pk) in approvers):
            continue
        if approval.decision == Approval.Decision.APPROVE:
            tally.approvals += 1
        else:
            tally.changes_by.append(approval.user_name)
    return tallies


def _rounds_of(search: Search) -> list[int] | None:
    """The spec's rounds without loading a deferred spec (the list annotates them as `rounds`)."""
    if "rounds" in search.__dict__:
        return search.__dict__["rounds"]
    if "spec_normalized" in search.__dict__:
        return list((search.spec_normalized or {}).get("rounds") or [])
    return None


def _run_of(search: Search) -> SearchRun | None:
    try:
        return search.run
    except SearchRun.DoesNotExist:
        return None


def search_facts(searches: list[Search], *, fresh: bool = False) -> dict[str, Any]:
    """Runs, merges, whether steps began and the winners' tallies of these searches. A run the
    rows were read with is used unless `fresh` (a search held for a while may cache a stale one)."""
    pks = [search.pk for search in searches]
    loaded = [] if fresh else [search for search in searches
                               if Search.run.is_cached(search)]  # type: ignore[attr-defined]
    runs = {search.pk: _run_of(search) for search in loaded}
    missing = [pk for pk in pks if pk not in runs]
    if missing:
        runs.update({pk: None for pk in missing})
        runs.update({run.search_id: run for run in SearchRun.objects.filter(search_id__in=missing)})
    merges = dict(Merge.objects.filter(search_id__in=pks).values_list("search_id", "branch"))
    started = set(Step.objects.filter(search_id__in=pks, started_at__isnull=False)
                  .values_list("search_id", flat=True).distinct())
    winner_pks = [run.winner_id for run in runs.values() if run is not None and run.winner_id is not None]
    winners = list(Candidate.objects.filter(pk__in=winner_pks).values_list("pk", "search__project_id",
                                                                             "patch_sha256"))
    return {"runs": runs, "merges": merges, "started": started, "tallies": approval_tallies(winners)}


def search_statuses(searches: Iterable[Search], *, fresh: bool = False) -> dict[int, Status]:
    """{search pk: Status} for a list of searches: a few queries whatever its length."""
    searches = list(searches)
    facts = search_facts(searches, fresh=fresh)
    statuses = {}
    for search in searches:
        run = facts["runs"].get(search.pk)
        statuses[search.pk] = search_status(
            run, started=search.pk in facts["started"], rounds=_rounds_of(search),
            merge_branch=facts["merges"].get(search.pk),
            tally=facts["tallies"].get(run.winner_id) if run is not None and run.winner_id else None)
    return statuses


def search_status_of(search: Search) -> Status:
    """One search's status, read now (never from a run cached on the instance)."""
    return search_statuses([search], fresh=True)[search.pk]


def candidate_statuses(search: Search, candidates: Iterable[Candidate]) -> dict[int, Status]:
    """{candidate pk: Status} for candidates of one search."""
    facts = search_facts([search], fresh=True)
    run = facts["runs"].get(search.pk)
    branch = facts["merges"].get(search.pk)
    tally = facts["tallies"].get(run.winner_id) if run is not None and run.winner_id else None
    return {candidate.pk: candidate_status(candidate, run, merge_branch=branch, tally=tally)
            for candidate in candidates}


def candidate_status_of(candidate: Candidate) -> Status:
    return candidate_statuses(candidate.search, [candidate])[candidate.pk]
