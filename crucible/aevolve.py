"""`import crucible.aevolve as ae`: A-Evolve's top level (`ae.Evolver(agent, benchmark, config,
engine).run(cycles)`, `ae.EvolveConfig`, `ae.BaseAgent`, `ae.Task` …) with the evolution run
under Crucible. A thin door: it sets Django up when the script has not, then re-exports.
The code is evolve_app/dropin.py; the other names are A-Evolve's own (the a-evolve package), so
a script's subclasses stay A-Evolve's types. See docs/evolution.md, "Your A-Evolve script under
Crucible"."""

from __future__ import annotations

import os
from importlib.util import find_spec

import django
from django.apps import apps

if find_spec("agent_evolve") is None:
    raise ImportError("crucible.aevolve runs A-Evolve scripts and needs the a-evolve package: "
                      "pip install -e '.[a-evolve]'")

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crucible.settings")
if not apps.ready:  # a plain script; under manage.py or a test run Django is set up already
    django.setup()

from agent_evolve import (
    AgentWorkspace,
    BaseAgent,
    BenchmarkAdapter,
    CycleRecord,
    EvolutionEngine,
    EvolutionHistory,
    EvolutionResult,
    EvolveConfig,
    Feedback,
    Manifest,
    Observation,
    SkillMeta,
    StepResult,
    Task,
    Trajectory,
    TrialRunner,
)

from evolve_app.dropin import Evolver, MappedConfig, config_map

__version__ = "0.1.0"  # the A-Evolve top level this door answers as

__all__ = [
    "AgentWorkspace",
    "BaseAgent",
    "BenchmarkAdapter",
    "CycleRecord",
    "EvolutionEngine",
    "EvolutionHistory",
    "EvolutionResult",
    "EvolveConfig",
    "Evolver",
    "Feedback",
    "Manifest",
    "MappedConfig",
    "Observation",
    "SkillMeta",
    "StepResult",
    "Task",
    "Trajectory",
    "TrialRunner",
    "config_map",
]
