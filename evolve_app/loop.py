"""The evolution loop: `Evolver(agent, benchmark, config).run(cycles=N)`, usable without the web
server. Each cycle solves a batch (concurrently, bounded), evaluates it, snapshots `pre-evo-N`,
lets the engine mutate the workspace (with a trial runner), reverts edits outside
`evolvable_layers`, optionally gates the mutation on the holdout split, snapshots `evo-N`,
records the cycle, reloads the agent and checks convergence.

What upstream leaves undone is done here: convergence really uses `egl_threshold`, the
evolvable layers are enforced (and symlinks, special files and oversized files are reverted
wherever an engine writes them), a holdout gate can roll a mutation back, and a failed engine
or cycle leaves the workspace's files at `pre-evo-N` (HEAD agreeing) while the run goes on.

Each cycle's train observations are written, before the engine runs, as the JSONL batch
`evolution/observations/batch_<cycle>.jsonl` (A-Evolve's place and record format): by the
Python Evolver and by the services alike, and `EvolutionHistory.get_observations` reads them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import statistics
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evolve_app.agents import BaseAgent, agent_for
from evolve_app.benchmarks import DETAIL_CHARS, BenchmarkError, benchmark_adapt, benchmark_get, task_down
from evolve_app.engines import cycle_end_call, cycle_end_takes_score, engine_get
from evolve_app.history import EvolutionHistory
from evolve_app.models import Cycle
from evolve_app.types import Feedback, Observation, Task, Trajectory
from evolve_app.workspace import (
    EXCLUDED_DIR,
    LAYERS,
    MAX_FILE_BYTES,
    MAX_MEMORY_LINES,
    AgentWorkspace,
    workspace_changes,
    workspace_git,
    workspace_import,
    workspace_restore,
    workspace_rollback,
    workspace_size_problem,
    workspace_snapshot,
)
from evolve_app.workspace.snapshots import _empty_dirs_remove

logger = logging.getLogger(__name__)


class EvolveConfig(BaseModel):
    """How a run evolves; every field has a default a first run can use."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(default=12, ge=1, le=1000, description="train tasks solved per cycle")
    holdout_size: int = Field(default=0, ge=0, le=1000, description="holdout tasks; 0 turns the gate off")
    holdout_tolerance: float = Field(default=0.0, ge=0, le=1, description="largest holdout drop allowed")
    egl_threshold: float = Field(default=0.05, ge=0, le=1, description="converged when a window differs less")
    egl_window: int = Field(default=3, ge=2, le=100, description="cycles in the convergence window")
    concurrency: int = Field(default=4, ge=1, le=16, description="tasks solved at once")
    review_mode: bool = Field(default=False, description="each mutation waits for an approver")
    engine_options: dict[str, str | bool | int | float] = Field(
        default_factory=dict, description="the engine's own settings, e.g. {preset, model} for skillforge")


@dataclass
class CycleResult:
    number: int
    score: float | None = None
    holdout_score: float | None = None
    holdout_after: float | None = None
    mutated: bool = False
    status: str = Cycle.Status.ACCEPTED  # or REJECTED, FAILED, AWAITING_REVIEW
    summary: str = ""
    engine_metadata: dict[str, Any] = field(default_factory=dict)
    skills_added: list[str] = field(default_factory=list)
    skills_modified: list[str] = field(default_factory=list)
    skills_deleted: list[str] = field(default_factory=list)
    prompt_size_change: int = 0
    reverted_paths: list[str] = field(default_factory=list)
    pre_commit: str = ""
    post_commit: str = ""
    reason: str = ""
    observations: list[Observation] = field(default_factory=list)
    holdout_observations: list[Observation] = field(default_factory=list)
    stop: bool = False  # the engine asked to end the run after this cycle


@dataclass
class EvolutionResult:
    cycles: list[CycleResult]
    converged: bool
    reason: str
    paused_for_review: bool = False
    stopped: bool = False  # the engine asked to stop (StepResult.stop)

    @property
    def score_curve(self) -> list[tuple[int, float | None]]:
        return [(cycle.number, cycle.score) for cycle in self.cycles]


OBSERVATIONS_DIR = f"{EXCLUDED_DIR}/observations"
STOP_REASON = "the engine asked to stop"
_TAG = re.compile(r"(?:pre-)?evo-(\d{1,9})")


def observations_write(path: str | Path, number: int, observations: list[Observation]) -> Path:
    """Cycle `number`'s train observations as `evolution/observations/batch_<number>.jsonl`, one
    seed-format record a line (Observation.as_record); the one writer the Python Evolver and the
    services share. Outside the workspace's git history. Returns the file."""
    folder = Path(path) / OBSERVATIONS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    batch = folder / f"batch_{number:04d}.jsonl"
    lines = (json.dumps(o.as_record(), ensure_ascii=False, default=str) + "\n" for o in observations)
    temporary = batch.with_name(f".{batch.name}.tmp")
    temporary.write_text("".join(lines))
    os.replace(temporary, batch)
    return batch


def next_cycle_number(path: str | Path) -> int:
    """One past the highest pre-evo-N or evo-N tag of the workspace (a crashed cycle's tag counts
    too): cycle numbers run on across runs, and a tag is never made twice."""
    numbers = [int(match.group(1)) for name in workspace_git(Path(path), ["tag", "--list"]).decode(
        "utf-8", "replace").split() if (match := _TAG.fullmatch(name))]
    return max(numbers, default=0) + 1


def as_task(task: Any) -> Task:
    """`task` as Crucible's Task: itself, or one made from an object with A-Evolve's `id`,
    `input` and `metadata` (its metadata's `category`, if any, kept as the category):
    benchmarks.task_down, which raises BenchmarkError for a task without an id."""
    return task_down(task)


class TrialRunner:
    """Solves chosen tasks against the workspace as it is now (e.g. mutated, not yet committed).
    The agent is chosen from the manifest again, with the run's trust: an engine that rewrote
    manifest.yaml cannot make it name a class nobody allowed.

    `run(tasks)` gives (trajectory, feedback) pairs; A-Evolve's calls are here too:
    `run_tasks(tasks)` (observations), `run_single(task)` and `get_tasks(split, limit)`."""

    def __init__(self, workspace_path: Path, benchmark: Any, concurrency: int = 4, *,
                 trusted: bool = False) -> None:
        self.workspace_path, self.benchmark, self.concurrency = workspace_path, benchmark, concurrency
        self.trusted = trusted

    def run_tasks(self, tasks: list[Any]) -> list[Observation]:
        """Solve and evaluate `tasks`; one observation each (a failure is a failed observation).
        A task of A-Evolve's own type (`id`, `input`, `metadata`) is taken as Crucible's Task."""
        agent = agent_for(self.workspace_path, trusted=self.trusted)
        return solve_batch(agent, self.benchmark, [as_task(task) for task in tasks], self.concurrency)

    def run(self, tasks: list[Task]) -> list[tuple[Trajectory, Feedback]]:
        return [(o.trajectory, o.feedback) for o in self.run_tasks(tasks)]

    def run_single(self, task: Task) -> Observation:
        return self.run_tasks([task])[0]

    def get_tasks(self, split: str = "train", limit: int = 5) -> list[Task]:
        """Tasks of the run's benchmark (A-Evolve's trial.get_tasks)."""
        return list(self.benchmark.get_tasks(split, limit))

    def for_workspace(self, path: Path) -> TrialRunner:
        """The same benchmark, concurrency and trust against another copy of the workspace (the
        search engine's candidates)."""
        return TrialRunner(path, self.benchmark, self.concurrency, trusted=self.trusted)


def solve_batch(agent: Any, benchmark: Any, tasks: list[Any], concurrency: int) -> list[Observation]:
    """Solve and evaluate every task; an agent or checker that raises gives a failed observation.
    A task of any type with an id (A-Evolve's `Task`) is taken as Crucible's first (as_task)."""

    def one(number: int, given: Any) -> Observation:
        try:
            task = as_task(given)
        except BenchmarkError as error:  # a task without an id: a failed observation, not a crash
            task = Task(f"task-{number}", str(given)[:DETAIL_CHARS])
            why = str(error)
            return Observation(task, Trajectory(task.task_id, error=why), Feedback(False, 0.0, why))
        try:
            trajectory = agent.solve(task)
        except Exception as error:  # the agent is not trusted to behave: its failure is an observation
            trajectory = Trajectory(task.task_id, error=f"{type(error).__name__}: {error}")
        try:
            feedback = benchmark.evaluate(task, trajectory)
        except Exception as error:
            why = f"the benchmark could not evaluate it: {type(error).__name__}: {error}"
            feedback = Feedback(False, 0.0, why)
        return Observation(task, trajectory, feedback)

    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(tasks) or 1))) as pool:
        return list(pool.map(one, range(1, len(tasks) + 1), tasks))


def _mean(observations: list[Observation]) -> float | None:
    return round(statistics.fmean(o.feedback.score for o in observations), 6) if observations else None


class Evolver:
    """`Evolver(agent, benchmark, config).run(cycles=N)`; `on_cycle` receives each CycleResult
    as it is decided (the services write it to the database and announce it).

    Names (an agent type in the manifest, a benchmark, an engine) are resolved as the web and
    API may name them; `trusted=True` (the CLI, or your own Python code) also honours dotted
    paths. The check is made here again, whatever checked the run before. Cycles are numbered
    from `first_cycle`, by default one past the workspace's highest `pre-evo-N`/`evo-N` tag."""

    def __init__(self, agent: Any, benchmark: Any, config: EvolveConfig | dict[str, Any] | None = None, *,
                 engine: Any = "textbook", on_cycle: Callable[[CycleResult], object] | None = None,
                 should_stop: Callable[[], bool] | None = None, first_cycle: int | None = None,
                 trusted: bool = False) -> None:
        self.trusted = trusted
        self.agent = agent if isinstance(agent, BaseAgent) else agent_for(Path(agent), trusted=trusted)
        self.path = Path(self.agent.workspace_path)
        self.benchmark = benchmark_get(benchmark, trusted=trusted) if isinstance(benchmark, str) \
            else benchmark_adapt(benchmark)
        self.config = config if isinstance(config, EvolveConfig) else EvolveConfig(**(config or {}))
        self.engine = engine_get(engine, trusted=trusted, **self.config.engine_options) \
            if isinstance(engine, str) else engine
        self._takes_score = cycle_end_takes_score(self.engine)
        self.on_cycle = on_cycle or (lambda result: None)
        self.should_stop = should_stop or (lambda: False)
        self.first_cycle = first_cycle

    def run(self, cycles: int) -> EvolutionResult:
        workspace_import(self.path)  # a git repo with evo-0, whatever state it came in
        first = self.first_cycle if self.first_cycle is not None else next_cycle_number(self.path)
        done: list[CycleResult] = []
        for number in range(first, first + cycles):
            if self.should_stop():
                return EvolutionResult(done, False, "cancelled")
            result = self.cycle(number)
            done.append(result)
            self.on_cycle(result)
            if result.status == Cycle.Status.AWAITING_REVIEW:
                return EvolutionResult(done, False, f"cycle {number} awaits review", paused_for_review=True)
            converged, why = self.converged(done)
            if converged:
                return EvolutionResult(done, True, why)
            if result.stop:
                return EvolutionResult(done, False, STOP_REASON, stopped=True)
        return EvolutionResult(done, False, f"{cycles} cycle{'s' if cycles != 1 else ''} done")

    def converged(self, done: list[CycleResult]) -> tuple[bool, str]:
        """Scores of the last egl_window cycles within egl_threshold of each other."""
        window = [c.score for c in done if c.score is not None][-self.config.egl_window:]
        if len(window) < self.config.egl_window:
            return False, ""
        spread = max(window) - min(window)
        if spread < self.config.egl_threshold:
            return True, (f"converged: the last {len(window)} scores differ by {spread:.3f}, "
                          f"less than egl_threshold {self.config.egl_threshold}")
        return False, ""

    def cycle(self, number: int) -> CycleResult:
        """One cycle, always decided: a failure anywhere after `pre-evo-N` (the engine, the
        checks, the `evo-N` snapshot, reading what it changed, reloading the agent, the
        engine's on_cycle_end) records the cycle as failed with its reason, its files back at
        `pre-evo-N` and HEAD agreeing with them."""
        result = CycleResult(number)
        tasks = self.benchmark.get_tasks("train", self.config.batch_size)
        concurrency = self.config.concurrency
        result.observations = solve_batch(self.agent, self.benchmark, tasks, concurrency)
        result.score = _mean(result.observations)
        observations_write(self.path, number, result.observations)  # before the engine, as upstream
        size = self.config.holdout_size
        holdout = self.benchmark.get_tasks("holdout", size) if size else []
        if holdout:
            result.holdout_observations = solve_batch(self.agent, self.benchmark, holdout, concurrency)
            result.holdout_score = _mean(result.holdout_observations)
        self.agent.export_to_fs()
        result.pre_commit = workspace_snapshot(self.path, f"pre-evo-{number}", f"Before cycle {number}")
        workspace = AgentWorkspace(self.path)
        # The layers come from the manifest as committed, before the engine could touch it.
        allowed = set(workspace.manifest.evolvable_layers) & set(LAYERS)
        try:
            self._evolve(number, result, workspace, allowed, holdout)
        except _StepFailed as error:
            self._failed(result, str(error))
        except Exception as error:  # the cycle failed, not only the engine: back to pre-evo-N
            self._failed(result, f"the cycle failed: {type(error).__name__}: {error}")
        if result.status == Cycle.Status.AWAITING_REVIEW:
            return result  # decided later by an approver, with an engine made then
        try:
            cycle_end_call(self.engine, result.status == Cycle.Status.ACCEPTED, result.score or 0.0,
                           self._takes_score)
        except Exception as error:
            why = f"the engine's on_cycle_end failed: {type(error).__name__}: {error}"
            if result.status == Cycle.Status.FAILED:  # already back at pre-evo-N
                result.reason += f"; {why}"
            else:
                self._failed(result, why)
        return result

    def _failed(self, result: CycleResult, why: str) -> None:
        """Record the cycle as failed and put its files back at pre-evo-N: before `evo-N` exists,
        by restoring them and snapshotting `evo-N`; after, by a rollback commit on top of `evo-N`
        (a tag is never made twice, and HEAD always matches the files)."""
        number = result.number
        logger.warning("cycle %s failed: %s", number, why)
        result.status, result.mutated, result.reason = Cycle.Status.FAILED, False, why
        result.skills_added, result.skills_modified, result.skills_deleted = [], [], []
        result.prompt_size_change = 0
        if not self._tag_exists(f"evo-{number}"):
            workspace_restore(self.path, f"pre-evo-{number}")
            result.post_commit = workspace_snapshot(self.path, f"evo-{number}", f"Cycle {number}: failed")
        else:
            result.post_commit = workspace_rollback(self.path, f"pre-evo-{number}", force=True)
            result.reason += f"; evo-{number} was already made, so a new commit rolled its changes back"
        self.agent.reload_from_fs()

    def _tag_exists(self, tag: str) -> bool:
        return bool(workspace_git(self.path, ["tag", "--list", tag]).strip())

    def _evolve(self, number: int, result: CycleResult, workspace: AgentWorkspace, allowed: AbstractSet[str],
                holdout: list[Task]) -> None:
        trial = TrialRunner(self.path, self.benchmark, self.config.concurrency, trusted=self.trusted)
        try:
            step = self.engine.step(workspace, result.observations, EvolutionHistory(self.path), trial)
        except Exception as error:
            raise _StepFailed(f"the engine failed: {type(error).__name__}: {error}") from error
        result.summary, result.engine_metadata = step.summary, dict(step.metadata)
        result.stop = bool(getattr(step, "stop", False) or result.engine_metadata.get("stop") is True)
        reverted = unsafe_files_revert(self.path, f"pre-evo-{number}")
        for path in self._layers_enforce(number, allowed):
            reverted.setdefault(path, "outside evolvable_layers")
        _empty_dirs_remove(self.path)  # a reverted or deleted skill leaves no empty folder
        result.reverted_paths = sorted(reverted)
        if reverted:
            result.reason = "reverted " + "; ".join(f"{rel} ({why})" for rel, why in sorted(reverted.items()))
        too_big = workspace_size_problem(self.path)
        if too_big:  # many files each under the limit: the mutation as a whole is refused
            workspace_restore(self.path, f"pre-evo-{number}")
            _empty_dirs_remove(self.path)
            result.status = Cycle.Status.REJECTED
            result.reason = f"after the engine's step {too_big}: rolled back"
        if result.status == Cycle.Status.ACCEPTED and holdout and self._changed_since(f"pre-evo-{number}"):
            after = TrialRunner(self.path, self.benchmark, self.config.concurrency,
                                trusted=self.trusted).run(holdout)
            result.holdout_after = round(statistics.fmean(f.score for _, f in after), 6)
            drop = (result.holdout_score or 0) - result.holdout_after
            if drop > self.config.holdout_tolerance:
                workspace_restore(self.path, f"pre-evo-{number}")
                result.status = Cycle.Status.REJECTED
                result.reason = (f"holdout fell from {result.holdout_score:.3f} to "
                                 f"{result.holdout_after:.3f} (more than the tolerance "
                                 f"{self.config.holdout_tolerance}): rolled back")
        changes = workspace_changes(self.path, f"pre-evo-{number}")
        result.mutated = result.status == Cycle.Status.ACCEPTED and bool(changes)
        if reverted and result.status == Cycle.Status.ACCEPTED:
            # The engine's summary may name what was reverted: say what will be committed (its
            # own words stay in the metadata).
            result.engine_metadata.setdefault("engine_summary", result.summary)
            result.summary = (f"{changes_summary(changes)}; {len(reverted)} "
                              f"path{'s' if len(reverted) != 1 else ''} reverted")
        if result.mutated and self.config.review_mode:
            result.status = Cycle.Status.AWAITING_REVIEW
            return  # evo-N is made when an approver decides (cycle_decide)
        self.finish(result)

    def finish(self, result: CycleResult) -> None:
        """Snapshot evo-N and record what the cycle changed; reload the agent."""
        number = result.number
        message = f"Cycle {number}: {result.summary or ('no mutation' if not result.mutated else 'mutation')}"
        result.post_commit = workspace_snapshot(self.path, f"evo-{number}", message)
        changes = EvolutionHistory(self.path).layer_changes(f"pre-evo-{number}", f"evo-{number}")
        result.skills_added = changes.get("skills_added", [])
        result.skills_modified = changes.get("skills_modified", [])
        result.skills_deleted = changes.get("skills_deleted", [])
        result.prompt_size_change = changes.get("prompt_size_change", 0)
        self.agent.reload_from_fs()

    def _changed_since(self, ref: str) -> bool:
        return bool(workspace_changes(self.path, ref))

    def _layers_enforce(self, number: int, allowed: AbstractSet[str]) -> list[str]:
        """Edits outside the manifest's evolvable_layers go back to how pre-evo-N had them."""
        ref = f"pre-evo-{number}"
        reverted = []
        for status, path in workspace_changes(self.path, ref):
            if path.split("/", 1)[0] in allowed:
                continue
            target = self.path / path
            if status == "A":
                target.unlink(missing_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(workspace_git(self.path, ["cat-file", "blob", f"{ref}:{path}"]))
            reverted.append(path)
        return reverted


class _StepFailed(Exception):
    """The engine's step raised: the cycle fails with this reason."""


def changes_summary(changes: list[tuple[str, str]]) -> str:
    """What (status, path) changes commit, in words: skills added, changed and deleted, the
    prompt, other files."""
    added: set[str] = set()
    changed: set[str] = set()
    deleted: set[str] = set()
    others = 0
    for status, path in changes:
        parts = path.split("/")
        if parts[0] == "skills" and len(parts) >= 3 and not parts[1].startswith("_"):
            if parts[2] == "SKILL.md" and status in ("A", "D"):
                (added if status == "A" else deleted).add(parts[1])
            else:
                changed.add(parts[1])
        else:
            others += 1
    words = [f"{verb} skill {', '.join(sorted(names))}" for verb, names in
             (("added", added), ("changed", changed - added - deleted), ("deleted", deleted)) if names]
    if others:
        words.append(f"{others} other file{'s' if others != 1 else ''} changed")
    return "; ".join(words) or "nothing left to commit"


def _entries(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every entry under root that is not a real directory (symlinks
    to folders included, never followed), skipping .git and the top-level evolution/."""
    pending = [root]
    while pending:
        folder = pending.pop()
        with os.scandir(folder) as listing:
            for entry in listing:
                rel = Path(entry.path).relative_to(root).as_posix()
                if entry.name == ".git" or rel == EXCLUDED_DIR:
                    continue
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    pending.append(Path(entry.path))
                else:
                    yield rel, info


def _lines_over(path: Path, limit: int) -> bool:
    count = 0
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            count += chunk.count(b"\n")
            if count > limit:
                return True
    return False


def unsafe_files_revert(path: str | Path, ref: str) -> dict[str, str]:
    """Put back (as `ref` had them) or remove the files an engine may not leave, wherever they
    are: symlinks, special files (fifos, sockets, devices), files over workspace.MAX_FILE_BYTES
    and memory/*.jsonl files over MAX_MEMORY_LINES lines. Checked with lstat; nothing is followed,
    and an oversized file is never read. A file exactly as `ref` committed it (same path, same
    size) is left alone. Returns {path: why}."""
    root = Path(path)
    listing = workspace_git(root, ["ls-tree", "-r", "-l", "-z", ref]).split(b"\0")
    committed: dict[str, tuple[str, int | None]] = {}
    for line in filter(None, listing):
        meta, name = line.split(b"\t", 1)
        mode, _, _, size = meta.split()
        rel = name.decode("utf-8", "surrogateescape")
        committed[rel] = (mode.decode(), None if size == b"-" else int(size))
    reverted: dict[str, str] = {}
    for rel, info in _entries(root):
        file_mode = info.st_mode
        if stat.S_ISLNK(file_mode):
            why = "a symlink"
        elif not stat.S_ISREG(file_mode):
            why = "a special file (fifo, socket or device)"
        elif committed.get(rel, ("", None))[1] == info.st_size:
            continue  # as ref has it (a file imported before the limits applied)
        elif info.st_size > MAX_FILE_BYTES:
            why = f"{info.st_size} bytes, over the {MAX_FILE_BYTES}-byte limit per file"
        elif rel.startswith("memory/") and rel.endswith(".jsonl") \
                and _lines_over(root / rel, MAX_MEMORY_LINES):
            why = f"over the {MAX_MEMORY_LINES}-line limit per memory file"
        else:
            continue
        target = root / rel
        target.unlink()
        mode_at_ref, size_at_ref = committed.get(rel, ("", None))
        if mode_at_ref in ("100644", "100755") and (size_at_ref or 0) <= MAX_FILE_BYTES:
            data = workspace_git(root, ["cat-file", "blob", f"{ref}:{rel}"])
            target.write_bytes(data)
            target.chmod(0o755 if mode_at_ref == "100755" else 0o644)
        reverted[rel] = why
    return reverted
