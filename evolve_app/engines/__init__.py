"""Evolution engines: `step(workspace, observations, history, trial) -> StepResult`.

An engine may only change the workspace's files; the loop snapshots before and after, reverts
edits outside `evolvable_layers`, and rolls back mutations the holdout gate rejects. Engines
are named: the built-ins here (ENGINES), the entry points of `crucible.engines`, or a dotted path
where the caller may give one (the CLI, or CRUCIBLE_ALLOWED_EXTENSIONS; see evolve_app/extensions.py).
Their options arrive as keyword arguments from EvolveConfig.engine_options; `engine_check` checks a
name and its options without importing, constructing or calling anything.

- textbook: offline and deterministic (the demo's engine).
- skillforge: a model edits the workspace with the editor and a sandboxed shell (A-Evolve's default).
- guided: Guided Synthesis — failures become lessons in memory, lessons become drafted skills,
  drafts are curated (accept, merge, skip).
- adaptive: Adaptive Evolution — the most informative observations and an intervention size that
  follows the score curve, handed to an inner engine.
- adaptive-skill: Adaptive Skill — skill-gap analysis per task category, skills created or refined
  for the gaps, overlapping skills merged, unused ones pruned.
- search: candidate mutations by an inner engine on throwaway copies, each scored with the trial
  runner; the best is applied.

An engine that raises (e.g. a model call that fails after its retries: EngineError) fails the
cycle, and the loop puts the workspace back at pre-evo-N.

Engines written to A-Evolve's interface need not subclass EvolutionEngine: the loop calls
`on_cycle_end(accepted, score)` (or `(accepted)`, for a callback that takes one argument: see
cycle_end_call), ends the run when a StepResult has `stop` set, and hands them A-Evolve's calls
(`Task.id`, `trial.run_tasks` / `run_single` / `get_tasks`, the history's `get_observations` and
`latest_cycle`, the workspace's `clear_drafts` and folder attributes).

The package: `base` (the interface), `model` (what the model-driven engines share), one module per
engine, `registry` (names, options, loading). The names below are its public face: pyproject's
entry points name `evolve_app.engines:<Class>`.
"""

from __future__ import annotations

from evolve_app.engines.adaptive import (
    SIZE_KNOBS,
    AdaptiveEvolutionEngine,
    detail_signature,
    intervention_size,
    observations_filter,
)
from evolve_app.engines.adaptive_skill import AdaptiveSkillEngine
from evolve_app.engines.base import EngineError, EvolutionEngine, cycle_end_call, cycle_end_takes_score
from evolve_app.engines.guided import GuidedSynthesisEngine
from evolve_app.engines.model import LLM_KINDS, skill_categories
from evolve_app.engines.registry import (
    ENGINES,
    RESERVED_OPTIONS,
    builtins_register,
    engine_check,
    engine_choices,
    engine_get,
    engine_names,
    engine_resolve,
)
from evolve_app.engines.search import SearchEngine, _layer_files, search_winner, workspace_delta
from evolve_app.engines.skillforge import SkillForgeEngine
from evolve_app.engines.textbook import TextbookEngine

builtins_register({"textbook": TextbookEngine, "skillforge": SkillForgeEngine,
                   "guided": GuidedSynthesisEngine, "adaptive": AdaptiveEvolutionEngine,
                   "adaptive-skill": AdaptiveSkillEngine, "search": SearchEngine}, __name__)

# A-Evolve's engines through the adapter (offered when the a-evolve extra is installed): the module
# builds on the classes above and adds its engines to ENGINES, so it is registered last.
from evolve_app import aevolve  # noqa: E402, F401

__all__ = [
    "ENGINES", "LLM_KINDS", "RESERVED_OPTIONS", "SIZE_KNOBS", "AdaptiveEvolutionEngine",
    "AdaptiveSkillEngine", "EngineError", "EvolutionEngine", "GuidedSynthesisEngine", "SearchEngine",
    "SkillForgeEngine", "TextbookEngine", "_layer_files", "cycle_end_call", "cycle_end_takes_score",
    "detail_signature", "engine_check", "engine_choices", "engine_get", "engine_names", "engine_resolve",
    "intervention_size",
    "observations_filter", "search_winner", "skill_categories", "workspace_delta",
]
