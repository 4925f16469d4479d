"""A-Evolve's own engines, run by Crucible's loop through an adapter (the optional extra
`pip install -e '.[a-evolve]'`, import name `agent_evolve`).

    aevolve-skillforge      agent_evolve.algorithms.skillforge.engine.AEvolveEngine
    aevolve-guided          agent_evolve.algorithms.guided_synth.engine.GuidedSynthesisEngine
    aevolve-adaptive        agent_evolve.algorithms.adaptive_evolve.engine.AdaptiveEvolveEngine
    aevolve-adaptive-skill  agent_evolve.algorithms.adaptive_skill.engine.AdaptiveSkillEngine

Each Crucible engine here makes the A-Evolve engine once (it keeps state across cycles) and, every
cycle, hands its `step()` what it expects: the cycle's observations in agent_evolve's types, a
workspace facade that writes through Crucible's checked AgentWorkspace, a history facade over
Crucible's git history and `evolution/observations/` batches, a trial facade over the loop's
TrialRunner, and an `LLMProvider` whose every call goes to the run's fleet preset through
runtime_app.llm.ToolChat (receipts, key handling, account limits and retries as for Crucible's
own engines). No agent_evolve model client is ever made: `create_default_llm` never runs.

A-Evolve's `workspace_bash` tool (upstream: `bash -c` on the host, in the workspace) runs here in
the bubblewrap sandbox only (runtime_app.sandbox): the workspace bound writable with `.git`,
`evolution/` and `manifest.yaml` read-only on top, no network, a private /tmp and home; every
command leaves a receipt. Without bubblewrap the step refuses to start. The loop still reverts
whatever lands outside the manifest's evolvable layers.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from evolve_app.engines.base import EngineError
from evolve_app.engines.model import _ModelEngine, _Usage
from evolve_app.engines.registry import ENGINES
from evolve_app.types import History, Observation, StepResult, Trial, Workspace
from runtime_app import sandbox
from runtime_app import services as runtime_services
from runtime_app.llm import THINKING_BUDGET, ToolChat
from runtime_app.tools import MAX_RESULT_CHARS

PACKAGE = "agent_evolve"
INSTALL_HINT = "install it with pip install -e '.[a-evolve]'"
EFFORTS = ("off", "low", "medium", "high", "max")
BASH_TIMEOUT = 60  # seconds, as upstream's workspace bash
# Inside the writable workspace, these stay read-only for the model's commands: the history, the
# observation batches the history facade reads, and the manifest the loop reads its layers from.
BASH_READ_ONLY = (".git", "evolution", "manifest.yaml")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def available() -> bool:
    """Is the a-evolve package importable here?"""
    return importlib.util.find_spec(PACKAGE) is not None


def upstream() -> Any:
    """evolve_app.aevolve_upstream: the part that subclasses agent_evolve's classes. It is imported
    here, when an A-Evolve engine first steps, because agent_evolve is an optional extra: Crucible
    starts, lists and checks engines without it."""
    if not available():
        raise EngineError(f"A-Evolve's engines need the a-evolve package ({PACKAGE}), which is not "
                          f"installed: {INSTALL_HINT}")
    return importlib.import_module("evolve_app.aevolve_upstream")


def flag(value: Any) -> bool:
    """An option's boolean: true/false, yes/no, on/off, 1/0 (the web and CLI send text)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{value!r} is not true or false")


def _extra(value: Any) -> dict[str, Any]:
    if value in (None, ""):
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    try:
        data = json.loads(str(value))
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ValueError(f"extra must be a JSON object, like {{\"max_skills\": 8}}; got {value!r}")
    return data


def _links(root: Path) -> set[str]:
    """Symlinks and special files (fifos, sockets, devices) in the workspace, outside .git and
    evolution/; symlinked folders are not followed."""
    found = set()
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        for name in [*dirs, *files]:
            path = here / name
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                found.add(str(path.relative_to(root)))
        if here == root:
            dirs[:] = [d for d in dirs if d not in (".git", "evolution")]
    return found


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


class _AEvolveEngine(_ModelEngine):
    """What the four adapters share: options, the model calls, the sandboxed bash, the step."""

    name = "aevolve"
    upstream_path = ""  # the A-Evolve class, for the records
    uses_bash = True
    FLAGS: tuple[str, ...] = ()
    EXTRA_KEYS: tuple[str, ...] = ()  # options that go into EvolveConfig.extra

    def __init__(self, preset: str, model: str, effort: str, max_turns: int, evolver_max_tokens: int,
                 extra: str, **specific: Any) -> None:
        super().__init__(preset, model, effort, max_turns)
        self.evolver_max_tokens = int(evolver_max_tokens)
        self.extra = _extra(extra)
        self.specific = {key: flag(value) if key in self.FLAGS else value for key, value in specific.items()}
        self._engine: Any = None
        self._score: float | None = None
        # The run's settings, from the loop (run_configure): None until a loop hands them.
        self.layers: set[str] | None = None
        self.trajectory_only = False

    @classmethod
    def offered(cls) -> bool:
        """Listed among the engines only when the package is installed."""
        return available()

    @classmethod
    def options_check(cls, options: Mapping[str, Any]) -> None:
        if not available():
            raise EngineError(f"{cls.name} needs the a-evolve package ({PACKAGE}), which is not installed: "
                              f"{INSTALL_HINT}")
        if cls.uses_bash:  # refused when the run is asked for, not in the worker
            ready, reason = sandbox.bubblewrap_probe()
            if not ready:
                raise EngineError(f"{cls.name} runs A-Evolve's workspace bash only in the bubblewrap "
                                  f"sandbox, and {reason}")
        for key in cls.FLAGS:
            if key in options:
                try:
                    flag(options[key])
                except ValueError as error:
                    raise EngineError(f"{cls.name}: option {key}: {error}") from None
        if str(options.get("effort", "medium")) not in EFFORTS:
            raise EngineError(f"{cls.name}: effort is one of {', '.join(EFFORTS)}")
        if not 256 <= int(options.get("evolver_max_tokens", 16384)) <= 64_000:
            raise EngineError(f"{cls.name}: evolver_max_tokens is 256 to 64000")
        if not 1 <= int(options.get("max_turns", 20)) <= 100:
            raise EngineError(f"{cls.name}: max_turns is 1 to 100")
        try:
            _extra(options.get("extra"))
        except ValueError as error:
            raise EngineError(f"{cls.name}: {error}") from None

    # ------------------------------------------------------------------ the step

    def run_configure(self, *, layers: set[str], trajectory_only: bool) -> None:
        """The run's settings, handed by the loop before each step: the layers the engine may
        change (the manifest's evolvable_layers, narrowed by the run's evolve_layers) and
        trajectory_only. They become the A-Evolve engine's EvolveConfig (config())."""
        self.layers, self.trajectory_only = set(layers), bool(trajectory_only)

    def config(self, layers: set[str]) -> dict[str, Any]:
        """EvolveConfig's fields: the evolve_* gates from the layers the run allows, and the run's
        trajectory_only (never forced)."""
        extra = {**self.extra, **{key: self.specific[key] for key in self.EXTRA_KEYS if key in self.specific}}
        return {"evolve_prompts": "prompts" in layers, "evolve_skills": "skills" in layers,
                "evolve_memory": "memory" in layers, "evolve_tools": "tools" in layers,
                "trajectory_only": self.trajectory_only, "evolver_model": self.model or self.preset,
                "evolver_max_tokens": self.evolver_max_tokens, "extra": extra}

    def step(self, workspace: Workspace, observations: list[Observation], history: History,
             trial: Trial | None) -> StepResult:
        bridge = upstream()
        if self.uses_bash:
            ready, reason = sandbox.bubblewrap_probe()
            if not ready:
                raise EngineError(f"{self.name} runs A-Evolve's workspace bash only in the bubblewrap "
                                  f"sandbox, and {reason}")
        _, model = self._resolve_model()
        layers = set(workspace.manifest.evolvable_layers if self.layers is None else self.layers)
        usage = _Usage()
        bash = self.bash_for(Path(workspace.root), usage) if self.uses_bash else None
        llm = bridge.CrucibleLLM(lambda *args, **kwargs: self.chat(usage, *args, **kwargs), bash)
        if self._engine is None:
            self._engine = bridge.engine_make(self.name, self.config(layers), llm, self.specific)
        else:
            bridge.engine_rebind(self._engine, self.config(layers), llm)
        scores = [o.feedback.score for o in observations]
        self._score = sum(scores) / len(scores) if scores else None
        before = _links(Path(workspace.root)) if self.uses_bash else set()
        result, notes = bridge.engine_step(self._engine, workspace, observations, history, trial)
        for rel in sorted(_links(Path(workspace.root)) - before):  # a model's `ln -s`, mkfifo ...
            (Path(workspace.root) / rel).unlink(missing_ok=True)
            notes.append(f"removed {rel}: not a regular file or folder")
        metadata = {"upstream": self.upstream_path, "model": model, **usage.as_dict(),
                    "aevolve": _jsonable(dict(result.metadata or {}))}
        if notes:
            metadata["notes"] = notes
        stop = bool(getattr(result, "stop", False))
        kwargs = {"stop": stop} if "stop" in {f.name for f in fields(StepResult)} else {}
        if stop:
            metadata["stop"] = True
        return StepResult(bool(result.mutated), str(result.summary or "")[:500], metadata, **kwargs)

    def on_cycle_end(self, accepted: bool, score: float | None = None) -> None:
        """Both interfaces: Crucible's (accepted) and A-Evolve's (accepted, score); without a score
        the cycle's own (the mean of the observations its step saw) is passed on."""
        if self._engine is not None:
            self._engine.on_cycle_end(accepted, self._score if score is None else score)

    # ------------------------------------------------------------------ model calls and bash

    def chat(self, usage: _Usage, system: str, user: str, *, tools: list[dict[str, Any]],
             executors: Mapping[str, Callable[[str], str]], max_tokens: int, max_turns: int,
             label: str) -> tuple[str, dict[str, int], list[dict[str, Any]]]:
        """One conversation with the run's preset: (the model's last text, token usage, the tool
        calls of its last turn). Tool calls are answered by `executors` (name -> callable taking
        the `command`), for at most `max_turns` turns; every call leaves a receipt."""
        preset, model = self._resolve_model()
        chat = _Chat(preset.kind, model, system, user or "(no message)", tools, self.effort,
                     base_url=preset.base_url(), key_variable=preset.key_variable, account=preset.name,
                     account_limit=preset.concurrency, price_model=preset.price_model,
                     output_tokens=min(max(256, int(max_tokens)), self.evolver_max_tokens))

        record = self._recorder(usage, label)
        tokens = {"input_tokens": 0, "output_tokens": 0}
        uses: list[Any] = []
        for _turn in range(max(1, min(int(max_turns), self.max_turns))):
            reply, uses = self._turn(chat, record, usage)
            tokens["input_tokens"] += reply.usage.input_tokens
            tokens["output_tokens"] += reply.usage.output_tokens
            if not uses or not executors:
                break
            chat.results([(use.id, *self._tool(use.name, use.input, executors)) for use in uses])
            uses = []
        said = [entry["text"] for entry in chat.transcript(limit=50_000) if entry["role"] == "assistant"]
        calls = [{"id": use.id, "name": use.name, "input": use.input} for use in uses]
        return (said[-1] if said else ""), tokens, calls

    @staticmethod
    def _tool(name: str, tool_input: Any, executors: Mapping[str, Callable[[str], str]]) -> tuple[str, bool]:
        run = executors.get(name)
        if run is None:
            return f"unknown tool {name!r}: use {', '.join(executors)}", True
        command = tool_input.get("command") if isinstance(tool_input, dict) else None
        if not isinstance(command, str) or not command.strip():
            return "give the `command` to run", True
        text = run(command)
        if len(text) > MAX_RESULT_CHARS:
            text = text[: MAX_RESULT_CHARS // 2] + "\n… cut …\n" + text[-MAX_RESULT_CHARS // 2:]
        return text, False

    def bash_for(self, root: Path, usage: _Usage) -> Callable[[str], str]:
        """A-Evolve's workspace bash, sandboxed: `bash -c command` in the workspace under bubblewrap
        (required, whatever CRUCIBLE_SANDBOX says), no network, 60 s; output as upstream gives it."""

        evolution = root / "evolution"  # made first, so a command cannot make it a link elsewhere
        if not evolution.exists() and not evolution.is_symlink():
            evolution.mkdir()

        def bash(command: str) -> str:
            read_only = [rel for rel in BASH_READ_ONLY
                         if (root / rel).exists() and not (root / rel).is_symlink()]
            try:
                ran = runtime_services.command_run(["bash", "-c", command], cwd=root, timeout=BASH_TIMEOUT,
                                                   writable=True, isolation="required", read_only=read_only,
                                                   label=f"{self.name} workspace_bash")
            except sandbox.SandboxError as error:
                return f"ERROR: {error}"
            usage.receipts.append(ran.pk)
            output = (ran.stdout_excerpt + ran.stderr_excerpt).strip()
            if ran.timed_out:
                return "ERROR: Command timed out."
            status = "" if ran.exit_code == 0 else f"(exit {ran.exit_code})\n"
            return (status + output).strip() or "(no output)"

        return bash


class _Chat(ToolChat):
    """ToolChat with the output budget an A-Evolve engine asks for (evolver_max_tokens, or a
    call's own max_tokens), plus the thinking budget of the effort."""

    def __init__(self, *args: Any, output_tokens: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.output_tokens = output_tokens

    @property
    def max_tokens(self) -> int:
        return self.output_tokens + (THINKING_BUDGET.get(self.effort, 0) if self.anthropic else 0)


class AEvolveSkillForgeEngine(_AEvolveEngine):
    """A-Evolve's SkillForge (AEvolveEngine): the model reads the recent observations and drafts
    and edits the workspace with the (sandboxed) workspace bash."""

    name = "aevolve-skillforge"
    upstream_path = "agent_evolve.algorithms.skillforge.engine.AEvolveEngine"
    FLAGS = ("solver_proposed", "prompt_only", "protect_skills")
    EXTRA_KEYS = ("max_skills", "solver_proposed", "prompt_only", "protect_skills")

    def __init__(self, preset: str = "anthropic", model: str = "", effort: str = "medium",
                 max_turns: int = 20, evolver_max_tokens: int = 16384, max_skills: int = 5,
                 solver_proposed: bool = False, prompt_only: bool = False, protect_skills: bool = False,
                 extra: str = "") -> None:
        super().__init__(preset, model, effort, max_turns, evolver_max_tokens, extra,
                         max_skills=int(max_skills), solver_proposed=solver_proposed,
                         prompt_only=prompt_only, protect_skills=protect_skills)


class AEvolveAdaptiveSkillEngine(AEvolveSkillForgeEngine):
    """A-Evolve's Adaptive Skill engine (AdaptiveSkillEngine): SkillForge's loop with its own
    skill-budget prompts."""

    name = "aevolve-adaptive-skill"
    upstream_path = "agent_evolve.algorithms.adaptive_skill.engine.AdaptiveSkillEngine"


class AEvolveGuidedEngine(_AEvolveEngine):
    """A-Evolve's Guided Synthesis (GuidedSynthesisEngine): a short episodic memory per observation,
    then the model curates skill proposals (accept, merge, skip). Proposals are the drafts the
    agent left in skills/_drafts/ (consumed once curated) and any trajectory step carrying a
    `skill_proposal` text. No bash."""

    name = "aevolve-guided"
    upstream_path = "agent_evolve.algorithms.guided_synth.engine.GuidedSynthesisEngine"
    uses_bash = False
    FLAGS = ("write_memory", "verification_focus")

    def __init__(self, preset: str = "anthropic", model: str = "", effort: str = "off", max_turns: int = 1,
                 evolver_max_tokens: int = 16384, write_memory: bool = True, verification_focus: bool = False,
                 extra: str = "") -> None:
        super().__init__(preset, model, effort, max_turns, evolver_max_tokens, extra,
                         write_memory=write_memory, verification_focus=verification_focus)


class AEvolveAdaptiveEngine(_AEvolveEngine):
    """A-Evolve's Adaptive Evolution (AdaptiveEvolveEngine): per-claim and per-task-type analysis,
    auto-corrections and seeded skills (written through the checked workspace), then the model
    edits with the sandboxed workspace bash, then its sanity checks."""

    name = "aevolve-adaptive"
    upstream_path = "agent_evolve.algorithms.adaptive_evolve.engine.AdaptiveEvolveEngine"

    def __init__(self, preset: str = "anthropic", model: str = "", effort: str = "medium",
                 max_turns: int = 20, evolver_max_tokens: int = 16384, memory_cap: int = 15,
                 improvement_threshold: float = 0.02, stagnation_window: int = 5, extra: str = "") -> None:
        super().__init__(preset, model, effort, max_turns, evolver_max_tokens, extra,
                         memory_cap=int(memory_cap), improvement_threshold=float(improvement_threshold),
                         stagnation_window=int(stagnation_window))


AEVOLVE_ENGINES: dict[str, type[_AEvolveEngine]] = {
    cls.name: cls for cls in (AEvolveSkillForgeEngine, AEvolveGuidedEngine, AEvolveAdaptiveEngine,
                              AEvolveAdaptiveSkillEngine)}
ENGINES.update(AEVOLVE_ENGINES)  # built-ins by name; engine_names() lists them only when offered()
