"""Revising a winner after a reviewer asked for changes: the new patch is written, measured
beside the baseline and reviewed; the winner stands unless the revised patch passes."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from runtime_app import access
from runtime_app.presenters import short_sha
from runtime_app.queue import task_send
from runtime_app.services import audit_record
from search_app.frozen import search_spec
from search_app.measurement import (
    median_interval,
    paired_ratios,
    replay_blocks,
    revision_beats,
    revision_beats_absolute,
)
from search_app.models import Candidate, Review, Search, SearchRun, Step
from search_app.selectors import revision_feedback, revision_refusal, revisions_of
from search_app.services._common import (
    _candidate_event,
    _fits,
    _one_line,
    _replay_more_blocks,
    _replay_values,
    _reservation,
    _search_event,
    _winner_reason,
    comparison_for,
    review_blocks,
)
from search_app.services.decisions import MAX_COMMENT_CHARS, _user_name
from search_app.step_result import StepResult

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from search_app.spec import SearchSpec

REVISION_PART = 1000  # a revision's steps are parts REVISION_PART × n of the last round (unique per kind)


def search_revise(user: User, search: Search, note: str = "", *, enqueue: bool = True) -> SearchRun:
    """Send a finished search's winner back to its writer, to answer the changes requested:
    the writer revises its patch with the requests, open threads and `note` as feedback; the
    revised patch is gated, measured against the baseline in interleaved blocks, and read by the
    reviewer, then it waits for approval again. If any of that fails, the winner keeps the patch
    it had. Within the run's budget; at most MAX_REVISIONS per search."""
    note = (note or "").strip()
    if len(note) > MAX_COMMENT_CHARS:
        raise ValidationError({"note": f"Keep the note under {MAX_COMMENT_CHARS:,} characters."})
    access.require(user, access.OPERATOR, search.project)
    with transaction.atomic():
        run = SearchRun.objects.select_for_update(of=("self",)).select_related("winner") \
            .filter(search=search).first()
        refused = revision_refusal(user, search)
        if refused:
            raise ValidationError(refused)
        assert run is not None and run.winner is not None  # revision_refusal refuses otherwise
        if search.steps.filter(state__in=(Step.State.PENDING, Step.State.RUNNING)).exists():
            # A writer starts only once every command that saw the hidden files has ended.
            raise ValidationError("A step of this search is still running; send it back once it has ended.")
        winner = run.winner
        spec = search_spec(search)
        cost, tokens = _reservation(run, spec.concurrency)
        if not _fits(run, cost, tokens):
            raise ValidationError("The search's budget cannot cover another writer: "
                                  f"{_budget_text(run)}. Nothing was sent back.")
        number = len(revisions_of(search)) + 1
        previous = {"patch_hex": bytes(winner.patch or b"").hex(), "patch_sha256": winner.patch_sha256,
                    "patch_round": winner.patch_round, "diff_lines": winner.diff_lines,
                    "files": winner.files, "score": winner.score, "score_absolute": winner.score_absolute,
                    "spread": winner.spread}
        Step.objects.create(
            search=search, candidate=winner, kind=Step.Kind.GENERATE, round=len(spec.rounds) - 1,
            part=REVISION_PART * number, reserved_cost_microusd=cost, reserved_tokens=tokens,
            plan={"revision": number, "requested_by": _user_name(user), "note": note,
                  "feedback": revision_feedback(winner, note), "previous": previous})
        run.reserved_cost_microusd += cost
        run.reserved_tokens += tokens
        run.status, run.phase, run.finished_at = SearchRun.Status.RUNNING, SearchRun.Phase.REVISE, None
        run.reason = f"revision {number}: its writer answers the changes requested"
        run.save()
        winner.state = Candidate.State.WRITING
        winner.save(update_fields=["state", "updated_at"])
        audit_record(user, "search.revise", project=search.project,
                     target=f"{search.search_id} {winner.candidate_id}",
                     detail={"revision": number, "patch_sha256": winner.patch_sha256})
        _candidate_event(winner, f"sent back to its writer by {_user_name(user)} (revision {number})")
        _search_event(search, "search.revising", f"{search.name}: {winner.candidate_id} sent back to its "
                      f"writer by {_user_name(user)} (revision {number})", candidate_id=winner.candidate_id)
        if enqueue:
            transaction.on_commit(lambda: task_send("search_app.tasks.search_drive", search.pk))
    return run


def _budget_text(run: SearchRun) -> str:
    parts = []
    if run.budget_cost_microusd:
        spent, reserved = run.spent_cost_microusd / 1e6, run.reserved_cost_microusd / 1e6
        budget = run.budget_cost_microusd / 1e6
        parts.append(f"${spent:.2f} spent and ${reserved:.2f} reserved of ${budget:.2f}")
    if run.budget_tokens:
        used = run.spent_tokens + run.reserved_tokens
        parts.append(f"{used:,} of {run.budget_tokens:,} tokens spent or reserved")
    return "; ".join(parts)


def _revision_of(step: Step) -> Any:
    """The writer step of the revision `step` belongs to (its plan holds the request)."""
    number = step.plan.get("revision")
    return Step.objects.filter(search=step.search, kind=Step.Kind.GENERATE, plan__revision=number).first()


def _revision_written(step: Step, candidate: Any, result: StepResult) -> None:
    """The writer answered: a new patch goes to its gates and blocks (the replay step); none, or
    the same patch, ends the revision with the patch the winner had."""
    if result.eliminated is not None:
        _revision_end(step, f"the writer's revision failed: {result.eliminated}")
        return
    if result.patch_sha256 == candidate.patch_sha256:
        _revision_end(step, "its writer kept the patch as it was")
        return
    spec = search_spec(step.search)
    candidate.state = Candidate.State.EVALUATING
    candidate.patch = bytes.fromhex(result.patch_hex or "")
    candidate.patch_sha256 = result.patch_sha256
    candidate.diff_lines = result.diff_lines
    candidate.files = result.files if result.files is not None else []
    candidate.save()
    baseline = step.search.candidates.get(number=0)
    members = [candidate.candidate_id, *(["baseline"] if baseline.state == Candidate.State.ALIVE else [])]
    blocks = replay_blocks(spec.score.trials, spec.score.trials_ceiling, spec.score.confidence,
                           paired=comparison_for(step.search, spec, baseline) == "paired")
    Step.objects.create(search=step.search, candidate=candidate, kind=Step.Kind.REPLAY, round=step.round,
                        part=step.part, plan={"members": sorted(members), "blocks": [0, blocks],
                                              "namespace": f"revision-{step.plan['revision']}",
                                              "revision": step.plan["revision"]})
    _candidate_event(candidate, f"revision {step.plan['revision']}: its writer wrote patch "
                                f"{short_sha(candidate.patch_sha256)} ({candidate.diff_lines} lines); "
                                "gates and blocks against the baseline run")


def _revision_measured(step: Step, candidate: Candidate, passed: bool, why: str) -> None:
    """The revised patch passed its gates and beats the baseline: the reviewer reads it."""
    if not passed:
        _revision_end(step, why)
        return
    _revision_scores(step, candidate)
    candidate.save(update_fields=["score", "score_absolute", "spread", "updated_at"])
    run = SearchRun.objects.get(search_id=step.search_id)

    cost, tokens = _reservation(run, search_spec(step.search).concurrency)
    if not _fits(run, cost, tokens):
        cost = tokens = 0  # no room for a model review: the static reviewer reads it instead
    run.reserved_cost_microusd += cost
    run.reserved_tokens += tokens
    run.save(update_fields=["reserved_cost_microusd", "reserved_tokens", "updated_at"])
    Step.objects.create(search=step.search, candidate=candidate, kind=Step.Kind.REVIEW, round=step.round,
                        part=_revision_of(step).part, reserved_cost_microusd=cost, reserved_tokens=tokens,
                        plan={"revision": step.plan["revision"]})
    _candidate_event(candidate, f"revision {step.plan['revision']}: {why}; an independent reviewer reads it")


def _revision_reviewed(step: Step, candidate: Candidate, review: Any) -> None:
    """The reviewer's verdict on the revised patch: a reject that blocks ends the revision with
    the patch the winner had; otherwise the revised patch is the winner's, awaiting approval."""
    if review.verdict == Review.Verdict.REJECT and review_blocks(step.search, search_spec(step.search)):
        serious = [f for f in review.findings if isinstance(f, dict) and f.get("severity") == "high"]
        first = (serious or review.findings or [{}])[0]
        _revision_end(step, f"the reviewer rejects it: {first.get('message', 'no reason given')}")
        return
    revision = _revision_of(step)
    run = SearchRun.objects.get(search_id=step.search_id)
    candidate.state = Candidate.State.WINNER
    candidate.reason = _winner_reason(candidate, review.verdict)
    candidate.save(update_fields=["state", "reason", "updated_at"])
    outcome = (f"revision {revision.plan['revision']} is in: patch {short_sha(candidate.patch_sha256)} "
               f"replaces {short_sha(revision.plan['previous']['patch_sha256'])}; it needs approval again")
    _revision_record(revision, True, outcome)
    _revision_settle(run, candidate, outcome)


def _revision_end(step: Step, why: str) -> None:
    """The revision failed, or was cancelled: the winner keeps the patch (and score) it had, and
    the decisions on that patch count again."""
    revision = _revision_of(step)
    previous = revision.plan["previous"]
    candidate = type(step.candidate).objects.get(pk=step.candidate_id)
    candidate.patch = bytes.fromhex(previous["patch_hex"])
    candidate.patch_sha256, candidate.patch_round = previous["patch_sha256"], previous["patch_round"]
    candidate.diff_lines, candidate.files = previous["diff_lines"], previous["files"]
    candidate.score, candidate.score_absolute = previous["score"], previous["score_absolute"]
    candidate.spread = previous["spread"]
    candidate.state = Candidate.State.WINNER
    candidate.reason = _winner_reason(candidate)
    candidate.save()
    outcome = (f"revision {revision.plan['revision']} failed ({_one_line(why)}); it keeps patch "
               f"{short_sha(candidate.patch_sha256)}")
    _revision_record(revision, False, outcome)
    _revision_settle(SearchRun.objects.get(search_id=step.search_id), candidate, outcome)


def _revision_record(revision: Any, passed: bool, outcome: str) -> None:
    revision.result = {**(revision.result or {}), "revision_passed": passed, "revision_outcome": outcome,
                       "revision_ended_at": timezone.now().isoformat()}
    revision.save(update_fields=["result"])


def _revision_settle(run: SearchRun, candidate: Candidate, outcome: str) -> None:
    run.status, run.phase, run.outcome, run.winner = (SearchRun.Status.FINISHED, SearchRun.Phase.DONE,
                                                      SearchRun.WINNER, candidate)
    run.reason, run.finished_at = candidate.reason, timezone.now()
    run.save()
    _candidate_event(candidate, outcome)
    _search_event(run.search, "search.finished", f"{run.search.name}: {outcome}; winner "
                  f"{candidate.candidate_id} awaiting approval", outcome=SearchRun.WINNER)


def _revision_stalled(search: Search, why: str = "it stopped without a verdict") -> None:
    _revision_end(revisions_of(search)[-1], why)


def _revision_verdict(spec: SearchSpec, values: dict[int, float], base: dict[int, float], paired: bool
                      ) -> tuple[bool | None, str, int]:
    """(passed, why, more blocks) for a revised patch: it must beat the baseline it ran beside,
    by its paired interval (more blocks while that still holds 1, up to the ceiling) or, with
    `absolute` scoring, by its median."""
    direction, ceiling = spec.score.direction, spec.score.trials_ceiling
    if not base:
        return False, "the baseline was not measured beside the revised patch", 0
    if paired:
        revised = median_interval(paired_ratios(values, base), spec.score.confidence)
        passed, why = revision_beats(revised, direction)
        if not passed and revised.low <= 1.0 <= revised.high and len(values) < ceiling:
            more = _replay_more_blocks(spec, len(values))
            return None, f"{why} yet; {more} more block(s)", more
        return passed, why, 0
    return (*revision_beats_absolute(list(values.values()), list(base.values()), direction), 0)


def _revision_scores(step: Step, candidate: Candidate) -> None:
    """The revised patch's figures, from the blocks it ran beside the baseline."""
    merged = _replay_values(step, candidate, step.result)
    values, base = merged.get(candidate.candidate_id, {}), merged.get("baseline", {})
    ordered = sorted(values.values())
    candidate.score_absolute = statistics.median(ordered)
    candidate.spread = max(ordered) - min(ordered)
    baseline = step.search.candidates.get(number=0)
    paired = comparison_for(step.search, search_spec(step.search), baseline) == "paired"
    candidate.score = statistics.median(paired_ratios(values, base)) if paired and base else \
        candidate.score_absolute
