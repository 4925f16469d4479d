"""Adaptive Evolution: the most informative observations and an intervention size that follows
the score curve, handed to an inner engine."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Any, TypeGuard

from evolve_app.engines.base import EngineError, EvolutionEngine, cycle_end_call
from evolve_app.engines.model import _mean_score
from evolve_app.engines.registry import engine_get
from evolve_app.types import GuidedEngine, History, Observation, StepResult, Trial, Workspace

# ------------------------------------------------------------------------------------- adaptive evolution


def detail_signature(detail: str) -> str:
    """A feedback detail with its specifics blurred (quoted text, numbers, spacing), so two
    failures that went wrong the same way share a signature."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", (detail or "").lower())
    text = re.sub(r"\d+(?:\.\d+)?", "#", text)
    return re.sub(r"\s+", " ", text).strip()[:120]


def observations_filter(observations: list[Observation]) -> list[Observation]:
    """The most informative observations: diverse failures — the first failure of each
    (category, detail_signature(feedback detail)) — then successes, dropping those near a
    failure (of a category that also failed: the failure already speaks for it) and keeping one
    per remaining category (what works and must keep working). Failures first, order kept."""
    failures, seen, failed_categories = [], set(), set()
    for observation in observations:
        if observation.feedback.success:
            continue
        failed_categories.add(observation.task.category)
        key = (observation.task.category,
               detail_signature(observation.feedback.detail or observation.trajectory.error))
        if key not in seen:
            seen.add(key)
            failures.append(observation)
    successes, kept = [], set()
    for observation in observations:
        category = observation.task.category
        if observation.feedback.success and category not in failed_categories and category not in kept:
            kept.add(category)
            successes.append(observation)
    return failures + successes


def intervention_size(scores: list[float], size: int, window: int = 3, epsilon: float = 0.01,
                      max_size: int = 4) -> tuple[int, str]:
    """The next intervention size from the score curve (oldest first) and the current size:
    smaller (by one) while improving (the last score beats the one before by more than
    `epsilon`), larger (by one) on a plateau (the last `window` scores within `epsilon`), else
    unchanged; always within 1..max_size."""
    bounded = max(1, min(int(max_size), int(size)))
    if len(scores) >= 2 and scores[-1] - scores[-2] > epsilon:
        return max(1, bounded - 1), "improving"
    recent = scores[-window:]
    if len(scores) >= max(2, window) and max(recent) - min(recent) <= epsilon:
        return min(int(max_size), bounded + 1), "plateau"
    return bounded, "too few cycles" if len(scores) < max(2, window) else "steady"


SIZE_KNOBS = ("per_cycle", "max_gaps", "max_proposals")  # textbook, adaptive-skill, guided


def _size_knob(engine: object) -> str:
    """The engine's setting for how much it changes in a cycle ("" when it has none)."""
    return next((knob for knob in SIZE_KNOBS if isinstance(getattr(engine, knob, None), int)), "")


def _accepts_guidance(engine: EvolutionEngine) -> TypeGuard[GuidedEngine]:
    try:
        return "guidance" in inspect.signature(engine.step).parameters
    except (TypeError, ValueError):
        return False


class AdaptiveEvolutionEngine(EvolutionEngine):
    """Adaptive Evolution: filtered observations and an intervention size that follows the score.

    Each step records this cycle's mean train score in `self.scores` — the score curve. The loop
    does not hand scores to engines, and an engine lives for the whole run, so the curve is
    built here, one point per step() of this engine object (a run resumed after a review, which
    makes a new engine, starts a new curve). From it `intervention_size` grows the size on a
    plateau and shrinks it while the score improves (1..max_size, starting at `start_size`).

    The edit is delegated to an inner engine (`inner`, any engine name or dotted path, default
    skillforge; the other keyword options go to it) with `observations_filter`'s observations:
    an inner engine with a size setting (SIZE_KNOBS: textbook's per_cycle, adaptive-skill's
    max_gaps, guided's max_proposals) gets the size there; one whose step() takes `guidance`
    (skillforge) gets it as a budget sentence; any other gets none, and the metadata says so.
    """

    name = "adaptive"

    @classmethod
    def options_check(cls, options: Mapping[str, Any]) -> None:
        if int(options.get("window", 3)) < 1 or int(options.get("max_size", 4)) < 1:
            raise EngineError("adaptive: window and max_size are at least 1")

    def __init__(self, inner: str = "skillforge", window: int = 3, max_size: int = 4, epsilon: float = 0.01,
                 start_size: int = 1, *, trusted: bool = False, **inner_options: Any) -> None:
        self.options_check({"window": window, "max_size": max_size})
        self.inner_name = inner
        self.inner = engine_get(inner, trusted=trusted, **inner_options)
        self.window, self.max_size, self.epsilon = int(window), int(max_size), float(epsilon)
        self.size = max(1, min(self.max_size, int(start_size)))
        self.scores: list[float] = []

    def step(self, workspace: Workspace, observations: list[Observation], history: History,
             trial: Trial | None) -> StepResult:
        self.scores.append(_mean_score(observations))
        self.size, why = intervention_size(self.scores, self.size, self.window, self.epsilon, self.max_size)
        chosen = observations_filter(observations)
        failures = sum(1 for o in chosen if not o.feedback.success)
        metadata: dict[str, Any] = {
            "inner": self.inner_name, "score_curve": list(self.scores), "size": self.size,
            "size_reason": why, "observations": len(observations), "kept": [o.task.task_id for o in chosen],
            "kept_failures": failures,
        }
        if not failures:
            return StepResult(False, f"adaptive: no failures to learn from (size {self.size}, {why})",
                              {**metadata, "size_applied_as": "none"})
        knob = _size_knob(self.inner)
        if knob:
            setattr(self.inner, knob, self.size)
            metadata["size_applied_as"] = knob
            result = self.inner.step(workspace, chosen, history, trial)
        elif _accepts_guidance(self.inner):
            curve = ", ".join(f"{score:.3f}" for score in self.scores)
            guidance = (f"Budget for this cycle: at most {self.size} focused change"
                        f"{'s' if self.size != 1 else ''} (a change is one skill created or edited, one "
                        f"prompt edit, or one memory entry). The score curve so far is {curve} ({why}).")
            metadata["size_applied_as"] = "guidance"
            result = self.inner.step(workspace, chosen, history, trial, guidance=guidance)
        else:
            metadata["size_applied_as"] = "none (the inner engine has no size setting and takes no guidance)"
            result = self.inner.step(workspace, chosen, history, trial)
        metadata["inner_metadata"] = dict(result.metadata)
        summary = (f"adaptive (size {self.size}, {why}; {len(chosen)} of {len(observations)} observations) "
                   f"via {self.inner_name}: {result.summary}")
        return StepResult(result.mutated, summary[:500], metadata)

    def on_cycle_end(self, accepted: bool, score: float = 0.0) -> None:
        cycle_end_call(self.inner, accepted, score)
