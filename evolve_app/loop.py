"""The evolution loop: `Evolver(agent, benchmark, config).run(cycles=N)`, usable without the web
server. Each cycle solves a batch (concurrently, bounded), evaluates it, snapshots `pre-evo-N`,
lets the engine mutate the workspace (with a trial runner), reverts edits outside
`evolvable_layers`, optionally gates the mutation on the holdout split, snapshots `evo-N`,
records the cycle, reloads the agent and checks convergence.

What upstream leaves undone is done here: convergence really uses `egl_threshold`, the
evolvable layers are enforced, a holdout gate can roll a mutation back, and a failed engine
or cycle leaves the workspace at `pre-evo-N` while the run goes on.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evolve_app.types import Feedback, Observation, Task, Trajectory

logger = logging.getLogger(__name__)
LAYERS = ("prompts", "skills", "memory", "tools")


class EvolveConfig(BaseModel):
    """How a run evolves; every field has a default a first run can use."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(12, ge=1, le=1000, description="train tasks solved per cycle")
    holdout_size: int = Field(0, ge=0, le=1000, description="holdout tasks; 0 turns the gate off")
    holdout_tolerance: float = Field(0.0, ge=0, le=1, description="largest holdout drop allowed")
    egl_threshold: float = Field(0.05, ge=0, le=1, description="converged when a window differs less")
    egl_window: int = Field(3, ge=2, le=100, description="cycles in the convergence window")
    concurrency: int = Field(4, ge=1, le=16, description="tasks solved at once")
    review_mode: bool = Field(False, description="each mutation waits for an approver")
    engine_options: dict[str, str | int | float] = Field(
        default_factory=dict, description="the engine's own settings, e.g. {preset, model} for skillforge")


@dataclass
class CycleResult:
    number: int
    score: float | None = None
    holdout_score: float | None = None
    holdout_after: float | None = None
    mutated: bool = False
    status: str = "accepted"  # accepted | rejected | failed | awaiting_review
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


@dataclass
class EvolutionResult:
    cycles: list[CycleResult]
    converged: bool
    reason: str
    paused_for_review: bool = False

    @property
    def score_curve(self) -> list[tuple[int, float | None]]:
        return [(cycle.number, cycle.score) for cycle in self.cycles]


class TrialRunner:
    """Solves chosen tasks against the workspace as it is now (e.g. mutated, not yet committed).
    The agent is chosen from the manifest again, with the run's trust: an engine that rewrote
    manifest.yaml cannot make it name a class nobody allowed."""

    def __init__(self, workspace_path: Path, benchmark: Any, concurrency: int = 4, *,
                 trusted: bool = False) -> None:
        self.workspace_path, self.benchmark, self.concurrency = workspace_path, benchmark, concurrency
        self.trusted = trusted

    def run(self, tasks: list[Task]) -> list[tuple[Trajectory, Feedback]]:
        from evolve_app.agents import agent_for

        agent = agent_for(self.workspace_path, trusted=self.trusted)
        solved = solve_batch(agent, self.benchmark, tasks, self.concurrency)
        return [(o.trajectory, o.feedback) for o in solved]


def solve_batch(agent: Any, benchmark: Any, tasks: list[Task], concurrency: int) -> list[Observation]:
    """Solve and evaluate every task; an agent or checker that raises gives a failed observation."""

    def one(task: Task) -> Observation:
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
        return list(pool.map(one, tasks))


def _mean(observations: list[Observation]) -> float | None:
    return round(statistics.fmean(o.feedback.score for o in observations), 6) if observations else None


class Evolver:
    """`Evolver(agent, benchmark, config).run(cycles=N)`; `on_cycle` receives each CycleResult
    as it is decided (the services write it to the database and announce it).

    Names (an agent type in the manifest, a benchmark, an engine) are resolved as the web and
    API may name them; `trusted=True` (the CLI, or your own Python code) also honours dotted
    paths. The check is made here again, whatever checked the run before."""

    def __init__(self, agent: Any, benchmark: Any, config: EvolveConfig | dict | None = None, *,
                 engine: Any = "textbook", on_cycle: Callable[[CycleResult], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, first_cycle: int = 1,
                 trusted: bool = False) -> None:
        from evolve_app.agents import BaseAgent, agent_for
        from evolve_app.benchmarks import benchmark_get
        from evolve_app.engines import engine_get

        self.trusted = trusted
        self.agent = agent if isinstance(agent, BaseAgent) else agent_for(Path(agent), trusted=trusted)
        self.path = Path(self.agent.workspace_path)
        self.benchmark = benchmark_get(benchmark, trusted=trusted) if isinstance(benchmark, str) \
            else benchmark
        self.config = config if isinstance(config, EvolveConfig) else EvolveConfig(**(config or {}))
        self.engine = engine_get(engine, trusted=trusted, **self.config.engine_options) \
            if isinstance(engine, str) else engine
        self.on_cycle = on_cycle or (lambda result: None)
        self.should_stop = should_stop or (lambda: False)
        self.first_cycle = first_cycle

    def run(self, cycles: int) -> EvolutionResult:
        from evolve_app.workspace import workspace_import

        workspace_import(self.path)  # a git repo with evo-0, whatever state it came in
        done: list[CycleResult] = []
        for number in range(self.first_cycle, self.first_cycle + cycles):
            if self.should_stop():
                return EvolutionResult(done, False, "cancelled")
            result = self.cycle(number)
            done.append(result)
            self.on_cycle(result)
            if result.status == "awaiting_review":
                return EvolutionResult(done, False, f"cycle {number} awaits review", paused_for_review=True)
            converged, why = self.converged(done)
            if converged:
                return EvolutionResult(done, True, why)
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
        from evolve_app.workspace import AgentWorkspace, workspace_restore, workspace_snapshot

        result = CycleResult(number)
        tasks = self.benchmark.get_tasks("train", self.config.batch_size)
        concurrency = self.config.concurrency
        result.observations = solve_batch(self.agent, self.benchmark, tasks, concurrency)
        result.score = _mean(result.observations)
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
            return self._evolve(number, result, workspace, allowed, holdout)
        except Exception as error:  # the cycle failed, not only the engine: back to pre-evo-N
            logger.warning("cycle %s failed: %s", number, error)
            workspace_restore(self.path, f"pre-evo-{number}")
            result.status, result.mutated = "failed", False
            result.reason = result.reason or f"the cycle failed: {type(error).__name__}: {error}"
            result.post_commit = workspace_snapshot(self.path, f"evo-{number}", f"Cycle {number}: none")
            self.agent.reload_from_fs()
            return result

    def _evolve(self, number: int, result: CycleResult, workspace: Any, allowed: set[str],
                holdout: list[Task]) -> CycleResult:
        from evolve_app.history import EvolutionHistory
        from evolve_app.workspace import workspace_restore

        trial = TrialRunner(self.path, self.benchmark, self.config.concurrency, trusted=self.trusted)
        try:
            step = self.engine.step(workspace, result.observations, EvolutionHistory(self.path), trial)
        except Exception as error:
            result.reason = f"the engine failed: {type(error).__name__}: {error}"
            raise
        result.summary, result.engine_metadata = step.summary, dict(step.metadata)
        result.reverted_paths = self._layers_enforce(number, allowed)
        if result.reverted_paths:
            result.reason = f"reverted edits outside evolvable_layers: {', '.join(result.reverted_paths)}"
        if holdout and self._changed_since(f"pre-evo-{number}"):
            after = TrialRunner(self.path, self.benchmark, self.config.concurrency,
                                trusted=self.trusted).run(holdout)
            result.holdout_after = round(statistics.fmean(f.score for _, f in after), 6)
            drop = (result.holdout_score or 0) - result.holdout_after
            if drop > self.config.holdout_tolerance:
                workspace_restore(self.path, f"pre-evo-{number}")
                result.status = "rejected"
                result.reason = (f"holdout fell from {result.holdout_score:.3f} to "
                                 f"{result.holdout_after:.3f} (more than the tolerance "
                                 f"{self.config.holdout_tolerance}): rolled back")
        result.mutated = result.status == "accepted" and self._changed_since(f"pre-evo-{number}")
        if result.mutated and self.config.review_mode:
            result.status = "awaiting_review"
            return result  # evo-N is made when an approver decides (cycle_decide)
        self.finish(result)
        return result

    def finish(self, result: CycleResult) -> None:
        """Snapshot evo-N and record what the cycle changed; reload the agent."""
        from evolve_app.history import EvolutionHistory
        from evolve_app.workspace import workspace_snapshot

        number = result.number
        message = f"Cycle {number}: {result.summary or ('no mutation' if not result.mutated else 'mutation')}"
        result.post_commit = workspace_snapshot(self.path, f"evo-{number}", message)
        changes = EvolutionHistory(self.path).layer_changes(f"pre-evo-{number}", f"evo-{number}")
        result.skills_added = changes.get("skills_added", [])
        result.skills_modified = changes.get("skills_modified", [])
        result.skills_deleted = changes.get("skills_deleted", [])
        result.prompt_size_change = changes.get("prompt_size_change", 0)
        self.agent.reload_from_fs()
        self.engine.on_cycle_end(result.status == "accepted")

    def _changed_since(self, ref: str) -> bool:
        from evolve_app.workspace import workspace_changes

        return bool(workspace_changes(self.path, ref))

    def _layers_enforce(self, number: int, allowed: set[str]) -> list[str]:
        """Edits outside the manifest's evolvable_layers go back to how pre-evo-N had them."""
        from evolve_app.workspace import workspace_changes, workspace_git

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
