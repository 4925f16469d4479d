"""Every write in search_app: spec drafts and versions, and freezing searches."""

from __future__ import annotations

import logging
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from runtime_app import access, remotes
from runtime_app.models import Project, Repository
from runtime_app.services import audit_record, event_emit, repository_fetch
from search_app.freeze import FreezeError, freeze_inputs
from search_app.models import Comment, HiddenFile, Search, SearchRun, Spec, SpecVersion, Step
from search_app.preflight import preflight_problems, provider_problems, start_problems
from search_app.spec import MAX_SPEC_BYTES, spec_validate

logger = logging.getLogger(__name__)


def _check_title(title: str) -> str:
    title = (title or "").strip()
    if not 1 <= len(title) <= 96:
        raise ValidationError({"title": "Give the spec a title of 1–96 characters."})
    return title


def _check_text(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:  # lone surrogates cannot be stored or hashed
        raise ValidationError({"text": f"The spec has a character that is not valid text at "
                                       f"offset {error.start}."}) from None
    if len(text.encode("utf-8")) > MAX_SPEC_BYTES:
        raise ValidationError({"text": f"A spec may be at most {MAX_SPEC_BYTES:,} bytes."})
    if "\x00" in text:
        raise ValidationError({"text": "A spec cannot contain NUL characters."})
    return text


def _version_add(user: Any, spec: Spec, text: str) -> SpecVersion:
    latest = spec.versions.order_by("-number").first()
    if latest is not None and latest.text == text:
        return latest  # saving unchanged text adds no version
    version = SpecVersion.objects.create(
        spec=spec, number=(latest.number + 1 if latest else 1), text=text,
        valid=spec_validate(text).valid, created_by=user,
    )
    Spec.objects.filter(pk=spec.pk).update(updated_at=version.created_at)
    return version


def spec_create(user: Any, project: Project, title: str, text: str) -> Spec:
    """Save a new draft; drafts may be invalid, freezing is where validity is required."""
    access.require(user, access.OPERATOR, project)
    title, text = _check_title(title), _check_text(text)
    with transaction.atomic():
        spec = Spec.objects.create(project=project, title=title, created_by=user)
        _version_add(user, spec, text)
    return spec


def spec_save(user: Any, spec: Spec, text: str) -> SpecVersion:
    access.require(user, access.OPERATOR, spec.project)
    text = _check_text(text)
    with transaction.atomic():
        Spec.objects.select_for_update().filter(pk=spec.pk).first()
        return _version_add(user, spec, text)


def spec_duplicate(user: Any, spec: Spec) -> Spec:
    access.require(user, access.OPERATOR, spec.project)
    latest = spec.latest
    with transaction.atomic():
        copy = Spec.objects.create(
            project=spec.project, title=f"{spec.title} (copy)"[:96], duplicated_from=spec,
            created_by=user,
        )
        _version_add(user, copy, latest.text if latest else "")
    return copy


def search_freeze(
    user: Any,
    project: Project,
    text: str,
    ref: str,
    *,
    repository: Repository | None = None,
    repository_path: str | None = None,
    spec_version: SpecVersion | None = None,
) -> Search:
    """Freeze a spec against a baseline: resolve, hash and record it; immutable from here.

    Web and API callers name a registered repository; the local CLI may give a path.
    Freezing the same inputs again returns the search already recorded.
    """
    access.require(user, access.OPERATOR, project)
    if repository is not None:
        if repository.project_id != project.pk:
            raise ValidationError({"repository": "That repository belongs to another project."})
        repository_fetch(repository)  # a repository registered by URL: its remote's branches as of now
        repository_path = repository.path
    if not repository_path:
        raise ValidationError({"repository": "Pick a registered repository."})
    try:
        frozen = freeze_inputs(_check_text(text), repository_path, ref)
    except FreezeError as error:
        raise ValidationError({"__all__": error.problems}) from None
    existing = Search.objects.filter(search_id=frozen.search_id).first()
    if existing is not None:
        if existing.project_id != project.pk:
            raise ValidationError("These exact inputs are already frozen in another project.")
        return existing
    # A command that cannot start inside the sandbox is refused now, not after every candidate ran.
    cannot_start = preflight_problems(frozen.spec, frozen.repository_path, frozen.baseline_commit)
    if cannot_start:
        raise ValidationError({"__all__": cannot_start})
    try:
        with transaction.atomic():
            search = Search.objects.create(
                project=project, search_id=frozen.search_id,
                preregistration_hash=frozen.preregistration_hash, spec_version=spec_version,
                repository=repository, repository_path=frozen.repository_path, ref=ref,
                name=frozen.spec.name, objective=frozen.spec.objective,
                baseline_commit=frozen.baseline_commit,
                requested_model_id=frozen.requested_model_id,
                resolved_model_id=frozen.resolved_model_id,
                model_resolution=frozen.model_resolution,
                public_evidence_hash=frozen.public_evidence_hash,
                evaluator_hash=frozen.evaluator_hash, spec_text=text,
                spec_normalized=frozen.record["spec"], hashed_inputs=frozen.hashed_inputs(),
                candidate_batches=frozen.candidate_batches, created_by=user,
            )
            HiddenFile.objects.bulk_create([  # host hidden files: the bytes frozen with the search
                HiddenFile(search=search, path=item.path, source=item.source, sha256=item.sha256,
                           size=len(item.data), executable=item.executable, content=item.data)
                for item in frozen.hidden
            ])
            audit_record(user, "search.freeze", project=project,
                         target=f"{search.search_id} {search.name}",
                         detail={"preregistration_hash": search.preregistration_hash})
            event_emit(project, "search", search.pk, "search.frozen",
                       {"message": f"{search.name} frozen as {search.search_id}"})
    except IntegrityError:  # frozen concurrently by someone else: theirs stands
        return Search.objects.get(search_id=frozen.search_id)
    return search


def spec_draft_save(
    user: Any, project: Project, spec: Spec | None, title: str, text: str
) -> tuple[Spec, SpecVersion]:
    """Save text as a new spec (spec None) or as the next version of spec."""
    if spec is None:
        spec = spec_create(user, project, title, text)
        return spec, spec.latest
    return spec, spec_save(user, spec, text)


def spec_draft_freeze(
    user: Any, project: Project, spec: Spec | None, title: str, text: str, ref: str,
    repository: Repository,
) -> Search:
    """Save the text as a version and freeze that version; a failed freeze saves nothing."""
    with transaction.atomic():
        _, version = spec_draft_save(user, project, spec, title, text)
        return search_freeze(user, project, text, ref, repository=repository, spec_version=version)


# ----------------------------------------------------------------------------- running a search
#
# The database is the source of truth. `search_advance` is the only place that decides what
# happens next (admission, round closing, selection, replay, review, outcome); it runs under
# a row lock on the SearchRun, so two drivers never decide twice. `step_execute` claims one
# step by compare-and-set, does its work with a heartbeat extending its lease, and records
# the result in one transaction only if it still holds the lease. Steps are idempotent: a
# done step is never run again, and a step whose worker died is taken over after its lease
# expires (`steps_reconcile`).

MAX_ATTEMPTS = 3
MAX_REPLAYS = 3
RESULT_FIELDS_NOT_STORED = ("patch_hex",)


def _lease_seconds() -> int:
    from django.conf import settings

    return settings.CONFIG.step_lease_seconds


_ENDED_EVENTS = ("search.finished", "search.cancelled")


def _search_event(search: Search, kind: str, message: str, **payload: Any) -> None:
    event_emit(search.project, "search", search.pk, kind, {"message": message, **payload})
    if kind in _ENDED_EVENTS:  # no trial will use an evaluation tree parked on this host any more
        transaction.on_commit(lambda: _parked_trees_release(search))


def _parked_trees_release(search: Search) -> None:
    from search_app.execution import parked_trees_remove

    try:
        parked_trees_remove(search)
    except Exception:  # the search has ended either way: a tree left behind costs only disk
        logger.exception("could not remove the parked evaluation trees of search %s", search.search_id)


def _candidate_event(candidate: Any, message: str) -> None:
    _search_event(
        candidate.search, "candidate.updated", f"{candidate.candidate_id}: {message}",
        candidate_id=candidate.candidate_id, state=candidate.state, round=candidate.round_reached,
        score=candidate.score, reason=candidate.reason,
    )


class ProviderUnready(ValidationError):
    """The writers' provider would fail every call (no key, no server): nothing was started."""


def search_start_checked(
    user: Any, search: Search, *, start_anyway: bool = False, enqueue: bool = True,
) -> Any:
    """`search_start` as people ask for it (the page, the API, the CLI): a search whose provider
    has no key or no reachable server is refused with the reason (ProviderUnready) unless they
    start it anyway, since the key may live only in the workers' environment."""
    from search_app.execution import search_spec
    from search_app.models import SearchRun

    access.require(user, access.OPERATOR, search.project)
    if not start_anyway and not SearchRun.objects.filter(search=search).exists():
        problems = provider_problems(search_spec(search).worker.provider)
        if problems:
            raise ProviderUnready(problems)
    return search_start(user, search, enqueue=enqueue)


def search_start(user: Any, search: Search, *, enqueue: bool = True) -> Any:
    """Start a frozen search: its candidates and run state are written; work begins on commit.

    Starting a search that already runs or ran returns its run unchanged. `enqueue=False`
    leaves driving it to the caller (the CLI's `search_run_inline`).
    """
    from search_app.execution import search_spec
    from search_app.models import Candidate, SearchRun, Step

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
        baseline = Candidate.objects.create(
            search=search, candidate_id="baseline", number=0, batch=0, state="evaluating",
            reason="the unchanged baseline, for comparison",
        )
        Candidate.objects.bulk_create([
            Candidate(search=search, candidate_id=candidate_id, number=number, batch=batch)
            for batch, ids in enumerate(search.candidate_batches)
            for number, candidate_id in ((int(cid.split("_")[1]), cid) for cid in ids)
        ])
        Step.objects.create(search=search, candidate=baseline, kind="evaluate", round=0)
        if enqueue:
            from search_app.tasks import search_drive

            transaction.on_commit(lambda: search_drive.delay(search.pk))
        audit_record(user, "search.start", project=search.project, target=f"{search.search_id} {search.name}")
        _search_event(search, "search.started", f"{search.name} started: {spec.population} candidates, "
                      f"rounds {spec.rounds}")
    return run


def search_cancel(user: Any, search: Search) -> Any:
    """Ask a running search to stop: no new steps; running ones are stopped and say so."""
    from search_app.models import SearchRun

    access.require(user, access.OPERATOR, search.project)
    with transaction.atomic():
        run = SearchRun.objects.select_for_update().filter(search=search).first()
        if run is None:
            raise ValidationError("This search has not started.")
        if run.terminal or run.status == "cancelling":
            return run
        run.status = "cancelling"
        run.save(update_fields=["status", "updated_at"])
        audit_record(user, "search.cancel", project=search.project, target=search.search_id)
        _search_event(search, "search.cancelling", f"{search.name}: cancel requested by {user}")
    return run


REVISION_PART = 1000  # a revision's steps are parts REVISION_PART × n of the last round (unique per kind)


def search_revise(user: Any, search: Search, note: str = "", *, enqueue: bool = True) -> Any:
    """Send a finished search's winner back to its writer, to answer the changes requested:
    the writer revises its patch with the requests, open threads and `note` as feedback; the
    revised patch is gated, measured against the baseline in interleaved blocks, and read by the
    reviewer, then it waits for approval again. If any of that fails, the winner keeps the patch
    it had. Within the run's budget; at most MAX_REVISIONS per search."""
    from search_app.execution import search_spec
    from search_app.models import SearchRun, Step
    from search_app.selectors import revision_feedback, revision_refusal, revisions_of

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
        spec = search_spec(search)
        cost, tokens = _reservation(run, spec.concurrency)
        if not _fits(run, cost, tokens):
            raise ValidationError("The search's budget cannot cover another writer: "
                                  f"{_budget_text(run)}. Nothing was sent back.")
        winner, number = run.winner, len(revisions_of(search)) + 1
        previous = {"patch_hex": bytes(winner.patch or b"").hex(), "patch_sha256": winner.patch_sha256,
                    "patch_round": winner.patch_round, "diff_lines": winner.diff_lines,
                    "files": winner.files, "score": winner.score, "score_absolute": winner.score_absolute,
                    "spread": winner.spread}
        Step.objects.create(
            search=search, candidate=winner, kind="generate", round=len(spec.rounds) - 1,
            part=REVISION_PART * number, reserved_cost_microusd=cost, reserved_tokens=tokens,
            plan={"revision": number, "requested_by": _user_name(user), "note": note,
                  "feedback": revision_feedback(winner, note), "previous": previous})
        run.reserved_cost_microusd += cost
        run.reserved_tokens += tokens
        run.status, run.phase, run.finished_at = "running", "revise", None
        run.reason = f"revision {number}: its writer answers the changes requested"
        run.save()
        winner.state = "writing"
        winner.save(update_fields=["state", "updated_at"])
        audit_record(user, "search.revise", project=search.project,
                     target=f"{search.search_id} {winner.candidate_id}",
                     detail={"revision": number, "patch_sha256": winner.patch_sha256})
        _candidate_event(winner, f"sent back to its writer by {_user_name(user)} (revision {number})")
        _search_event(search, "search.revising", f"{search.name}: {winner.candidate_id} sent back to its "
                      f"writer by {_user_name(user)} (revision {number})", candidate_id=winner.candidate_id)
        if enqueue:
            from search_app.tasks import search_drive

            transaction.on_commit(lambda: search_drive.delay(search.pk))
    return run


def _budget_text(run: Any) -> str:
    parts = []
    if run.budget_cost_microusd:
        spent, reserved = run.spent_cost_microusd / 1e6, run.reserved_cost_microusd / 1e6
        budget = run.budget_cost_microusd / 1e6
        parts.append(f"${spent:.2f} spent and ${reserved:.2f} reserved of ${budget:.2f}")
    if run.budget_tokens:
        used = run.spent_tokens + run.reserved_tokens
        parts.append(f"{used:,} of {run.budget_tokens:,} tokens spent or reserved")
    return "; ".join(parts)


def _revision_of(step: Any) -> Any:
    """The writer step of the revision `step` belongs to (its plan holds the request)."""
    from search_app.models import Step

    number = step.plan.get("revision")
    return Step.objects.filter(search=step.search, kind="generate", plan__revision=number).first()


def _revision_written(step: Any, candidate: Any, result: dict) -> None:
    """The writer answered: a new patch goes to its gates and blocks (the replay step); none, or
    the same patch, ends the revision with the patch the winner had."""
    from search_app.execution import search_spec
    from search_app.measurement import replay_blocks
    from search_app.models import Step

    if "eliminated" in result:
        _revision_end(step, f"the writer's revision failed: {result['eliminated']}")
        return
    if result["patch_sha256"] == candidate.patch_sha256:
        _revision_end(step, "its writer kept the patch as it was")
        return
    spec = search_spec(step.search)
    candidate.state = "evaluating"
    candidate.patch = bytes.fromhex(result["patch_hex"])
    candidate.patch_sha256 = result["patch_sha256"]
    candidate.diff_lines, candidate.files = result.get("diff_lines"), result.get("files", [])
    candidate.save()
    baseline = step.search.candidates.get(number=0)
    members = [candidate.candidate_id, *(["baseline"] if baseline.state == "alive" else [])]
    blocks = replay_blocks(spec.score.trials, spec.score.trials_ceiling, spec.score.confidence,
                           paired=comparison_for(step.search, spec, baseline) == "paired")
    Step.objects.create(search=step.search, candidate=candidate, kind="replay", round=step.round,
                        part=step.part, plan={"members": sorted(members), "blocks": [0, blocks],
                                              "namespace": f"revision-{step.plan['revision']}",
                                              "revision": step.plan["revision"]})
    _candidate_event(candidate, f"revision {step.plan['revision']}: its writer wrote patch "
                                f"{candidate.patch_sha256[:12]} ({candidate.diff_lines} lines); gates and "
                                "blocks against the baseline run")


def _revision_measured(step: Any, candidate: Any, passed: bool, why: str) -> None:
    """The revised patch passed its gates and beats the baseline: the reviewer reads it."""
    from search_app.execution import search_spec
    from search_app.models import SearchRun, Step

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
    Step.objects.create(search=step.search, candidate=candidate, kind="review", round=step.round,
                        part=_revision_of(step).part, reserved_cost_microusd=cost, reserved_tokens=tokens,
                        plan={"revision": step.plan["revision"]})
    _candidate_event(candidate, f"revision {step.plan['revision']}: {why}; an independent reviewer reads it")


def _revision_reviewed(step: Any, candidate: Any, review: Any) -> None:
    """The reviewer's verdict on the revised patch: a reject that blocks ends the revision with
    the patch the winner had; otherwise the revised patch is the winner's, awaiting approval."""
    from search_app.execution import search_spec
    from search_app.models import SearchRun

    if review.verdict == "reject" and review_blocks(step.search, search_spec(step.search)):
        serious = [f for f in review.findings if isinstance(f, dict) and f.get("severity") == "high"]
        first = (serious or review.findings or [{}])[0]
        _revision_end(step, f"the reviewer rejects it: {first.get('message', 'no reason given')}")
        return
    revision = _revision_of(step)
    run = SearchRun.objects.get(search_id=step.search_id)
    candidate.state = "winner"
    candidate.reason = _winner_reason(candidate, review.verdict)
    candidate.save(update_fields=["state", "reason", "updated_at"])
    outcome = (f"revision {revision.plan['revision']} is in: patch {candidate.patch_sha256[:12]} replaces "
               f"{revision.plan['previous']['patch_sha256'][:12]}; it needs approval again")
    _revision_record(revision, True, outcome)
    _revision_settle(run, candidate, outcome)


def _revision_end(step: Any, why: str) -> None:
    """The revision failed, or was cancelled: the winner keeps the patch (and score) it had, and
    the decisions on that patch count again."""
    from search_app.models import SearchRun

    revision = _revision_of(step)
    previous = revision.plan["previous"]
    candidate = type(step.candidate).objects.get(pk=step.candidate_id)
    candidate.patch = bytes.fromhex(previous["patch_hex"])
    candidate.patch_sha256, candidate.patch_round = previous["patch_sha256"], previous["patch_round"]
    candidate.diff_lines, candidate.files = previous["diff_lines"], previous["files"]
    candidate.score, candidate.score_absolute = previous["score"], previous["score_absolute"]
    candidate.spread = previous["spread"]
    candidate.state = "winner"
    candidate.reason = _winner_reason(candidate)
    candidate.save()
    outcome = (f"revision {revision.plan['revision']} failed ({_one_line(why)}); it keeps patch "
               f"{candidate.patch_sha256[:12]}")
    _revision_record(revision, False, outcome)
    _revision_settle(SearchRun.objects.get(search_id=step.search_id), candidate, outcome)


def _revision_record(revision: Any, passed: bool, outcome: str) -> None:
    from django.utils import timezone

    revision.result = {**(revision.result or {}), "revision_passed": passed, "revision_outcome": outcome,
                       "revision_ended_at": timezone.now().isoformat()}
    revision.save(update_fields=["result"])


def _revision_settle(run: Any, candidate: Any, outcome: str) -> None:
    from django.utils import timezone

    run.status, run.phase, run.outcome, run.winner = "finished", "done", "winner", candidate
    run.reason, run.finished_at = candidate.reason, timezone.now()
    run.save()
    _candidate_event(candidate, outcome)
    _search_event(run.search, "search.finished", f"{run.search.name}: {outcome}; winner "
                  f"{candidate.candidate_id} awaiting approval", outcome="winner")


def _reservation(run: Any, concurrency: int) -> tuple[int, int]:
    """A writer's worst case: it may spend up to the budget's share of one live slot."""
    cost = run.budget_cost_microusd // concurrency if run.budget_cost_microusd else 0
    tokens = run.budget_tokens // concurrency if run.budget_tokens else 0
    return cost, tokens


def _fits(run: Any, cost: int, tokens: int) -> bool:
    if run.budget_cost_microusd and run.spent_cost_microusd + run.reserved_cost_microusd + cost > \
            run.budget_cost_microusd:
        return False
    return not (run.budget_tokens and run.spent_tokens + run.reserved_tokens + tokens > run.budget_tokens)


# What the planner reads of a candidate: never its patch, trials or blocks (they grow with the search).
_PLAN_FIELDS = ("id", "search_id", "candidate_id", "number", "batch", "state", "round_reached",
                "patch_sha256", "patch_round", "duplicate_of_id", "score", "reason")
_LIVE_STATES = ("pending", "running")
_PLAN_PASSES = 3  # a round closes, the next one starts; never more than that in one call


def search_advance(search_pk: int) -> list[int]:
    """Decide what happens next; return the ids of steps ready to run (at most `concurrency` live).

    Incremental: a call reads a constant number of rows whatever the population (indexed counts
    and lookups, no patches or results), without the write lock; it takes the lock, and reads
    again under it, only when there is something to write."""
    from search_app.execution import search_spec

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


def _writing_first(search: Search) -> int | None:
    """The number of the first candidate whose writer has not finished: later ones wait for it."""
    return search.candidates.filter(number__gt=0, state__in=("queued", "writing")).order_by("number") \
        .values_list("number", flat=True).first()


def _to_evaluate(search: Search, round_index: int, before: int | None) -> Any:
    """Candidates whose writer finished this round, with no evaluation yet, before `before`."""
    steps = Step.objects.filter(candidate=OuterRef("pk"), round=round_index)
    candidates = search.candidates.filter(number__gt=0, state="evaluating").filter(
        Exists(steps.filter(kind="generate", state__in=("done", "failed")))).exclude(
        Exists(steps.filter(kind="evaluate")))
    if before is not None:
        candidates = candidates.filter(number__lt=before)
    return candidates.order_by("number").only(*_PLAN_FIELDS)


def _planner_has_work(run: Any, spec: Any) -> bool:
    """Whether a locked pass would write anything (read without the lock; the pass re-checks)."""
    search = run.search
    if run.status == "cancelling":
        return True
    if run.phase != "rounds":
        return run.phase in ("replay", "review", "revise") and not _live_steps(search).exists()
    if _to_evaluate(search, run.round_index, _writing_first(search)).exists():
        return True
    live = _live_steps(search).count()
    if live < spec.concurrency and search.candidates.filter(number__gt=0, state="queued").exists():
        # A writer is admitted, or the rest are not admitted; unless the budget waits for a live writer.
        return _fits(run, *_reservation(run, spec.concurrency)) or not _live_reserved(search)
    return live == 0 and _round_complete(run)


def _live_reserved(search: Search) -> bool:
    """Whether a live writer holds a reservation (it may hand part of it back)."""
    return _live_steps(search).filter(Q(reserved_cost_microusd__gt=0) | Q(reserved_tokens__gt=0)).exists()


def _plan(run: Any, spec: Any) -> bool:
    """The planner's writes, under the run's lock; False when the search stopped planning."""
    search = run.search
    if run.status == "cancelling":
        _cancel_settle(run)
        return False
    if run.phase == "rounds":
        live = _admit(run, spec)
        if not live and _round_complete(run):
            _round_next(run, spec)
    busy = _live_steps(search).exists
    if run.phase == "replay" and not busy():
        _replay_next(run, spec)
    if run.phase == "review" and not busy():
        _outcome_winner(run, spec)
    if run.phase == "revise" and not busy():  # every revision step ends it; this never waits forever
        run.save()
        _revision_stalled(search)
        return False
    run.save()
    return True


def _ready_steps(search: Search, concurrency: int) -> list[int]:
    # Never more than `concurrency` steps running, however many are pending (a round's
    # promotions are all created at once).
    slots = concurrency - search.steps.filter(state="running").count()
    if slots <= 0:
        return []
    return list(search.steps.filter(state="pending").order_by("id").values_list("id", flat=True)[:slots])


def _admit(run: Any, spec: Any) -> int:
    """Admit to evaluation each candidate whose writer has finished (in round 0, or a refinement
    in a later round), in candidate order, and round 0's writers in batch order; return how
    many steps are live after it.

    A candidate is admitted to evaluation only once every earlier candidate's writer of the round
    has finished, and a refinement that reproduces the patch of a candidate still refining waits for
    that writer, so identical patches are grouped deterministically: the group is evaluated once, by
    its earliest-admitted member, and the others are marked at once, whatever they would have scored.
    """
    search = run.search
    live = _live_steps(search).count()
    for candidate in _to_evaluate(search, run.round_index, _writing_first(search)):
        original = _identical_earlier(candidate)
        if original is not None and original.state == "writing":
            continue  # its writer may still change that patch: the group waits for it
        if original is not None:
            candidate.duplicate_of = original
            _eliminate(candidate, f"identical patch to {original.candidate_id}: evaluated once and credited "
                                  f"to {original.candidate_id}, the earliest candidate with it")
            continue
        Step.objects.create(search=search, candidate=candidate, kind="evaluate", round=run.round_index)
        live += 1
    queued = search.candidates.filter(number__gt=0, state="queued").order_by("number").only(*_PLAN_FIELDS)
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
        candidate.state = "writing"
        candidate.save(update_fields=["state", "updated_at"])
        Step.objects.create(search=search, candidate=candidate, kind="generate", round=0,
                            reserved_cost_microusd=cost, reserved_tokens=tokens)
        live += 1
        _candidate_event(candidate, "admitted; its writer starts")
    return live


# States of candidates whose patch is still in the race (a refining writer's until it lands).
_GROUPED_STATES = ("evaluating", "alive", "winner", "writing")


def _identical_earlier(candidate: Any) -> Any:
    """The earliest-admitted other candidate with byte-identical patch bytes, whatever the round:
    one still in the race with them, or one judged on them in this same round; None if the patch
    is its own. Patches are admitted by round, then in candidate order, so a refinement that
    reproduces a patch kept since an earlier round is credited to that patch's candidate."""
    if not candidate.patch_sha256:
        return None
    earlier = Q(patch_round__lt=candidate.patch_round) | Q(patch_round=candidate.patch_round,
                                                           number__lt=candidate.number)
    holding = Q(state__in=_GROUPED_STATES) | Q(state="eliminated", patch_round=candidate.patch_round)
    return candidate.search.candidates.filter(
        earlier, holding, number__gt=0, patch_sha256=candidate.patch_sha256, duplicate_of__isnull=True,
    ).order_by("patch_round", "number").only(*_PLAN_FIELDS).first()


def _not_admitted(run: Any, candidates: list) -> None:
    spent = f"{run.spent_cost_microusd:,} µUSD and {run.spent_tokens:,} tokens spent"
    for candidate in candidates:
        candidate.state = "not_admitted"
        candidate.reason = f"not admitted: the budget cannot cover another writer ({spent})"
        candidate.save(update_fields=["state", "reason", "updated_at"])
    _search_event(run.search, "search.budget_exhausted",
                  f"admission stopped: the budget cannot cover another writer; "
                  f"{len(candidates)} not admitted")


def _round_complete(run: Any) -> bool:
    if run.round_index == 0 and run.search.candidates.filter(state__in=("queued", "writing")).exists():
        return False
    return not _live_steps(run.search).exists()


def _entries(candidates: list, scores: dict[str, float] | None = None) -> list:
    from search_app.selection import Entry

    scores = scores or {}
    return [Entry(c.candidate_id, score=scores.get(c.candidate_id, c.score), cost_microusd=c.cost_microusd,
                  tokens=c.tokens, diff_lines=c.diff_lines or 0, runtime_seconds=c.runtime_seconds or 0.0,
                  patch_sha256=c.patch_sha256, admitted=(c.patch_round, c.number)) for c in candidates]


def comparison_for(search: Search, spec: Any, baseline: Any) -> str:
    """How this search compares candidates now: `paired` (per-block ratios to the baseline) when
    its spec asks for it and the baseline is measured; `absolute` otherwise, and always for a
    search frozen before paired blocks existed (contract 1), which runs as it was frozen."""
    from search_app.measurement import is_paired

    return "paired" if is_paired(search.contract, spec.score.comparison, baseline.state) else "absolute"


def _interval(candidate: Any, spec: Any) -> Any:
    from search_app.measurement import Interval

    return Interval(candidate.score, candidate.score_low, candidate.score_high, spec.score.confidence,
                    len(candidate.blocks.get(str(candidate.round_reached), {})))


def _separated(candidates: list, intervals: dict, round_index: int, spec: Any) -> Any:
    """Whether two of the round's candidates can be told apart: their intervals do not overlap,
    or head to head over the blocks both ran (measurement.head_to_head) one is clearly better."""
    from search_app.measurement import head_to_head

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
    from search_app.measurement import beats, contested, min_blocks, undecided_against

    search, round_index = run.search, run.round_index
    baseline = search.candidates.get(number=0)
    participants = list(search.candidates.filter(state="alive", round_reached=round_index, number__gt=0))
    measures = list(search.steps.filter(kind="measure", round=round_index).defer("result")
                    .order_by("part", "id"))
    failed = next((s for s in measures if s.state == "failed"), None)
    if failed is not None:
        _outcome_none(run, f"round {round_index} could not be measured: {failed.error}")
        return
    if not participants:
        _round_close(run, spec)
        return
    members = ["baseline"] if baseline.state == "alive" else []
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
    from search_app.models import Step

    baseline = run.search.candidates.get(number=0)
    Step.objects.create(search=run.search, candidate=baseline, kind="measure", round=round_index, part=part,
                        plan={"members": sorted(members), "blocks": [first, last]})


def _round_close(run: Any, spec: Any) -> None:
    """Select the round's survivors; promote them to the next round, or go on to replay."""
    from search_app.measurement import beats, describe, tie_groups, tied_scores
    from search_app.selection import is_better, select

    search, round_index = run.search, run.round_index
    baseline = search.candidates.get(number=0)
    paired = comparison_for(search, spec, baseline) == "paired"
    direction = spec.score.direction
    participants = list(search.candidates.filter(state="alive", round_reached=round_index, number__gt=0))
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
    if not participants:
        _outcome_none(run, f"no candidate survived round {round_index}")
        return
    last = round_index >= len(spec.rounds) - 1
    keep = len(participants) if last else spec.rounds[round_index + 1]
    scores, ties = None, {}
    if paired:
        intervals = {c.candidate_id: _interval(c, spec) for c in participants}
        separated = _separated(participants, intervals, round_index, spec)
        scores = tied_scores(intervals, direction, separated)
        for group in tie_groups(intervals, direction, separated):
            for cid in group:
                if len(group) > 1:
                    ties[cid] = [other for other in group if other != cid]
    decisions = select(_entries(participants, scores), keep, direction=direction,
                       policy=spec.selection.policy, ordering=spec.selection.ordering,
                       tie_breakers=spec.score.tie_breakers,
                       retain_diversity=spec.selection.retain_diversity, labels=labels)
    by_id = {c.candidate_id: c for c in participants}
    run.rankings = {**run.rankings, str(round_index): [d.candidate_id for d in decisions
                                                       if not d.duplicate_of]}
    for decision in decisions:
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
    _search_event(search, "search.round_closed", f"round {round_index} closed: "
                  f"{sum(d.promoted for d in decisions)} of {len(decisions)} go on", round=round_index)
    if last:
        run.phase = "replay"
    else:
        run.round_index = round_index + 1
        if baseline.state == "alive":  # the baseline runs in every round's blocks
            baseline.round_reached = round_index + 1
            baseline.save(update_fields=["round_reached", "updated_at"])


def _promote(run: Any, spec: Any, candidate: Any, next_round: int) -> None:
    """On to the next round's blocks with the patch it has; with `worker.refine`, its writer
    revises the patch first, if the budget can cover one more writer (otherwise the patch goes
    on as it is)."""
    from search_app.models import Step

    if spec.worker.refine:
        cost, tokens = _reservation(run, spec.concurrency)
        if _fits(run, cost, tokens):
            run.reserved_cost_microusd += cost
            run.reserved_tokens += tokens
            candidate.state = "writing"
            candidate.save(update_fields=["state", "updated_at"])
            Step.objects.create(search=run.search, candidate=candidate, kind="generate", round=next_round,
                                reserved_cost_microusd=cost, reserved_tokens=tokens)
            _candidate_event(candidate, f"promoted to round {next_round}; its writer refines its patch")
            return
        _candidate_event(candidate, f"promoted to round {next_round}; not refined: the budget cannot "
                                    "cover another writer")
    else:
        _candidate_event(candidate, f"promoted to round {next_round}")
    _carry_on(candidate, next_round)


def _carry_on(candidate: Any, round_index: int) -> None:
    """A patch that passed its gates goes into `round_index`'s blocks as it is."""
    candidate.state, candidate.round_reached = "alive", round_index
    candidate.save(update_fields=["state", "round_reached", "updated_at"])


def _refinement_kept(candidate: Any, step: Any, why: str) -> None:
    """A refinement that fails costs the candidate nothing: it goes on with the patch it had."""
    _carry_on(candidate, step.round)
    _candidate_event(candidate, f"round {step.round}: refinement failed ({why}); keeps its round "
                                f"{candidate.patch_round} patch")


def _one_line(text: str) -> str:
    """Reasons are shown in tables and event logs: keep each on one line."""
    import re

    return re.sub(r"\s*\n\s*(?:-\s*)?", "; ", text.strip()).replace(":;", ":")


def _eliminate(candidate: Any, reason: str) -> None:
    candidate.state, candidate.reason = "eliminated", _one_line(reason)
    candidate.save(update_fields=["state", "reason", "duplicate_of", "updated_at"])
    _candidate_event(candidate, f"eliminated — {reason}")


def _replay_order(run: Any) -> list[str]:
    order: list[str] = []
    for round_key in sorted(run.rankings, key=int, reverse=True):
        order.extend(cid for cid in run.rankings[round_key] if cid not in order)
    return order


def _replay_next(run: Any, spec: Any) -> None:
    """Replay the best candidate not yet replayed, interleaved with the baseline; after
    MAX_REPLAYS failures, NONE."""
    from search_app.measurement import replay_blocks
    from search_app.models import Step

    search = run.search
    # A replayed candidate already reviewed was rejected by a blocking review: the next one is due.
    passed = search.steps.filter(kind="replay", state="done", result__passed=True).exclude(
        candidate__reviews__isnull=False).select_related("candidate")
    if passed.exists():
        candidate = passed.first().candidate
        run.phase = "review"
        cost, tokens = _reservation(run, spec.concurrency)
        if not _fits(run, cost, tokens):
            cost = tokens = 0  # no room for a model review: the static reviewer reads it instead
        run.reserved_cost_microusd += cost
        run.reserved_tokens += tokens
        Step.objects.create(search=search, candidate=candidate, kind="review", round=run.round_index,
                            reserved_cost_microusd=cost, reserved_tokens=tokens)
        _candidate_event(candidate, "replay passed; an independent reviewer reads it")
        return
    remaining = [cid for cid in _replay_order(run) if cid not in run.replayed]
    if not remaining or len(run.replayed) >= MAX_REPLAYS:
        stage = "replay and review" if search.reviews.filter(verdict="reject").exists() else "replay"
        _outcome_none(run, f"no candidate passed {stage} ({', '.join(run.replayed) or 'none replayed'})")
        return
    candidate = search.candidates.get(candidate_id=remaining[0])
    baseline = search.candidates.get(number=0)
    members = [candidate.candidate_id, *(["baseline"] if baseline.state == "alive" else [])]
    run.replayed = [*run.replayed, candidate.candidate_id]
    blocks = replay_blocks(spec.score.trials, spec.score.trials_ceiling, spec.score.confidence,
                           paired=comparison_for(search, spec, baseline) == "paired")
    Step.objects.create(search=search, candidate=candidate, kind="replay", round=run.round_index,
                        plan={"members": sorted(members), "blocks": [0, blocks],
                              "namespace": f"replay-{candidate.candidate_id}"})
    _candidate_event(candidate, "provisional winner: replaying on a clean baseline, interleaved with the "
                                "baseline")


def _replay_extend(step: Any, candidate: Any, more: int, why: str) -> None:
    """The replay's next blocks, as a step of their own (its gates already passed)."""
    from search_app.models import Step

    step.result = {**step.result, "passed": None, "why": why}
    step.save(update_fields=["result"])
    first = step.plan["blocks"][1]
    Step.objects.create(search=step.search, candidate=candidate, kind="replay", round=step.round,
                        part=step.part + 1,
                        plan={**step.plan, "blocks": [first, first + more], "extends": step.pk})
    _candidate_event(candidate, why)


def review_blocks(search: Any, spec: Any) -> bool:
    """Whether a reviewer's reject eliminates a provisional winner: `selection.review` says so,
    and the search was frozen after reviews could block (contract 3); older ones run as frozen."""
    return search.contract >= 3 and spec.selection.review == "blocking"


def _outcome_winner(run: Any, spec: Any) -> None:
    from django.utils import timezone

    review = run.search.reviews.order_by("-id").select_related("candidate").first()
    if review is None:
        _outcome_none(run, "the review step did not finish")
        return
    candidate = review.candidate
    if review.verdict == "reject" and review_blocks(run.search, spec):
        # The gates ran the candidate's code, which can force their exit code (os._exit(0) at import);
        # the reviewer read its patch from outside: its reject stands. The next candidate is replayed.
        serious = [f for f in review.findings if isinstance(f, dict) and f.get("severity") == "high"]
        first = (serious or review.findings or [{}])[0]
        where = f" at {first['path']}:{first['line']}" if first.get("path") and first.get("line") else ""
        _eliminate(candidate, f"the reviewer rejects it: {first.get('message', 'no reason given')}{where} "
                              f"({len(review.findings)} finding(s); selection.review is blocking)")
        run.phase = "replay"
        _replay_next(run, spec)
        return
    candidate.state = "winner"
    candidate.reason = _winner_reason(candidate, review.verdict)
    candidate.save(update_fields=["state", "reason", "updated_at"])
    run.outcome, run.winner, run.status, run.phase = "winner", candidate, "finished", "done"
    run.reason = candidate.reason
    run.finished_at = timezone.now()
    _candidate_event(candidate, candidate.reason)
    _search_event(run.search, "search.finished", f"{run.search.name}: winner {candidate.candidate_id} "
                  f"(score {candidate.score:g}), awaiting approval", outcome="winner")


def _winner_reason(winner: Any, verdict: str | None = None) -> str:
    """A winner's reason: how it won, then where it stands with people (selectors.winner_standing)
    — awaiting approval, approved, changes requested or merged — so every page, the API and the
    CLI say the same once someone decides."""
    from search_app.models import Merge
    from search_app.selectors import approval_state, winner_standing

    if verdict is None:
        review = winner.reviews.order_by("-id").first()
        verdict = review.verdict if review else "nothing"
    approval = approval_state(winner)
    merge = Merge.objects.filter(search_id=winner.search_id).first()
    standing = winner_standing(approval, merge is not None)
    approvers = ", ".join(a.user_name for a in approval["standing_approvals"])
    text = f"winner: replay passed; reviewer says {verdict}"
    if standing == "merged":
        return f"{text}; merged onto {merge.branch} as {merge.commit_sha[:12]} by {merge.merged_by_name}"
    if standing == "approved":
        return f"{text}; approved by {approvers}; ready to merge"
    if standing == "changes requested":
        return f"{text}; changes requested by {', '.join(a.user_name for a in approval['changes_requested'])}"
    if approvers:
        return f"{text}; approved by {approvers} ({len(approval['standing_approvals'])} of " \
               f"{approval['required']} needed); awaiting human approval"
    return f"{text}; awaiting human approval"


def _winner_reason_refresh(winner: Any) -> None:
    """After a decision or a merge: the winner's and its run's reason say where it stands now."""
    from django.utils import timezone

    from search_app.models import SearchRun

    winner.reason = _winner_reason(winner)
    winner.save(update_fields=["reason", "updated_at"])
    SearchRun.objects.filter(search_id=winner.search_id, winner=winner).update(reason=winner.reason,
                                                                             updated_at=timezone.now())


def _outcome_none(run: Any, reason: str) -> None:
    from django.utils import timezone

    run.outcome, run.status, run.phase, run.reason = "NONE", "finished", "done", reason
    run.finished_at = timezone.now()
    for candidate in run.search.candidates.filter(state__in=("alive", "evaluating")).exclude(number=0):
        _eliminate(candidate, candidate.reason or reason)
    _search_event(run.search, "search.finished", f"{run.search.name}: NONE — {reason}", outcome="NONE")


def _spec_failure_stop(run: Any, message: str) -> None:
    """The first command that cannot start stops the search with NONE and its reason: the rest
    would hit the same wall. Running steps are cancelled (as by a person) and settled below."""
    if run.status != "running":
        return  # stopping already: the first reason stands
    run.status, run.outcome, run.reason = "cancelling", "NONE", _one_line(f"stopped: {message}")
    run.save(update_fields=["status", "outcome", "reason", "updated_at"])
    _search_event(run.search, "search.spec_failure", f"{run.search.name}: {run.reason}")


def _cancel_settle(run: Any) -> None:
    from django.utils import timezone

    search = run.search
    search.steps.filter(state="pending").update(state="cancelled", finished_at=timezone.now())
    if search.steps.filter(state="running").exists():
        run.save()
        return
    if run.phase == "revise":  # cancelling a revision leaves the winner as it was
        run.reserved_cost_microusd = run.reserved_tokens = 0
        run.save()
        _revision_stalled(search, "cancelled by a person")
        return
    stopped = run.outcome == "NONE"  # by _spec_failure_stop, not by a person
    run.reserved_cost_microusd = run.reserved_tokens = 0
    run.status, run.phase, run.finished_at = "finished" if stopped else "cancelled", "done", timezone.now()
    run.reason = run.reason if stopped else "cancelled by a person"
    settled = []
    for candidate in search.candidates.exclude(state__in=("eliminated", "not_admitted", "winner")):
        candidate.state = "cancelled"
        candidate.reason = candidate.reason or (
            "the search stopped" if stopped else "the search was cancelled")
        candidate.save(update_fields=["state", "reason", "updated_at"])
        settled.append(candidate.candidate_id)
    run.save()
    if stopped:
        _search_event(search, "search.finished", f"{search.name}: NONE — {run.reason}", outcome="NONE",
                      candidate_ids=settled)
        return
    _search_event(search, "search.cancelled", f"{search.name}: cancelled", outcome="cancelled",
                  candidate_ids=settled)


def _revision_stalled(search: Search, why: str = "it stopped without a verdict") -> None:
    from search_app.selectors import revisions_of

    _revision_end(revisions_of(search)[-1], why)


def steps_enqueue_mark(step_pks: list[int]) -> list[int]:
    """Mark steps handed to the broker; a step already handed over within a lease is skipped,
    so each completion does not flood the queue with duplicates (a lost message is handed
    over again once a lease has passed)."""
    from datetime import timedelta

    from django.db.models import Q
    from django.utils import timezone

    from search_app.models import Step

    now = timezone.now()
    stale = now - timedelta(seconds=_lease_seconds())
    marked = []
    if not step_pks:
        return marked
    with transaction.atomic():  # one write transaction for the lot, not one per step
        for step_pk in step_pks:
            if Step.objects.filter(pk=step_pk, state="pending").filter(
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
    from datetime import timedelta

    from django.db.models import F, Q
    from django.utils import timezone

    from search_app.models import Step

    now = timezone.now()
    claimed = Step.objects.filter(pk=step_pk).filter(
        Q(state="pending") | Q(state="running", lease_expires_at__lt=now)
    ).filter(attempts__lt=MAX_ATTEMPTS).update(
        state="running", lease_owner=owner, lease_expires_at=now + timedelta(seconds=_lease_seconds()),
        attempts=F("attempts") + 1, started_at=now,
    )
    if not claimed:
        return None
    return Step.objects.select_related("search__project", "candidate__search__project").get(pk=step_pk)


def _heartbeat(step_pk: int, owner: str, search_pk: int, cancel: Any, stop: Any) -> None:
    """Extend the lease while the step works; notice cancellation or a lost lease."""
    from datetime import timedelta

    from django.db import connection
    from django.utils import timezone

    from search_app.models import SearchRun, Step

    renew_every = max(_lease_seconds() / 6, 0.5)
    renewed = time.monotonic()
    try:
        while not stop.wait(min(renew_every, 1.0)):  # cancellation is noticed within a second
            kept = True
            if time.monotonic() - renewed >= renew_every:
                renewed = time.monotonic()
                kept = Step.objects.filter(pk=step_pk, state="running", lease_owner=owner).update(
                    lease_expires_at=timezone.now() + timedelta(seconds=_lease_seconds()))
            cancelling = SearchRun.objects.filter(search_id=search_pk, status="cancelling").exists()
            if not kept or cancelling:
                cancel.set()
    finally:
        connection.close()


def step_execute(step_pk: int, owner: str) -> bool:
    """Claim a step, do its work, and record the result if the lease is still ours."""
    import threading

    from search_app import execution

    step = step_claim(step_pk, owner)
    if step is None:
        return False
    cancel, stop = threading.Event(), threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(step.pk, owner, step.search_id, cancel, stop),
                            daemon=True)
    beat.start()
    work = {"generate": execution.generate, "evaluate": execution.evaluate, "measure": execution.measure,
            "replay": execution.replay, "review": execution.review}[step.kind]
    try:
        result = work(step, cancel)
    except Exception as error:  # a runtime fault: the step fails with its reason, the search goes on
        logger.exception("step %s failed", step_pk)
        result = {"error": f"{type(error).__name__}: {error}"}
    finally:
        stop.set()
        beat.join()
    recorded = _step_record(step.pk, owner, result)
    # The search ended while this step ran: no trial will need the trees it parked.
    if step.kind in ("evaluate", "measure") and \
            not SearchRun.objects.filter(search_id=step.search_id, status="running").exists():
        _parked_trees_release(step.search)
    return recorded


def _step_record(step_pk: int, owner: str, result: dict) -> bool:
    from django.utils import timezone

    from search_app.models import Review, SearchRun, Step

    with transaction.atomic():
        run = SearchRun.objects.select_for_update().get(search__steps__pk=step_pk)
        step = Step.objects.select_related("candidate", "search__project").get(pk=step_pk)
        if step.state != "running" or step.lease_owner != owner:
            return False  # another worker took it over; our receipts stay as evidence
        candidate = step.candidate
        stored = {k: v for k, v in result.items() if k not in RESULT_FIELDS_NOT_STORED}
        step.result, step.finished_at = stored, timezone.now()
        step.state = "cancelled" if result.get("cancelled") else ("failed" if "error" in result else "done")
        step.error = result.get("error", "")
        usage = result.get("usage", {})
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
        if step.state == "cancelled":
            return True
        if "spec_failure" in result and "revision" in step.plan:  # the winner stands as it was
            _revision_end(step, result["spec_failure"])
            return True
        if "spec_failure" in result:  # a command of the spec cannot start: stop the search (preflight.py)
            _spec_failure_stop(run, result["spec_failure"])
            return True
        if "error" in result:
            if step.kind == "measure":
                pass  # the round cannot be decided: search_advance ends the search with the reason
            elif candidate.number == 0:
                candidate.state, candidate.reason = "eliminated", f"baseline not measured: {result['error']}"
                candidate.save()
                _candidate_event(candidate, candidate.reason)
            elif "revision" in step.plan:
                _revision_end(step, f"{step.kind} step failed in the runtime: {result['error']}")
            elif step.refines:
                _refinement_kept(candidate, step, f"a runtime fault: {result['error']}")
            else:
                _eliminate(candidate, f"{step.kind} step failed in the runtime: {result['error']}")
            return True
        _result_apply(step, candidate, result, Review)
    return True


def _result_apply(step: Any, candidate: Any, result: dict, review_model: Any) -> None:
    if step.kind == "generate" and "revision" in step.plan:
        _revision_written(step, candidate, result)
        return
    if step.refines:
        _refinement_apply(step, candidate, result)
        return
    if step.kind == "generate":
        candidate.patch = bytes.fromhex(result.get("patch_hex", ""))
        candidate.patch_sha256 = result.get("patch_sha256", "")
        candidate.diff_lines = result.get("diff_lines")
        candidate.files = result.get("files", [])
        if "eliminated" in result:
            _eliminate(candidate, result["eliminated"])
        else:
            candidate.state = "evaluating"
            candidate.save()
            _candidate_event(candidate, f"wrote a patch of {candidate.diff_lines} lines")
        return
    if step.kind == "review":
        review_model.objects.create(search=step.search, candidate=candidate, verdict=result["verdict"],
                                    findings=result.get("findings", []), reviewer=result.get("reviewer", ""),
                                    receipt_id=result.get("review_receipt"))
        findings = len(result.get("findings", []))
        _candidate_event(candidate, f"reviewer says {result['verdict']} ({findings} findings)")
        if "revision" in step.plan:
            _revision_reviewed(step, candidate, candidate.reviews.order_by("-id").first())
        return
    if step.kind == "replay":
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
        return
    if step.kind == "measure":
        _measurement_apply(step, result)
        return
    # evaluate: the gates (a new patch's, or the baseline's)
    candidate.gates_passed = max(candidate.gates_passed, result.get("gates_passed", 0))
    if "eliminated" in result:
        if candidate.number == 0:
            candidate.state, candidate.reason = "eliminated", f"baseline: {result['eliminated']}"
            candidate.save()
            _candidate_event(candidate, candidate.reason)
            _search_event(step.search, "search.baseline_failed", f"the baseline failed its gates "
                          f"({result['eliminated']}): candidates are compared by absolute values",
                          round=step.round)
        else:
            candidate.round_reached = step.round
            _eliminate(candidate, f"round {step.round}: {result['eliminated']}")
        return
    candidate.round_reached = step.round
    candidate.state = "alive"
    candidate.save()
    _candidate_event(candidate, f"round {step.round}: passed its {candidate.gates_passed} gate(s); "
                                "measured with the round's blocks")


def _measurement_apply(step: Any, result: dict) -> None:
    """Record a round's blocks: each member's values, a member whose trial failed eliminated, then
    every measured candidate's figure and interval for the round so far."""
    from search_app.execution import search_spec

    search = step.search
    spec = search_spec(search)
    key = str(step.round)
    members = {c.candidate_id: c for c in search.candidates.filter(candidate_id__in=result["members"])}
    for cid, candidate in members.items():
        values, seconds = result["values"].get(cid, {}), result["durations"].get(cid, {})
        round_blocks = dict(candidate.blocks.get(key, {}))
        round_blocks.update({block: {"value": value, "seconds": seconds.get(block)}
                             for block, value in values.items()})
        candidate.blocks = {**candidate.blocks, key: round_blocks}
        candidate.save(update_fields=["blocks", "updated_at"])
    for cid, why in result["dropped"].items():
        candidate = members[cid]
        if candidate.number == 0:
            candidate.state, candidate.reason = "eliminated", f"baseline not measured: {why}"
            candidate.save(update_fields=["state", "reason", "updated_at"])
            _candidate_event(candidate, candidate.reason)
            _search_event(search, "search.baseline_failed", f"the baseline could not be measured ({why}): "
                          "candidates are compared by absolute values", round=step.round)
        else:
            _eliminate(candidate, f"round {step.round}: {why}")
    _scores_update(search, spec, step.round)


def _block_values(candidate: Any, key: str) -> dict[int, float]:
    return {int(block): item["value"] for block, item in candidate.blocks.get(key, {}).items()}


def _scores_update(search: Search, spec: Any, round_index: int) -> None:
    """Each measured candidate's figure for the round: its median paired ratio to the baseline
    with its interval (paired), or the median of its values (absolute); the absolute median is
    kept either way."""
    import statistics

    from search_app.measurement import median_interval, paired_ratios

    key = str(round_index)
    baseline = search.candidates.get(number=0)
    paired = comparison_for(search, spec, baseline) == "paired"
    base_values = _block_values(baseline, key)
    for candidate in search.candidates.filter(state="alive", round_reached=round_index):
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


def _replay_values(step: Any, candidate: Any, result: dict) -> dict[str, dict[int, float]]:
    """The replay's values by member and block: this step's and those of the replay steps it
    extends (one replay, measured in more than one step when it needed more blocks)."""
    from search_app.models import Step

    merged: dict[str, dict[int, float]] = {}
    earlier = Step.objects.filter(search=step.search, candidate=candidate, kind="replay", state="done",
                                  plan__namespace=step.plan.get("namespace")).exclude(pk=step.pk)
    for source in [*(s.result for s in earlier.order_by("id")), result]:
        for member, by_block in (source.get("values") or {}).items():
            merged.setdefault(member, {}).update({int(block): v for block, v in by_block.items()})
    return merged


def _replay_verdict(step: Any, candidate: Any, result: dict) -> tuple[bool | None, str, int]:
    """(passed, why, more blocks). Paired: the replay's interval must overlap the one it won
    with and still beat the baseline; while it only holds the baseline for want of blocks, it
    gets more (up to the spec's ceiling) instead of a verdict: None. Absolute: its median must
    stay within the band of its earlier trials."""
    import statistics

    from search_app.execution import search_spec
    from search_app.measurement import (
        median_interval,
        paired_ratios,
        replay_consistent,
        replay_undecided,
        replay_within_band,
    )

    if "eliminated" in result:  # its patch or its gates
        return False, result["eliminated"], 0
    spec = search_spec(step.search)
    cid = candidate.candidate_id
    if cid in result["dropped"]:
        return False, result["dropped"][cid], 0
    merged = _replay_values(step, candidate, result)
    values, base = merged.get(cid, {}), merged.get("baseline", {})
    if not values:
        return False, "the replay measured nothing", 0
    baseline = step.search.candidates.get(number=0)
    paired = comparison_for(step.search, spec, baseline) == "paired"
    if "revision" in step.plan:
        return _revision_verdict(spec, values, base, paired and "baseline" not in result["dropped"])
    if paired and base and "baseline" not in result["dropped"]:
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


def _replay_more_blocks(spec: Any, have: int) -> int:
    """Blocks to add to a replay that cannot decide yet: enough to decide at its confidence, in
    steps of `trials`, never past the ceiling."""
    from search_app.measurement import min_blocks

    return min(spec.score.trials_ceiling - have, max(spec.score.trials, min_blocks(spec.score.confidence)))


def _revision_verdict(spec: Any, values: dict[int, float], base: dict[int, float], paired: bool
                      ) -> tuple[bool | None, str, int]:
    """(passed, why, more blocks) for a revised patch: it must beat the baseline it ran beside,
    by its paired interval (more blocks while that still holds 1, up to the ceiling) or, with
    `absolute` scoring, by its median."""
    from search_app.measurement import (
        median_interval,
        paired_ratios,
        revision_beats,
        revision_beats_absolute,
    )

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


def _revision_scores(step: Any, candidate: Any) -> None:
    """The revised patch's figures, from the blocks it ran beside the baseline."""
    import statistics

    from search_app.execution import search_spec
    from search_app.measurement import paired_ratios

    merged = _replay_values(step, candidate, step.result)
    values, base = merged.get(candidate.candidate_id, {}), merged.get("baseline", {})
    ordered = sorted(values.values())
    candidate.score_absolute = statistics.median(ordered)
    candidate.spread = max(ordered) - min(ordered)
    baseline = step.search.candidates.get(number=0)
    paired = comparison_for(step.search, search_spec(step.search), baseline) == "paired"
    candidate.score = statistics.median(paired_ratios(values, base)) if paired and base else \
        candidate.score_absolute


def _refinement_apply(step: Any, candidate: Any, result: dict) -> None:
    if "eliminated" in result:
        _refinement_kept(candidate, step, result["eliminated"])
        return
    if result["patch_sha256"] == candidate.patch_sha256:
        _carry_on(candidate, step.round)  # the same patch passed its gates already
        _candidate_event(candidate, f"round {step.round}: its writer kept its patch")
        return
    candidate.state = "evaluating"
    candidate.patch = bytes.fromhex(result["patch_hex"])
    candidate.patch_sha256, candidate.patch_round = result["patch_sha256"], step.round
    candidate.diff_lines, candidate.files = result.get("diff_lines"), result.get("files", [])
    candidate.save()
    _candidate_event(candidate, f"round {step.round}: its writer refined its patch "
                                f"({candidate.diff_lines} lines); gates run again")


def steps_reconcile() -> list[int]:
    """Release steps whose worker vanished (lease expired); fail those that lost 3 workers.

    Returns the searches still running, so the caller drives each of them (a lost message
    delays work but never loses it).
    """
    from django.utils import timezone

    from search_app.models import SearchRun, Step

    now = timezone.now()
    for step in Step.objects.filter(state="running", lease_expires_at__lt=now).select_related("candidate"):
        with transaction.atomic():
            if step.attempts >= MAX_ATTEMPTS:
                claimed = Step.objects.filter(pk=step.pk, state="running", lease_expires_at__lt=now).update(
                    state="failed", error=f"lost its worker {step.attempts} times", finished_at=now)
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
                Step.objects.filter(pk=step.pk, state="running", lease_expires_at__lt=now).update(
                    state="pending", lease_owner="", enqueued_at=None)
    running = SearchRun.objects.filter(status__in=("running", "cancelling"))
    return list(running.values_list("search_id", flat=True))


def _reservation_release(step: Any) -> None:
    """A step that failed without a result hands its budget reservation back to its run."""
    from search_app.models import SearchRun

    if step.reserved_cost_microusd or step.reserved_tokens:
        run = SearchRun.objects.select_for_update().get(search_id=step.search_id)
        run.reserved_cost_microusd -= step.reserved_cost_microusd
        run.reserved_tokens -= step.reserved_tokens
        run.save(update_fields=["reserved_cost_microusd", "reserved_tokens", "updated_at"])


def search_run_inline(search: Search, *, workers: int | None = None, progress: Any = None,
                      poll: float = 0.2) -> Any:
    """Drive a started search to its end in this process (the CLI's way; no Celery needed)."""
    import os
    import socket
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    from django.db import connection

    from search_app.execution import search_spec
    from search_app.models import SearchRun

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


# ------------------------------------------------------------------------------- drafting a spec

DRAFT_INSTRUCTIONS = """You draft Crucible search specs. A person describes what they want; you reply
with one complete spec in TOML, in a ```toml block, and nothing else of substance. Follow the
reference exactly (keys, types, ranges): population equals the first round; rounds strictly
decrease to 1; concurrency at most 16 and at most the population. Keep commands and paths
plausible for the repository described; the person will edit them before saving.
"""


def spec_draft_write(user: Any, project: Project, description: str) -> tuple[str, str]:
    """Ask the configured model for a spec; returns (TOML text, who drafted it). Nothing is saved:
    the text is shown in the editor as an editable draft and validated like any other."""
    import re

    from django.conf import settings

    from runtime_app.fleet import PRESETS
    from runtime_app.llm import LLMError, ToolChat
    from runtime_app.services import receipt_record
    from search_app.reference import spec_reference_markdown
    from search_app.spec_templates import spec_template_get

    access.require(user, access.OPERATOR, project)
    description = (description or "").strip()
    if not 10 <= len(description) <= 4000:
        raise ValidationError({"description": "Describe what you want in 10 to 4,000 characters."})
    configured = settings.CONFIG.draft_model
    if not configured:
        raise ValidationError({"description": "Drafting is off: an administrator sets "
                                              "CRUCIBLE_DRAFT_MODEL (e.g. anthropic:claude-sonnet-4-5) "
                                              "and the provider's key."})
    preset_name, model = configured.split(":", 1)
    preset = PRESETS.get(preset_name)
    if preset is None or preset.kind in ("command", "agent-cli"):  # drafting calls the model itself
        raise ValidationError({"description": f"CRUCIBLE_DRAFT_MODEL names {preset_name!r}, "
                                              "not an LLM preset."})
    prefix = (DRAFT_INSTRUCTIONS + "\n# The spec reference\n\n" + spec_reference_markdown()
              + "\n# An example\n\n```toml\n" + spec_template_get("speed-up").text + "```\n")
    chat = ToolChat(preset.kind, model, prefix, description, [], "off", base_url=preset.base_url(),
                    key_variable=preset.key_variable, account=preset.name)
    try:
        reply, _ = chat.turn(lambda receipt: receipt_record(
            receipt, project=project, subject=("project", project.pk), label="spec draft"), None)
    except LLMError as error:
        raise ValidationError({"description": f"The model could not draft a spec: {error}"}) from None
    content = chat.messages[-1]["content"]
    if not isinstance(content, str):
        content = "\n".join(block.get("text", "") for block in content if isinstance(block, dict))
    found = re.search(r"```(?:toml)?\s*\n(.*?)```", content, re.DOTALL)
    text = (found.group(1) if found else content).strip() + "\n"
    if not text.strip():
        raise ValidationError({"description": "The model answered without a spec; try describing it again."})
    return _check_text(text), f"{preset.name} {reply.receipt.resolved_model or model}"


# ------------------------------------------------------------------ review, approval and merge
#
# A person decides; the reviewer's verdict is advice. An approval is bound to the exact patch
# hash the approver was shown, so a changed patch leaves it stale. A merge needs enough
# standing approvals, makes one commit with dulwich on a new or unmoved branch, and never pushes.
# A decision is withdrawn when its maker may no longer decide; a merge commits only bytes whose
# SHA-256 is the approved one, onto a branch name git reads as a plain branch.

MAX_COMMENT_CHARS = 10_000
MAX_BRANCH_CHARS = 200
VALID_BRANCH_HINT = ("A valid branch name looks like crucible/faster-parser or feature/x-2: letters, digits "
                     "and . _ - / ; it does not start with '-', '.', '/' or 'refs/', is not HEAD or another "
                     "*_HEAD name, has no spaces, '..', '~^:?*[\\' or control characters and does not end in "
                     "'/', '.' or '.lock'.")


class Conflict(ValidationError):
    """A refusal because the state moved on from what the caller saw (a stale patch hash, a
    winner merged already, stored bytes that no longer match): the API answers 409."""


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _user_name(user: Any) -> str:
    return user.get_username()


def comment_add(user: Any, candidate: Any, body: str, path: str = "", line: int | None = None,
                reply_to: int | None = None) -> Any:
    """A project member's comment on a candidate. Without `reply_to` it starts a thread on the
    candidate, one file, or one line the diff shows (keeping the patch hash and the line's text, so
    a refinement can mark it outdated); with it, a reply in that thread, which has no place of its own."""
    access.require(user, access.VIEWER, candidate.search.project)
    body = (body or "").strip()
    errors = {}
    if not body:
        errors["body"] = "Write something."
    elif len(body) > MAX_COMMENT_CHARS:
        errors["body"] = f"Keep a comment under {MAX_COMMENT_CHARS:,} characters ({len(body):,} now)."
    path = (path or "").strip()
    thread = None
    if reply_to is not None:
        thread = _thread_of(candidate, reply_to, "reply to", "reply_to")
        if path or line is not None:
            errors["reply_to"] = ("A reply belongs to its thread's place; give it no file or line "
                                  f"(thread #{thread.pk} is on {_place(thread)}).")
    elif path and path not in (candidate.files or []):
        errors["path"] = f"{path!r} is not a file this candidate's patch changes."
    if thread is None and line is not None and not path:
        errors["line"] = "A line needs a file."
    elif thread is None and line is not None and not 1 <= line <= 10_000_000:
        errors["line"] = "Give a line number from 1."
    elif thread is None and line is not None and "path" not in errors:
        errors.update(_line_in_diff_errors(candidate, path, line))
    if errors:
        raise ValidationError(errors)
    line_text = ""
    if thread is None and line is not None:
        from search_app.selectors import diff_new_line_texts

        line_text = diff_new_line_texts(_patch_text(candidate), path).get(line, "")
    with transaction.atomic():
        comment = Comment.objects.create(
            candidate=candidate, reply_to=thread, author=user, author_name=_user_name(user),
            path=path, line=line, body=body, patch_sha256=candidate.patch_sha256, line_text=line_text)
        if thread is not None:
            what = f"replied to thread #{thread.pk} on {candidate.candidate_id}"
        else:
            what = f"commented on {candidate.candidate_id}" + (f" on {path}" + (f":{line}" if line else "")
                                                              if path else "")
        _search_event(candidate.search, "candidate.comment", f"{_user_name(user)} {what}",
                      candidate_id=candidate.candidate_id, comment=comment.pk, thread=(thread or comment).pk)
    return comment


def _patch_text(candidate: Any) -> str:
    return bytes(candidate.patch or b"").decode(errors="replace")


def _place(comment: Any) -> str:
    if not comment.path:
        return "the whole candidate"
    return f"{comment.path}:{comment.line}" if comment.line else comment.path


def _thread_of(candidate: Any, comment_id: Any, verb: str, field: str | None = None) -> Any:
    """The thread `comment_id` names on this candidate, or a refusal in the words every door uses
    (as an error of `field`, or of the whole request). A comment of another candidate, or of a
    project the user cannot see, reads as not existing."""

    def refuse(message: str) -> ValidationError:
        return ValidationError({field: message} if field else message)

    try:
        number = int(comment_id)
    except (TypeError, ValueError):
        raise refuse(f"{comment_id!r} is not a comment number.") from None
    comment = Comment.objects.filter(pk=number, candidate=candidate).first()
    if comment is None:
        raise refuse(f"#{number} is not a comment on this candidate ({candidate.candidate_id}).")
    if comment.reply_to_id is not None:
        raise refuse(f"#{number} is a reply; {verb} its thread (#{comment.reply_to_id}) instead.")
    return comment


def thread_resolve(user: Any, candidate: Any, comment_id: Any) -> Any:
    """Mark a thread resolved (any project member). Resolving a resolved thread changes nothing."""
    return _thread_state_set(user, candidate, comment_id, "resolved")


def thread_reopen(user: Any, candidate: Any, comment_id: Any) -> Any:
    """Open a resolved thread again (any project member). Reopening an open thread changes nothing."""
    return _thread_state_set(user, candidate, comment_id, "open")


def _thread_state_set(user: Any, candidate: Any, comment_id: Any, state: str) -> Any:
    search = candidate.search
    access.require(user, access.VIEWER, search.project)
    verb = "resolve" if state == Comment.State.RESOLVED else "reopen"
    with transaction.atomic():
        thread = _thread_of(candidate, comment_id, verb)
        thread = Comment.objects.select_for_update().get(pk=thread.pk)
        if thread.state == state:
            return thread  # a double click, or someone else was first: harmless
        thread.state = state
        thread.state_changed_by, thread.state_changed_by_name = user, _user_name(user)
        thread.state_changed_at = timezone.now()
        thread.save(update_fields=["state", "state_changed_by", "state_changed_by_name", "state_changed_at"])
        audit_record(user, f"comment.{verb}", project=search.project,
                     target=f"{search.search_id} {candidate.candidate_id} #{thread.pk}",
                     detail={"comment": thread.pk, "candidate": candidate.candidate_id})
        done = "resolved" if state == Comment.State.RESOLVED else "reopened"
        _search_event(search, f"candidate.comment.{done}",
                      f"{_user_name(user)} {done} thread #{thread.pk} on {candidate.candidate_id}",
                      candidate_id=candidate.candidate_id, thread=thread.pk, state=state)
    return thread


def _line_in_diff_errors(candidate: Any, path: str, line: int) -> dict[str, str]:
    """A line comment anchors on a line the diff shows, or a reader could never find it."""
    from search_app.selectors import diff_new_lines, line_ranges_text

    shown = diff_new_lines(_patch_text(candidate), path)
    if line in shown:
        return {}
    where = f"it shows lines {line_ranges_text(shown)}" if shown else "it shows no line of the new file"
    return {"line": f"Line {line} of {path} is not in this candidate's diff ({where})."}


def _winner_of(search: Search) -> Any:
    from search_app.models import SearchRun
    from search_app.selectors import REVISING

    run = SearchRun.objects.filter(search=search).select_related("winner").first()
    if run is not None and run.phase == "revise":
        raise ValidationError(REVISING)
    if run is None or run.status != "finished" or run.outcome != "winner" or run.winner is None:
        raise ValidationError("Only a finished search's winner can be approved or merged; "
                              "this search has none yet." if not run or run.outcome != "NONE"
                              else "This search ended with NONE: there is nothing to approve or merge.")
    return run.winner


def approval_record(user: Any, candidate: Any, decision: str, patch_sha256: str, note: str = "") -> Any:
    """An approver's decision on a winner, bound to the patch hash they confirmed.

    Submitting the same decision on the same hash again returns the standing one (a double
    click is harmless). A later decision by the same person replaces theirs.
    """
    from search_app.models import Approval, Merge
    from search_app.selectors import approval_state, decision_refusals, winner_replay

    search = candidate.search
    access.require(user, access.APPROVER, search.project)
    if decision not in Approval.Decision.values:
        raise ValidationError({"decision": "Choose approve or request changes."})
    if not _SHA256_HEX.fullmatch(patch_sha256 or ""):
        raise ValidationError({"patch_sha256": "The patch hash is not a SHA-256."})
    if len(note or "") > MAX_COMMENT_CHARS:
        raise ValidationError({"note": f"Keep the note under {MAX_COMMENT_CHARS:,} characters."})
    with transaction.atomic():
        winner = _winner_of(search)
        candidate = type(candidate).objects.select_for_update().get(pk=candidate.pk)
        if candidate.pk != winner.pk:
            raise ValidationError(f"{candidate.candidate_id} is not this search's winner "
                                  f"({winner.candidate_id}); only the winner is approved or merged.")
        if Merge.objects.filter(search=search).exists():
            raise Conflict("This winner is merged already.")
        if patch_sha256 != candidate.patch_sha256:
            raise Conflict({"patch_sha256": "The patch changed since you looked "
                            f"(now {candidate.patch_sha256[:12]}): read it again, then decide."})
        refused = decision_refusals(user, search)[decision]
        if refused:
            raise ValidationError(refused)
        standing = approval_state(candidate)["decisions"].get(user.pk)
        if (standing is not None and standing.decision == decision and not standing.stale
                and standing.withdrawn_at is None):
            return standing
        replay = winner_replay(search)
        approval = Approval.objects.create(
            candidate=candidate, user=user, user_name=_user_name(user), decision=decision,
            patch_sha256=patch_sha256, replay=replay["why"] if replay else "", note=(note or "").strip())
        action = "approval.approve" if decision == "approve" else "approval.request_changes"
        audit_record(user, action, project=search.project,
                     target=f"{search.search_id} {candidate.candidate_id}",
                     detail={"patch_sha256": patch_sha256})
        verb = "approved" if decision == "approve" else "requested changes to"
        _winner_reason_refresh(candidate)
        _search_event(search, f"approval.{decision}", f"{_user_name(user)} {verb} {candidate.candidate_id} "
                      f"(patch {patch_sha256[:12]})", candidate_id=candidate.candidate_id,
                      state=candidate.state, reason=candidate.reason)
    return approval


def approvals_withdraw(actor: Any, user: Any, *, project: Project | None = None, reason: str) -> int:
    """Withdraw, for good, the decisions `user` made on winners not merged yet (in `project`,
    or in every project): they left it or lost the approve permission. Each candidate's
    withdrawal is audited and announced; returns how many decisions were withdrawn."""
    from django.utils import timezone

    from search_app.models import Approval, Candidate

    pending = Approval.objects.filter(user=user, withdrawn_at__isnull=True,
                                      candidate__search__merge__isnull=True)
    if project is not None:
        pending = pending.filter(candidate__search__project=project)
    with transaction.atomic():
        by_candidate: dict[int, list[str]] = {}
        for candidate_id, decision in pending.values_list("candidate_id", "decision"):
            by_candidate.setdefault(candidate_id, []).append(decision)
        if not by_candidate:
            return 0
        withdrawn = Approval.objects.filter(pk__in=list(pending.values_list("pk", flat=True))).update(
            withdrawn_at=timezone.now(), withdrawn_reason=reason[:200])
        username = user.get_username()
        for candidate in Candidate.objects.filter(pk__in=by_candidate).select_related("search__project"):
            search = candidate.search
            audit_record(actor, "approval.withdraw", project=search.project,
                         target=f"{search.search_id} {candidate.candidate_id}",
                         detail={"user": username, "reason": reason, "decisions": by_candidate[candidate.pk]})
            if candidate.state == "winner":
                _winner_reason_refresh(candidate)
            _search_event(search, "approval.withdrawn", f"{username}'s decision on {candidate.candidate_id} "
                          f"was withdrawn: {reason}", candidate_id=candidate.candidate_id)
    return withdrawn


def branch_name_check(branch: str) -> str:
    """A branch name git's `check-ref-format --branch` accepts and that git cannot read as
    something else (HEAD-like names, options, full ref names); else a ValidationError."""
    from dulwich.refs import check_ref_format

    name = (branch or "").strip()
    problem = ""
    if len(name) > MAX_BRANCH_CHARS:
        problem = f"it is {len(name)} characters long (at most {MAX_BRANCH_CHARS})"
    elif name.startswith("-"):
        problem = "it starts with '-', so git would read it as an option"
    elif name.startswith("refs/"):
        problem = "it starts with 'refs/'; give the branch's short name"
    elif _head_like(name):
        problem = "git reads it as a special ref, not a branch"
    elif not check_ref_format(f"refs/heads/{name}".encode()):
        problem = "git refuses it as a branch name"
    if problem:
        raise ValidationError({"branch": f"{name!r} cannot be a branch: {problem}. {VALID_BRANCH_HINT}"})
    return name


def _head_like(name: str) -> bool:
    """HEAD, ORIG_HEAD, FETCH_HEAD, MERGE_HEAD, …_HEAD and @: git resolves these before any branch."""
    return name == "@" or (name.endswith("HEAD") and all(c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ_" for c in name))


def merge_branch_default(search: Search) -> str:
    return f"crucible/{search.search_id}"


class PatchMismatch(ValidationError):
    """The winner's stored bytes do not hash to the patch hash its approvals were bound to."""

    def __init__(self, approved: str, actual: str) -> None:
        self.approved, self.actual = approved, actual
        super().__init__(f"The winner's patch bytes (SHA-256 {actual[:12]}) do not match the approved hash "
                         f"({approved[:12]}): they changed after approval, so nothing was merged. Ask an "
                         "administrator to look at how the stored patch was altered.")


def _patch_verified(winner: Any) -> bytes:
    """The exact bytes to apply, once their SHA-256 is the one the approvals were bound to."""
    import hashlib

    patch = bytes(winner.patch or b"")
    actual = hashlib.sha256(patch).hexdigest()
    if actual != winner.patch_sha256:
        raise PatchMismatch(winner.patch_sha256, actual)
    return patch


def merge_create(user: Any, search: Search, target: str = "new_branch", branch: str = "") -> Any:
    """Commit the approved winner's patch onto the baseline: on a new branch (default
    `crucible/<search-id>`) or on an existing branch that still points at the baseline.

    Needs the approver role and enough standing approvals; one merge per search. Pushes the branch
    only to a repository registered by URL (where it lives); a repository registered by path is
    never pushed.
    The branch name is checked (branch_name_check) and the bytes committed must hash to the
    approved patch hash, else nothing is merged and the refusal is audited.
    """
    from search_app.models import Merge

    access.require(user, access.APPROVER, search.project)
    if target not in Merge.Target.values:
        raise ValidationError({"target": "Choose a new branch or an existing branch."})
    branch = (branch or "").strip() or (merge_branch_default(search) if target == "new_branch" else "")
    if not branch:
        raise ValidationError({"branch": "Name the existing branch to commit on."})
    branch = branch_name_check(branch)
    try:
        return _merge_create(user, search, target, branch)
    except PatchMismatch as mismatch:  # recorded outside the refused merge's rolled-back transaction
        audit_record(user, "merge.refuse", project=search.project, target=f"{search.search_id} → {branch}",
                     detail={"reason": "patch bytes do not match the approved hash",
                             "approved_sha256": mismatch.approved, "actual_sha256": mismatch.actual})
        raise Conflict(mismatch.messages[0]) from None


def _merge_create(user: Any, search: Search, target: str, branch: str) -> Any:
    from datetime import UTC, datetime
    from time import monotonic

    from runtime_app.models import Receipt
    from runtime_app.services import receipt_record
    from search_app.models import Merge, SearchRun
    from search_app.selectors import approval_state

    with transaction.atomic():
        SearchRun.objects.select_for_update().get(search=search)  # one merge decision at a time
        if Merge.objects.filter(search=search).exists():
            raise Conflict(f"Merged already: {search.merge.branch} @ {search.merge.commit_sha[:12]}.")
        winner = _winner_of(search)
        state = approval_state(winner)
        if not state["mergeable"]:
            raise ValidationError(state["blocker"])
        patch = _patch_verified(winner)
        approvers = ", ".join(sorted({a.user_name for a in state["standing_approvals"]}))
        started_at, started = datetime.now(UTC), monotonic()
        # A merge whose commit was made but whose row was not (a crash between the two) is adopted.
        commit = _earlier_merge_commit(search, winner, branch)
        adopted = commit is not None
        if not adopted:
            commit = _merge_commit(search, winner, branch, target, user, approvers, patch=patch)
        pushed = _merge_push(search, branch, commit)
        receipt = receipt_record(Receipt(
            kind="merge", argv=["crucible", "merge", branch], cwd=".", started_at=started_at,
            finished_at=datetime.now(UTC), duration_seconds=round(monotonic() - started, 6), exit_code=0,
            detail={"branch": branch, "target": target, "commit": commit, "baseline": search.baseline_commit,
                    "patch_sha256": winner.patch_sha256, "approved_by": approvers,
                    "pushed": bool(pushed), "pushed_to": pushed,
                    "adopted": adopted},
        ), project=search.project, subject=("candidate", winner.pk), label=f"{winner.candidate_id} merge")
        merge = Merge.objects.create(
            search=search, candidate=winner, target=target, branch=branch, commit_sha=commit,
            patch_sha256=winner.patch_sha256, merged_by=user, merged_by_name=_user_name(user),
            receipt=receipt)
        audit_record(user, "merge.create", project=search.project, target=f"{search.search_id} → {branch}",
                     detail={"commit": commit, "candidate": winner.candidate_id,
                             "patch_sha256": winner.patch_sha256})
        _winner_reason_refresh(winner)
        _search_event(search, "search.merged", f"{winner.candidate_id} merged onto {branch} as {commit[:12]} "
                      f"by {_user_name(user)} ({f'pushed to {pushed}' if pushed else 'not pushed'})",
                      candidate_id=winner.candidate_id,
                      state=winner.state, reason=winner.reason)
    return merge


def _merge_push(search: Search, branch: str, commit: str) -> str:
    """Push the merged branch back to a repository registered by URL (where it lives); the URL pushed
    to, or "" for a repository registered by path, which Crucible never pushes. A push that fails
    refuses the merge with the reason; merging again adopts the commit already made and pushes it."""
    url = search.repository.remote_url if search.repository_id else ""
    if not url:
        return ""
    try:
        remotes.remote_push(url, Path(search.repository_path), branch)
    except remotes.RemoteError as error:
        raise ValidationError(f"The merge commit {commit[:12]} was made on {branch} in the server's clone, "
                              f"but not pushed: {error}. Fix the server's access to the remote, then merge "
                              "again.") from None
    return url


def _merge_commit(search: Search, winner: Any, branch: str, target: str, user: Any, approvers: str,
                  patch: bytes | None = None) -> str:
    """The winner's patch on a clean baseline, committed with dulwich onto `branch`; `patch` is
    the bytes merge_create verified (read and verified here when not given)."""
    from time import monotonic

    from runtime_app.git import GitError, commit_create
    from runtime_app.worktrees import patch_apply, worktree_remove

    patch = _patch_verified(winner) if patch is None else patch
    # No repo lock here: worktree creation takes it, and the branch moves by compare-and-set.
    if target == "new_branch" and _branch_exists(search.repository_path, branch):
        raise ValidationError({"branch": f"Branch {branch} exists already; choose another name."})
    if target == "existing_branch":
        _branch_at_baseline(search, branch)
    worktree = None
    try:
        worktree = patch_apply(search.repository_path, search.baseline_commit, patch,
                               f"merge-{search.search_id}-{int(monotonic() * 1000)}")
        return commit_create(
            search.repository_path,
            message=f"{search.name}: {winner.candidate_id}\n\n{search.objective}",
            author=_identity(user), committer="Crucible <crucible@localhost>",
            trailers={"Crucible-Search": search.search_id,
                      "Crucible-Preregistration": search.preregistration_hash,
                      "Crucible-Candidate": f"{winner.candidate_id} {winner.patch_sha256}",
                      "Approved-by": approvers},
            parent_commit=search.baseline_commit, tree_from_worktree=worktree, branch=branch,
        )
    except GitError as error:
        raise ValidationError(f"The merge was not made: {error}") from None
    finally:
        if worktree is not None:
            worktree_remove(search.repository_path, worktree)


def _earlier_merge_commit(search: Search, winner: Any, branch: str) -> str | None:
    """The head of `branch` if it is this search's merge of this patch onto the baseline."""
    from runtime_app.git import repo_open

    with repo_open(search.repository_path) as repo:
        ref = f"refs/heads/{branch}".encode()
        if ref not in repo.refs:
            return None
        commit = repo[repo.refs[ref]]
        if [parent.decode() for parent in getattr(commit, "parents", [])] != [search.baseline_commit]:
            return None
        message = commit.message.decode(errors="replace")
    wanted = (f"Crucible-Search: {search.search_id}",
              f"Crucible-Candidate: {winner.candidate_id} {winner.patch_sha256}")
    return commit.id.decode() if all(line in message.splitlines() for line in wanted) else None


def _identity(user: Any) -> str:
    import re

    name = re.sub(r"[<>\n\r\0]", "", user.get_full_name() or user.get_username()).strip() or "user"
    local = re.sub(r"[^A-Za-z0-9._-]", "", user.get_username()) or "user"
    email = re.sub(r"[<>\s\0]", "", user.email or "") or f"{local}@crucible.invalid"
    return f"{name} <{email}>"


def _branch_exists(repo_path: str, branch: str) -> bool:
    from runtime_app.git import repo_open

    with repo_open(repo_path) as repo:
        return f"refs/heads/{branch}".encode() in repo.refs


def _branch_at_baseline(search: Search, branch: str) -> None:
    from runtime_app.git import repo_open

    with repo_open(search.repository_path) as repo:
        ref = f"refs/heads/{branch}".encode()
        if ref not in repo.refs:
            raise ValidationError({"branch": f"There is no branch {branch}."})
        head = repo.refs[ref].decode()
    if head != search.baseline_commit:
        raise ValidationError({"branch": f"{branch} has moved on from the baseline ({head[:12]} is not "
                               f"{search.baseline_commit[:12]}); merge to a new branch instead."})
