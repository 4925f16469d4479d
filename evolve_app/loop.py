"""The evolution loop: `Evolver(agent, benchmark, config).run(cycles=N)`, usable without the web
server. Each cycle solves a batch (concurrently, bounded), evaluates it, snapshots `pre-evo-N`,
lets the engine mutate the workspace (with a trial runner), reverts edits outside
`evolvable_layers`, optionally gates the mutation on the holdout split, snapshots `evo-N`,
records the cycle, reloads the agent and checks convergence.

What upstream leaves undone is done here: convergence can use `egl_threshold` (the "crucible"
rule; "a-evolve" is A-Evolve's own rule, epsilon 0.01, the default for A-Evolve agents), the
evolvable layers are enforced (and symlinks, special files and oversized files are reverted
wherever an engine writes them), a holdout gate can roll a mutation back, and a failed engine
or cycle leaves the workspace's files at `pre-evo-N` (HEAD agreeing) while the run goes on.

The files A-Evolve writes in `evolution/` are written as it writes them, by the Python Evolver
and the services alike: each cycle's observation batch before the engine runs
(`observations/batch_<cycle>.jsonl`, A-Evolve 0.1.0's record, and its newer observer's
`trajectories/batch_<cycle>/`), and after each decided cycle `history.jsonl` and `metrics.json`.
`EvolutionHistory.get_observations` reads the batches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import stat
import statistics
import uuid
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from evolve_app.agents import BaseAgent, agent_for, agent_mapping
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
    # None: the agent's default, "a-evolve" for an A-Evolve agent (agents.agent_mapping), else
    # "crucible"; a run records the rule it used (services.evolution_run_start fills it in).
    convergence: Literal["crucible", "a-evolve"] | None = Field(
        default=None, description="the convergence rule: crucible (the window's spread under "
                                  "egl_threshold) or a-evolve (each of the window's scores within 0.01 of "
                                  "the score before it)")
    egl_threshold: float = Field(default=0.05, ge=0, le=1,
                                 description="converged when a window differs less (the crucible rule only)")
    egl_window: int = Field(default=3, ge=1, le=100, description="cycles in the convergence window")
    trajectory_only: bool = Field(default=False, description="the engine sees what the agent did, never a "
                                  "score: batches without success/score/feedback, as A-Evolve writes them")
    evolve_layers: list[str] | None = Field(
        default=None, description="the layers the engine may change: None for the manifest's "
                                  "evolvable_layers, else only those of them listed here")
    concurrency: int = Field(default=4, ge=1, le=16, description="tasks solved at once")
    review_mode: bool = Field(default=False, description="each mutation waits for an approver")
    engine_options: dict[str, str | bool | int | float] = Field(
        default_factory=dict, description="the engine's own settings, e.g. {preset, model} for skillforge")

    @field_validator("egl_window")
    @classmethod
    def _window_fits_rule(cls, value: int, info: ValidationInfo) -> int:
        if value < 2 and info.data.get("convergence") == "crucible":
            raise ValueError("the crucible rule compares 2 or more cycles; a window of 1 needs "
                             "convergence a-evolve (each score against the one before)")
        return value

    @field_validator("evolve_layers")
    @classmethod
    def _layers_known(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        unknown = [layer for layer in value if layer not in LAYERS]
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))}: the layers are {', '.join(LAYERS)}")
        return list(dict.fromkeys(value))

    def convergence_for(self, workspace_path: str | Path) -> Literal["crucible", "a-evolve"]:
        """The rule a run of this workspace uses: the one named, else "a-evolve" for an A-Evolve
        agent (agents.agent_mapping) and "crucible" for any other. A window of 1 with the crucible
        rule is refused (ValueError) with the reason."""
        a_evolve = bool(agent_mapping(workspace_path).get("a_evolve"))
        rule = self.convergence or ("a-evolve" if a_evolve else "crucible")
        if rule == "crucible" and self.egl_window < 2:
            raise ValueError("egl_window: the crucible rule compares 2 or more cycles; a window of 1 needs "
                             "convergence a-evolve")
        return rule


# A-Evolve's epsilon (engine/loop.py `_is_score_converged(..., epsilon=0.01)`): its rule never reads
# egl_threshold, and neither does Crucible's "a-evolve" rule.
AEVOLVE_EPSILON = 0.01


def score_converged(scores: list[float], window: int = 3, epsilon: float = AEVOLVE_EPSILON) -> bool:
    """A-Evolve's `_is_score_converged`: each of the last `window` scores within `epsilon` of the
    score before them (so flat scores stop after window + 1 cycles)."""
    if len(scores) < window + 1:
        return False
    baseline = scores[-(window + 1)]
    return all(abs(score - baseline) < epsilon for score in scores[-window:])


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
    file_score: float = 0.0  # the score history.jsonl gets: A-Evolve's (unrounded; 0.0 when none)


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
TRAJECTORIES_DIR = f"{EXCLUDED_DIR}/trajectories"
HISTORY_FILE = f"{EXCLUDED_DIR}/history.jsonl"
METRICS_FILE = f"{EXCLUDED_DIR}/metrics.json"
STOP_REASON = "the engine asked to stop"
_TAG = re.compile(r"(?:pre-)?evo-(\d{1,9})")
_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f/]")
MAX_TID_BYTES = 200  # a file name is at most 255 bytes: room for patch_ / trajectory_ and .json


def _folder(root: Path, rel: str) -> Path:
    """`root/rel` as a real folder: a symlink (or file) an engine left on the way is removed, so
    nothing written under it lands outside the workspace."""
    root.mkdir(parents=True, exist_ok=True)
    here = root
    for part in rel.split("/"):
        here = here / part
        if here.is_symlink() or (here.exists() and not here.is_dir()):
            here.unlink()
        here.mkdir(exist_ok=True)
    return here


def _write(target: Path, text: str) -> None:
    """Write `text` to `target` through a fresh temporary file and a rename: a symlink at
    `target` is replaced, never followed."""
    temporary = target.with_name(f".{uuid.uuid4().hex}.tmp")
    with open(temporary, "x", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, target)


def task_file_id(task_id: str) -> str:
    """A task id as a file name part: `/` becomes `_` as in A-Evolve's observer; control
    characters (NUL included) become `_` too, so `..`, `/etc/passwd` or `a/../../b` stay one name
    inside the batch folder; an empty id is `_`, and an id over MAX_TID_BYTES bytes is cut and
    ends with 12 hex digits of its sha256 (two long ids never share a file)."""
    name = _UNSAFE_NAME.sub("_", str(task_id)) or "_"
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) > MAX_TID_BYTES:
        digest = hashlib.sha256(encoded).hexdigest()[:12]
        name = encoded[:MAX_TID_BYTES - 13].decode("utf-8", "ignore") + "-" + digest
    return name


def observations_write(path: str | Path, number: int, observations: list[Observation], *,
                       trajectory_only: bool = False) -> Path:
    """Cycle `number`'s train observations as A-Evolve writes them (the one writer the Python
    Evolver and the services share, outside the workspace's git history):
    `evolution/observations/batch_<number>.jsonl`, one A-Evolve 0.1.0 record a line
    (Observation.as_aevolve_record; `trajectory_only` leaves the scores out), and, as A-Evolve's
    newer observer, `evolution/trajectories/batch_<number>/patch_<tid>.diff` (the agent's output)
    for every task and `trajectory_<tid>.json` for a task with a conversation (tid: task_file_id).
    Returns the batch file."""
    root = Path(path)
    folder = _folder(root, OBSERVATIONS_DIR)
    batch = folder / f"batch_{number:04d}.jsonl"
    tasks = _folder(root, f"{TRAJECTORIES_DIR}/batch_{number:04d}")
    lines = []
    for observation in observations:
        tid = task_file_id(observation.task.task_id)
        _write(tasks / f"patch_{tid}.diff", observation.trajectory.output or "")
        if observation.trajectory.conversation:
            _write(tasks / f"trajectory_{tid}.json",
                   json.dumps(observation.trajectory.conversation, indent=2, ensure_ascii=False, default=str))
        record = observation.as_aevolve_record(trajectory_only=trajectory_only)
        lines.append(json.dumps(record, default=str) + "\n")  # ensure_ascii as upstream
    _write(batch, "".join(lines))
    return batch


def upstream_score(observations: list[Observation]) -> float:
    """A cycle's score as A-Evolve computes it: the mean train score, 0.0 for an empty batch."""
    return sum(o.feedback.score for o in observations) / len(observations) if observations else 0.0


def evolution_files_record(path: str | Path, number: int, score: float | None, mutated: bool) -> None:
    """After a decided cycle, as A-Evolve's loop (`_append_history`, `_write_metrics`): append
    {cycle, score, mutated, timestamp} to `evolution/history.jsonl` and rewrite
    `evolution/metrics.json` {cycles_completed, latest_score, best_score, avg_score}. Cycles keep
    Crucible's numbers (they run on across runs), so the metrics cover every cycle the file
    records; a cycle without a score counts as 0.0, as upstream's empty batch."""
    root = Path(path)
    folder = _folder(root, EXCLUDED_DIR)
    history = folder / "history.jsonl"
    entry = {"cycle": number, "score": float(score or 0.0), "mutated": bool(mutated),
             "timestamp": datetime.now().isoformat()}
    previous = history.read_text(encoding="utf-8", errors="replace") \
        if history.is_file() and not history.is_symlink() else ""
    if previous and not previous.endswith("\n"):
        previous += "\n"
    _write(history, previous + json.dumps(entry) + "\n")
    scores = []
    for line in (previous + json.dumps(entry)).splitlines():
        try:
            value = json.loads(line).get("score")
        except (ValueError, AttributeError):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            scores.append(float(value))
    metrics = {
        "cycles_completed": len(scores),
        "latest_score": scores[-1] if scores else 0.0,
        "best_score": max(scores) if scores else 0.0,
        "avg_score": sum(scores) / len(scores) if scores else 0.0,
    }
    _write(folder / "metrics.json", json.dumps(metrics, indent=2))


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
                 trusted: bool = False, agent: BaseAgent | None = None) -> None:
        self.workspace_path, self.benchmark, self.concurrency = workspace_path, benchmark, concurrency
        self.trusted = trusted
        # The run's own agent object (a script's, crucible.aevolve): read again before each trial.
        self.agent = agent

    def run_tasks(self, tasks: list[Any]) -> list[Observation]:
        """Solve and evaluate `tasks`; one observation each (a failure is a failed observation).
        A task of A-Evolve's own type (`id`, `input`, `metadata`) is taken as Crucible's Task."""
        if self.agent is not None:
            self.agent.reload_from_fs()
        agent = self.agent or agent_for(self.workspace_path, trusted=self.trusted)
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
        self.own_agent = isinstance(agent, BaseAgent)  # given as an object: trials solve with it too
        self.agent = agent if isinstance(agent, BaseAgent) else agent_for(Path(agent), trusted=trusted)
        self.path = Path(self.agent.workspace_path)
        self.benchmark = benchmark_get(benchmark, trusted=trusted) if isinstance(benchmark, str) \
            else benchmark_adapt(benchmark)
        self.config = config if isinstance(config, EvolveConfig) else EvolveConfig(**(config or {}))
        self.convergence = self.config.convergence_for(self.path)  # the rule named, or the agent's default
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
            if result.status == Cycle.Status.AWAITING_REVIEW:  # its history line is written when decided
                return EvolutionResult(done, False, f"cycle {number} awaits review", paused_for_review=True)
            evolution_files_record(self.path, number, result.file_score, result.mutated)
            converged, why = self.converged(done)
            if converged:
                return EvolutionResult(done, True, why)
            if result.stop:
                return EvolutionResult(done, False, STOP_REASON, stopped=True)
        return EvolutionResult(done, False, f"{cycles} cycle{'s' if cycles != 1 else ''} done")

    def converged(self, done: list[CycleResult]) -> tuple[bool, str]:
        """The run's rule over this run's scored cycles (a cycle without a score, e.g. of an engine
        that evaluates on its own, is left out). "crucible": the last egl_window scores within
        egl_threshold of each other. "a-evolve": A-Evolve's `_is_score_converged` with its
        epsilon 0.01 (egl_threshold unused, as upstream)."""
        scores = [c.score for c in done if c.score is not None]
        size = self.config.egl_window
        if self.convergence == "a-evolve":
            if score_converged(scores, size, AEVOLVE_EPSILON):
                return True, (f"converged (A-Evolve's rule): the last {size} score{'s' if size != 1 else ''} "
                              f"within {AEVOLVE_EPSILON} of {scores[-(size + 1)]:.3f}, the score before them")
            return False, ""
        window = scores[-size:]
        if len(window) < size:
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
        concurrency = self.config.concurrency
        if not self.own_evaluation:
            tasks = self.benchmark.get_tasks("train", self.config.batch_size)
            result.observations = solve_batch(self.agent, self.benchmark, tasks, concurrency)
        # An engine that evaluates on its own gets no batch: an empty one is written, and the
        # cycle has no score (the page shows none; history.jsonl gets A-Evolve's 0.0).
        result.score = _mean(result.observations)
        result.file_score = upstream_score(result.observations)
        observations_write(self.path, number, result.observations,  # before the engine, as upstream
                           trajectory_only=self.config.trajectory_only)
        size = self.config.holdout_size
        holdout = self.benchmark.get_tasks("holdout", size) if size else []
        if holdout:
            result.holdout_observations = solve_batch(self.agent, self.benchmark, holdout, concurrency)
            result.holdout_score = _mean(result.holdout_observations)
        self.agent.export_to_fs()
        result.pre_commit = workspace_snapshot(self.path, f"pre-evo-{number}", f"Before cycle {number}")
        workspace = AgentWorkspace(self.path)
        # The layers come from the manifest as committed, before the engine could touch it, and
        # only those of them the run's evolve_layers lists.
        allowed = set(workspace.manifest.evolvable_layers) & set(LAYERS)
        if self.config.evolve_layers is not None:
            allowed &= set(self.config.evolve_layers)
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
            if result.summary:  # the engine's words name a change this commit does not hold
                result.engine_metadata.setdefault("engine_summary", result.summary)
            brief = " ".join(why.split())  # one line: the commit's subject
            brief = brief if len(brief) <= 300 else brief[:299] + "…"
            message = f"Cycle {number}: failed ({brief}); the files are as before the cycle"
            result.post_commit = workspace_snapshot(self.path, f"evo-{number}", message)
        else:
            result.post_commit = workspace_rollback(self.path, f"pre-evo-{number}", force=True)
            result.reason += f"; evo-{number} was already made, so a new commit rolled its changes back"
        self.agent.reload_from_fs()

    def _tag_exists(self, tag: str) -> bool:
        return bool(workspace_git(self.path, ["tag", "--list", tag]).strip())

    def _evolve(self, number: int, result: CycleResult, workspace: AgentWorkspace, allowed: AbstractSet[str],
                holdout: list[Task]) -> None:
        trial = TrialRunner(self.path, self.benchmark, self.config.concurrency, trusted=self.trusted,
                            agent=self.agent if self.own_agent else None)
        seen = [_scoreless(o) for o in result.observations] if self.config.trajectory_only \
            else result.observations
        configure = getattr(self.engine, "run_configure", None)
        try:
            if callable(configure):  # the A-Evolve adapters: their EvolveConfig from the run's settings
                configure(layers=set(allowed), trajectory_only=self.config.trajectory_only)
            step = self.engine.step(workspace, seen, EvolutionHistory(self.path), trial)
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
            after = TrialRunner(self.path, self.benchmark, self.config.concurrency, trusted=self.trusted,
                                agent=self.agent if self.own_agent else None).run(holdout)
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

    @property
    def own_evaluation(self) -> bool:
        """A-Evolve's `manages_own_evaluation`: the engine evaluates with the trial runner, and
        the loop solves no batch for it."""
        return getattr(self.engine, "manages_own_evaluation", False) is True

    def finish(self, result: CycleResult) -> None:
        """Snapshot evo-N and record what the cycle changed; reload the agent. A rejected cycle's
        evo-N says what it commits (the files as before the cycle, and why); the engine's own
        summary stays in its metadata (`engine_summary`)."""
        number = result.number
        if result.status == Cycle.Status.REJECTED:
            result.engine_metadata.setdefault("engine_summary", result.summary)
            result.summary = rejected_summary(result.reason)
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


def rejected_summary(reason: str) -> str:
    """What a rejected cycle's evo-N commits, in words: nothing of the engine's change, and why."""
    why = re.sub(r"[:;,]?\s*rolled back$", "", (reason or "").strip()).strip()
    return f"rejected ({why}); the engine's change was rolled back" if why else \
        "rejected; the engine's change was rolled back"


def _scoreless(observation: Observation) -> Observation:
    """The observation as a trajectory_only engine sees it: what the agent did, no verdict."""
    return dataclasses.replace(observation, feedback=Feedback(False, 0.0, ""))


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
