"""The values that pass between agents, benchmarks, engines and the evolution loop (the A-Evolve
seed's vocabulary). Plain dataclasses: JSON-ready through `dataclasses.asdict`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """One benchmark task: an id, the input the agent sees, and whatever its checker needs."""

    task_id: str
    input: str
    category: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    """What an agent did for a task: its final output, its steps, and an error if it failed."""

    task_id: str
    output: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


@dataclass(frozen=True)
class Feedback:
    """A benchmark's verdict on a trajectory; score in [0, 1]."""

    success: bool
    score: float
    detail: str = ""


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


@dataclass(frozen=True)
class SkillMeta:
    """A skill's front matter: `skills/<name>/SKILL.md` starts with YAML `name` and `description`."""

    name: str
    description: str
    path: str


@dataclass
class StepResult:
    """What an engine's step did: whether it mutated the workspace, a summary, and its metadata."""

    mutated: bool
    summary: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
