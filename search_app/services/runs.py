"""Running a search.

The database is the source of truth. `search_advance` is the only place that decides what
happens next (admission, round closing, selection, replay, review, outcome); it runs under
a row lock on the SearchRun, so two drivers never decide twice. `step_execute` (steps.py) claims
one step by compare-and-set, does its work with a heartbeat extending its lease, and records
the result in one transaction only if it still holds the lease. Steps are idempotent: a
done step is never run again, and a step whose worker died is taken over after its lease
expires (`steps_reconcile`).
"""

from __future__ import annotations

import os
import socket
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from runtime_app import access
from runtime_app.queue import task_send
from runtime_app.services import audit_record
from search_app.frozen import search_spec
from search_app.measurement import (
    MAX_REPLAYS,
    beats,
    contested,
    describe,
    head_to_head,
    min_blocks,
    replay_blocks,
    tie_groups,
    tied_scores,
    undecided_against,
)
from search_app.models import Candidate, Review, Search, SearchRun, Step
from search_app.preflight import provider_problems, start_problems
from search_app.selection import Entry, is_better, select
from search_app.services._common import (
    _candidate_event,
    _carry_on,
    _eliminate,
    _fits,
    _interval,
    _reservation,
    _search_event,
    _winner_reason,
    comparison_for,
    review_blocks,
)
from search_app.services.revisions import _revision_stalled
from search_app.services.steps import step_execute, steps_reconcile

if TYPE_CHECKING:
    from django.contrib.auth.models import User


class ProviderUnready(ValidationError):
    """The writers' provider would fail every call (no key, no server): nothing was started."""


def search_start_checked(
    user: User, search: Search, *, start_anyway: bool = False, enqueue: bool = True,
) -> Any:
    """`search_start` as people ask for it (the page, the API, the CLI): a search whose provider
    has no key or no reachable server is refused with the reason (ProviderUnready) unless they
    start it anyway, since the key may live only in the workers' environment."""
    access.require(user, access.OPERATOR, search.project)
    if not start_anyway and not SearchRun.objects.filter(search=search).exists():
        problems = provider_problems(search_spec(search).worker.provider)
        if problems:
            raise ProviderUnready(problems)
    return search_start(user, search, enqueue=enqueue)


def search_start(user: User, search: Search, *, enqueue: bool = True) -> Any:
    """Start a frozen search: its candidates and run state are written; work begins on commit.

    Starting a search that already runs or ran returns its run unchanged. `enqueue=False`
    leaves driving it to the caller (the CLI's `search_run_inline`).
    """
    access.require(user, access.OPERATOR, search.project)
    spec = search_spec(search)
    if not SearchRun.objects.filter(search=search).exists():
        # Before anything runs or is spent: every command must be able to start (search_app/preflight.py).
        cannot_start = start_problems(search)
        if cannot_start:
            raise ValidationError(cannot_start)
    with transaction.atomic():
        run, created = SearchRun.objects.get_or_create(
            search=search,
            defaults={"started_by": user, "budget_cost_microusd": spec.budget.max_cost_microusd,
                      "budget_tokens": spec.budget.max_tokens},
        )
        if not created:
            return run
        # The baseline's evaluation is created by the planner once every round 0 writer has ended.
        Candidate.objects.create(
            search=search, candidate_id="baseline", number=0, batch=0, state=Candidate.State.EVALUATING,
            reason="the unchanged baseline, for comparison",
        )
        Candidate.objects.bulk_create([
            Candidate(search=search, candidate_id=candidate_id, number=number, batch=batch)
            for batch, ids in enumerate(search.candidate_batches)
            for number, candidate_id in ((int(cid.split("_")[1]), cid) for cid in ids)
        ])
        if enqueue:
            transaction.on_commit(lambda: task_send("search_app.tasks.search_drive", search.pk))
        audit_record(user, "search.start", project=search.project, target=f"{search.search_id} {search.name}")
        _search_event(search, "search.started", f"{search.name} started: {spec.population} candidates, "
                      f"rounds {spec.rounds}")
        _barrier_event(search, 0)
    return run


def search_cancel(user: User, search: Search) -> Any:
    """Ask a running search to stop: no new steps; running ones are stopped and say so."""
    access.require(user, access.OPERATOR, search.project)
    with transaction.atomic():
        run = SearchRun.objects.select_for_update().filter(search=search).first()
        if run is None:
            raise ValidationError("This search has not started.")
        if run.terminal or run.status == SearchRun.Status.CANCELLING:
            return run
        run.status = SearchRun.Status.CANCELLING
        run.save(update_fields=["status", "updated_at"])
        audit_record(user, "search.cancel", project=search.project, target=search.search_id)
        _search_event(search, "search.cancelling", f"{search.name}: cancel requested by {user}")
    return run


# What the planner reads of a candidate: never its patch, trials or blocks (they grow with the search).
_PLAN_FIELDS = ("id", "search_id", "candidate_id", "number", "batch", "state", "round_reached",
                "patch_sha256", "patch_round", "duplicate_of_id", "score", "reason")


_LIVE_STATES = (Step.State.PENDING, Step.State.RUNNING)
# Candidates not yet through their writer (round 0 admits them in turn).
_UNWRITTEN_STATES = (Candidate.State.QUEUED, Candidate.State.WRITING)
# Candidates whose fate is decided: a cancellation leaves them as they are.
_SETTLED_STATES = (Candidate.State.ELIMINATED, Candidate.State.NOT_ADMITTED, Candidate.State.WINNER)


_PLAN_PASSES = 3  # a round closes, the next one starts; never more than that in one call


def search_advance(search_pk: int) -> list[int]:
    """Decide what happens next; return the ids of steps ready to run (at most `concurrency` live).

    Incremental: a call reads a constant number of rows whatever the population (indexed counts
    and lookups, no patches or results), without the write lock; it takes the lock, and reads
    again under it, only when there is something to write."""
    run = _run_for_planning(search_pk, lock=False)
    if run is None or run.terminal:
        return []
    spec = search_spec(run.search)
    if _planner_has_work(run, spec):
        with transaction.atomic():
            run = _run_for_planning(search_pk, lock=True)
            if run is None or run.terminal:
                return []
            # Closing a round and making the next round's first step are two passes: take them
            # together, or a worker planning after the last completion finds nothing to run and
            # the search waits for the beat's next drive.
            for _ in range(_PLAN_PASSES):
                before = (run.round_index, run.phase)
                if not _plan(run, spec):
                    return []
                if run.terminal or (run.round_index, run.phase) == before:
                    break
    return _ready_steps(run.search, spec.concurrency)


def _run_for_planning(search_pk: int, *, lock: bool) -> Any:
    runs = SearchRun.objects.select_for_update() if lock else SearchRun.objects.all()
    # Rankings, replay order and the search's batches grow with the population: loaded when a
    # round transition needs them, not on every call.
    return runs.select_related("search__project").defer(
        "rankings", "replayed", "search__candidate_batches", "search__hashed_inputs", "search__spec_text",
    ).filter(search_id=search_pk).first()


def _live_steps(search: Search) -> Any:
    return search.steps.filter(state__in=_LIVE_STATES)


def _writers_live(search: Search) -> bool:
    """Whether a writer of the search may still run: a writer step not ended (pending, running, or
    running on a worker whose lease expired: it stays live until it is run again or fails), or a
    candidate not yet through its writer. While one may, no evaluation tree gets hidden files."""
    return search.steps.filter(kind=Step.Kind.GENERATE, state__in=_LIVE_STATES).exists() or \
        search.candidates.filter(number__gt=0, state__in=_UNWRITTEN_STATES).exists()


def _evaluations_due(search: Search, round_index: int) -> tuple[Any, Any]:
    """(the baseline if its round 0 evaluation is due, the candidates whose evaluation is due): none
    while any writer of the search may still run. This is the barrier (docs/sandbox.md, "Writers
    and hidden files"): an evaluation tree holds the hidden files, and concurrent sandboxes always
    share some channel."""
    if _writers_live(search):
        return None, search.candidates.none()
    return _baseline_unevaluated(search, round_index), _to_evaluate(search, round_index)


def _to_evaluate(search: Search, round_index: int) -> Any:
    """Candidates whose writer finished this round, with no evaluation yet (past the barrier only)."""
    steps = Step.objects.filter(candidate=OuterRef("pk"), round=round_index)
    return search.candidates.filter(number__gt=0, state=Candidate.State.EVALUATING).filter(
        Exists(steps.filter(kind=Step.Kind.GENERATE, state__in=(Step.State.DONE, Step.State.FAILED)))
    ).exclude(
        Exists(steps.filter(kind=Step.Kind.EVALUATE))).order_by("number").only(*_PLAN_FIELDS)


def _baseline_unevaluated(search: Search, round_index: int) -> Any:
    """The baseline, if its round 0 evaluation is not made yet (past the barrier only)."""
    if round_index != 0:
        return None
    evaluated = Step.objects.filter(candidate=OuterRef("pk"), kind=Step.Kind.EVALUATE)
    return search.candidates.filter(number=0, state=Candidate.State.EVALUATING).exclude(
        Exists(evaluated)).only(*_PLAN_FIELDS).first()


def _barrier_event(search: Search, round_index: int) -> None:
    """Once per round that has writers: why its evaluations wait."""
    _search_event(search, "search.barrier", f"round {round_index}: evaluations start when every writer of "
                  f"round {round_index} has ended (no hidden evaluator file exists while a writer of this "
                  "search runs)", round=round_index)


def _planner_has_work(run: Any, spec: Any) -> bool:
    """Whether a locked pass would write anything (read without the lock; the pass re-checks)."""
    search = run.search
    if run.status == SearchRun.Status.CANCELLING:
        return True
    if run.phase != SearchRun.Phase.ROUNDS:
        return run.phase in _ENDGAME_PHASES and not _live_steps(search).exists()
    baseline, due = _evaluations_due(search, run.round_index)
    if baseline is not None or due.exists():
        return True
    live = _live_steps(search).count()
    queued = search.candidates.filter(number__gt=0, state=Candidate.State.QUEUED)
    if live < spec.concurrency and queued.exists():
        # A writer is admitted, or the rest are not admitted; unless the budget waits for a live writer.
        return _fits(run, *_reservation(run, spec.concurrency)) or not _live_reserved(search)
    return live == 0 and _round_complete(run)


def _live_reserved(search: Search) -> bool:
    """Whether a live writer holds a reservation (it may hand part of it back)."""
    return _live_steps(search).filter(Q(reserved_cost_microusd__gt=0) | Q(reserved_tokens__gt=0)).exists()


def _plan(run: Any, spec: Any) -> bool:
    """The planner's writes, under the run's lock; False when the search stopped planning."""
    search = run.search
    if run.status == SearchRun.Status.CANCELLING:
        _cancel_settle(run)
        return False
    if run.phase == SearchRun.Phase.ROUNDS:
        live = _admit(run, spec)
        if not live and _round_complete(run):
            _round_next(run, spec)
    busy = _live_steps(search).exists
    if run.phase == SearchRun.Phase.REPLAY and not busy():
        _replay_next(run, spec)
    if run.phase == SearchRun.Phase.REVIEW and not busy():
        _outcome_winner(run, spec)
    # Every revision step ends it; this never waits forever.
    if run.phase == SearchRun.Phase.REVISE and not busy():
        run.save()
        _revision_stalled(search)
        return False
    run.save()
    return True


def _ready_steps(search: Search, concurrency: int) -> list[int]:
    # Never more than `concurrency` steps running, however many are pending (a round's
    # promotions are all created at once).
    slots = concurrency - search.steps.filter(state=Step.State.RUNNING).count()
    if slots <= 0:
        return []
    pending = search.steps.filter(state=Step.State.PENDING).order_by("id")
    return list(pending.values_list("id", flat=True)[:slots])


def _admit(run: Any, spec: Any) -> int:
    """Admit round 0's writers in batch order, and, once every writer of the round has ended
    (round 0's, or a later round's refinements), the round's evaluations: the baseline's (round 0)
    and each written candidate's, in candidate order; return how many steps are live after it.

    No evaluation exists while a writer of the search may run (an evaluation tree holds the hidden
    files, and concurrent sandboxes always share some channel), so identical patches are grouped
    with every writer of the round finished: the group is evaluated once, by its earliest-admitted
    member, and the others are marked at once, whatever they would have scored.
    """
    search = run.search
    live = _live_steps(search).count()
    queued = search.candidates.filter(number__gt=0, state=Candidate.State.QUEUED).order_by("number") \
        .only(*_PLAN_FIELDS)
    reserved_here = False  # a writer admitted by this call holds a reservation too
    for candidate in queued[: max(spec.concurrency - live, 0)]:
        cost, tokens = _reservation(run, spec.concurrency)
        if not _fits(run, cost, tokens):
            if reserved_here or _live_reserved(search):
                break  # a live writer may hand back part of its reservation: wait for it
            _not_admitted(run, list(queued.filter(number__gte=candidate.number)))
            break
        run.reserved_cost_microusd += cost
        run.reserved_tokens += tokens
        reserved_here = reserved_here or bool(cost or tokens)
        candidate.state = Candidate.State.WRITING
        candidate.save(update_fields=["state", "updated_at"])
        Step.objects.create(search=search, candidate=candidate, kind=Step.Kind.GENERATE, round=0,
                            reserved_cost_microusd=cost, reserved_tokens=tokens)
        live += 1
        _candidate_event(candidate, "admitted; its writer starts")
    return live + _evaluations_admit(run)


def _evaluations_admit(run: Any) -> int:
    """The round's evaluations, once every writer of the search has ended; how many were made."""
    search, round_index = run.search, run.round_index
    baseline, due_now = _evaluations_due(search, round_index)
    due = list(due_now)
    if not (baseline or due):
        return 0
    if not search.steps.filter(kind=Step.Kind.EVALUATE, round=round_index).exists():
        _search_event(search, "search.evaluating", f"round {round_index}: every writer of round "
                      f"{round_index} has ended; evaluations start", round=round_index)
    made = 0
    if baseline is not None:
        Step.objects.create(search=search, candidate=baseline, kind=Step.Kind.EVALUATE, round=0)
        made += 1
    for candidate in due:
        original = _identical_earlier(candidate)
        if original is not None:
            candidate.duplicate_of = original
            _eliminate(candidate, f"identical patch to {original.candidate_id}: evaluated once and credited "
                                  f"to {original.candidate_id}, the earliest candidate with it")
            continue
        Step.objects.create(search=search, candidate=candidate, kind=Step.Kind.EVALUATE, round=round_index)
        made += 1
    return made


# States of candidates whose patch is still in the race (a refining writer's until it lands).
_ENDGAME_PHASES = (SearchRun.Phase.REPLAY, SearchRun.Phase.REVIEW, SearchRun.Phase.REVISE)
_GROUPED_STATES = (Candidate.State.EVALUATING, Candidate.State.ALIVE, Candidate.State.WINNER,
                   Candidate.State.WRITING)


def _identical_earlier(candidate: Any) -> Any:
    """The earliest-admitted other candidate with byte-identical patch bytes, whatever the round:
    one still in the race with them, or one judged on them in this same round; None if the patch
    is its own. Patches are admitted by round, then in candidate order, so a refinement that
    reproduces a patch kept since an earlier round is credited to that patch's candidate."""
    if not candidate.patch_sha256:
        return None
    earlier = Q(patch_round__lt=candidate.patch_round) | Q(patch_round=candidate.patch_round,
                                                           number__lt=candidate.number)
    holding = Q(state__in=_GROUPED_STATES) | Q(state=Candidate.State.ELIMINATED,
                                                patch_round=candidate.patch_round)
    return candidate.search.candidates.filter(
        earlier, holding, number__gt=0, patch_sha256=candidate.patch_sha256, duplicate_of__isnull=True,
    ).order_by("patch_round", "number").only(*_PLAN_FIELDS).first()


def _not_admitted(run: Any, candidates: list) -> None:
    spent = f"{run.spent_cost_microusd:,} µUSD and {run.spent_tokens:,} tokens spent"
    for candidate in candidates:
        candidate.state = Candidate.State.NOT_ADMITTED
        candidate.reason = f"not admitted: the budget cannot cover another writer ({spent})"
        candidate.save(update_fields=["state", "reason", "updated_at"])
    _search_event(run.search, "search.budget_exhausted",
                  f"admission stopped: the budget cannot cover another writer; "
                  f"{len(candidates)} not admitted")


def _round_complete(run: Any) -> bool:
    if run.round_index == 0 and run.search.candidates.filter(state__in=_UNWRITTEN_STATES).exists():
        return False
    return not _live_steps(run.search).exists()


def _entries(candidates: list, scores: dict[str, float] | None = None) -> list:
    scores = scores or {}
    return [Entry(c.candidate_id, score=scores.get(c.candidate_id, c.score), cost_microusd=c.cost_microusd,
                  tokens=c.tokens, diff_lines=c.diff_lines or 0, runtime_seconds=c.runtime_seconds or 0.0,
                  patch_sha256=c.patch_sha256, admitted=(c.patch_round, c.number)) for c in candidates]


def _separated(candidates: list, intervals: dict, round_index: int, spec: Any) -> Any:
    """Whether two of the round's candidates can be told apart: their intervals do not overlap,
    or head to head over the blocks both ran (measurement.head_to_head) one is clearly better."""
    key = str(round_index)
    values = {c.candidate_id: {int(block): entry["value"] for block, entry in c.blocks.get(key, {}).items()
                               if entry.get("value") is not None} for c in candidates}

    def separated(a: str, b: str) -> bool:
        if not intervals[a].overlaps(intervals[b]):
            return True
        ratio = head_to_head(values.get(a, {}), values.get(b, {}), spec.score.confidence)
        return ratio is not None and (ratio.high < 1 or ratio.low > 1)

    return separated


def _round_next(run: Any, spec: Any) -> None:
    """The round's gates are done: measure its survivors in blocks, add blocks where the
    candidates at the cut (or against the baseline) cannot be told apart yet, then close it."""
    search, round_index = run.search, run.round_index
    baseline = search.candidates.get(number=0)
    participants = list(search.candidates.filter(state=Candidate.State.ALIVE, round_reached=round_index,
                                                 number__gt=0))
    measures = list(search.steps.filter(kind=Step.Kind.MEASURE, round=round_index).defer("result")
                    .order_by("part", "id"))
    failed = next((s for s in measures if s.state == Step.State.FAILED), None)
    if failed is not None:
        _outcome_none(run, f"round {round_index} could not be measured: {failed.error}")
        return
    if not participants:
        _round_close(run, spec)
        return
    members = ["baseline"] if baseline.state == Candidate.State.ALIVE else []
    if not measures:
        _measure_create(run, round_index, 0, [*members, *(c.candidate_id for c in participants)],
                        0, spec.score.trials)
        return
    if comparison_for(search, spec, baseline) == "paired":
        intervals = {c.candidate_id: _interval(c, spec) for c in participants if c.score is not None}
        last = round_index >= len(spec.rounds) - 1
        keep = 1 if last else spec.rounds[round_index + 1]
        direction = spec.score.direction
        # More blocks where the order at the cut, or against the baseline, is not known yet, and
        # for any candidate that would go on (or win) on too few blocks to decide anything.
        separated = _separated(participants, intervals, round_index, spec)
        wanted = {*contested(intervals, keep, direction, separated),
                  *undecided_against(intervals, 1.0, direction),
                  *(cid for cid, interval in intervals.items()
                    if not interval.decided and beats(interval, 1.0, direction))}
        counts = {c.candidate_id: len(c.blocks.get(str(round_index), {})) for c in participants}
        more = sorted(cid for cid in wanted if counts[cid] < spec.score.trials_ceiling)
        if more:
            first = max(s.plan["blocks"][1] for s in measures)
            fewest = min(counts[cid] for cid in more)
            # Enough at once to decide (min_blocks), in steps of `trials`, never past the ceiling.
            blocks = min(spec.score.trials_ceiling - fewest,
                         max(spec.score.trials, min_blocks(spec.score.confidence) - fewest))
            _measure_create(run, round_index, len(measures), [*members, *more], first, first + blocks)
            _search_event(search, "search.measuring", f"round {round_index}: {', '.join(more)} cannot be "
                          f"told apart yet; {blocks} more block(s) for them and the baseline",
                          round=round_index)
            return
    _round_close(run, spec)


def _measure_create(run: Any, round_index: int, part: int, members: list[str], first: int, last: int) -> None:
    baseline = run.search.candidates.get(number=0)
    Step.objects.create(search=run.search, candidate=baseline, kind=Step.Kind.MEASURE, round=round_index,
                        part=part, plan={"members": sorted(members), "blocks": [first, last]})


def _round_close(run: Any, spec: Any) -> None:
    """Select the round's survivors; promote them to the next round, or go on to replay."""
    search, round_index = run.search, run.round_index
    baseline = search.candidates.get(number=0)
    paired = comparison_for(search, spec, baseline) == "paired"
    direction = spec.score.direction
    participants = list(search.candidates.filter(state=Candidate.State.ALIVE, round_reached=round_index,
                                                 number__gt=0))
    labels = _baseline_cut(participants, baseline, spec, round_index, paired)
    if not participants:
        _outcome_none(run, f"no candidate survived round {round_index}")
        return
    last = round_index >= len(spec.rounds) - 1
    keep = len(participants) if last else spec.rounds[round_index + 1]
    scores, ties = _ties(participants, spec, round_index) if paired else (None, {})
    decisions = select(_entries(participants, scores), keep, direction=direction,
                       policy=spec.selection.policy, ordering=spec.selection.ordering,
                       tie_breakers=spec.score.tie_breakers,
                       retain_diversity=spec.selection.retain_diversity, labels=labels)
    by_id = {c.candidate_id: c for c in participants}
    run.rankings = {**run.rankings, str(round_index): [d.candidate_id for d in decisions
                                                       if not d.duplicate_of]}
    for decision in decisions:
        _decision_apply(run, spec, decision, by_id, ties, round_index, last)
    _search_event(search, "search.round_closed", f"round {round_index} closed: "
                  f"{sum(d.promoted for d in decisions)} of {len(decisions)} go on", round=round_index)
    if not last and search.steps.filter(kind=Step.Kind.GENERATE, round=round_index + 1).exists():
        _barrier_event(search, round_index + 1)
    if last:
        run.phase = SearchRun.Phase.REPLAY
    else:
        run.round_index = round_index + 1
        if baseline.state == Candidate.State.ALIVE:  # the baseline runs in every round's blocks
            baseline.round_reached = round_index + 1
            baseline.save(update_fields=["round_reached", "updated_at"])


def _baseline_cut(participants: list[Any], baseline: Any, spec: Any, round_index: int,
                  paired: bool) -> dict[str, str]:
    """Eliminate (and take out of `participants`) every candidate not clearly better than the
    baseline; the paired interval's label of each candidate, for the selection's reasons."""
    direction = spec.score.direction
    labels: dict[str, str] = {}
    if paired:
        for candidate in list(participants):
            interval = _interval(candidate, spec)
            labels[candidate.candidate_id] = describe(interval, paired=True)
            if not beats(interval, 1.0, direction):
                _eliminate(candidate, f"round {round_index}: {labels[candidate.candidate_id]}: not clearly "
                                      "better than the baseline")
                participants.remove(candidate)
    elif baseline.score is not None:
        for candidate in [c for c in participants if not is_better(c.score, baseline.score, direction)]:
            _eliminate(candidate, f"round {round_index}: score {candidate.score:g} is not better than the "
                                  f"baseline's {baseline.score:g}")
            participants.remove(candidate)
    return labels


def _ties(participants: list[Any], spec: Any, round_index: int
          ) -> tuple[dict[str, float] | None, dict[str, list[str]]]:
    """Paired: the scores selection orders by (tied candidates share one) and, for each tied
    candidate, those it is tied with."""
    direction = spec.score.direction
    ties: dict[str, list[str]] = {}
    intervals = {c.candidate_id: _interval(c, spec) for c in participants}
    separated = _separated(participants, intervals, round_index, spec)
    scores = tied_scores(intervals, direction, separated)
    for group in tie_groups(intervals, direction, separated):
        for cid in group:
            if len(group) > 1:
                ties[cid] = [other for other in group if other != cid]
    return scores, ties


def _decision_apply(run: Any, spec: Any, decision: Any, by_id: dict[str, Any], ties: dict[str, list[str]],
                    round_index: int, last: bool) -> None:
    """One candidate's fate at the round's cut: promoted, eliminated, or (in the last round) kept."""
    candidate = by_id[decision.candidate_id]
    reason = decision.reason
    if decision.candidate_id in ties:
        reason += f"; tied with {', '.join(ties[decision.candidate_id])} (neither is clearly better, " \
                  f"head to head), so the tie-breakers ({', '.join(spec.score.tie_breakers)}) order them"
    if decision.duplicate_of:
        candidate.duplicate_of = by_id[decision.duplicate_of]
    if decision.promoted and not last:
        candidate.reason = f"round {round_index}: {reason}"
        candidate.save(update_fields=["reason", "duplicate_of", "updated_at"])
        _promote(run, spec, candidate, round_index + 1)
    elif not decision.promoted:
        _eliminate(candidate, f"round {round_index}: {reason}")
    else:
        candidate.reason = f"round {round_index}: {reason}"
        candidate.save(update_fields=["reason", "duplicate_of", "updated_at"])


def _promote(run: Any, spec: Any, candidate: Any, next_round: int) -> None:
    """On to the next round's blocks with the patch it has; with `worker.refine`, its writer
    revises the patch first, if the budget can cover one more writer (otherwise the patch goes
    on as it is)."""
    if spec.worker.refine:
        cost, tokens = _reservation(run, spec.concurrency)
        if _fits(run, cost, tokens):
            run.reserved_cost_microusd += cost
            run.reserved_tokens += tokens
            candidate.state = Candidate.State.WRITING
            candidate.save(update_fields=["state", "updated_at"])
            Step.objects.create(search=run.search, candidate=candidate, kind=Step.Kind.GENERATE,
                                round=next_round, reserved_cost_microusd=cost, reserved_tokens=tokens)
            _candidate_event(candidate, f"promoted to round {next_round}; its writer refines its patch")
            return
        _candidate_event(candidate, f"promoted to round {next_round}; not refined: the budget cannot "
                                    "cover another writer")
    else:
        _candidate_event(candidate, f"promoted to round {next_round}")
    _carry_on(candidate, next_round)


def _replay_order(run: Any) -> list[str]:
    order: list[str] = []
    for round_key in sorted(run.rankings, key=int, reverse=True):
        order.extend(cid for cid in run.rankings[round_key] if cid not in order)
    return order


def _replay_next(run: Any, spec: Any) -> None:
    """Replay the best candidate not yet replayed, interleaved with the baseline; after
    MAX_REPLAYS failures, NONE."""
    search = run.search
    # A replayed candidate already reviewed was rejected by a blocking review: the next one is due.
    passed = search.steps.filter(kind=Step.Kind.REPLAY, state=Step.State.DONE, result__passed=True).exclude(
        candidate__reviews__isnull=False).select_related("candidate")
    if passed.exists():
        candidate = passed.first().candidate
        run.phase = SearchRun.Phase.REVIEW
        cost, tokens = _reservation(run, spec.concurrency)
        if not _fits(run, cost, tokens):
            cost = tokens = 0  # no room for a model review: the static reviewer reads it instead
        run.reserved_cost_microusd += cost
        run.reserved_tokens += tokens
        Step.objects.create(search=search, candidate=candidate, kind=Step.Kind.REVIEW, round=run.round_index,
                            reserved_cost_microusd=cost, reserved_tokens=tokens)
        _candidate_event(candidate, "replay passed; an independent reviewer reads it")
        return
    remaining = [cid for cid in _replay_order(run) if cid not in run.replayed]
    if not remaining or len(run.replayed) >= MAX_REPLAYS:
        rejected = search.reviews.filter(verdict=Review.Verdict.REJECT).exists()
        stage = "replay and review" if rejected else "replay"
        _outcome_none(run, f"no candidate passed {stage} ({', '.join(run.replayed) or 'none replayed'})")
        return
    candidate = search.candidates.get(candidate_id=remaining[0])
    baseline = search.candidates.get(number=0)
    members = [candidate.candidate_id, *(["baseline"] if baseline.state == Candidate.State.ALIVE else [])]
    run.replayed = [*run.replayed, candidate.candidate_id]
    blocks = replay_blocks(spec.score.trials, spec.score.trials_ceiling, spec.score.confidence,
                           paired=comparison_for(search, spec, baseline) == "paired")
    Step.objects.create(search=search, candidate=candidate, kind=Step.Kind.REPLAY, round=run.round_index,
                        plan={"members": sorted(members), "blocks": [0, blocks],
                              "namespace": f"replay-{candidate.candidate_id}"})
    _candidate_event(candidate, "provisional winner: replaying on a clean baseline, interleaved with the "
                                "baseline")


def _outcome_winner(run: Any, spec: Any) -> None:
    review = run.search.reviews.order_by("-id").select_related("candidate").first()
    if review is None:
        _outcome_none(run, "the review step did not finish")
        return
    candidate = review.candidate
    if review.verdict == Review.Verdict.REJECT and review_blocks(run.search, spec):
        # The gates ran the candidate's code, which can force their exit code (os._exit(0) at import);
        # the reviewer read its patch from outside: its reject stands. The next candidate is replayed.
        serious = [f for f in review.findings if isinstance(f, dict) and f.get("severity") == "high"]
        first = (serious or review.findings or [{}])[0]
        where = f" at {first['path']}:{first['line']}" if first.get("path") and first.get("line") else ""
        _eliminate(candidate, f"the reviewer rejects it: {first.get('message', 'no reason given')}{where} "
                              f"({len(review.findings)} finding(s); selection.review is blocking)")
        run.phase = SearchRun.Phase.REPLAY
        _replay_next(run, spec)
        return
    candidate.state = Candidate.State.WINNER
    candidate.reason = _winner_reason(candidate, review.verdict)
    candidate.save(update_fields=["state", "reason", "updated_at"])
    run.outcome, run.winner = SearchRun.WINNER, candidate
    run.status, run.phase = SearchRun.Status.FINISHED, SearchRun.Phase.DONE
    run.reason = candidate.reason
    run.finished_at = timezone.now()
    _candidate_event(candidate, candidate.reason)
    _search_event(run.search, "search.finished", f"{run.search.name}: winner {candidate.candidate_id} "
                  f"(score {candidate.score:g}), awaiting approval", outcome=SearchRun.WINNER)


def _outcome_none(run: Any, reason: str) -> None:
    run.outcome, run.reason = SearchRun.NONE, reason
    run.status, run.phase = SearchRun.Status.FINISHED, SearchRun.Phase.DONE
    run.finished_at = timezone.now()
    racing = (Candidate.State.ALIVE, Candidate.State.EVALUATING)
    for candidate in run.search.candidates.filter(state__in=racing).exclude(number=0):
        _eliminate(candidate, candidate.reason or reason)
    _search_event(run.search, "search.finished", f"{run.search.name}: NONE — {reason}",
                  outcome=SearchRun.NONE)


def _cancel_settle(run: Any) -> None:
    search = run.search
    search.steps.filter(state=Step.State.PENDING).update(state=Step.State.CANCELLED,
                                                         finished_at=timezone.now())
    if search.steps.filter(state=Step.State.RUNNING).exists():
        run.save()
        return
    if run.phase == SearchRun.Phase.REVISE:  # cancelling a revision leaves the winner as it was
        run.reserved_cost_microusd = run.reserved_tokens = 0
        run.save()
        _revision_stalled(search, "cancelled by a person")
        return
    stopped = run.outcome == SearchRun.NONE  # by _spec_failure_stop, not by a person
    run.reserved_cost_microusd = run.reserved_tokens = 0
    run.status = SearchRun.Status.FINISHED if stopped else SearchRun.Status.CANCELLED
    run.phase, run.finished_at = SearchRun.Phase.DONE, timezone.now()
    run.reason = run.reason if stopped else "cancelled by a person"
    settled = []
    for candidate in search.candidates.exclude(state__in=_SETTLED_STATES):
        candidate.state = Candidate.State.CANCELLED
        candidate.reason = candidate.reason or (
            "the search stopped" if stopped else "the search was cancelled")
        candidate.save(update_fields=["state", "reason", "updated_at"])
        settled.append(candidate.candidate_id)
    run.save()
    if stopped:
        _search_event(search, "search.finished", f"{search.name}: NONE — {run.reason}",
                      outcome=SearchRun.NONE, candidate_ids=settled)
        return
    _search_event(search, "search.cancelled", f"{search.name}: cancelled", outcome=SearchRun.Status.CANCELLED,
                  candidate_ids=settled)


def search_run_inline(search: Search, *, workers: int | None = None, progress: Any = None,
                      poll: float = 0.2) -> Any:
    """Drive a started search to its end in this process (the CLI's way; no Celery needed)."""
    owner = f"inline@{socket.gethostname()}:{os.getpid()}"
    concurrency = workers or search_spec(search).concurrency

    def work(step_pk: int) -> None:
        try:
            step_execute(step_pk, owner)
        finally:
            connection.close()

    in_flight: dict[int, Any] = {}
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="crucible-step") as pool:
        while True:
            for step_pk in search_advance(search.pk):
                if step_pk not in in_flight and len(in_flight) < concurrency:
                    in_flight[step_pk] = pool.submit(work, step_pk)
            run = SearchRun.objects.get(search=search)
            if progress is not None:
                progress(run)
            if run.terminal and not in_flight:
                return run
            if in_flight:
                done, _ = wait(in_flight.values(), timeout=poll, return_when=FIRST_COMPLETED)
                for step_pk in [pk for pk, future in in_flight.items() if future in done]:
                    in_flight.pop(step_pk).result()
            else:
                steps_reconcile()
                time.sleep(poll)
