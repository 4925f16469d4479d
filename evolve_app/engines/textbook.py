"""The textbook engine: offline and deterministic (the demo's engine)."""

from __future__ import annotations

import json
from pathlib import Path

from evolve_app.engines.base import EvolutionEngine
from evolve_app.types import History, Observation, StepResult, Trial, Workspace


class TextbookEngine(EvolutionEngine):
    """Deterministic and offline (the demo's engine): for each task category that failed in this
    cycle's observations, write the skill the textbook has for it, unless the workspace has it
    already; then record a lesson in episodic memory. It checks its mutation with the trial
    runner on the failed tasks before the cycle commits."""

    name = "textbook"
    PATH_OPTIONS = ("textbook",)

    def __init__(self, textbook: str | Path | None = None, per_cycle: int = 1) -> None:
        default = Path(__file__).resolve().parent.parent / "demo" / "textbook.json"
        self.textbook = json.loads(Path(textbook or default).read_text())["categories"]
        self.per_cycle = per_cycle

    def step(self, workspace: Workspace, observations: list[Observation], history: History,
             trial: Trial | None) -> StepResult:
        failed = [o for o in observations if not o.feedback.success]
        have = {skill.name for skill in workspace.list_skills()}
        categories = list(dict.fromkeys(o.task.category for o in failed if o.task.category))
        missing = [c for c in categories if c in self.textbook and self.textbook[c]["skill"] not in have]
        written = []
        for category in missing[: self.per_cycle]:
            entry = self.textbook[category]
            workspace.write_skill(entry["skill"], entry["skill_md"])
            workspace.add_memory({"lesson": entry["lesson"], "category": category}, "episodic")
            written.append(entry["skill"])
        if not written:
            return StepResult(False, "nothing to learn from this cycle's failures",
                              {"failed_categories": categories})
        checked = trial.run([o.task for o in failed if o.task.category in missing[: self.per_cycle]]) \
            if trial is not None else []
        passed = sum(1 for _, feedback in checked if feedback.success)
        metadata = {"failed_categories": categories, "trial_passed": passed, "trial_tasks": len(checked)}
        return StepResult(True, f"added skill {', '.join(written)}", metadata)
