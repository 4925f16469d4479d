"""An A-Evolve user's own script under Crucible: the code behind `crucible.aevolve`, whose
`Evolver(agent, benchmark, config=None, engine=None, work_dir=...)` and `run(cycles=None)` take
what `agent_evolve.Evolver` takes and return what it returns, while the evolution runs under
Crucible (a run and its cycles in the database, live pages, sandboxed commands, receipts, the
holdout gate, review mode).

What each argument may be, and what it becomes here:

- agent: a workspace folder, an A-Evolve seed name (`_SEED_REGISTRY`: swe, mcp, terminal …,
  from the wheel's `seed_workspaces/`), an A-Evolve `BaseAgent` instance (wrapped: its `solve`
  gets A-Evolve's Task and gives A-Evolve's Trajectory, its workspace rebound to Crucible's copy),
  or a Crucible agent instance. The folder is imported as Crucible's own copy in the data dir;
  the user's folder is never written.
- benchmark: a registry key (Crucible's, and A-Evolve's where installed) or a BenchmarkAdapter
  instance, A-Evolve's (wrapped, its Task/Trajectory/Feedback converted both ways) or Crucible's.
- config: A-Evolve's EvolveConfig, the path of its YAML, a dict of its keys, or None; every key is
  mapped by `config_map` (honoured, or refused with a ValueError naming it and why).
- engine: None (A-Evolve's default SkillForge: Crucible's `aevolve-skillforge`), an instance of one
  of A-Evolve's four engines (its Crucible adapter, keeping its config), any other A-Evolve
  EvolutionEngine (wrapped: `UpstreamEngine`), or a Crucible engine name or instance.

An A-Evolve `BaseAgent`'s (or engine's, or benchmark's) own Python code runs in the script's
process, as under A-Evolve: it is the user's code, trusted by the user who runs it. Agents named
by their workspace (a path or a seed) run as any Crucible run's agent does, in the sandbox.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import agent_evolve
from agent_evolve import types as ae
from agent_evolve.algorithms.adaptive_evolve.engine import AdaptiveEvolveEngine
from agent_evolve.algorithms.adaptive_skill.engine import AdaptiveSkillEngine
from agent_evolve.algorithms.guided_synth.engine import GuidedSynthesisEngine
from agent_evolve.algorithms.skillforge.engine import AEvolveEngine
from agent_evolve.api import _BENCHMARK_REGISTRY, _SEED_REGISTRY
from agent_evolve.benchmarks.base import BenchmarkAdapter as UpstreamBenchmarkAdapter
from agent_evolve.config import EvolveConfig as UpstreamConfig
from agent_evolve.contract.workspace import AgentWorkspace as UpstreamWorkspace
from agent_evolve.engine.base import EvolutionEngine as UpstreamEngineBase
from agent_evolve.protocol.base_agent import BaseAgent as UpstreamAgentBase
from django.conf import settings as django_settings
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import connection
from pydantic import ValidationError as PydanticError

from evolve_app import aevolve_upstream as bridge
from evolve_app import services
from evolve_app.agents import AgentError, agent_check, agent_run_problems
from evolve_app.agents import BaseAgent as CrucibleAgent
from evolve_app.benchmarks import BenchmarkAdapter as CrucibleBenchmarkAdapter
from evolve_app.benchmarks import BenchmarkError, benchmark_adapt, benchmark_get
from evolve_app.engines import EngineError, cycle_end_call, engine_get
from evolve_app.loop import CycleResult
from evolve_app.loop import EvolveConfig as CrucibleConfig
from evolve_app.models import Cycle, EvolutionRun
from evolve_app.types import Observation, StepResult, Task, Trajectory
from evolve_app.workspace import WorkspaceError, workspace_manifest

logger = logging.getLogger(__name__)

SEEDS_DIR = Path(agent_evolve.__file__).resolve().parent.parent / "seed_workspaces"
DEFAULT_ENGINE = "aevolve-skillforge"  # A-Evolve's default (SkillForge's AEvolveEngine), adapted
MAX_CYCLES = 200  # as a run started from a page, the API or the CLI
# Crucible's own settings an A-Evolve config may carry in `extra` (or as top-level YAML keys, which
# A-Evolve's from_yaml puts in extra): taken by Crucible's loop, not handed to the engine.
CRUCIBLE_EXTRA = ("review_mode", "concurrency", "holdout_tolerance", "convergence", "engine_options")
CONVERGENCE_RULES = ("a-evolve", "crucible")
# The A-Evolve EvolveConfig field each Crucible setting comes from, for the refusals' messages.
_SOURCE_KEY = {"batch_size": "batch_size", "holdout_size": "holdout_ratio", "egl_threshold": "egl_threshold",
               "egl_window": "egl_window", "trajectory_only": "trajectory_only",
               "evolve_layers": "evolve_prompts/evolve_skills/evolve_memory/evolve_tools",
               "convergence": "extra['convergence']", "review_mode": "extra['review_mode']",
               "concurrency": "extra['concurrency']", "holdout_tolerance": "extra['holdout_tolerance']",
               "engine_options": "evolver_model/evolver_max_tokens/extra"}
# Upstream's create_default_llm: which provider an evolver_model names.
_BEDROCK_MODEL = re.compile(r".*\..*(?:anthropic|amazon|meta)|.*(?:anthropic|amazon|meta).*\.")
_UPSTREAM_ENGINES: tuple[tuple[type, str], ...] = (
    (AdaptiveSkillEngine, "aevolve-adaptive-skill"), (GuidedSynthesisEngine, "aevolve-guided"),
    (AdaptiveEvolveEngine, "aevolve-adaptive"), (AEvolveEngine, DEFAULT_ENGINE))


# ------------------------------------------------------------------------------------ the config


@dataclasses.dataclass
class MappedConfig:
    """An A-Evolve EvolveConfig as Crucible takes it: `settings` for Crucible's loop
    (evolve_app.loop.EvolveConfig's fields), `max_cycles` for run(cycles=None), the options of
    A-Evolve's engines (`aevolve_options`), a Crucible engine's own (`engine_options`), and a note
    per key saying what became of it."""

    settings: dict[str, Any]
    max_cycles: int
    aevolve_options: dict[str, Any]
    engine_options: dict[str, Any]
    notes: dict[str, str]


def config_read(config: Any) -> UpstreamConfig:
    """`config` as A-Evolve's EvolveConfig: itself, None (the defaults), the path of its YAML
    (read by A-Evolve's own from_yaml), or a dict of its keys (unknown keys go to extra, as
    from_yaml puts them)."""
    if config is None:
        return UpstreamConfig()
    if isinstance(config, UpstreamConfig):
        return config
    if isinstance(config, str | Path):
        if not Path(config).is_file():
            raise ValueError(f"config: {config} is not a file (give an EvolveConfig, the path of its YAML, "
                             "a dict or None)")
        try:
            return UpstreamConfig.from_yaml(config)
        except Exception as error:
            raise ValueError(f"config: {config} could not be read as A-Evolve's EvolveConfig YAML: "
                             f"{type(error).__name__}: {error}") from None
    if isinstance(config, Mapping):
        known = {f.name for f in dataclasses.fields(UpstreamConfig)}
        extra = dict(config.get("extra") or {})
        extra.update({str(k): v for k, v in config.items() if k not in known})
        try:
            return UpstreamConfig(**{k: v for k, v in config.items() if k in known and k != "extra"},
                                  extra=extra)
        except TypeError as error:
            raise ValueError(f"config: {error}") from None
    raise ValueError(f"config: give A-Evolve's EvolveConfig, the path of its YAML, a dict or None; "
                     f"got {type(config).__name__}")


def _integer(key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"config {key}: {value!r} cannot be honoured: Crucible takes a whole number "
                         f"from {low} to {high}")
    return value


def _number(key: str, value: Any, low: float, high: float, *, below: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
        and low <= value and (value < high if below else value <= high)
    if not ok:
        bound = f"below {high}" if below else f"at most {high}"
        raise ValueError(f"config {key}: {value!r} cannot be honoured: Crucible takes a number from {low}, "
                         f"{bound}")
    return float(value)


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"config {key}: {value!r} cannot be honoured: give true or false")
    return value


def evolver_preset(model: str) -> str:
    """The fleet preset A-Evolve's create_default_llm would pick for `evolver_model`: Bedrock for
    a Bedrock id (`us.anthropic.…`, and anything it does not know), Anthropic's API for `claude…`,
    OpenAI's for `gpt-`, `o1`, `o3`."""
    if "." in model and _BEDROCK_MODEL.fullmatch(model):
        return "bedrock"
    if model.startswith("claude"):
        return "anthropic"
    if model.startswith(("gpt-", "o1", "o3")):
        return "openai"
    return "bedrock"


def config_map(config: UpstreamConfig, *, preset: str | None = None) -> MappedConfig:
    """Every key of A-Evolve's EvolveConfig, honoured or refused (a ValueError naming the key and
    why); nothing is silently forced. `preset` (CRUCIBLE_AEVOLVE_PRESET) names the fleet preset
    the evolver model is called through, else it is chosen as A-Evolve chooses its provider.

    batch_size → batch_size · max_cycles → run(cycles=None) · holdout_ratio → holdout_size =
    round(ratio × batch_size) (the holdout gate) · evolve_prompts/skills/memory/tools →
    evolve_layers · trajectory_only, egl_threshold, egl_window → the same names · convergence:
    A-Evolve's rule · evolver_model, evolver_max_tokens → the A-Evolve engine's model (through the
    preset) and evolver_max_tokens · extra → the engine's extra (JSON), except Crucible's own
    settings (CRUCIBLE_EXTRA: review_mode, concurrency, holdout_tolerance, convergence and a
    Crucible engine's engine_options), which Crucible's loop takes."""
    notes: dict[str, str] = {}
    batch = _integer("batch_size", config.batch_size, 1, 1000)
    notes["batch_size"] = f"batch_size {batch}"
    cycles = _integer("max_cycles", config.max_cycles, 1, MAX_CYCLES)
    notes["max_cycles"] = f"run(cycles=None) runs {cycles} cycles"
    ratio = _number("holdout_ratio", config.holdout_ratio, 0.0, 1.0, below=True)
    holdout = round(ratio * batch)
    notes["holdout_ratio"] = (f"holdout gate on {holdout} holdout task{'s' if holdout != 1 else ''} "
                              f"(round({ratio:g} × batch_size {batch}))" if holdout else "holdout gate off")
    layers = [layer for layer, key in (("prompts", "evolve_prompts"), ("skills", "evolve_skills"),
                                       ("memory", "evolve_memory"), ("tools", "evolve_tools"))
              if _flag(key, getattr(config, key))]
    for key in ("evolve_prompts", "evolve_skills", "evolve_memory", "evolve_tools"):
        notes[key] = f"evolve_layers {layers} (with the manifest's evolvable_layers)"
    trajectory_only = _flag("trajectory_only", config.trajectory_only)
    notes["trajectory_only"] = f"trajectory_only {trajectory_only}"
    threshold = _number("egl_threshold", config.egl_threshold, 0.0, 1.0)
    window = _integer("egl_window", config.egl_window, 2, 100)
    notes["egl_threshold"], notes["egl_window"] = f"egl_threshold {threshold:g}", f"egl_window {window}"
    if not isinstance(config.extra, Mapping):
        raise ValueError(f"config extra: {config.extra!r} cannot be honoured: give a mapping")
    extra = dict(config.extra)
    settings: dict[str, Any] = {"batch_size": batch, "holdout_size": holdout, "egl_threshold": threshold,
                                "egl_window": window, "evolve_layers": layers,
                                "trajectory_only": trajectory_only, "convergence": "a-evolve"}
    if "review_mode" in extra:
        settings["review_mode"] = _flag("extra['review_mode']", extra.pop("review_mode"))
    if "concurrency" in extra:
        settings["concurrency"] = _integer("extra['concurrency']", extra.pop("concurrency"), 1, 16)
    if "holdout_tolerance" in extra:
        settings["holdout_tolerance"] = _number("extra['holdout_tolerance']", extra.pop("holdout_tolerance"),
                                                0.0, 1.0)
    if "convergence" in extra:
        rule = extra.pop("convergence")
        if rule not in CONVERGENCE_RULES:
            raise ValueError(f"config extra['convergence']: {rule!r} cannot be honoured: give one of "
                             f"{', '.join(CONVERGENCE_RULES)}")
        settings["convergence"] = rule
    notes["convergence"] = f"convergence rule {settings['convergence']}"
    engine_options = extra.pop("engine_options", None) or {}
    if not isinstance(engine_options, Mapping):
        raise ValueError("config extra['engine_options']: give a mapping of a Crucible engine's options")
    model = config.evolver_model
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"config evolver_model: {model!r} cannot be honoured: give a model id")
    max_tokens = _integer("evolver_max_tokens", config.evolver_max_tokens, 256, 64_000)
    try:
        extra_text = json.dumps(extra, sort_keys=True) if extra else ""
    except (TypeError, ValueError) as error:
        raise ValueError(f"config extra: cannot be handed to the engine as JSON: {error}") from None
    chosen = preset or evolver_preset(model)
    aevolve_options: dict[str, Any] = {"preset": chosen, "model": model, "evolver_max_tokens": max_tokens}
    if extra_text:
        aevolve_options["extra"] = extra_text
    notes["evolver_model"] = f"the A-Evolve engine's model {model} through the {chosen} preset"
    notes["evolver_max_tokens"] = f"evolver_max_tokens {max_tokens}"
    notes["extra"] = f"to the engine: {extra_text or 'nothing'}"
    return MappedConfig(settings, cycles, aevolve_options, dict(engine_options), notes)


def crucible_config(mapped: MappedConfig) -> tuple[CrucibleConfig, list[str]]:
    """Crucible's loop settings for `mapped`; a value Crucible cannot honour raises ValueError
    naming A-Evolve's key. (The warnings list stays for settings a later A-Evolve adds.)"""
    settings = dict(mapped.settings)
    warnings: list[str] = []
    try:
        return CrucibleConfig(**settings), warnings
    except PydanticError as error:
        problems = "; ".join(f"{_SOURCE_KEY.get(str(e['loc'][0]), e['loc'][0]) if e['loc'] else 'config'}: "
                             f"{e['msg']}" for e in error.errors())
        raise ValueError(f"config cannot be honoured: {problems}") from None


# ------------------------------------------------------------------------------------- the agent


def _task_up(task: Task) -> ae.Task:
    """The A-Evolve Task `task` came from (kept by the benchmark wrapper), else one made of it."""
    original = getattr(task, "_upstream", None)
    if isinstance(original, ae.Task):
        return original
    metadata = dict(task.metadata)
    if task.category and "category" not in metadata:
        metadata["category"] = task.category
    return ae.Task(id=task.task_id, input=task.input, metadata=metadata)


def _trajectory_down(trajectory: Any, task: Task) -> Trajectory:
    if not isinstance(trajectory, ae.Trajectory | Trajectory):
        raise TypeError(f"solve() returned {type(trajectory).__name__}, not a Trajectory")
    made = Trajectory(task_id=str(trajectory.task_id or task.task_id), output=str(trajectory.output or ""),
                      steps=list(trajectory.steps or []),
                      conversation=list(getattr(trajectory, "conversation", []) or []))
    made._upstream = trajectory  # type: ignore[attr-defined]  # what the benchmark wrapper evaluates
    return made


def _trajectory_up(trajectory: Trajectory) -> ae.Trajectory:
    original = getattr(trajectory, "_upstream", None)
    if isinstance(original, ae.Trajectory):
        return original
    return ae.Trajectory(task_id=trajectory.task_id, output=trajectory.output or trajectory.error,
                         steps=list(trajectory.steps),
                         conversation=list(getattr(trajectory, "conversation", []) or []))


class UpstreamAgent(CrucibleAgent):
    """An A-Evolve BaseAgent run by Crucible's loop: its workspace rebound to Crucible's copy (so
    its reads and memories go there, never to the user's folder), `solve` handed A-Evolve's Task
    and its Trajectory taken back, reload_from_fs/export_to_fs delegated."""

    def __init__(self, workspace_path: str | Path, upstream: UpstreamAgentBase) -> None:
        self.upstream = upstream
        upstream.workspace = UpstreamWorkspace(Path(workspace_path))
        super().__init__(workspace_path)  # reload_from_fs: Crucible's state and the agent's own

    def __repr__(self) -> str:
        return f"UpstreamAgent({type(self.upstream).__name__}, {str(self.workspace_path)!r})"

    def solve(self, task: Task) -> Trajectory:
        return _trajectory_down(self.upstream.solve(_task_up(task)), task)

    def reload_from_fs(self) -> None:
        super().reload_from_fs()
        self.upstream.reload_from_fs()

    def export_to_fs(self) -> int:
        written = super().export_to_fs()
        pending = len(getattr(self.upstream, "_new_memories", []) or [])
        self.upstream.export_to_fs()
        return written + pending


def agent_source(agent: Any) -> tuple[Path, Any]:
    """The folder `agent` names and the agent object to wrap (None for a folder or seed name).
    Refuses (ValueError) what is neither a folder, a seed name nor an agent."""
    if isinstance(agent, UpstreamAgentBase):
        return Path(agent.workspace.root), agent
    if isinstance(agent, CrucibleAgent):
        return Path(agent.workspace_path), agent
    if isinstance(agent, str | Path) and str(agent).strip():
        path = Path(agent).expanduser()
        if path.is_dir():
            return path.resolve(), None
        seed = _SEED_REGISTRY.get(str(agent))
        if seed is not None:
            folder = SEEDS_DIR / seed
            if folder.is_dir():
                return folder, None
            shipped = sorted(p.name for p in SEEDS_DIR.iterdir()) if SEEDS_DIR.is_dir() else []
            raise ValueError(f"agent {agent!r}: A-Evolve's seed {seed!r} is not in the installed a-evolve "
                             f"package (its seed_workspaces has {', '.join(shipped) or 'nothing'})")
        raise ValueError(f"Cannot resolve agent: {str(agent)!r} is neither a folder nor an A-Evolve seed "
                         f"name ({', '.join(sorted(_SEED_REGISTRY))}). Pass a workspace directory path, a "
                         "seed name, or a BaseAgent instance.")
    raise ValueError(f"Cannot resolve agent: got {type(agent).__name__}. Pass a workspace directory path, "
                     "a seed name, or a BaseAgent instance (agent_evolve.protocol.base_agent.BaseAgent).")


# --------------------------------------------------------------------------------- the benchmark


def _class_path(value: Any) -> str:
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"


def benchmark_resolve(benchmark: Any) -> tuple[CrucibleBenchmarkAdapter, str]:
    """(the benchmark Crucible's loop runs, what the run's page calls it)."""
    if isinstance(benchmark, UpstreamBenchmarkAdapter):
        return benchmark_adapt(benchmark), _class_path(benchmark)
    if isinstance(benchmark, CrucibleBenchmarkAdapter):
        return benchmark, _class_path(benchmark)
    if not isinstance(benchmark, str) or not benchmark.strip():
        raise ValueError(f"benchmark: give a registry key ({', '.join(sorted(_BENCHMARK_REGISTRY))}, or "
                         f"Crucible's: demo, jsonl:PATH, folder:PATH) or a BenchmarkAdapter instance; got "
                         f"{type(benchmark).__name__}")
    try:
        return benchmark_get(benchmark, trusted=True), benchmark
    except BenchmarkError as error:  # A-Evolve's keys too: what this host lacks, named at once
        raise ValueError(f"benchmark {benchmark!r}: {error}") from None


# ------------------------------------------------------------------------------------ the engine


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


class UpstreamEngine:
    """Any other A-Evolve EvolutionEngine run by Crucible's loop: its step() handed the facades
    A-Evolve's engines expect (workspace, history, trial: evolve_app.aevolve_upstream) and the
    cycle's observations in A-Evolve's types; its StepResult (and `stop`, where it has one) taken
    back; `manages_own_evaluation` passed on to the loop."""

    def __init__(self, engine: UpstreamEngineBase) -> None:
        self.engine = engine
        self.name = _class_path(engine)

    @property
    def manages_own_evaluation(self) -> bool:
        return bool(getattr(self.engine, "manages_own_evaluation", False))

    def step(self, workspace: Any, observations: list[Observation], history: Any, trial: Any) -> StepResult:
        root = Path(workspace.root)
        upstream = [ae.Observation(_task_up(o.task), _trajectory_up(o.trajectory),
                                   ae.Feedback(success=o.feedback.success, score=o.feedback.score,
                                               detail=o.feedback.detail)) for o in observations]
        facades: tuple[Any, Any, Any] = (bridge.WorkspaceFacade(workspace),
                                         bridge.HistoryFacade(history, root, observations),
                                         bridge.TrialFacade(trial))  # A-Evolve's interfaces, duck-typed
        result = self.engine.step(facades[0], upstream, facades[1], facades[2])
        metadata = _jsonable(dict(getattr(result, "metadata", None) or {}))
        stop = bool(getattr(result, "stop", False))
        if stop:
            metadata["stop"] = True
        return StepResult(bool(result.mutated), str(result.summary or "")[:500],
                          {"upstream": self.name, **metadata}, stop=stop)

    def on_cycle_end(self, accepted: bool, score: float = 0.0) -> None:
        self.engine.on_cycle_end(accepted, score)


def _adapter_options(engine: Any, name: str, preset: str | None) -> dict[str, Any]:
    """The options of the Crucible adapter `name` that keep an A-Evolve engine instance's config."""
    config = getattr(engine, "config", None) or UpstreamConfig()
    model = str(config.evolver_model)
    options: dict[str, Any] = {"preset": preset or evolver_preset(model), "model": model,
                               "evolver_max_tokens": int(config.evolver_max_tokens)}
    if config.extra:
        options["extra"] = json.dumps(_jsonable(dict(config.extra)), sort_keys=True)
    if name == "aevolve-guided":
        options.update(write_memory=bool(getattr(engine, "_write_memory", True)),
                       verification_focus=bool(getattr(engine, "_verification_focus", False)))
    elif name == "aevolve-adaptive":
        options.update(memory_cap=int(getattr(engine, "_memory_cap", 15)),
                       improvement_threshold=float(getattr(engine, "_improvement_threshold", 0.02)),
                       stagnation_window=int(getattr(engine, "_stagnation_window", 5)))
    return options


def _engine_make(name: str, options: dict[str, Any]) -> Any:
    try:
        return engine_get(name, trusted=True, **options)
    except (EngineError, TypeError, ValueError) as error:
        raise ValueError(f"engine {name!r} cannot run here: {error}") from None


def engine_resolve(engine: Any, mapped: MappedConfig, *,
                   preset: str | None = None) -> tuple[Any, str, list[str]]:
    """(the engine Crucible's loop runs, what the run's page calls it, notes)."""
    if engine is None:
        return _engine_make(DEFAULT_ENGINE, mapped.aevolve_options), DEFAULT_ENGINE, [
            "engine: A-Evolve's default SkillForge, as Crucible's aevolve-skillforge"]
    if isinstance(engine, UpstreamEngineBase):
        for cls, name in _UPSTREAM_ENGINES:
            if type(engine) is cls or (isinstance(engine, cls) and not _overrides_step(engine, cls)):
                notes = [f"engine: {type(engine).__name__} as Crucible's {name} (its config kept; its model "
                         "calls through Crucible's fleet preset, its bash in the sandbox)"]
                if getattr(engine, "_llm", None) is not None:
                    notes.append("engine: the LLM provider it was given is not used (Crucible's preset is)")
                return _engine_make(name, _adapter_options(engine, name, preset)), name, notes
        return UpstreamEngine(engine), _class_path(engine), [
            f"engine: {type(engine).__name__} stepped through A-Evolve's interfaces (its own code, in this "
            "process)"]
    if isinstance(engine, str) and engine.strip():
        name = engine.strip()
        options = mapped.aevolve_options if name.startswith("aevolve-") else mapped.engine_options
        return _engine_make(name, dict(options)), name, []
    if callable(getattr(engine, "step", None)):
        return engine, _class_path(engine), []
    raise ValueError(f"engine: give an A-Evolve EvolutionEngine, a Crucible engine name or instance, or "
                     f"None; got {type(engine).__name__}")


def _overrides_step(engine: Any, cls: type) -> bool:
    """A user's subclass of one of A-Evolve's engines with its own step(): not the engine the
    adapter makes, so it is stepped as it is (UpstreamEngine)."""
    return type(engine).step is not cls.step  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------- the door


def database_ready() -> None:
    """The first use of an embedded data dir: make its tables (as `crucible_setup` would)."""
    if "evolve_app_evolutionrun" not in connection.introspection.table_names():
        call_command("migrate", verbosity=0, interactive=False)


def _refusal(error: ValidationError) -> str:
    if hasattr(error, "message_dict"):
        return "; ".join(f"{key}: {' '.join(map(str, values))}" for key, values in error.message_dict.items())
    return " ".join(map(str, error.messages))


class Evolver:
    """A-Evolve's `Evolver`, run under Crucible. See the module's docstring for what it takes.

    `work_dir` is accepted and not used: Crucible keeps its copy of the workspace in its data dir
    (the result's details name it). Who runs it and where: CRUCIBLE_AEVOLVE_USER and
    CRUCIBLE_AEVOLVE_PROJECT (services.script_actor_get); the evolver model's fleet preset:
    CRUCIBLE_AEVOLVE_PRESET (default: the one A-Evolve's provider choice names)."""

    def __init__(self, agent: Any, benchmark: Any, config: Any = None, engine: Any = None,
                 work_dir: str | Path = "./evolution_workdir") -> None:
        self.config = config_read(config)
        preset = os.environ.get("CRUCIBLE_AEVOLVE_PRESET", "").strip() or None
        self.mapped = config_map(self.config, preset=preset)
        source, instance = agent_source(agent)
        self.work_dir = Path(work_dir)
        database_ready()
        try:
            self.user, self.project = services.script_actor_get(
                os.environ.get("CRUCIBLE_AEVOLVE_USER", "").strip(),
                os.environ.get("CRUCIBLE_AEVOLVE_PROJECT", "").strip())
            self.agent_row = services.script_agent_import(self.user, self.project, source)
        except ValidationError as error:
            raise ValueError(f"agent {str(source)!r} cannot be imported: {_refusal(error)}") from None
        path = Path(self.agent_row.path)
        self.workspace = path
        if isinstance(instance, UpstreamAgentBase):
            self.agent: Any = UpstreamAgent(path, instance)
        elif isinstance(instance, CrucibleAgent):
            self.agent = type(instance)(path)
        else:
            try:
                agent_check(path, trusted=True)
                problems = agent_run_problems(path)
            except (AgentError, OSError) as error:
                raise ValueError(f"agent {str(source)!r} cannot run: {error}") from None
            if problems:
                raise ValueError(f"agent {str(source)!r} cannot run: " + "; ".join(problems))
            self.agent = str(path)
        self.benchmark, self._benchmark_label = benchmark_resolve(benchmark)
        try:
            workspace_manifest(path)
        except WorkspaceError as error:
            raise ValueError(f"agent {str(source)!r}: {error}") from None
        self.settings, self.warnings = crucible_config(self.mapped)
        self.engine, self._engine_label, engine_notes = engine_resolve(engine, self.mapped, preset=preset)
        self.notes = [*self.mapped.notes.values(), *engine_notes,
                      f"work_dir {self.work_dir}: not used; Crucible's copy is {path}"]
        for warning in self.warnings:
            logger.warning("crucible.aevolve: %s", warning)
        self.run_row: EvolutionRun | None = None

    def run(self, cycles: int | None = None) -> ae.EvolutionResult:
        """Run `cycles` cycles (None: config.max_cycles) as a Crucible run, and return A-Evolve's
        EvolutionResult. A cycle awaiting review (extra['review_mode']) ends the call: the result's
        details say `awaiting_review` (the cycle's number) and the run's page, where an approver
        decides; calling run() again then goes on with the same run's remaining cycles."""
        count = cycles or self.mapped.max_cycles
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_CYCLES:
            raise ValueError(f"cycles: give 1 to {MAX_CYCLES} cycles (or None for config.max_cycles); "
                             f"got {count!r}")
        resume = self.run_row
        if resume is not None:
            resume.refresh_from_db()
            if resume.status not in (EvolutionRun.Status.QUEUED, EvolutionRun.Status.AWAITING_REVIEW):
                resume = None  # that run ended: this call is a new run, as A-Evolve's would be
        if resume is not None and resume.status == EvolutionRun.Status.QUEUED:
            self._review_decided(resume)
        labels = {"benchmark": self._benchmark_label, "engine": self._engine_label}
        try:
            self.run_row, _ = services.evolution_run_script(
                self.user, self.agent_row, solver=self.agent, benchmark=self.benchmark, engine=self.engine,
                config=self.settings, cycles=count, labels=labels, run=resume, on_cycle=self._announce)
        except ValidationError as error:
            raise ValueError(_refusal(error)) from None
        return self.result()

    def _review_decided(self, run: EvolutionRun) -> None:
        """An approver decided the cycle this script paused on: the agent reads the files as they
        are now, and the engine hears the decision (as a worker's engine made after it would not)."""
        if isinstance(self.agent, CrucibleAgent):
            self.agent.reload_from_fs()
        last = Cycle.objects.filter(run=run).order_by("-number").first()
        if last is not None and last.decided_by_id is not None:
            cycle_end_call(self.engine, last.status == Cycle.Status.ACCEPTED, last.score or 0.0)

    @staticmethod
    def _announce(result: CycleResult) -> None:
        score = "—" if result.score is None else f"{result.score:.3f}"
        logger.info("cycle %s %s, score %s", result.number, result.status, score)

    def result(self) -> ae.EvolutionResult:
        """A-Evolve's EvolutionResult for the run so far (details: the run, its page, each cycle)."""
        run = self.run_row
        if run is None:
            return ae.EvolutionResult(cycles_completed=0, final_score=0.0, details={"notes": self.notes})
        run.refresh_from_db()
        cycles = list(Cycle.objects.filter(run=run).order_by("number"))
        scores = [float(cycle.score or 0.0) for cycle in cycles]
        waiting = next((c.number for c in cycles if c.status == Cycle.Status.AWAITING_REVIEW), None)
        path = run.get_absolute_url()
        config = django_settings.CONFIG
        base = f"http://{config.host}:{config.port}"  # where `manage.py serve` serves
        details = {"run_id": run.pk, "run_number": run.number, "agent_id": run.agent_id,
                   "project": self.project.name, "status": run.status, "reason": run.reason,
                   "url": f"{base}{path}", "path": path, "workspace": str(self.workspace),
                   "source": self.agent_row.source_path, "awaiting_review": waiting,
                   "cycles": [{"cycle": c.number, "status": c.status, "score": c.score, "mutated": c.mutated,
                               "summary": c.summary, "reason": c.reason} for c in cycles],
                   "notes": list(self.notes), "warnings": list(self.warnings)}
        return ae.EvolutionResult(cycles_completed=len(cycles), final_score=scores[-1] if scores else 0.0,
                                  score_history=scores, converged=bool(run.converged), details=details)
