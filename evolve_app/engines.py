"""Evolution engines: `step(workspace, observations, history, trial) -> StepResult`.

An engine may only change the workspace's files; the loop snapshots before and after, reverts
edits outside `evolvable_layers`, and rolls back mutations the holdout gate rejects. Engines
are named here or given by dotted path.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from evolve_app.types import Observation, StepResult


class EngineError(Exception):
    """An engine name or path that does not resolve to an engine."""


class EvolutionEngine:
    """The seed's engine interface."""

    name = "engine"

    def step(self, workspace: Any, observations: list[Observation], history: Any, trial: Any) -> StepResult:
        raise NotImplementedError

    def on_cycle_end(self, accepted: bool) -> None:  # optional callback
        return None


class TextbookEngine(EvolutionEngine):
    """Deterministic and offline (the demo's engine): for each task category that failed in this
    cycle's observations, write the skill the textbook has for it, unless the workspace has it
    already; then record a lesson in episodic memory. It checks its mutation with the trial
    runner on the failed tasks before the cycle commits."""

    name = "textbook"

    def __init__(self, textbook: str | Path | None = None, per_cycle: int = 1) -> None:
        default = Path(__file__).resolve().parent / "demo" / "textbook.json"
        self.textbook = json.loads(Path(textbook or default).read_text())["categories"]
        self.per_cycle = per_cycle

    def step(self, workspace: Any, observations: list[Observation], history: Any, trial: Any) -> StepResult:
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


SKILLFORGE_INSTRUCTIONS = """You improve an AI agent by editing the files of its workspace.
The agent reads its system prompt (prompts/system.md), its skills (skills/<name>/SKILL.md, each
starting with YAML front matter `name` and `description`) and its memory (memory/<category>.jsonl,
one JSON object per line). Below are its current files and how it did on recent tasks. Study the
failures, then make small, general improvements with the `editor` tool (view, create,
str_replace, insert); you may run read-only checks with `shell`. Change only these layers: {layers}.
Do not write task answers into the workspace: teach the method. When you are done, reply with one
paragraph saying what you changed and why.
"""
MAX_OBSERVATIONS = 20


def _observation_text(observation: Observation) -> str:
    task, trajectory, feedback = observation.task, observation.trajectory, observation.feedback
    return (f"### {task.task_id} ({task.category or 'no category'}): "
            f"{'success' if feedback.success else 'failure'}, score {feedback.score:g}\n"
            f"Input: {task.input[:1000]}\nOutput: {(trajectory.output or trajectory.error)[:1000]}\n"
            f"Feedback: {feedback.detail[:500]}\n")


class SkillForgeEngine(EvolutionEngine):
    """A-Evolve's default engine: a model edits the workspace with the editor tool and a sandboxed
    shell, given recent observations (failures first), the prompt, the skills, the drafts, the
    memory and the score history. Every call leaves a receipt; the key never reaches the tools."""

    name = "skillforge"

    def __init__(self, preset: str = "anthropic", model: str = "", effort: str = "medium",
                 max_turns: int = 20) -> None:
        self.preset, self.model, self.effort, self.max_turns = preset, model, effort, max_turns

    def context(self, workspace: Any, observations: list[Observation], history: Any) -> tuple[str, str]:
        layers = list(workspace.manifest.evolvable_layers)
        parts = [SKILLFORGE_INSTRUCTIONS.format(layers=", ".join(layers)),
                 f"## prompts/system.md\n{workspace.read_prompt()}\n"]
        for skill in workspace.list_skills():
            parts.append(f"## {skill.path}/SKILL.md\n{workspace.read_skill(skill.name)}\n")
        for draft in workspace.list_drafts():
            parts.append(f"## draft skill {draft['name']}\n{draft['content']}\n")
        memories = workspace.read_all_memories(limit=50)
        if memories:
            lines = (json.dumps(memory, ensure_ascii=False) for memory in memories)
            parts.append("## recent memory\n" + "\n".join(lines))
        ordered = sorted(observations, key=lambda o: o.feedback.success)[:MAX_OBSERVATIONS]
        curve = [f"cycle {tag['cycle']}" for tag in history.version_log() if tag.get("kind") == "post"]
        suffix = (f"Cycles so far: {len(curve)}. Recent tasks ({len(observations)}, failures first):\n\n"
                  + "\n".join(_observation_text(o) for o in ordered))
        return "\n".join(parts), suffix

    def step(self, workspace: Any, observations: list[Observation], history: Any, trial: Any) -> StepResult:
        from runtime_app import services as runtime_services
        from runtime_app.fleet import preset_get
        from runtime_app.llm import LLMError, ToolChat
        from runtime_app.tools import EDITOR_TOOL, SHELL_TOOL, tool_dispatch

        preset = preset_get(self.preset)
        if preset is None or preset.kind not in ("anthropic", "bedrock", "openai-compatible"):
            raise EngineError(f"skillforge needs an LLM preset; {self.preset!r} is not one")
        model = self.model or preset.default_model
        if not model:
            raise EngineError(f"skillforge: give a model (preset {self.preset!r} has no default)")
        prefix, suffix = self.context(workspace, observations, history)
        chat = ToolChat(preset.kind, model, prefix, suffix, [EDITOR_TOOL, SHELL_TOOL], self.effort,
                        base_url=preset.base_url(), key_variable=preset.key_variable, account=preset.name,
                        account_limit=preset.concurrency, price_model=preset.price_model)
        receipts: list[int] = []

        def record(receipt: Any) -> Any:
            written = runtime_services.receipt_record(receipt, label=f"skillforge call {len(receipts) + 1}")
            receipts.append(written.pk)
            return written

        def shell(command: str) -> str:
            ran = runtime_services.command_run(command, cwd=workspace.root, timeout=60, writable=False,
                                               label="skillforge shell")
            receipts.append(ran.pk)
            return f"exit {ran.exit_code} ({ran.outcome})\n{ran.stdout_excerpt}{ran.stderr_excerpt}"

        layers = list(workspace.manifest.evolvable_layers)
        cost = tokens = calls = 0
        for _turn in range(self.max_turns):
            try:
                reply, uses = chat.turn(record, None)
            except LLMError as error:
                raise EngineError(f"skillforge: the model call failed: {error}") from None
            calls += 1
            cost += reply.cost_microusd
            tokens += sum(getattr(reply.usage, name) for name in (
                "input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens"))
            if not uses:
                break
            chat.results([(use.id, *tool_dispatch(use.name, use.input, worktree=workspace.root, shell=shell,
                                                  write_roots=layers)) for use in uses])
        said = [entry["text"] for entry in chat.transcript() if entry["role"] == "assistant"]
        return StepResult(True, (said[-1] if said else "no summary")[:500],
                          {"model": model, "calls": calls, "cost_microusd": cost, "tokens": tokens,
                           "receipts": receipts})


ENGINES = {"textbook": TextbookEngine, "skillforge": SkillForgeEngine}


def engine_get(name: str, **options: Any) -> EvolutionEngine:
    """A named engine or a dotted path to an EvolutionEngine subclass (or factory)."""
    if name in ENGINES:
        return ENGINES[name](**options)
    module_name, _, attribute = name.rpartition(".")
    if not module_name:
        raise EngineError(f"unknown engine {name!r}: use one of {', '.join(ENGINES)} or a dotted path")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise EngineError(f"engine {name!r} cannot be loaded: {error}") from None
    engine = factory(**options)
    if not hasattr(engine, "step"):
        raise EngineError(f"{name!r} is not an evolution engine (it has no step())")
    return engine
