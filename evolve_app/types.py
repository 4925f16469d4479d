"""The values that pass between agents, benchmarks, engines and the evolution loop (the A-Evolve
seed's vocabulary). Plain dataclasses: JSON-ready through `dataclasses.asdict`. And what an engine's
step is handed, as Protocols: the Workspace, the History and the Trial runner. And the request a
page or an API route is handed, from someone signed in."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from django.http import HttpRequest

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from evolve_app.workspace import Manifest


@dataclass(frozen=True, init=False)
class Task:
    """One benchmark task: an id, the input the agent sees, and whatever its checker needs.

    `task.id` is `task.task_id` (A-Evolve's name), and `Task(id=..., input=...)` builds one as
    A-Evolve's engines and benchmarks do."""

    task_id: str
    input: str
    category: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def __init__(self, task_id: str | None = None, input: str = "", category: str = "",
                 metadata: dict[str, Any] | None = None, *, id: str | None = None) -> None:
        if task_id is None and id is None:
            raise TypeError("Task needs a task_id (or id)")
        if task_id is not None and id is not None and task_id != id:
            raise TypeError(f"Task: task_id {task_id!r} and id {id!r} differ; give one")
        object.__setattr__(self, "task_id", task_id if task_id is not None else id)
        object.__setattr__(self, "input", input)
        object.__setattr__(self, "category", category)
        object.__setattr__(self, "metadata", {} if metadata is None else metadata)

    @property
    def id(self) -> str:
        """A-Evolve's name for task_id."""
        return self.task_id


@dataclass
class Trajectory:
    """What an agent did for a task: its final output, its steps, an error if it failed, and the
    model conversation (A-Evolve's `conversation`: the messages, when the agent keeps them)."""

    task_id: str
    output: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    conversation: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Feedback:
    """A benchmark's verdict on a trajectory; score in [0, 1]. `raw` is the checker's own data
    (A-Evolve's: e.g. `per_claim`, which the batch files turn into `claims`)."""

    success: bool
    score: float
    detail: str = ""
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Observation:
    """One (task, trajectory, feedback) triple, as the seed's JSONL observation batches store it."""

    task: Task
    trajectory: Trajectory
    feedback: Feedback

    def as_record(self) -> dict[str, Any]:
        """The seed's observation format: task_id, task_input, agent_output, steps, success,
        score, feedback_detail."""
        return {
            "task_id": self.task.task_id, "task_input": self.task.input,
            "agent_output": self.trajectory.output, "steps": self.trajectory.steps,
            "success": self.feedback.success, "score": self.feedback.score,
            "feedback_detail": self.feedback.detail,
        }

    def as_aevolve_record(self, *, trajectory_only: bool = False,
                          timestamp: datetime | None = None) -> dict[str, Any]:
        """The record A-Evolve 0.1.0's Observer.collect writes a line of an observation batch:
        the flat fields (task_id, task_input, agent_output, steps, conversation, success, score,
        feedback_detail, timestamp) and the nested task{id,input,metadata}, trajectory{output,
        steps} and feedback{success,score,detail,claims,raw}, in its key order. `trajectory_only`
        leaves out success, score, feedback_detail and feedback, as A-Evolve's newer Observer does."""
        task, trajectory, feedback = self.task, self.trajectory, self.feedback
        metadata = dict(task.metadata)
        if task.category and "category" not in metadata:  # Crucible keeps it apart; A-Evolve in metadata
            metadata["category"] = task.category
        steps = list(trajectory.steps)
        raw = feedback.raw if isinstance(feedback.raw, dict) else {}
        claims = [{
            "claim": claim.get("claim", ""), "outcome": claim.get("outcome", "not_fulfilled"),
            "pass": isinstance(claim.get("score", 0.0), (int, float)) and claim.get("score", 0.0) >= 1.0,
            "score": claim.get("score", 0.0),
            "justification": claim.get("justification", ""),
        } for claim in raw.get("per_claim") or [] if isinstance(claim, dict)]
        record: dict[str, Any] = {
            "task_id": task.task_id, "task_input": task.input, "agent_output": trajectory.output,
            "steps": steps, "conversation": list(trajectory.conversation),
            "success": feedback.success, "score": feedback.score, "feedback_detail": feedback.detail,
            "timestamp": (timestamp or datetime.now()).isoformat(),  # local time, as upstream
            "task": {"id": task.task_id, "input": task.input, "metadata": metadata},
            "trajectory": {"output": trajectory.output, "steps": steps},
            "feedback": {"success": feedback.success, "score": feedback.score, "detail": feedback.detail,
                         "claims": claims, "raw": raw},
        }
        if trajectory_only:
            for key in ("success", "score", "feedback_detail", "feedback"):
                del record[key]
        return record


@dataclass(frozen=True)
class SkillMeta:
    """A skill's front matter: `skills/<name>/SKILL.md` starts with YAML `name` and `description`."""

    name: str
    description: str
    path: str


@dataclass
class StepResult:
    """What an engine's step did: whether it mutated the workspace, a summary, and its metadata.
    `stop=True` (or `metadata["stop"]` true) ends the run once this cycle is recorded."""

    mutated: bool
    summary: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    stop: bool = False

    @property
    def wants_stop(self) -> bool:
        metadata = self.metadata if isinstance(self.metadata, dict) else {}
        return bool(self.stop or metadata.get("stop") is True)


# ------------------------------------------------------------------ what an engine's step is handed


class Workspace(Protocol):
    """The agent's files as an engine reads and writes them (evolve_app.workspace.AgentWorkspace)."""

    root: Path

    @property
    def manifest(self) -> Manifest: ...

    def read_prompt(self) -> str: ...

    def list_skills(self) -> list[SkillMeta]: ...

    def read_skill(self, name: str) -> str: ...

    def write_skill(self, name: str, content: str) -> None: ...

    def delete_skill(self, name: str) -> None: ...

    def list_drafts(self) -> list[dict[str, str]]: ...

    def write_draft(self, name: str, content: str) -> None: ...

    def delete_draft(self, name: str) -> None: ...

    def read_memories(self, category: str = "episodic", limit: int | None = None) -> list[dict[str, Any]]: ...

    def add_memory(self, entry: dict[str, Any], category: str = "episodic") -> None: ...

    def read_all_memories(self, limit: int = 100) -> list[dict[str, Any]]: ...

    def _path(self, rel: str) -> Path: ...


class History(Protocol):
    """The workspace's snapshots and observation batches (evolve_app.history.EvolutionHistory)."""

    def version_log(self) -> list[dict[str, Any]]: ...

    def get_observations(self, last_n_cycles: int | None = None,
                         only_failures: bool = False) -> list[dict[str, Any]]: ...

    @property
    def latest_cycle(self) -> int: ...


class Trial(Protocol):
    """Solves chosen tasks against the workspace as it is now (evolve_app.loop.TrialRunner)."""

    def run(self, tasks: list[Task]) -> list[tuple[Trajectory, Feedback]]: ...

    def run_tasks(self, tasks: list[Any]) -> list[Observation]: ...

    def run_single(self, task: Task) -> Observation: ...

    def get_tasks(self, split: str = "train", limit: int = 5) -> list[Task]: ...

    def for_workspace(self, path: Path) -> Trial: ...


class GuidedEngine(Protocol):
    """An engine whose step also takes a `guidance` text for this cycle (the adaptive and search engines
    hand it one)."""

    def step(self, workspace: Workspace, observations: list[Observation], history: History,
             trial: Trial | None, guidance: str) -> StepResult: ...


# ------------------------------------------------------------------------- what a view is handed


class AuthedRequest(HttpRequest):
    """A request past LoginRequiredMiddleware (pages) or the API's authentication: a signed-in user."""

    user: User
