"""Every write of evolve_app: importing agents, starting, running, deciding on and rolling back
evolution. Views, API, CLI and tasks all come through here."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import F, Max, Q
from django.utils import timezone
from pydantic import ValidationError as PydanticError

from evolve_app.agents import AgentError, agent_check, agent_mapping, agent_run_problems
from evolve_app.benchmarks import BenchmarkError, benchmark_check
from evolve_app.demo import SEED_WORKSPACE
from evolve_app.engines import EngineError, engine_check, engine_resolve
from evolve_app.history import EvolutionHistory
from evolve_app.loop import CycleResult, EvolveConfig, Evolver
from evolve_app.models import Agent, Cycle, EvolutionRun, ObservationRecord
from evolve_app.workspace import (
    WorkspaceError,
    WorkspaceInvalid,
    workspace_check,
    workspace_git,
    workspace_import,
    workspace_manifest,
    workspace_restore,
    workspace_rollback,
    workspace_snapshot,
)
from runtime_app import access
from runtime_app.git import GitError
from runtime_app.models import Project
from runtime_app.presenters import NAME_MAX_LENGTH, short_sha
from runtime_app.queue import task_send
from runtime_app.services import audit_record, event_emit, server_path_check

if TYPE_CHECKING:
    from django.contrib.auth.models import User

logger = logging.getLogger(__name__)
RunStatus, CycleStatus, Split = EvolutionRun.Status, Cycle.Status, ObservationRecord.Split
# A run whose worker died this many times fails instead of being handed on again.
MAX_ATTEMPTS = 3


@contextlib.contextmanager
def _workspace_refusals() -> Iterator[None]:
    """A workspace the services could not read or write (a folder gone, a tag that exists) is the
    caller's to read: the same message as a ValidationError, so a page, the API (400) and the CLI
    show it as they show any refusal."""
    try:
        yield
    except (WorkspaceError, OSError) as error:
        raise ValidationError(str(error)) from None


def _agent_event(agent: Agent, kind: str, message: str, **payload: Any) -> None:
    event_emit(agent.project, "agent", agent.pk, kind, {"message": message, **payload})


class ManifestMissing(ValidationError):
    """The folder has no manifest.yaml and no `manifest` was given: the caller offers the
    import preview (`selectors.import_preview`) instead of a refusal."""

    def __init__(self, path: Path):
        self.path = path
        super().__init__({"path": f"{path} has no manifest.yaml: preview the manifest Crucible infers from "
                                  "its files (web: Import; API: POST /api/agents/preview; CLI: evolve import "
                                  "shows it), check or edit it, then import with it."})


def agent_import(user: User, project: Project, path: str, name: str = "", *,
                 manifest: str | None = None, trusted: bool = False) -> Agent:
    """Import a workspace folder as an agent: every problem is reported with its file and line;
    a folder that is not a git repository becomes one, its first commit tagged `evo-0`.

    A folder without manifest.yaml raises ManifestMissing unless `manifest` gives the text of
    its confirmed (or edited) import preview: it is checked like any manifest, and written (with
    the prompt copied to prompts/system.md) only when everything checks; if anything fails the
    folder is left as it was. Unknown manifest keys never refuse an import: read them with
    `selectors.agent_manifest` (`manifest_warnings`)."""
    with _workspace_refusals():
        return _agent_import(user, project, path, name, manifest=manifest, trusted=trusted)


def _agent_import(user: User, project: Project, path: str, name: str, *, manifest: str | None,
                  trusted: bool) -> Agent:
    access.require(user, access.OPERATOR, project)
    resolved = server_path_check(path, trusted=trusted, what="workspace")
    if not resolved.is_dir():
        raise ValidationError({"path": f"{resolved}: no such folder."})
    if manifest is None and not os.path.lexists(resolved / "manifest.yaml"):
        raise ManifestMissing(resolved)
    problems, _ = workspace_check(resolved, manifest_text=manifest)
    if problems:
        raise ValidationError({"path": [str(problem) for problem in problems]})
    existing = Agent.objects.filter(path=str(resolved)).first()
    if existing is not None:
        if existing.project_id != project.pk:
            raise ValidationError({"path": "This workspace belongs to another project."})
        return existing
    try:
        workspace_import(resolved, manifest_text=manifest)
    except WorkspaceInvalid as error:  # changed since it was checked
        raise ValidationError({"path": [str(problem) for problem in error.problems]}) from None
    manifest_read = workspace_manifest(resolved)
    with transaction.atomic():
        agent = Agent.objects.create(project=project,
                                     name=(name or "").strip()[:NAME_MAX_LENGTH] or manifest_read.name,
                                     path=str(resolved), agent_type=manifest_read.agent.type, created_by=user)
        detail = " with the manifest of its import preview" if manifest is not None else ""
        audit_record(user, "agent.import", project=project, target=f"{agent.name} {resolved}{detail}")
        _agent_event(agent, "agent.imported", f"agent {agent.name} imported from {resolved}{detail}")
    return agent


def demo_agent_create(user: User, project: Project) -> Agent:
    """A fresh copy of the offline demo workspace in the data dir, imported as an agent."""
    access.require(user, access.OPERATOR, project)  # before anything is copied
    folder = Path(settings.DATA_DIR) / "agents"
    folder.mkdir(parents=True, exist_ok=True)
    number = 1 + sum(1 for _ in folder.glob("demo-*"))
    target = folder / f"demo-{number}"
    while target.exists():
        number += 1
        target = folder / f"demo-{number}"
    shutil.copytree(SEED_WORKSPACE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return agent_import(user, project, str(target), name=f"demo agent {number}", trusted=True)


def evolution_run_start(user: User, agent: Agent, *, benchmark: str = "demo",
                        engine: str = "textbook", cycles: int = 5, config: dict[str, Any] | None = None,
                        enqueue: bool = True, trusted: bool = False) -> EvolutionRun:
    """Check the benchmark, engine, the workspace's agent type and the settings, then queue the
    run (one at a time per agent), recording what the agent runs as (agent_mapping).

    What a run could not honour is refused here, each problem named: a benchmark's requirement
    this host lacks, an agent class nobody allowed, a reference agent without a model provider,
    a model or a key, an A-Evolve agent none of whose tools can run (agents.agent_run_problems).

    The check is by name, never by importing or making anything (evolve_app/extensions.py):
    the web and API may name what is registered, paths under CRUCIBLE_REPO_ROOTS and the dotted
    paths of CRUCIBLE_ALLOWED_EXTENSIONS; `trusted` (the local administrator's CLI) may name
    any path or dotted path. The run keeps its trust, and the worker checks again with it."""
    access.require(user, access.OPERATOR, agent.project)
    errors: dict[str, str] = {}
    if not isinstance(cycles, int) or not 1 <= cycles <= 200:
        errors["cycles"] = "Give 1 to 200 cycles."
    try:
        settings = EvolveConfig(**(config or {}))
    except PydanticError as error:
        errors["config"] = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        settings = None
    try:
        benchmark_check(benchmark, trusted=trusted)
    except BenchmarkError as error:
        errors["benchmark"] = str(error)
    try:
        engine_check(engine, settings.engine_options if settings else {}, trusted=trusted)
    except EngineError as error:
        errors["engine"] = str(error)
    try:
        agent_check(agent.path, trusted=trusted)
        problems = agent_run_problems(agent.path)
    except (AgentError, OSError) as error:
        errors["agent"] = str(error)
    else:
        if problems:
            errors["agent"] = f"{agent.name} cannot run: " + "; ".join(problems)
    if errors:
        raise ValidationError(errors)
    assert settings is not None  # a config that does not validate is an error above
    requested = engine
    engine, engine_note = engine_resolve(engine)  # A-Evolve's class by its path: Crucible's adapter of it
    with transaction.atomic():
        # The agent's row is the lock: two starts at once cannot both see no run, or one number.
        type(agent).objects.select_for_update().filter(pk=agent.pk).first()
        active = EvolutionRun.objects.select_for_update().filter(agent=agent, status__in=EvolutionRun.ACTIVE)
        if active.exists():
            raise ValidationError("This agent already has a run in progress.")
        number = (EvolutionRun.objects.filter(agent=agent).aggregate(last=Max("number"))["last"] or 0) + 1
        run = EvolutionRun.objects.create(agent=agent, number=number, benchmark=benchmark, engine=engine,
                                          started_by=user, config=settings.model_dump(),
                                          agent_mapping=agent_mapping(agent.path),
                                          cycles_planned=cycles, trusted=trusted)
        resolved = {"engine_requested": requested, "engine_note": engine_note} if engine_note else {}
        audit_record(user, "evolution.start", project=agent.project, target=f"{agent.name} run {run.number}",
                     detail={"benchmark": benchmark, "engine": engine, "cycles": cycles, "trusted": trusted,
                             **resolved})
        noted = f"; {engine_note}" if engine_note else ""
        _agent_event(agent, "evolution.queued", f"{agent.name}: run {run.number} queued ({cycles} cycles, "
                     f"{engine} on {benchmark}{noted})", run=run.pk)
        if enqueue:
            _run_enqueue(run)
    return run


def _lease() -> timedelta:
    return timedelta(seconds=settings.CONFIG.step_lease_seconds)


def _run_enqueue(run: EvolutionRun) -> None:
    """Hand the run to the broker once the caller's transaction commits (queued by name: the
    tasks module imports this one)."""
    EvolutionRun.objects.filter(pk=run.pk).update(enqueued_at=timezone.now())
    transaction.on_commit(lambda: task_send("evolve_app.tasks.evolution_run", run.pk))


def evolution_run_claim(run_pk: int, owner: str) -> bool:
    """Take a queued run, or a running one whose worker's lease has passed, by compare-and-set."""
    now = timezone.now()
    return bool(EvolutionRun.objects.filter(pk=run_pk).filter(
        Q(status=RunStatus.QUEUED) | Q(status=RunStatus.RUNNING, lease_expires_at__isnull=True)
        | Q(status=RunStatus.RUNNING, lease_expires_at__lt=now)
    ).update(status=RunStatus.RUNNING, lease_owner=owner, lease_expires_at=now + _lease(),
             attempts=F("attempts") + 1))


def _lease_keep(run_pk: int, owner: str, stop: threading.Event) -> None:
    """Renew the lease while the run works, so the reconciler leaves it to this worker."""
    every = max(_lease().total_seconds() / 6, 0.5)
    try:
        while not stop.wait(every):
            EvolutionRun.objects.filter(pk=run_pk, status=RunStatus.RUNNING, lease_owner=owner).update(
                lease_expires_at=timezone.now() + _lease())
    finally:
        connection.close()


def evolution_runs_reconcile() -> list[int]:
    """Beat: runs to hand to a worker again — running ones whose lease passed (their worker
    died) and queued ones whose message has waited a whole lease (lost); a run that lost
    MAX_ATTEMPTS workers fails with the reason."""
    now = timezone.now()
    orphaned = EvolutionRun.objects.filter(
        Q(status=RunStatus.RUNNING, lease_expires_at__lt=now)
        | Q(status=RunStatus.QUEUED) & (Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=now - _lease()))
    ).select_related("agent__project")
    again = []
    for run in orphaned:
        if run.status == RunStatus.RUNNING and run.attempts >= MAX_ATTEMPTS:
            reason = f"its worker was lost {run.attempts} times; start it again once the workers are healthy"
            if EvolutionRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING,
                                           lease_expires_at__lt=now).update(
                    status=RunStatus.FAILED, finished_at=now, reason=reason):
                _agent_event(run.agent, "evolution.failed",
                             f"{run.agent.name}: run {run.number} failed: {reason}", run=run.pk)
            continue
        if EvolutionRun.objects.filter(pk=run.pk).filter(
                Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=now - _lease())).update(enqueued_at=now):
            again.append(run.pk)
    return again


def evolution_run_execute(run_pk: int, owner: str = "") -> EvolutionRun:
    """Run (or go on with) an evolution run in this process until it ends, converges, is
    cancelled, or a mutation waits for review. A run another live worker holds is left to it."""
    owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    if not evolution_run_claim(run_pk, owner):
        return EvolutionRun.objects.select_related("agent__project").get(pk=run_pk)
    stop = threading.Event()
    keeper = threading.Thread(target=_lease_keep, args=(run_pk, owner, stop), daemon=True)
    keeper.start()
    try:
        return _run_execute(EvolutionRun.objects.select_related("agent__project").get(pk=run_pk))
    finally:
        stop.set()
        keeper.join()


def _run_execute(run: EvolutionRun) -> EvolutionRun:
    agent = run.agent
    remaining = run.cycles_planned - Cycle.objects.filter(run=run).count()
    _agent_event(agent, "evolution.running",
                 f"{agent.name}: run {run.number} running, {remaining} cycles to go", run=run.pk)

    def cancelled() -> bool:
        return EvolutionRun.objects.filter(pk=run.pk, status=RunStatus.CANCELLED).exists()

    try:
        evolver = Evolver(agent.path, run.benchmark, run.config, engine=run.engine, trusted=run.trusted,
                          on_cycle=lambda result: cycle_record(run, result), should_stop=cancelled)
        result = evolver.run(cycles=remaining) if remaining > 0 else None
    except Exception as error:
        logger.exception("evolution run %s failed", run.pk)
        EvolutionRun.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, finished_at=timezone.now(),
                                                      reason=f"{type(error).__name__}: {error}")
        run.refresh_from_db()
        _agent_event(agent, "evolution.failed", f"{agent.name}: run {run.number} failed: {error}", run=run.pk)
        return run
    run.refresh_from_db()
    if run.status == RunStatus.CANCELLED:
        return run
    if result is not None and result.paused_for_review:
        run.status, run.reason = RunStatus.AWAITING_REVIEW, result.reason
        run.save(update_fields=["status", "reason"])
    else:
        run.status, run.finished_at = RunStatus.FINISHED, timezone.now()
        run.converged = bool(result and result.converged)
        # Counted over the whole run: a run resumed after a review ran only its last cycles here.
        done = Cycle.objects.filter(run=run).count()
        if result is not None and (result.converged or result.stopped):
            run.reason = result.reason
        else:
            run.reason = f"{done} cycle{'s' if done != 1 else ''} done"
        run.save(update_fields=["status", "finished_at", "converged", "reason"])
    _agent_event(agent, f"evolution.{run.status}",
                 f"{agent.name}: run {run.number} {run.status}: {run.reason}", run=run.pk)
    return run


def cycle_record(run: EvolutionRun, result: CycleResult) -> Cycle:
    """Write a decided cycle and its observations in the database, and announce it (the loop
    wrote the cycle's JSONL batch before its engine ran: evolve_app.loop.observations_write)."""
    fields = {name: getattr(result, name) for name in (
        "score", "holdout_score", "holdout_after", "mutated", "status", "summary", "engine_metadata",
        "skills_added", "skills_modified", "skills_deleted", "prompt_size_change", "reverted_paths",
        "pre_commit", "post_commit", "reason")}
    fields["finished_at"] = None if result.status == CycleStatus.AWAITING_REVIEW else timezone.now()
    with transaction.atomic():
        cycle, _ = Cycle.objects.update_or_create(run=run, number=result.number, defaults=fields)
        if not cycle.observations.exists():
            ObservationRecord.objects.bulk_create(
                [ObservationRecord(cycle=cycle, split=Split.TRAIN, **o.as_record())
                 for o in result.observations]
                + [ObservationRecord(cycle=cycle, split=Split.HOLDOUT, **o.as_record())
                   for o in result.holdout_observations])
        score = "—" if result.score is None else f"{result.score:.3f}"
        _agent_event(run.agent, "cycle.recorded", f"{run.agent.name}: cycle {result.number} {result.status}, "
                     f"score {score}{': ' + result.summary if result.summary else ''}", run=run.pk,
                     cycle=result.number)
    return cycle


def cycle_decide(user: User, cycle: Cycle, approve: bool) -> Cycle:
    """Review mode: an approver accepts a waiting mutation (the run goes on) or rejects it (the
    workspace goes back to pre-evo-N). A workspace that cannot be read or written is a
    ValidationError with its message."""
    with _workspace_refusals():
        return _cycle_decide(user, cycle, approve)


def _cycle_decide(user: User, cycle: Cycle, approve: bool) -> Cycle:
    agent = cycle.run.agent
    access.require(user, access.APPROVER, agent.project)
    with transaction.atomic():
        cycle = Cycle.objects.select_for_update().select_related("run__agent").get(pk=cycle.pk)
        if cycle.status != CycleStatus.AWAITING_REVIEW:
            raise ValidationError(f"Cycle {cycle.number} is {cycle.get_status_display()}, "
                                  "not awaiting review.")
        path, number = Path(agent.path), cycle.number
        # A decision that failed after evo-N was made (its transaction rolled back) is decided
        # again on the same tag: a tag is never made twice.
        made = workspace_git(path, ["tag", "--list", f"evo-{number}"]).strip()
        if approve:
            tag = f"evo-{number}"
            if made:
                cycle.post_commit = workspace_git(path, ["rev-parse", f"{tag}^{{commit}}"]).decode().strip()
            else:
                cycle.post_commit = workspace_snapshot(path, tag, f"Cycle {number}: {cycle.summary}")
            try:
                changes = EvolutionHistory(path).layer_changes(f"pre-evo-{number}", f"evo-{number}")
            except (WorkspaceError, GitError) as error:  # the snapshot stands; only the summary is lost
                changes = {}
                cycle.reason = f"what cycle {number} changed could not be read: {error}"
            cycle.skills_added = changes.get("skills_added", [])
            cycle.skills_modified = changes.get("skills_modified", [])
            cycle.skills_deleted = changes.get("skills_deleted", [])
            cycle.prompt_size_change = changes.get("prompt_size_change", 0)
            cycle.status = CycleStatus.ACCEPTED
        elif made:
            cycle.post_commit = workspace_rollback(path, f"pre-evo-{number}", force=True)
            cycle.status, cycle.mutated = CycleStatus.REJECTED, False
            cycle.reason = f"rejected by {user.get_username()} in review (a new commit undid evo-{number})"
        else:
            workspace_restore(path, f"pre-evo-{number}")
            cycle.post_commit = workspace_snapshot(path, f"evo-{number}", f"Cycle {number}: rejected")
            cycle.status, cycle.mutated = CycleStatus.REJECTED, False
            cycle.reason = f"rejected by {user.get_username()} in review"
        cycle.decided_by, cycle.finished_at = user, timezone.now()
        cycle.save()
        run = cycle.run
        run.status = RunStatus.QUEUED
        run.save(update_fields=["status"])
        verb = "approved" if approve else "rejected"
        audit_record(user, f"evolution.cycle_{verb}", project=agent.project,
                     target=f"{agent.name} run {run.number} cycle {number}")
        _agent_event(agent, "cycle.decided", f"{agent.name}: cycle {number} {verb} by {user.get_username()}",
                     run=run.pk, cycle=number)
        _run_enqueue(run)
    return cycle


def evolution_run_cancel(user: User, run: EvolutionRun) -> EvolutionRun:
    access.require(user, access.OPERATOR, run.agent.project)
    with transaction.atomic():
        run = EvolutionRun.objects.select_for_update().get(pk=run.pk)
        if run.status not in EvolutionRun.ACTIVE:
            raise ValidationError(f"Run {run.number} is {run.get_status_display()}: nothing to cancel.")
        run.status, run.finished_at = RunStatus.CANCELLED, timezone.now()
        run.reason = f"cancelled by {user.get_username()}"
        run.save(update_fields=["status", "finished_at", "reason"])
        name = run.agent.name
        audit_record(user, "evolution.cancel", project=run.agent.project, target=f"{name} run {run.number}")
        _agent_event(run.agent, "evolution.cancelled", f"{name}: run {run.number} cancelled", run=run.pk)
    return run


def agent_rollback(user: User, agent: Agent, tag: str) -> str:
    """Make the workspace equal to `evo-K` again with a new commit (history is kept)."""
    access.require(user, access.APPROVER, agent.project)
    if not re.fullmatch(r"evo-\d{1,6}", tag or ""):
        raise ValidationError({"tag": "Roll back to a tag like evo-3."})
    if EvolutionRun.objects.filter(agent=agent, status__in=EvolutionRun.ACTIVE).exists():
        raise ValidationError("A run of this agent is in progress: cancel it or let it end first.")
    author = f"{user.get_username()} <{user.get_username()}@crucible.invalid>"
    try:
        sha = EvolutionHistory(agent.path).rollback(tag, author=author)
    except Exception as error:
        raise ValidationError({"tag": f"Cannot roll back to {tag}: {error}"}) from None
    audit_record(user, "agent.rollback", project=agent.project, target=f"{agent.name} → {tag}",
                 detail={"commit": sha})
    _agent_event(agent, "agent.rolled_back", f"{agent.name} rolled back to {tag} ({short_sha(sha)})", tag=tag,
                 commit=sha)
    return sha
