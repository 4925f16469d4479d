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
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth import get_user_model
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
from evolve_app.loop import (
    CycleResult,
    EvolutionResult,
    EvolveConfig,
    Evolver,
    evolution_files_record,
)
from evolve_app.models import Agent, Cycle, EvolutionRun, ObservationRecord
from evolve_app.selectors import files_unused
from evolve_app.workspace import (
    ImportPreview,
    Problem,
    WorkspaceError,
    WorkspaceInvalid,
    copy_slug,
    workspace_check,
    workspace_copy,
    workspace_copy_problem,
    workspace_git,
    workspace_import,
    workspace_manifest,
    workspace_preview,
    workspace_restore,
    workspace_rollback,
    workspace_snapshot,
)
from runtime_app import access
from runtime_app.git import GitError
from runtime_app.models import Project, ProjectMembership
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
                                  "shows it), check or edit it, then import with it (API: `infer: true` or "
                                  "`manifest`; CLI: --accept-inferred or --manifest FILE). It is written "
                                  "into Crucible's copy only, never into the folder."})


def agent_import(user: User, project: Project, path: str, name: str = "", *,
                 manifest: str | None = None, infer: bool = False, trusted: bool = False) -> Agent:
    """Import a workspace folder as an agent, by copying it: `Agent.path` is Crucible's own copy
    (DATA_DIR/agents/<slug>-<n>/, its git history kept), `Agent.source_path` the folder, which
    is only read, never written. Every problem is reported with its file and line; the copy
    becomes a git repository if it is not one, its first commit tagged `evo-0`.

    A folder without manifest.yaml raises ManifestMissing unless `infer` (the manifest Crucible
    infers, `workspace_preview`) or `manifest` (the text of its import preview, as is or edited)
    gives one: it is written, with the prompt copied to prompts/system.md, into the copy only.
    The inferred manifest's reasoning and every file Crucible will not use (with the reason) are
    stored as `Agent.import_warnings`; they never refuse an import. A folder too big to copy is
    refused before anything is copied.

    The same folder imported again into the same project returns its agent, unchanged, with
    `agent.import_note` saying so (the copy is not refreshed); an agent's own copy returns it."""
    with _workspace_refusals():
        return _agent_import(user, project, path, name, manifest=manifest, infer=infer, trusted=trusted)


def _existing_agent(project: Project, resolved: Path) -> Agent | None:
    """The agent the folder already is (its copy, or an agent imported in place before copies
    existed), or the project's agent copied from it, with a note."""
    existing = Agent.objects.filter(path=str(resolved)).first()
    if existing is not None:
        if existing.project_id != project.pk:
            raise ValidationError({"path": "This workspace belongs to another project."})
        return existing
    copied = Agent.objects.filter(project=project, source_path=str(resolved)).order_by("pk").first()
    if copied is not None:
        copied.import_note = (f"{resolved} is already imported into {project.name} as agent {copied.name} "
                              f"(its copy {copied.path}); nothing was copied again, and changes made to the "
                              "folder since are not in the copy.")
    return copied


def _copy_target(slug: str) -> Path:
    """A new empty folder DATA_DIR/agents/<slug>-<n>, n the first number free (made atomically)."""
    folder = Path(settings.DATA_DIR) / "agents"
    folder.mkdir(parents=True, exist_ok=True)
    number = 1 + sum(1 for _ in folder.glob(f"{slug}-*"))
    while True:
        target = folder / f"{slug}-{number}"
        try:
            target.mkdir()
        except FileExistsError:
            number += 1
            continue
        return target


def _import_warnings(copy: Path, *, inferred: ImportPreview | None, edited: bool,
                     notes: list[Problem]) -> list[dict[str, str]]:
    """What the import found, to show with the agent: the inferred manifest and its reasoning,
    what was not copied, and each file Crucible will not use (a command agent's or an agent
    class's own program may read any file, so none is listed for those)."""
    warnings: list[dict[str, str]] = []
    if inferred is not None:
        how = ("as edited in its import preview" if edited
               else "as Crucible inferred it from the folder's files")
        warnings.append({"kind": "inferred", "path": "manifest.yaml", "message": (
            f"the folder has no manifest.yaml: its copy has one, {how} (agent type, evolvable layers, "
            "where the prompt is); check it in its files (Browse every file)")})
        warnings += [{"kind": "inferred", "path": "manifest.yaml", "message": note}
                     for note in inferred.notes]
    warnings += [{"kind": "not_copied", "path": note.path, "message": note.message} for note in notes]
    prompt_from = inferred.prompt_from if inferred is not None else None
    warnings += [{"kind": "unused", "path": problem.path, "message": problem.message}
                 for problem in files_unused(copy, prompt_from=prompt_from)]
    return warnings


def _agent_import(user: User, project: Project, path: str, name: str, *, manifest: str | None,
                  infer: bool, trusted: bool, fresh_slug: str = "") -> Agent:
    """`fresh_slug`: always a new copy named <slug>-<n> (never the existing agent), and when no
    `name` is given the agent is called "<slug> agent <n>" ("demo agent 3")."""
    access.require(user, access.OPERATOR, project)
    resolved = server_path_check(path, trusted=trusted, what="workspace")
    if not resolved.is_dir():
        raise ValidationError({"path": f"{resolved}: no such folder."})
    if not fresh_slug and (existing := _existing_agent(project, resolved)) is not None:
        return existing
    has_manifest = os.path.lexists(resolved / "manifest.yaml")
    inferred = None
    if not has_manifest:
        if manifest is None and not infer:
            raise ManifestMissing(resolved)
        inferred = workspace_preview(resolved)
    edited = inferred is not None and manifest is not None and manifest != inferred.manifest
    if inferred is not None and manifest is None:
        manifest = inferred.manifest
    problems, _ = workspace_check(resolved, manifest_text=manifest)
    if problems:
        raise ValidationError({"path": [str(problem) for problem in problems]})
    too_big = workspace_copy_problem(resolved)
    if too_big:
        raise ValidationError({"path": f"{resolved}: {too_big}. Nothing was copied."})
    copy = _copy_target(fresh_slug or copy_slug(resolved))
    try:
        notes = workspace_copy(resolved, copy)
        try:
            workspace_import(copy, manifest_text=manifest)
        except WorkspaceInvalid as error:  # changed since it was checked
            raise ValidationError({"path": [str(problem) for problem in error.problems]}) from None
        manifest_read = workspace_manifest(copy)
        warnings = _import_warnings(copy, inferred=inferred, edited=edited, notes=notes)
        with transaction.atomic():
            name = (name or "").strip()[:NAME_MAX_LENGTH]
            if fresh_slug and not name:
                name = f"{fresh_slug} agent {copy.name.rsplit('-', 1)[1]}"
            agent = Agent.objects.create(project=project, name=name or manifest_read.name,
                                         path=str(copy), source_path=str(resolved),
                                         agent_type=manifest_read.agent.type, import_warnings=warnings,
                                         created_by=user)
            detail = ""
            if inferred is not None:
                detail = " with the manifest of its import preview" + (", edited" if edited else "")
            audit_record(user, "agent.import", project=project,
                         target=f"{agent.name} {resolved} → {copy}{detail}")
            _agent_event(agent, "agent.imported", f"agent {agent.name} imported from {resolved}{detail}")
    except BaseException:
        shutil.rmtree(copy, ignore_errors=True)
        raise
    return agent


def demo_agent_create(user: User, project: Project) -> Agent:
    """A fresh copy of the offline demo workspace in the data dir, imported as an agent (the
    same copy as any import; every call makes a new one)."""
    with _workspace_refusals():
        return _agent_import(user, project, str(SEED_WORKSPACE), "", manifest=None, infer=False,
                             trusted=True, fresh_slug="demo")


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
        # The run records the convergence rule it uses: the one named, else the agent's default
        # ("a-evolve" for an A-Evolve agent).
        settings.convergence = settings.convergence_for(agent.path)
    except PydanticError as error:
        errors["config"] = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        settings = None
    except (ValueError, OSError) as error:  # a window the agent's default rule cannot use
        errors["config"] = str(error)
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
    # A script-driven run's agent, benchmark and engine live in its script: never a worker's.
    return bool(EvolutionRun.objects.filter(pk=run_pk, driver=EvolutionRun.Driver.WORKER).filter(
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
    MAX_ATTEMPTS workers fails with the reason. A script-driven run whose lease passed fails
    (the script that drove it stopped); a queued one waits for its script to call run() again."""
    now = timezone.now()
    orphaned = EvolutionRun.objects.filter(
        Q(status=RunStatus.RUNNING, lease_expires_at__lt=now)
        | Q(status=RunStatus.QUEUED) & (Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=now - _lease()))
    ).select_related("agent__project")
    again = []
    for run in orphaned:
        if run.driver == EvolutionRun.Driver.SCRIPT:
            _script_run_lost(run, now)  # no worker can rebuild a script's objects
            continue
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
        _run_failed(run, error)
        return run
    _run_conclude(run, result)
    return run


def _run_failed(run: EvolutionRun, error: Exception) -> None:
    """The loop raised: the run fails with the error as its reason, and says so."""
    logger.exception("evolution run %s failed", run.pk)
    EvolutionRun.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, finished_at=timezone.now(),
                                                  reason=f"{type(error).__name__}: {error}")
    run.refresh_from_db()
    _agent_event(run.agent, "evolution.failed", f"{run.agent.name}: run {run.number} failed: {error}",
                 run=run.pk)


def _run_conclude(run: EvolutionRun, result: EvolutionResult | None) -> None:
    """After the loop returned: a run not cancelled meanwhile waits for review or is finished (by
    convergence, the engine's stop or its cycles), and says so."""
    run.refresh_from_db()
    if run.status == RunStatus.CANCELLED:
        return
    if result is not None and result.paused_for_review:
        # No lease while a person decides: a script's run is not handed on meanwhile.
        run.status, run.reason, run.lease_expires_at = RunStatus.AWAITING_REVIEW, result.reason, None
        run.save(update_fields=["status", "reason", "lease_expires_at"])
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
    _agent_event(run.agent, f"evolution.{run.status}",
                 f"{run.agent.name}: run {run.number} {run.status}: {run.reason}", run=run.pk)


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
        else:
            # evo-N (or the commit undoing it) holds the files as before the cycle: its message
            # and the cycle's summary say so; the engine's own summary stays in its metadata.
            metadata = dict(cycle.engine_metadata or {})
            metadata.setdefault("engine_summary", cycle.summary)
            cycle.engine_metadata = metadata
            who = user.get_username()
            if made:
                cycle.post_commit = workspace_rollback(path, f"pre-evo-{number}", force=True)
                cycle.reason = f"rejected by {who} in review (a new commit undid evo-{number})"
                cycle.summary = f"rejected by {who} in review; a new commit undid evo-{number}"
            else:
                cycle.reason = f"rejected by {who} in review"
                cycle.summary = f"rejected by {who} in review; the engine's change was not committed"
                workspace_restore(path, f"pre-evo-{number}")
                message = f"Cycle {number}: {cycle.summary}"
                cycle.post_commit = workspace_snapshot(path, f"evo-{number}", message)
            cycle.status, cycle.mutated = CycleStatus.REJECTED, False
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
        if run.driver != EvolutionRun.Driver.SCRIPT:  # a script goes on when it calls run() again
            _run_enqueue(run)
    # Decided: its line in evolution/history.jsonl and the metrics, as the loop writes them.
    train = [o.score for o in cycle.observations.filter(split=Split.TRAIN).order_by("id")]
    evolution_files_record(path, number, sum(train) / len(train) if train else 0.0, cycle.mutated)
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


# ---- runs driven by a Python script (crucible.aevolve: an A-Evolve script under Crucible)

SCRIPT_LOST = "the script that drove it stopped"
AEVOLVE_USERNAME = "aevolve"  # the local account an A-Evolve script acts as when there is no other


def _script_run_lost(run: EvolutionRun, now: Any) -> None:
    """A running script-driven run whose lease passed fails: its script (the only process that
    holds its agent, benchmark and engine) stopped. A queued one waits for its script."""
    if run.status != RunStatus.RUNNING:
        return
    if EvolutionRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING, lease_expires_at__lt=now).update(
            status=RunStatus.FAILED, finished_at=now, reason=SCRIPT_LOST):
        _agent_event(run.agent, "evolution.failed",
                     f"{run.agent.name}: run {run.number} failed: {SCRIPT_LOST}", run=run.pk)


def script_actor_get(username: str = "", project_name: str = "") -> tuple[User, Project]:
    """Who an A-Evolve script acts as, and in which project: the account `username`
    (CRUCIBLE_AEVOLVE_USER; it must exist), else the admin account (CRUCIBLE_ADMIN_USERNAME),
    else the first superuser, else a local `aevolve` account (made once, no password: it cannot
    sign in). The project `project_name` (CRUCIBLE_AEVOLVE_PROJECT, default `a-evolve`) is made
    if missing, the account its admin; an existing one must let the account operate in it.
    A script with the database's credentials is the local administrator, as the CLI is."""
    users = get_user_model().objects
    if username:
        user = users.filter(username=username).first()
        if user is None:
            raise ValidationError({"user": f"no user named {username!r} (CRUCIBLE_AEVOLVE_USER): give an "
                                           "existing account, or unset it to use the admin account"})
    else:
        user = (users.filter(username=settings.CONFIG.admin_username, is_active=True).first()
                or users.filter(is_superuser=True, is_active=True).order_by("pk").first())
        if user is None:
            user, made = users.get_or_create(username=AEVOLVE_USERNAME)
            if made:
                user.set_unusable_password()
                user.save(update_fields=["password"])
    name = (project_name or "a-evolve").strip()
    project = Project.objects.filter(name__iexact=name).first()
    if project is None:
        with transaction.atomic():
            project = Project.objects.create(
                name=name[:NAME_MAX_LENGTH], created_by=user,
                description="Runs started by A-Evolve scripts (crucible.aevolve).")
            ProjectMembership.objects.create(project=project, user=user, role=access.ADMIN)
            audit_record(user, "project.create", project=project, target=project.name,
                         detail={"by": "crucible.aevolve"})
    try:
        access.require(user, access.OPERATOR, project)
    except Exception:
        raise ValidationError({"project": f"{user.get_username()} may not run evolutions in project "
                                          f"{project.name!r}: make them an operator there, or set "
                                          "CRUCIBLE_AEVOLVE_USER / CRUCIBLE_AEVOLVE_PROJECT"}) from None
    return user, project


def evolution_run_script(user: User, agent: Agent, *, solver: Any, benchmark: Any, engine: Any,
                         config: EvolveConfig, cycles: int, labels: dict[str, str],
                         run: EvolutionRun | None = None,
                         on_cycle: Callable[[CycleResult], object] | None = None,
                         ) -> tuple[EvolutionRun, EvolutionResult | None]:
    """Run an evolution in this process for a Python script (crucible.aevolve), recorded as any
    run is: an EvolutionRun with driver `script` (trusted: the script is the local
    administrator), its cycles written through cycle_record as they are decided (pages and
    events live), its lease renewed while it works (a script that stops leaves a run the
    reconciler fails). `solver` is the agent object or the workspace path, `benchmark` and
    `engine` made objects, `labels` what the run's page shows for them ({"benchmark", "engine"}).

    Without `run`, a new run of `cycles` cycles; with one (the same script going on after a
    review), its remaining cycles once an approver decided. A cycle awaiting review ends the
    call with the run awaiting review. Returns the run and the loop's result (None when nothing
    ran: the run still awaits review, or had already ended)."""
    access.require(user, access.OPERATOR, agent.project)
    owner = f"script:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    now = timezone.now()
    if run is None:
        if not isinstance(cycles, int) or not 1 <= cycles <= 200:
            raise ValidationError({"cycles": "Give 1 to 200 cycles."})
        with transaction.atomic():
            type(agent).objects.select_for_update().filter(pk=agent.pk).first()
            active = EvolutionRun.objects.select_for_update().filter(agent=agent,
                                                                     status__in=EvolutionRun.ACTIVE)
            busy = active.first()
            if busy is not None:
                raise ValidationError(f"{agent.name} already has a run in progress (run {busy.number}, "
                                      f"{busy.get_status_display()}, {busy.get_absolute_url()}): cancel it "
                                      "on its page, or let it end first.")
            number = (EvolutionRun.objects.filter(agent=agent).aggregate(last=Max("number"))["last"] or 0) + 1
            run = EvolutionRun.objects.create(
                agent=agent, number=number, benchmark=labels.get("benchmark", "")[:500],
                engine=labels.get("engine", "")[:200], started_by=user, config=config.model_dump(),
                agent_mapping=agent_mapping(agent.path), cycles_planned=cycles, trusted=True,
                driver=EvolutionRun.Driver.SCRIPT, status=RunStatus.RUNNING, lease_owner=owner,
                lease_expires_at=now + _lease(), attempts=1)
            audit_record(user, "evolution.start", project=agent.project,
                         target=f"{agent.name} run {run.number}",
                         detail={"benchmark": run.benchmark, "engine": run.engine, "cycles": cycles,
                                 "driver": "script"})
    elif not EvolutionRun.objects.filter(pk=run.pk, driver=EvolutionRun.Driver.SCRIPT,
                                         status=RunStatus.QUEUED).update(
            status=RunStatus.RUNNING, lease_owner=owner, lease_expires_at=now + _lease(),
            attempts=F("attempts") + 1):
        run.refresh_from_db()
        return run, None  # still awaiting review, cancelled or ended: nothing to go on with
    stop = threading.Event()
    keeper = threading.Thread(target=_lease_keep, args=(run.pk, owner, stop), daemon=True)
    keeper.start()
    try:
        return _script_run_execute(run, solver, benchmark, engine, config, on_cycle)
    finally:
        stop.set()
        keeper.join()


def _script_run_execute(run: EvolutionRun, solver: Any, benchmark: Any, engine: Any, config: EvolveConfig,
                        on_cycle: Callable[[CycleResult], object] | None,
                        ) -> tuple[EvolutionRun, EvolutionResult | None]:
    agent = run.agent
    remaining = run.cycles_planned - Cycle.objects.filter(run=run).count()
    _agent_event(agent, "evolution.running", f"{agent.name}: run {run.number} running from a script, "
                 f"{remaining} cycles to go", run=run.pk)

    def recorded(result: CycleResult) -> None:
        cycle_record(run, result)
        if on_cycle is not None:
            on_cycle(result)

    def cancelled() -> bool:
        return EvolutionRun.objects.filter(pk=run.pk, status=RunStatus.CANCELLED).exists()

    try:
        evolver = Evolver(solver, benchmark, config, engine=engine, trusted=True, on_cycle=recorded,
                          should_stop=cancelled)
        result = evolver.run(cycles=remaining) if remaining > 0 else None
    except KeyboardInterrupt:  # Ctrl-C in the script: the run ends now, not when its lease passes
        EvolutionRun.objects.filter(pk=run.pk, status__in=EvolutionRun.ACTIVE).update(
            status=RunStatus.CANCELLED, finished_at=timezone.now(),
            reason="the script that drove it was interrupted")
        _agent_event(agent, "evolution.cancelled",
                     f"{agent.name}: run {run.number} cancelled: its script was interrupted", run=run.pk)
        raise
    except Exception as error:
        _run_failed(run, error)
        raise
    _run_conclude(run, result)
    return run, result


def script_agent_import(user: User, project: Project, source: Path, name: str = "") -> Agent:
    """The agent an A-Evolve script evolves from the folder `source`: Crucible's own copy of it in
    the data dir (never written into the user's folder), made once and used again by later runs
    of the same folder (as A-Evolve reuses its work_dir copy). A folder without manifest.yaml gets
    the manifest Crucible infers, written into the copy only."""
    return agent_import(user, project, str(source.expanduser().resolve()), name, trusted=True, infer=True)
