"""SkillForge: a model edits the workspace with the editor and a sandboxed shell (A-Evolve's default)."""

from __future__ import annotations

import json
from typing import Any

from evolve_app.engines.base import EngineError, EvolutionEngine
from evolve_app.engines.model import _observation_text
from evolve_app.types import History, Observation, StepResult, Trial, Workspace
from runtime_app import services as runtime_services
from runtime_app.fleet import preset_get
from runtime_app.llm import LLMError, ToolChat
from runtime_app.tools import EDITOR_TOOL, SHELL_TOOL, tool_dispatch

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


class SkillForgeEngine(EvolutionEngine):
    """A-Evolve's default engine: a model edits the workspace with the editor tool and a sandboxed
    shell, given recent observations (failures first), the prompt, the skills, the drafts, the
    memory and the score history. Every call leaves a receipt; the key never reaches the tools."""

    name = "skillforge"

    def __init__(self, preset: str = "anthropic", model: str = "", effort: str = "medium",
                 max_turns: int = 20) -> None:
        self.preset, self.model, self.effort, self.max_turns = preset, model, effort, max_turns

    def context(self, workspace: Workspace, observations: list[Observation], history: History,
                guidance: str = "") -> tuple[str, str]:
        """(prefix, suffix) of the conversation; `guidance`, when given (e.g. the adaptive engine's
        budget or the search engine's candidate note), ends the suffix."""
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
        if guidance:
            suffix += f"\n{guidance}\n"
        return "\n".join(parts), suffix

    def step(self, workspace: Workspace, observations: list[Observation], history: History,
             trial: Trial | None, guidance: str = "") -> StepResult:
        preset = preset_get(self.preset)
        if preset is None or preset.kind not in ("anthropic", "bedrock", "openai-compatible"):
            raise EngineError(f"skillforge needs an LLM preset; {self.preset!r} is not one")
        model = self.model or preset.default_model
        if not model:
            raise EngineError(f"skillforge: give a model (preset {self.preset!r} has no default)")
        prefix, suffix = self.context(workspace, observations, history, guidance)
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
