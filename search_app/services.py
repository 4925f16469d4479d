"""Every write in search_app: spec drafts and versions, and freezing searches."""

from __future__ import annotations

import logging
import time
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from runtime_app import roles
from runtime_app.models import Project, Repository
from runtime_app.services import _require, _require_member, audit_record, event_emit
from search_app.freeze import FreezeError, freeze_inputs
from search_app.models import HiddenFile, Search, Spec, SpecVersion
from search_app.preflight import preflight_problems, start_problems
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
    _require(user, roles.OPERATE)
    _require_member(user, project)
    title, text = _check_title(title), _check_text(text)
    with transaction.atomic():
        spec = Spec.objects.create(project=project, title=title, created_by=user)
        _version_add(user, spec, text)
    return spec


def spec_save(user: Any, spec: Spec, text: str) -> SpecVersion:
    _require(user, roles.OPERATE)
    _require_member(user, spec.project)
    text = _check_text(text)
    with transaction.atomic():
        Spec.objects.select_for_update().filter(pk=spec.pk).first()
        return _version_add(user, spec, text)


def spec_duplicate(user: Any, spec: Spec) -> Spec:
    _require(user, roles.OPERATE)
    _require_member(user, spec.project)
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
    _require(user, roles.OPERATE)
    _require_member(user, project)
    if repository is not None:
        if repository.project_id != project.pk:
            raise ValidationError({"repository": "That repository belongs to another project."})
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


def _search_event(search: Search, kind: str, message: str, **payload: Any) -> None:
    event_emit(search.project, "search", search.pk, kind, {"message": message, **payload})


def _candidate_event(candidate: Any, message: str) -> None:
    _search_event(
        candidate.search, "candidate.updated", f"{candidate.candidate_id}: {message}",
        candidate_id=candidate.candidate_id, state=candidate.state, round=candidate.round_reached,
        score=candidate.score, reason=candidate.reason,
    )


def search_start(user: Any, search: Search, *, enqueue: bool = True) -> Any:
    """Start a frozen search: its candidates and run state are written; work begins on commit.

    Starting a search that already runs or ran returns its run unchanged. `enqueue=False`
    leaves driving it to the caller (the CLI's `search_run_inline`).
    """
    from search_app.execution import search_spec
    from search_app.models import Candidate, SearchRun, Step

    _require(user, roles.OPERATE)
    _require_member(user, search.project)
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

    _require(user, roles.OPERATE)
    _require_member(user, search.project)
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


def search_advance(search_pk: int) -> list[int]:
    """Decide what happens next; return the ids of steps ready to run (at most `concurrency` live)."""
    from search_app.execution import search_spec
    from search_app.models import SearchRun

    with transaction.atomic():
        run = SearchRun.objects.select_for_update().select_related("search__project").filter(
            search_id=search_pk).first()
        if run is None or run.terminal:
            return []
        search = run.search
        spec = search_spec(search)
        if run.status == "cancelling":
            _cancel_settle(run)
            return []
        steps = list(search.steps.select_related("candidate"))
        live = [step for step in steps if step.state in ("pending", "running")]
        if run.phase == "rounds":
            _admit(run, spec, steps, live)
            if not live and _round_complete(run, steps):
                _round_close(run, spec)
        busy = search.steps.filter(state__in=("pending", "running")).exists
        if run.phase == "replay" and not busy():
            _replay_next(run, spec)
        if run.phase == "review" and not busy():
            _outcome_winner(run)
        run.save()
        # Never more than `concurrency` steps running, however many are pending (a round's
        # promotions are all created at once).
        slots = spec.concurrency - search.steps.filter(state="running").count()
        pending = search.steps.filter(state="pending").order_by("id").values_list("id", flat=True)
        return list(pending[: max(slots, 0)])


def _admit(run: Any, spec: Any, steps: list, live: list) -> None:
    """Queue the evaluation of each candidate its writer has finished with (in round 0, or a
    refinement in a later round), and admit round 0's writers in batch order."""
    from search_app.models import Step

    search = run.search
    has_evaluate = {(s.candidate_id, s.round) for s in steps if s.kind == "evaluate"}
    for step in steps:
        candidate = step.candidate
        if step.kind == "generate" and step.state in ("done", "failed") and \
                (step.candidate_id, step.round) not in has_evaluate and candidate.state == "evaluating":
            live.append(Step.objects.create(search=search, candidate=candidate, kind="evaluate",
                                            round=step.round))
    queued = list(search.candidates.filter(state="queued").order_by("number"))
    for candidate in queued:
        if len(live) >= spec.concurrency:
            break
        cost, tokens = _reservation(run, spec.concurrency)
        if not _fits(run, cost, tokens):
            if any(s.reserved_cost_microusd or s.reserved_tokens for s in live):
                break  # a live writer may hand back part of its reservation: wait for it
            _not_admitted(run, queued[queued.index(candidate):])
            break
        run.reserved_cost_microusd += cost
        run.reserved_tokens += tokens
        candidate.state = "writing"
        candidate.save(update_fields=["state", "updated_at"])
        live.append(Step.objects.create(search=search, candidate=candidate, kind="generate", round=0,
                                        reserved_cost_microusd=cost, reserved_tokens=tokens))
        _candidate_event(candidate, "admitted; its writer starts")


def _not_admitted(run: Any, candidates: list) -> None:
    spent = f"{run.spent_cost_microusd:,} µUSD and {run.spent_tokens:,} tokens spent"
    for candidate in candidates:
        candidate.state = "not_admitted"
        candidate.reason = f"not admitted: the budget cannot cover another writer ({spent})"
        candidate.save(update_fields=["state", "reason", "updated_at"])
    _search_event(run.search, "search.budget_exhausted",
                  f"admission stopped: the budget cannot cover another writer; "
                  f"{len(candidates)} not admitted")


def _round_complete(run: Any, steps: list) -> bool:
    if run.round_index == 0 and run.search.candidates.filter(state__in=("queued", "writing")).exists():
        return False
    return not any(s.state in ("pending", "running") for s in steps)


def _entries(candidates: list) -> list:
    from search_app.selection import Entry

    return [Entry(c.candidate_id, score=c.score, cost_microusd=c.cost_microusd, tokens=c.tokens,
                  diff_lines=c.diff_lines or 0, runtime_seconds=c.runtime_seconds or 0.0,
                  patch_sha256=c.patch_sha256) for c in candidates]


def _round_close(run: Any, spec: Any) -> None:
    """Select the round's survivors; promote them to fresh trials, or go on to replay."""
    from search_app.selection import is_better, select

    search, round_index = run.search, run.round_index
    baseline = search.candidates.get(number=0)
    participants = list(search.candidates.filter(state="alive", round_reached=round_index, number__gt=0))
    if baseline.score is not None:
        for candidate in [c for c in participants
                          if not is_better(c.score, baseline.score, spec.score.direction)]:
            _eliminate(candidate, f"round {round_index}: score {candidate.score:g} is not better than the "
                                  f"baseline's {baseline.score:g}")
            participants.remove(candidate)
    if not participants:
        _outcome_none(run, f"no candidate survived round {round_index}")
        return
    last = round_index >= len(spec.rounds) - 1
    keep = len(participants) if last else spec.rounds[round_index + 1]
    decisions = select(_entries(participants), keep, direction=spec.score.direction,
                       policy=spec.selection.policy, ordering=spec.selection.ordering,
                       tie_breakers=spec.score.tie_breakers, retain_diversity=spec.selection.retain_diversity)
    by_id = {c.candidate_id: c for c in participants}
    run.rankings = {**run.rankings, str(round_index): [d.candidate_id for d in decisions
                                                       if not d.duplicate_of]}
    for decision in decisions:
        candidate = by_id[decision.candidate_id]
        if decision.duplicate_of:
            candidate.duplicate_of = by_id[decision.duplicate_of]
        if decision.promoted and not last:
            candidate.state, candidate.reason = "evaluating", f"round {round_index}: {decision.reason}"
            candidate.save(update_fields=["state", "reason", "duplicate_of", "updated_at"])
            _promote(run, spec, candidate, round_index + 1)
        elif not decision.promoted:
            _eliminate(candidate, f"round {round_index}: {decision.reason}")
        else:
            candidate.reason = f"round {round_index}: {decision.reason}"
            candidate.save(update_fields=["reason", "duplicate_of", "updated_at"])
    _search_event(search, "search.round_closed", f"round {round_index} closed: "
                  f"{sum(d.promoted for d in decisions)} of {len(decisions)} go on", round=round_index)
    if last:
        run.phase = "replay"
    else:
        run.round_index = round_index + 1


def _promote(run: Any, spec: Any, candidate: Any, next_round: int) -> None:
    """Fresh trials in the next round; with `worker.refine`, its writer revises the patch first,
    if the budget can cover one more writer (otherwise the patch is re-scored as it is)."""
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
    Step.objects.create(search=run.search, candidate=candidate, kind="evaluate", round=next_round)


def _refinement_kept(candidate: Any, step: Any, why: str) -> None:
    """A refinement that fails costs the candidate nothing: it goes on with the patch it had."""
    candidate.state = "evaluating"
    candidate.save(update_fields=["state", "updated_at"])
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
    """Replay the best candidate not yet replayed; after MAX_REPLAYS failures, NONE."""
    from search_app.models import Step

    search = run.search
    passed = search.steps.filter(kind="replay", state="done", result__passed=True).select_related("candidate")
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
        _outcome_none(run, f"no candidate passed replay ({', '.join(run.replayed) or 'none replayed'})")
        return
    candidate = search.candidates.get(candidate_id=remaining[0])
    run.replayed = [*run.replayed, candidate.candidate_id]
    Step.objects.create(search=search, candidate=candidate, kind="replay", round=run.round_index)
    _candidate_event(candidate, "provisional winner: replaying on a clean baseline")


def _outcome_winner(run: Any) -> None:
    from django.utils import timezone

    review = run.search.reviews.order_by("-id").select_related("candidate").first()
    if review is None:
        _outcome_none(run, "the review step did not finish")
        return
    candidate = review.candidate
    candidate.state = "winner"
    candidate.reason = f"winner: replay passed; reviewer says {review.verdict}; awaiting human approval"
    candidate.save(update_fields=["state", "reason", "updated_at"])
    run.outcome, run.winner, run.status, run.phase = "winner", candidate, "finished", "done"
    run.reason = candidate.reason
    run.finished_at = timezone.now()
    _candidate_event(candidate, candidate.reason)
    _search_event(run.search, "search.finished", f"{run.search.name}: winner {candidate.candidate_id} "
                  f"(score {candidate.score:g}), awaiting approval", outcome="winner")


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
    stopped = run.outcome == "NONE"  # by _spec_failure_stop, not by a person
    run.reserved_cost_microusd = run.reserved_tokens = 0
    run.status, run.phase, run.finished_at = "finished" if stopped else "cancelled", "done", timezone.now()
    run.reason = run.reason if stopped else "cancelled by a person"
    for candidate in search.candidates.exclude(state__in=("eliminated", "not_admitted", "winner")):
        candidate.state = "cancelled"
        candidate.reason = candidate.reason or (
            "the search stopped" if stopped else "the search was cancelled")
        candidate.save(update_fields=["state", "reason", "updated_at"])
    run.save()
    if stopped:
        _search_event(search, "search.finished", f"{search.name}: NONE — {run.reason}", outcome="NONE")
        return
    _search_event(search, "search.cancelled", f"{search.name}: cancelled", outcome="cancelled")


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
    for step_pk in step_pks:
        if Step.objects.filter(pk=step_pk, state="pending").filter(
                Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=stale)).update(enqueued_at=now):
            marked.append(step_pk)
    return marked


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
    try:
        if step.kind == "generate":
            result = execution.generate(step, cancel)
        elif step.kind == "evaluate":
            # Gates run on every new patch: round 0's, and a refinement's in its round.
            result = execution.evaluate(step, cancel, gates=step.round == step.candidate.patch_round)
        elif step.kind == "replay":
            result = execution.evaluate(step, cancel, gates=True)
        else:
            result = execution.review(step, cancel)
    except Exception as error:  # a runtime fault: the step fails with its reason, the search goes on
        logger.exception("step %s failed", step_pk)
        result = {"error": f"{type(error).__name__}: {error}"}
    finally:
        stop.set()
        beat.join()
    return _step_record(step.pk, owner, result)


def _step_record(step_pk: int, owner: str, result: dict) -> bool:
    from django.utils import timezone

    from search_app.execution import replay_verdict
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
        if "spec_failure" in result:  # a command of the spec cannot start: stop the search (preflight.py)
            _spec_failure_stop(run, result["spec_failure"])
            return True
        if "error" in result:
            if candidate.number == 0:
                candidate.state, candidate.reason = "eliminated", f"baseline not measured: {result['error']}"
                candidate.save()
            elif step.refines:
                _refinement_kept(candidate, step, f"a runtime fault: {result['error']}")
            else:
                _eliminate(candidate, f"{step.kind} step failed in the runtime: {result['error']}")
            return True
        _result_apply(step, candidate, result, replay_verdict, Review)
    return True


def _result_apply(step: Any, candidate: Any, result: dict, replay_verdict: Any, review_model: Any) -> None:
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
        return
    if step.kind == "replay":
        # The noise band comes from the trials of the patch being replayed (not of a patch
        # its writer later refined).
        earlier = [v for round_key, values in candidate.trials.items()
                   if int(round_key) >= candidate.patch_round for v in values]
        if "eliminated" in result:
            passed, why = False, f"replay failed: {result['eliminated']}"
        else:
            from search_app.execution import search_spec

            tolerance = search_spec(step.search).score.replay_tolerance
            passed, why = replay_verdict(earlier, result["score"], tolerance)
            why = ("replay passed: " if passed else "replay failed: ") + why
        step.result = {**step.result, "passed": passed, "why": why}
        step.save(update_fields=["result"])
        if not passed:
            _eliminate(candidate, why)
        else:
            candidate.reason = why
            candidate.save()
            _candidate_event(candidate, why)
        return
    # evaluate
    candidate.gates_passed = max(candidate.gates_passed, result.get("gates_passed", 0))
    if "eliminated" in result:
        if candidate.number == 0:
            candidate.state, candidate.reason = "eliminated", f"baseline: {result['eliminated']}"
            candidate.save()
            _candidate_event(candidate, candidate.reason)
        else:
            candidate.round_reached = step.round
            _eliminate(candidate, f"round {step.round}: {result['eliminated']}")
        return
    candidate.round_reached = step.round
    candidate.score, candidate.spread = result["score"], result["spread"]
    candidate.runtime_seconds = result["runtime_seconds"]
    candidate.trials = {**candidate.trials, str(step.round): result["trials"]}
    candidate.state = "alive"
    candidate.save()
    _candidate_event(candidate, f"round {step.round}: score {candidate.score:g} ± {candidate.spread:g}")


def _refinement_apply(step: Any, candidate: Any, result: dict) -> None:
    if "eliminated" in result:
        _refinement_kept(candidate, step, result["eliminated"])
        return
    candidate.state = "evaluating"
    if result["patch_sha256"] == candidate.patch_sha256:
        candidate.save(update_fields=["state", "updated_at"])
        _candidate_event(candidate, f"round {step.round}: its writer kept its patch")
        return
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
                if step.refines:
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

    _require(user, roles.OPERATE)
    _require_member(user, project)
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
    if preset is None or preset.kind == "command":
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

MAX_COMMENT_CHARS = 10_000


def _user_name(user: Any) -> str:
    return user.get_username()


def comment_add(user: Any, candidate: Any, body: str, path: str = "", line: int | None = None) -> Any:
    """A project member's comment on a candidate, optionally on one file (and line) of its patch."""
    from search_app.models import Comment

    _require_member(user, candidate.search.project)
    body = (body or "").strip()
    errors = {}
    if not body:
        errors["body"] = "Write something."
    elif len(body) > MAX_COMMENT_CHARS:
        errors["body"] = f"Keep a comment under {MAX_COMMENT_CHARS:,} characters ({len(body):,} now)."
    path = (path or "").strip()
    if path and path not in (candidate.files or []):
        errors["path"] = f"{path!r} is not a file this candidate's patch changes."
    if line is not None and not path:
        errors["line"] = "A line needs a file."
    elif line is not None and not 1 <= line <= 10_000_000:
        errors["line"] = "Give a line number from 1."
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        comment = Comment.objects.create(candidate=candidate, author=user, author_name=_user_name(user),
                                         path=path, line=line, body=body)
        where = f" on {path}" + (f":{line}" if line else "") if path else ""
        _search_event(candidate.search, "candidate.comment",
                      f"{_user_name(user)} commented on {candidate.candidate_id}{where}",
                      candidate_id=candidate.candidate_id)
    return comment


def _winner_of(search: Search) -> Any:
    from search_app.models import SearchRun

    run = SearchRun.objects.filter(search=search).select_related("winner").first()
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
    from django.conf import settings

    from search_app.models import Approval, Merge
    from search_app.selectors import approval_state, winner_replay

    search = candidate.search
    _require(user, roles.APPROVE)
    _require_member(user, search.project)
    if decision not in dict(Approval.DECISIONS):
        raise ValidationError({"decision": "Choose approve or request changes."})
    if len(note or "") > MAX_COMMENT_CHARS:
        raise ValidationError({"note": f"Keep the note under {MAX_COMMENT_CHARS:,} characters."})
    with transaction.atomic():
        winner = _winner_of(search)
        candidate = type(candidate).objects.select_for_update().get(pk=candidate.pk)
        if candidate.pk != winner.pk:
            raise ValidationError(f"{candidate.candidate_id} is not this search's winner "
                                  f"({winner.candidate_id}); only the winner is approved or merged.")
        if Merge.objects.filter(search=search).exists():
            raise ValidationError("This winner is merged already.")
        if patch_sha256 != candidate.patch_sha256:
            raise ValidationError({"patch_sha256": "The patch changed since you looked "
                                   f"(now {candidate.patch_sha256[:12]}): read it again, then decide."})
        if decision == "approve" and not settings.CONFIG.self_approval and search.created_by_id == user.pk:
            raise ValidationError("You froze this search, so someone else must approve its winner "
                                  "(an administrator can allow it with CRUCIBLE_SELF_APPROVAL=true).")
        standing = approval_state(candidate)["decisions"].get(user.pk)
        if standing is not None and standing.decision == decision and not standing.stale:
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
        _search_event(search, f"approval.{decision}", f"{_user_name(user)} {verb} {candidate.candidate_id} "
                      f"(patch {patch_sha256[:12]})", candidate_id=candidate.candidate_id)
    return approval


def merge_branch_default(search: Search) -> str:
    return f"crucible/{search.search_id}"


def merge_create(user: Any, search: Search, target: str = "new_branch", branch: str = "") -> Any:
    """Commit the approved winner's patch onto the baseline: on a new branch (default
    `crucible/<search-id>`) or on an existing branch that still points at the baseline.

    Needs the approver role and enough standing approvals; one merge per search; never pushes.
    """
    from datetime import UTC, datetime
    from time import monotonic

    from runtime_app.models import Receipt
    from runtime_app.services import receipt_record
    from search_app.models import Merge
    from search_app.selectors import approval_state

    _require(user, roles.APPROVE)
    _require_member(user, search.project)
    if target not in dict(Merge.TARGETS):
        raise ValidationError({"target": "Choose a new branch or an existing branch."})
    branch = (branch or "").strip() or (merge_branch_default(search) if target == "new_branch" else "")
    if not branch:
        raise ValidationError({"branch": "Name the existing branch to commit on."})
    with transaction.atomic():
        from search_app.models import SearchRun

        SearchRun.objects.select_for_update().get(search=search)  # one merge decision at a time
        if Merge.objects.filter(search=search).exists():
            raise ValidationError(f"Merged already: {search.merge.branch} @ {search.merge.commit_sha[:12]}.")
        winner = _winner_of(search)
        state = approval_state(winner)
        if not state["mergeable"]:
            raise ValidationError(state["blocker"])
        approvers = ", ".join(sorted({a.user_name for a in state["standing_approvals"]}))
        started_at, started = datetime.now(UTC), monotonic()
        # A merge whose commit was made but whose row was not (a crash between the two) is adopted.
        commit = _earlier_merge_commit(search, winner, branch)
        adopted = commit is not None
        if not adopted:
            commit = _merge_commit(search, winner, branch, target, user, approvers)
        receipt = receipt_record(Receipt(
            kind="merge", argv=["crucible", "merge", branch], cwd=".", started_at=started_at,
            finished_at=datetime.now(UTC), duration_seconds=round(monotonic() - started, 6), exit_code=0,
            detail={"branch": branch, "target": target, "commit": commit, "baseline": search.baseline_commit,
                    "patch_sha256": winner.patch_sha256, "approved_by": approvers, "pushed": False,
                    "adopted": adopted},
        ), project=search.project, subject=("candidate", winner.pk), label=f"{winner.candidate_id} merge")
        merge = Merge.objects.create(
            search=search, candidate=winner, target=target, branch=branch, commit_sha=commit,
            patch_sha256=winner.patch_sha256, merged_by=user, merged_by_name=_user_name(user),
            receipt=receipt)
        audit_record(user, "merge.create", project=search.project, target=f"{search.search_id} → {branch}",
                     detail={"commit": commit, "candidate": winner.candidate_id,
                             "patch_sha256": winner.patch_sha256})
        _search_event(search, "search.merged", f"{winner.candidate_id} merged onto {branch} as {commit[:12]} "
                      f"by {_user_name(user)} (not pushed)", candidate_id=winner.candidate_id)
    return merge


def _merge_commit(search: Search, winner: Any, branch: str, target: str, user: Any, approvers: str) -> str:
    """The winner's patch on a clean baseline, committed with dulwich onto `branch`."""
    from time import monotonic

    from runtime_app.git import GitError, commit_create
    from runtime_app.worktrees import patch_apply, worktree_remove

    # No repo lock here: worktree creation takes it, and the branch moves by compare-and-set.
    if target == "new_branch" and _branch_exists(search.repository_path, branch):
        raise ValidationError({"branch": f"Branch {branch} exists already; choose another name."})
    if target == "existing_branch":
        _branch_at_baseline(search, branch)
    worktree = None
    try:
        worktree = patch_apply(search.repository_path, search.baseline_commit, bytes(winner.patch),
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
