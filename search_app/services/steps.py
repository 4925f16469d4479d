"""Steps: handed to workers, claimed under a lease, executed, reconciled when their worker
died, and their results applied to the candidate and the run in one transaction."""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from search_app import execution
from search_app.context import StepContext, step_context
from search_app.frozen import search_spec
from search_app.measurement import (
    TrialFigures,
    median_interval,
    paired_ratios,
    replay_consistent,
    replay_undecided,
    replay_within_band,
    report_contradicted,
    report_overruns,
    report_tolerance,
)
from search_app.models import Candidate, Review, Search, SearchRun, Step
from search_app.services._common import (
    _candidate_event,
    _carry_on,
    _eliminate,
    _interval,
    _lease_seconds,
    _one_line,
    _parked_trees_release,
    _refinement_kept,
    _replay_more_blocks,
    _replay_values,
    _search_event,
    comparison_for,
)
from search_app.services.revisions import (
    _revision_end,
    _revision_measured,
    _revision_reviewed,
    _revision_verdict,
    _revision_written,
)
from search_app.step_result import StepResult

logger = logging.getLogger(__name__)


MAX_ATTEMPTS = 3


def _replay_extend(step: Any, candidate: Any, more: int, why: str) -> None:
    """The replay's next blocks, as a step of their own (its gates already passed)."""
    step.result = {**step.result, "passed": None, "why": why}
    step.save(update_fields=["result"])
    first = step.plan["blocks"][1]
    Step.objects.create(search=step.search, candidate=candidate, kind=Step.Kind.REPLAY, round=step.round,
                        part=step.part + 1,
                        plan={**step.plan, "blocks": [first, first + more], "extends": step.pk})
    _candidate_event(candidate, why)


def _spec_failure_stop(run: Any, message: str) -> None:
    """The first command that cannot start stops the search with NONE and its reason: the rest
    would hit the same wall. Running steps are cancelled (as by a person) and settled below."""
    if run.status != SearchRun.Status.RUNNING:
        return  # stopping already: the first reason stands
    run.status, run.outcome = SearchRun.Status.CANCELLING, SearchRun.NONE
    run.reason = _one_line(f"stopped: {message}")
    run.save(update_fields=["status", "outcome", "reason", "updated_at"])
    _search_event(run.search, "search.spec_failure", f"{run.search.name}: {run.reason}")


def steps_enqueue_mark(step_pks: list[int]) -> list[int]:
    """Mark steps handed to the broker; a step already handed over within a lease is skipped,
    so each completion does not flood the queue with duplicates (a lost message is handed
    over again once a lease has passed)."""
    now = timezone.now()
    stale = now - timedelta(seconds=_lease_seconds())
    marked: list[int] = []
    if not step_pks:
        return marked
    with transaction.atomic():  # one write transaction for the lot, not one per step
        for step_pk in step_pks:
            if Step.objects.filter(pk=step_pk, state=Step.State.PENDING).filter(
                    Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=stale)).update(enqueued_at=now):
                marked.append(step_pk)
    return marked


def search_drive_request(search_pk: int) -> bool:
    """Mark a search_drive of this search as handed to the broker, by compare-and-set; False when
    one is already pending (each completion need not queue its own), unless that mark is older
    than a lease (its message may be lost)."""
    now = timezone.now()
    stale = now - timedelta(seconds=_lease_seconds())
    return bool(SearchRun.objects.filter(search_id=search_pk).filter(
        Q(drive_enqueued_at__isnull=True) | Q(drive_enqueued_at__lt=stale)).update(drive_enqueued_at=now))


def search_drive_started(search_pk: int) -> None:
    """A drive starts: later completions queue the next one (it reads what they wrote after this)."""
    SearchRun.objects.filter(search_id=search_pk, drive_enqueued_at__isnull=False).update(
        drive_enqueued_at=None)


def step_claim(step_pk: int, owner: str) -> Any:
    """Take a pending step (or one whose lease expired) by compare-and-set; None if taken."""
    now = timezone.now()
    claimed = Step.objects.filter(pk=step_pk).filter(
        Q(state=Step.State.PENDING) | Q(state=Step.State.RUNNING, lease_expires_at__lt=now)
    ).filter(attempts__lt=MAX_ATTEMPTS).update(
        state=Step.State.RUNNING, lease_owner=owner,
        lease_expires_at=now + timedelta(seconds=_lease_seconds()),
        attempts=F("attempts") + 1, started_at=now,
    )
    if not claimed:
        return None
    return Step.objects.select_related("search__project", "candidate__search__project").get(pk=step_pk)


def _lease_renew(step_pk: int, owner: str) -> bool:
    """Extend this worker's lease on a running step; False when it is no longer ours."""
    return Step.objects.filter(pk=step_pk, state=Step.State.RUNNING, lease_owner=owner).update(
        lease_expires_at=timezone.now() + timedelta(seconds=_lease_seconds())) > 0


def _heartbeat(step_pk: int, owner: str, search_pk: int, cancel: Any, stop: Any, fenced: Any) -> None:
    """Extend the lease while the step works; notice cancellation or a lost lease.

    A worker that has not renewed its lease for half a lease (the database unreachable, a stalled
    process) stops its commands itself (`fenced`): once the lease expires, another worker may take
    the step over and the planner may count its writer as ended, so nothing of this attempt may
    still run then (the writer/evaluation barrier relies on it)."""
    lease = _lease_seconds()
    renew_every = max(lease / 6, 0.5)
    renewed = held = time.monotonic()
    try:
        while not stop.wait(min(renew_every, 1.0)):  # cancellation is noticed within a second
            kept, cancelling = True, False
            try:
                if time.monotonic() - renewed >= renew_every:
                    renewed = time.monotonic()  # before the write: the lease it sets ends later
                    kept = _lease_renew(step_pk, owner)
                    held = renewed if kept else held
                cancelling = SearchRun.objects.filter(search_id=search_pk,
                                                      status=SearchRun.Status.CANCELLING).exists()
            except DatabaseError:
                logger.warning("step %s: its lease could not be renewed", step_pk, exc_info=True)
                connection.close()  # the next renewal reconnects
            if time.monotonic() - held >= lease / 2:
                fenced.set()
            if not kept or cancelling or fenced.is_set():
                cancel.set()
    finally:
        connection.close()


def step_execute(step_pk: int, owner: str) -> bool:
    """Claim a step, do its work, and record the result if the lease is still ours.

    A step whose worker stopped it for want of a renewed lease records nothing: it stays running
    until its lease expires, then is taken back or failed like a step whose worker died."""
    step = step_claim(step_pk, owner)
    if step is None:
        return False
    cancel, stop, fenced = threading.Event(), threading.Event(), threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(step.pk, owner, step.search_id, cancel, stop, fenced),
                            daemon=True)
    beat.start()
    try:
        # The frozen search as this step sees it, resolved once: spec, repository, policy, reads.
        context = step_context(step.search)
        result = _HANDLERS[step.kind].work(step, context, cancel)
    except Exception as error:  # a runtime fault: the step fails with its reason, the search goes on
        logger.exception("step %s failed", step_pk)
        result = StepResult(error=f"{type(error).__name__}: {error}")
    finally:
        stop.set()
        beat.join()
    if fenced.is_set():
        logger.warning("step %s stopped: its lease was not renewed for half a lease", step_pk)
        return False
    recorded = _step_record(step.pk, owner, result)
    # The search ended while this step ran: no trial will need the trees it parked.
    if step.kind in (Step.Kind.EVALUATE, Step.Kind.MEASURE) and \
            not SearchRun.objects.filter(search_id=step.search_id, status=SearchRun.Status.RUNNING).exists():
        _parked_trees_release(step.search)
    return recorded


def _step_record(step_pk: int, owner: str, result: StepResult) -> bool:
    with transaction.atomic():
        run = SearchRun.objects.select_for_update().get(search__steps__pk=step_pk)
        step = Step.objects.select_related("candidate", "search__project").get(pk=step_pk)
        if step.state != Step.State.RUNNING or step.lease_owner != owner:
            return False  # another worker took it over; our receipts stay as evidence
        candidate = step.candidate
        step.result, step.finished_at = result.stored(), timezone.now()
        step.state = Step.State.CANCELLED if result.cancelled else (
            Step.State.FAILED if result.error is not None else Step.State.DONE)
        step.error = result.error or ""
        usage = result.usage or {}
        if step.reserved_cost_microusd or step.reserved_tokens or usage:
            # Actual use replaces the reservation; a writer never counts beyond what it reserved.
            run.reserved_cost_microusd -= step.reserved_cost_microusd
            run.reserved_tokens -= step.reserved_tokens
            cost = usage.get("cost_microusd", 0)
            tokens = usage.get("tokens", 0)
            if run.budget_cost_microusd:
                cost = min(cost, step.reserved_cost_microusd)
            if run.budget_tokens:
                tokens = min(tokens, step.reserved_tokens)
            run.spent_cost_microusd += cost
            run.spent_tokens += tokens
            candidate.cost_microusd += cost
            candidate.tokens += tokens
        step.save()
        run.save()
        if step.state == Step.State.CANCELLED:
            return True
        if result.spec_failure is not None and "revision" in step.plan:  # the winner stands as it was
            _revision_end(step, result.spec_failure)
            return True
        if result.spec_failure is not None:  # a command of the spec cannot start: stop the search
            _spec_failure_stop(run, result.spec_failure)  # (preflight.py)
            return True
        if result.error is not None:
            if step.kind == Step.Kind.MEASURE:
                pass  # the round cannot be decided: search_advance ends the search with the reason
            elif candidate.number == 0:
                candidate.state = Candidate.State.ELIMINATED
                candidate.reason = f"baseline not measured: {result.error}"
                candidate.save()
                _candidate_event(candidate, candidate.reason)
            elif "revision" in step.plan:
                _revision_end(step, f"{step.kind} step failed in the runtime: {result.error}")
            elif step.refines:
                _refinement_kept(candidate, step, f"a runtime fault: {result.error}")
            else:
                _eliminate(candidate, f"{step.kind} step failed in the runtime: {result.error}")
            return True
        _HANDLERS[step.kind].apply(step, candidate, result)
    return True


def _generated(step: Step, candidate: Candidate, result: StepResult) -> None:
    if "revision" in step.plan:
        _revision_written(step, candidate, result)
        return
    if step.refines:
        _refinement_apply(step, candidate, result)
        return
    candidate.patch = bytes.fromhex(result.patch_hex or "")
    candidate.patch_sha256 = result.patch_sha256 or ""
    candidate.diff_lines = result.diff_lines
    candidate.files = result.files if result.files is not None else []
    if result.eliminated is not None:
        _eliminate(candidate, result.eliminated)
    else:
        candidate.state = Candidate.State.EVALUATING
        candidate.save()
        _candidate_event(candidate, f"wrote a patch of {candidate.diff_lines} lines")


def _reviewed(step: Step, candidate: Candidate, result: StepResult) -> None:
    findings = result.findings if result.findings is not None else []
    assert result.verdict is not None  # execution.review always gives one (the static reviewer's)
    Review.objects.create(search=step.search, candidate=candidate, verdict=result.verdict,
                          findings=findings, reviewer=result.reviewer if result.reviewer is not None else "",
                          receipt_id=result.review_receipt)
    _candidate_event(candidate, f"reviewer says {result.verdict} ({len(findings)} findings)")
    if "revision" in step.plan:
        _revision_reviewed(step, candidate, candidate.reviews.order_by("-id").first())


def _replayed(step: Step, candidate: Candidate, result: StepResult) -> None:
    passed, why, more = _replay_verdict(step, candidate, result)
    if passed is None:
        _replay_extend(step, candidate, more, "replay undecided: " + why)
        return
    why = ("replay passed: " if passed else "replay failed: ") + why
    step.result = {**step.result, "passed": passed, "why": why}
    step.save(update_fields=["result"])
    if "revision" in step.plan:
        _revision_measured(step, candidate, passed, why)
        return
    if not passed:
        _eliminate(candidate, why)
    else:
        candidate.reason = why
        candidate.save()
        _candidate_event(candidate, why)


def _measured(step: Step, candidate: Candidate, result: StepResult) -> None:
    _measurement_apply(step, result)


def _evaluated(step: Step, candidate: Candidate, result: StepResult) -> None:
    """The gates (a new patch's, or the baseline's)."""
    candidate.gates_passed = max(candidate.gates_passed, result.gates_passed or 0)
    if result.eliminated is not None:
        if candidate.number == 0:
            candidate.state, candidate.reason = Candidate.State.ELIMINATED, f"baseline: {result.eliminated}"
            candidate.save()
            _candidate_event(candidate, candidate.reason)
            _search_event(step.search, "search.baseline_failed", f"the baseline failed its gates "
                          f"({result.eliminated}): candidates are compared by absolute values"
                          + _results_unchecked(step.search), round=step.round)
        else:
            candidate.round_reached = step.round
            _eliminate(candidate, f"round {step.round}: {result.eliminated}")
        return
    candidate.round_reached = step.round
    candidate.state = Candidate.State.ALIVE
    candidate.save()
    _candidate_event(candidate, f"round {step.round}: passed its {candidate.gates_passed} gate(s); "
                                "measured with the round's blocks")


def _measurement_apply(step: Any, result: StepResult) -> None:
    """Record a round's blocks: each member's values, a member whose trial failed eliminated, then
    every measured candidate's figure and interval for the round so far."""
    search = step.search
    spec = search_spec(search)
    key = str(step.round)
    members = {c.candidate_id: c for c in search.candidates.filter(candidate_id__in=result.members or [])}
    for cid, candidate in members.items():
        values, seconds = (result.values or {}).get(cid, {}), (result.durations or {}).get(cid, {})
        cpu, rss = (result.cpu or {}).get(cid, {}), (result.rss or {}).get(cid, {})
        round_blocks = dict(candidate.blocks.get(key, {}))
        round_blocks.update({block: {"value": value, "seconds": seconds.get(block), "cpu": cpu.get(block),
                                     "rss": rss.get(block)}
                             for block, value in values.items()})
        candidate.blocks = {**candidate.blocks, key: round_blocks}
        candidate.save(update_fields=["blocks", "updated_at"])
    for cid, why in (result.dropped or {}).items():
        candidate = members[cid]
        if candidate.number == 0:
            candidate.state, candidate.reason = Candidate.State.ELIMINATED, f"baseline not measured: {why}"
            candidate.save(update_fields=["state", "reason", "updated_at"])
            _candidate_event(candidate, candidate.reason)
            _search_event(search, "search.baseline_failed", f"the baseline could not be measured ({why}): "
                          "candidates are compared by absolute values" + _results_unchecked(search),
                          round=step.round)
        else:
            _eliminate(candidate, f"round {step.round}: {why}")
    _scores_update(search, spec, step.round)


def _results_unchecked(search: Search) -> str:
    """What a search whose baseline is out loses: its trial results are no longer compared."""
    if search_spec(search).score.results is None:
        return ""
    return ("; trial results are not compared from here on (there is no baseline trial to compare "
            "them with): each trial's receipt says `results_check: not compared`")


def _block_values(candidate: Any, key: str) -> dict[int, float]:
    return {int(block): item["value"] for block, item in candidate.blocks.get(key, {}).items()}


def _block_figures(candidate: Any, key: str) -> dict[int, TrialFigures]:
    """Each block's reported value beside what the runtime measured of the same trial."""
    return {int(block): TrialFigures(item["value"], item.get("seconds"), item.get("cpu"), item.get("rss"))
            for block, item in candidate.blocks.get(key, {}).items()}


def _baseline_unit_wrong(spec: Any, baseline: Mapping[int, TrialFigures]) -> str | None:
    """The spec's failure when the baseline reports more time than its whole command took: the
    `reported` unit does not say what the score command reports."""
    kind = spec.score.reported
    if not spec.score.corroborated or not baseline:
        return None
    overrun = report_overruns(kind, baseline, report_tolerance(kind, baseline))
    if overrun is None:
        return None
    return (f"the baseline's score command {overrun}: `{spec.score.metric}` is not in the unit "
            f"`reported = \"{kind}\"` says (fix `score.reported` or the score command)")


def _report_check(search: Search, spec: Any, baseline: Any, key: str) -> bool:
    """Check every measured candidate's reported figure of round `key` against the runtime's own
    measurement (search_app.measurement.report_contradicted) and eliminate those it contradicts.
    False when the baseline's own report cannot be right: the search stops as a spec failure."""
    if not spec.score.corroborated:
        return True
    base = _block_figures(baseline, key) if baseline.state != Candidate.State.ELIMINATED else {}
    wrong = _baseline_unit_wrong(spec, base)
    if wrong:
        _spec_failure_stop(SearchRun.objects.get(search=search), wrong)
        return False
    for candidate in search.candidates.filter(state=Candidate.State.ALIVE, round_reached=int(key)
                                              ).exclude(number=0):
        mine = _block_figures(candidate, key)
        why = report_contradicted(spec.score.reported, mine, base, spec.score.confidence) if mine else None
        if why:
            _eliminate(candidate, f"round {key}: {why}")
    return True


def _scores_update(search: Search, spec: Any, round_index: int) -> None:
    """Each measured candidate's figure for the round: its median paired ratio to the baseline
    with its interval (paired), or the median of its values (absolute); the absolute median is
    kept either way."""
    key = str(round_index)
    baseline = search.candidates.get(number=0)
    if not _report_check(search, spec, baseline, key):
        return
    paired = comparison_for(search, spec, baseline) == "paired"
    base_values = _block_values(baseline, key)
    for candidate in search.candidates.filter(state=Candidate.State.ALIVE, round_reached=round_index):
        values = _block_values(candidate, key)
        if not values:
            continue
        ordered = [values[block] for block in sorted(values)]
        seconds = [item["seconds"] for item in candidate.blocks[key].values()
                   if item.get("seconds") is not None]
        candidate.trials = {**candidate.trials, key: ordered}
        candidate.score_absolute = statistics.median(ordered)
        candidate.spread = max(ordered) - min(ordered)
        candidate.runtime_seconds = statistics.fmean(seconds) if seconds else None
        ratios = paired_ratios(values, base_values) if candidate.number else [1.0]
        figures = ratios if paired and ratios else ordered
        interval = median_interval(figures, spec.score.confidence)
        candidate.score, candidate.score_low, candidate.score_high = (interval.point, interval.low,
                                                                      interval.high)
        candidate.save()
        shown = f"{interval.point:.3g}× baseline [{interval.low:.3g}, {interval.high:.3g}]" if paired else \
            f"score {interval.point:g}"
        _candidate_event(candidate, f"round {round_index}: {shown} over {len(figures)} block(s)")


def _replay_verdict(step: Any, candidate: Any, result: StepResult) -> tuple[bool | None, str, int]:
    """(passed, why, more blocks). Paired: the replay's interval must overlap the one it won
    with and still beat the baseline; while it only holds the baseline for want of blocks, it
    gets more (up to the spec's ceiling) instead of a verdict: None. Absolute: its median must
    stay within the band of its earlier trials."""
    if result.eliminated is not None:  # its patch or its gates
        return False, result.eliminated, 0
    spec = search_spec(step.search)
    cid = candidate.candidate_id
    dropped = result.dropped or {}
    if cid in dropped:
        return False, dropped[cid], 0
    merged = _replay_values(step, candidate, result.as_dict())
    values, base = merged.get(cid, {}), merged.get("baseline", {})
    if not values:
        return False, "the replay measured nothing", 0
    if spec.score.corroborated:
        figures = {name: _replay_values(step, candidate, result.as_dict(), name) for name in
                   ("durations", "cpu", "rss")}

        def trials(member: str) -> dict[int, TrialFigures]:
            return {block: TrialFigures(value, *(figures[name].get(member, {}).get(block)
                                                 for name in ("durations", "cpu", "rss")))
                    for block, value in merged.get(member, {}).items()}
        mine, theirs = trials(cid), trials("baseline") if "baseline" not in dropped else {}
        why = _baseline_unit_wrong(spec, theirs) or report_contradicted(
            spec.score.reported or "", mine, theirs, spec.score.confidence)
        if why:
            return False, why, 0
    baseline = step.search.candidates.get(number=0)
    paired = comparison_for(step.search, spec, baseline) == "paired"
    if "revision" in step.plan:
        return _revision_verdict(spec, values, base, paired and "baseline" not in dropped)
    if paired and base and "baseline" not in dropped:
        won, direction = _interval(candidate, spec), spec.score.direction
        replayed = median_interval(paired_ratios(values, base), spec.score.confidence)
        passed, why = replay_consistent(won, replayed, direction)
        ceiling = spec.score.trials_ceiling
        if not passed and replay_undecided(won, replayed, direction) and len(values) < ceiling:
            # As at a round's cut: the noise decides nothing; more blocks do, within the ceiling.
            more = _replay_more_blocks(spec, len(values))
            return None, why.replace("the replay no longer beats the baseline",
                                     f"not yet told apart from the baseline; {more} more block(s)"), more
        return passed, why, 0
    # The band comes from the trials of the patch being replayed (not of a patch its writer
    # later refined).
    earlier = [v for round_key, trial_values in candidate.trials.items()
               if int(round_key) >= candidate.patch_round for v in trial_values]
    return (*replay_within_band(earlier, statistics.median(values.values()), spec.score.replay_tolerance), 0)


def _refinement_apply(step: Any, candidate: Any, result: StepResult) -> None:
    if result.eliminated is not None:
        _refinement_kept(candidate, step, result.eliminated)
        return
    if result.patch_sha256 == candidate.patch_sha256:
        _carry_on(candidate, step.round)  # the same patch passed its gates already
        _candidate_event(candidate, f"round {step.round}: its writer kept its patch")
        return
    candidate.state = Candidate.State.EVALUATING
    candidate.patch = bytes.fromhex(result.patch_hex or "")
    candidate.patch_sha256, candidate.patch_round = result.patch_sha256, step.round
    candidate.diff_lines = result.diff_lines
    candidate.files = result.files if result.files is not None else []
    candidate.save()
    _candidate_event(candidate, f"round {step.round}: its writer refined its patch "
                                f"({candidate.diff_lines} lines); gates run again")


@dataclass
class StepHandler:
    """A step kind's work (execution.py, outside any transaction) and how its result is applied
    (inside the transaction that records it)."""

    work: Callable[[Step, StepContext, threading.Event], StepResult]
    apply: Callable[[Step, Candidate, StepResult], None]


_HANDLERS: dict[str, StepHandler] = {
    Step.Kind.GENERATE: StepHandler(execution.generate, _generated),
    Step.Kind.EVALUATE: StepHandler(execution.evaluate, _evaluated),
    Step.Kind.MEASURE: StepHandler(execution.measure, _measured),
    Step.Kind.REPLAY: StepHandler(execution.replay, _replayed),
    Step.Kind.REVIEW: StepHandler(execution.review, _reviewed),
}


def steps_reconcile() -> list[int]:
    """Release steps whose worker vanished (lease expired); fail those that lost 3 workers.

    Returns the searches still running, so the caller drives each of them (a lost message
    delays work but never loses it).
    """
    now = timezone.now()
    expired = Step.objects.filter(state=Step.State.RUNNING, lease_expires_at__lt=now)
    for step in expired.select_related("candidate"):
        with transaction.atomic():
            if step.attempts >= MAX_ATTEMPTS:
                claimed = Step.objects.filter(pk=step.pk, state=Step.State.RUNNING, lease_expires_at__lt=now
                                              ).update(state=Step.State.FAILED, finished_at=now,
                                                       error=f"lost its worker {step.attempts} times")
                if not claimed:
                    continue
                _reservation_release(step)
                why = f"{step.kind} step lost its worker {step.attempts} times"
                if "revision" in step.plan:
                    _revision_end(step, why)
                elif step.refines:
                    _refinement_kept(step.candidate, step, why)
                elif step.candidate.number:
                    _eliminate(step.candidate, why)
            else:
                Step.objects.filter(pk=step.pk, state=Step.State.RUNNING, lease_expires_at__lt=now).update(
                    state=Step.State.PENDING, lease_owner="", enqueued_at=None)
    running = SearchRun.objects.filter(status__in=(SearchRun.Status.RUNNING, SearchRun.Status.CANCELLING))
    return list(running.values_list("search_id", flat=True))


def _reservation_release(step: Any) -> None:
    """A step that failed without a result hands its budget reservation back to its run."""
    if step.reserved_cost_microusd or step.reserved_tokens:
        run = SearchRun.objects.select_for_update().get(search_id=step.search_id)
        run.reserved_cost_microusd -= step.reserved_cost_microusd
        run.reserved_tokens -= step.reserved_tokens
        run.save(update_fields=["reserved_cost_microusd", "reserved_tokens", "updated_at"])
