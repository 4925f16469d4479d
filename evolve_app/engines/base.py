"""The engine interface every evolution engine follows, its error, and the end-of-cycle callback."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from evolve_app.types import History, Observation, StepResult, Trial, Workspace


class EngineError(Exception):
    """An engine name or path that does not resolve to an engine."""


class EvolutionEngine:
    """The seed's engine interface. `PATH_OPTIONS` are options that name a file on the server:
    from the web and API they must lie under CRUCIBLE_REPO_ROOTS."""

    name = "engine"
    PATH_OPTIONS: tuple[str, ...] = ()

    @classmethod
    def options_check(cls, options: Mapping[str, Any]) -> None:
        """Refuse option values the engine would refuse, without making it (EngineError)."""
        return None

    def step(self, workspace: Workspace, observations: list[Observation], history: History,
             trial: Trial | None) -> StepResult:
        raise NotImplementedError

    def on_cycle_end(self, accepted: bool, score: float = 0.0) -> None:
        """Optional: called once each cycle is decided (not while it waits for review), with
        whether its mutation was kept and the cycle's train score (A-Evolve's signature)."""
        return None


def cycle_end_takes_score(engine: object) -> bool:
    """Whether `engine.on_cycle_end` takes the score too (A-Evolve's `(accepted, score)`), or
    only `accepted` (engines written before): its signature, inspected once."""
    method = getattr(engine, "on_cycle_end", None)
    if method is None:
        return False
    try:
        parameters = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in parameters
                  if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)


def cycle_end_call(engine: object, accepted: bool, score: float, takes_score: bool | None = None) -> None:
    """`engine.on_cycle_end(accepted, score)`, or `(accepted)` for an engine whose callback takes
    one argument; nothing for an engine without one."""
    if not hasattr(engine, "on_cycle_end"):
        return
    if takes_score if takes_score is not None else cycle_end_takes_score(engine):
        engine.on_cycle_end(accepted, score)
    else:
        engine.on_cycle_end(accepted)
