"""What the model-driven engines share: a preset and a ToolChat, receipts, usage, and the
parsing of a model's replies and of skills."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from evolve_app.engines.base import EngineError, EvolutionEngine
from evolve_app.types import Observation, Workspace
from evolve_app.workspace import skill_front_matter
from runtime_app import services as runtime_services
from runtime_app.fleet import preset_get
from runtime_app.llm import LLMError, ToolChat
from runtime_app.tools import EDITOR_TOOL, tool_dispatch

# ------------------------------------------------------------------------- shared by the engines below

LLM_KINDS = ("anthropic", "bedrock", "openai-compatible")
_CATEGORY = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_WORD = re.compile(r"[a-z0-9]+")


def _observation_text(observation: Observation) -> str:
    task, trajectory, feedback = observation.task, observation.trajectory, observation.feedback
    return (f"### {task.task_id} ({task.category or 'no category'}): "
            f"{'success' if feedback.success else 'failure'}, score {feedback.score:g}\n"
            f"Input: {task.input[:1000]}\nOutput: {(trajectory.output or trajectory.error)[:1000]}\n"
            f"Feedback: {feedback.detail[:500]}\n")


def _json_object(text: str) -> dict[str, Any] | None:
    """The JSON object a model's reply holds: the whole reply, a fenced block, or the text from
    the first `{` to the last `}`; None when there is none."""
    text = (text or "").strip()
    attempts = [text, *re.findall(r"```(?:json)?\s*\n(.*?)```", text, re.S)]
    start, end = text.find("{"), text.rfind("}")
    if start != -1 and end > start:
        attempts.append(text[start:end + 1])
    for attempt in attempts:
        try:
            value = json.loads(attempt)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _category_name(value: Any) -> str:
    """A model's or a benchmark's category as a memory-safe name ("" when nothing is left)."""
    if not isinstance(value, str):
        return ""
    name = re.sub(r"[^a-z0-9_-]+", "-", value.strip().lower()).strip("-_")[:64]
    return name if _CATEGORY.fullmatch(name) else ""


def _stem(word: str) -> str:
    """Plural 's' dropped ("dates" → "date", not "class"): the only stemming the matching does."""
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def _words(text: str) -> set[str]:
    return {_stem(word) for word in _WORD.findall(text.lower())}


def _front_matter(text: str) -> dict[str, Any]:
    data, _ = skill_front_matter(text)
    return data if isinstance(data, dict) else {}


def _skill_body(text: str) -> str:
    """A SKILL.md without its front matter."""
    lines = text.removeprefix("\ufeff").split("\n")
    if lines and lines[0].rstrip() == "---":
        end = next((i for i in range(1, len(lines)) if lines[i].rstrip() in ("---", "...")), None)
        if end is not None:
            return "\n".join(lines[end + 1:]).strip("\n")
    return text.strip("\n")


def skill_categories(name: str, text: str, known: Iterable[str]) -> set[str]:
    """The task categories a skill is for. Its front matter's `category` (or `categories`: a name
    or a list) when it has one; else every known category all of whose words appear, plural 's'
    dropped, among the words of the skill's name and description ("dates" → date-arithmetic,
    "number-bases" → bases). Deliberately simple: no embeddings, no model call."""
    data = _front_matter(text)
    declared = data.get("category", data.get("categories"))
    if isinstance(declared, str):
        declared = [declared]
    if isinstance(declared, list):
        named = {_category_name(item) for item in declared} - {""}
        if named:
            return named
    words = _words(f"{name} {data.get('description', '')}")
    return {category for category in known if category and _words(category) <= words}


def _spread(observations: list[Observation], limit: int) -> list[Observation]:
    """Up to `limit` observations taken round-robin over their categories, in order."""
    by_category: dict[str, list[Observation]] = {}
    for observation in observations:
        by_category.setdefault(observation.task.category, []).append(observation)
    chosen: list[Observation] = []
    while len(chosen) < limit and any(by_category.values()):
        for queue in by_category.values():
            if queue and len(chosen) < limit:
                chosen.append(queue.pop(0))
    return chosen


def _mean_score(observations: list[Observation]) -> float:
    return round(sum(o.feedback.score for o in observations) / len(observations), 6) if observations else 0.0


@dataclass
class _Usage:
    """What an engine's model calls cost in one step; every call leaves a receipt."""

    calls: int = 0
    cost_microusd: int = 0
    tokens: int = 0
    receipts: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "cost_microusd": self.cost_microusd, "tokens": self.tokens,
                "receipts": self.receipts}


class _ModelEngine(EvolutionEngine):
    """An engine that talks to a model as SkillForge does: a preset from runtime_app.fleet, a
    ToolChat, a receipt for every call, the editor through tool_dispatch. A failed call (after
    the client's retries) raises EngineError, so the loop marks the cycle failed and restores
    pre-evo-N."""

    def __init__(self, preset: str = "anthropic", model: str = "", effort: str = "medium",
                 max_turns: int = 12) -> None:
        self.preset, self.model, self.effort, self.max_turns = preset, model, effort, int(max_turns)

    def _resolve_model(self) -> tuple[Any, str]:
        preset = preset_get(self.preset)
        if preset is None or preset.kind not in LLM_KINDS:
            raise EngineError(f"{self.name} needs an LLM preset; {self.preset!r} is not one")
        model = self.model or preset.default_model
        if not model:
            raise EngineError(f"{self.name}: give a model (preset {self.preset!r} has no default)")
        return preset, model

    def _recorder(self, usage: _Usage, label: str) -> Callable[[Any], Any]:
        """What a ToolChat calls with each call's receipt: written, labelled, counted in `usage`."""
        def record(receipt: Any) -> Any:
            written = runtime_services.receipt_record(
                receipt, label=f"{self.name} {label} call {len(usage.receipts) + 1}")
            usage.receipts.append(written.pk)
            return written

        return record

    def _turn(self, chat: ToolChat, record: Callable[[Any], Any], usage: _Usage) -> tuple[Any, list[Any]]:
        """One model call of `chat`, added to `usage`; a failed call (after the client's retries)
        is an EngineError."""
        try:
            reply, uses = chat.turn(record, None)
        except LLMError as error:
            raise EngineError(f"{self.name}: the model call failed: {error}") from None
        usage.calls += 1
        usage.cost_microusd += reply.cost_microusd
        usage.tokens += sum(getattr(reply.usage, name) for name in (
            "input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens"))
        return reply, uses

    def _converse(self, prefix: str, suffix: str, usage: _Usage, *, label: str,
                  workspace: Workspace | None = None, write_roots: tuple[str, ...] = ()) -> str:
        """One conversation; with `write_roots` the model may use the editor under them (no shell).
        Returns the model's last text."""
        preset, model = self._resolve_model()
        tools = [EDITOR_TOOL] if workspace is not None and write_roots else []
        chat = ToolChat(preset.kind, model, prefix, suffix, tools, self.effort,
                        base_url=preset.base_url(), key_variable=preset.key_variable, account=preset.name,
                        account_limit=preset.concurrency, price_model=preset.price_model)

        record = self._recorder(usage, label)

        def no_shell(command: str) -> str:
            return "there is no shell here: only the editor tool"

        for _turn in range(self.max_turns if tools else 1):
            _reply, uses = self._turn(chat, record, usage)
            if not uses or not tools:
                break
            assert workspace is not None  # the editor tool is offered only with a workspace
            results = []
            for use in uses:
                if use.name != "editor":
                    results.append((use.id, f"unknown tool {use.name!r}: only `editor` is available", True))
                    continue
                results.append((use.id, *tool_dispatch(use.name, use.input, worktree=workspace.root,
                                                       shell=no_shell, write_roots=write_roots)))
            chat.results(results)
        said = [entry["text"] for entry in chat.transcript(limit=50_000) if entry["role"] == "assistant"]
        return said[-1] if said else ""


def _skills_text(workspace: Workspace, limit: int = 3000) -> str:
    parts = [f"## skills/{skill.name}/SKILL.md\n{workspace.read_skill(skill.name)[:limit]}\n"
             for skill in workspace.list_skills()]
    return "\n".join(parts) or "(the agent has no skills yet)\n"
