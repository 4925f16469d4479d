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
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve_app.extensions import (
    ENGINE_GROUP,
    dotted_allowed,
    dotted_load,
    dotted_refusal,
    installed,
    is_dotted,
    server_path,
)
from evolve_app.types import Observation, StepResult, Task


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

    def step(self, workspace: Any, observations: list[Observation], history: Any, trial: Any) -> StepResult:
        raise NotImplementedError

    def on_cycle_end(self, accepted: bool, score: float = 0.0) -> None:
        """Optional: called once each cycle is decided (not while it waits for review), with
        whether its mutation was kept and the cycle's train score (A-Evolve's signature)."""
        return None


def cycle_end_takes_score(engine: Any) -> bool:
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


def cycle_end_call(engine: Any, accepted: bool, score: float, takes_score: bool | None = None) -> None:
    """`engine.on_cycle_end(accepted, score)`, or `(accepted)` for an engine whose callback takes
    one argument; nothing for an engine without one."""
    if not hasattr(engine, "on_cycle_end"):
        return
    if takes_score if takes_score is not None else cycle_end_takes_score(engine):
        engine.on_cycle_end(accepted, score)
    else:
        engine.on_cycle_end(accepted)


class TextbookEngine(EvolutionEngine):
    """Deterministic and offline (the demo's engine): for each task category that failed in this
    cycle's observations, write the skill the textbook has for it, unless the workspace has it
    already; then record a lesson in episodic memory. It checks its mutation with the trial
    runner on the failed tasks before the cycle commits."""

    name = "textbook"
    PATH_OPTIONS = ("textbook",)

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

    def context(self, workspace: Any, observations: list[Observation], history: Any,
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

    def step(self, workspace: Any, observations: list[Observation], history: Any, trial: Any,
             guidance: str = "") -> StepResult:
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


# ------------------------------------------------------------------------- shared by the engines below

LLM_KINDS = ("anthropic", "bedrock", "openai-compatible")
_CATEGORY = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_WORD = re.compile(r"[a-z0-9]+")


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
    from evolve_app.workspace import skill_front_matter

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
        from runtime_app.fleet import preset_get

        preset = preset_get(self.preset)
        if preset is None or preset.kind not in LLM_KINDS:
            raise EngineError(f"{self.name} needs an LLM preset; {self.preset!r} is not one")
        model = self.model or preset.default_model
        if not model:
            raise EngineError(f"{self.name}: give a model (preset {self.preset!r} has no default)")
        return preset, model

    def _recorder(self, usage: _Usage, label: str) -> Callable[[Any], Any]:
        """What a ToolChat calls with each call's receipt: written, labelled, counted in `usage`."""
        from runtime_app import services as runtime_services

        def record(receipt: Any) -> Any:
            written = runtime_services.receipt_record(
                receipt, label=f"{self.name} {label} call {len(usage.receipts) + 1}")
            usage.receipts.append(written.pk)
            return written

        return record

    def _turn(self, chat: Any, record: Callable[[Any], Any], usage: _Usage) -> tuple[Any, list[Any]]:
        """One model call of `chat`, added to `usage`; a failed call (after the client's retries)
        is an EngineError."""
        from runtime_app.llm import LLMError

        try:
            reply, uses = chat.turn(record, None)
        except LLMError as error:
            raise EngineError(f"{self.name}: the model call failed: {error}") from None
        usage.calls += 1
        usage.cost_microusd += reply.cost_microusd
        usage.tokens += sum(getattr(reply.usage, name) for name in (
            "input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens"))
        return reply, uses

    def _converse(self, prefix: str, suffix: str, usage: _Usage, *, label: str, workspace: Any = None,
                  write_roots: tuple[str, ...] = ()) -> str:
        """One conversation; with `write_roots` the model may use the editor under them (no shell).
        Returns the model's last text."""
        from runtime_app.llm import ToolChat
        from runtime_app.tools import EDITOR_TOOL, tool_dispatch

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


def _skills_text(workspace: Any, limit: int = 3000) -> str:
    parts = [f"## skills/{skill.name}/SKILL.md\n{workspace.read_skill(skill.name)[:limit]}\n"
             for skill in workspace.list_skills()]
    return "\n".join(parts) or "(the agent has no skills yet)\n"


# ------------------------------------------------------------------------------------- guided synthesis

LESSON_INSTRUCTIONS = """You extract one lesson from a task an AI agent failed. Read the task, the
agent's output and the checker's feedback, then say in one or two sentences the general lesson that
would have avoided the failure (the method, never the task's answer), and name the kind of task in a
short category (lowercase words joined by '-').
Reply with one JSON object and nothing else: {"lesson": "...", "category": "..."}
"""
PROPOSAL_INSTRUCTIONS = """You propose a skill for an AI agent from lessons it learned on failed tasks.
A skill is the file skills/<name>/SKILL.md: YAML front matter between two '---' lines with `name`
(lowercase letters, digits and '-'), `description` (one line saying when to use it) and `category`
(the category below), then the skill's text. The agent reads its skills exactly as they are written:
follow the format of its existing skills, shown below. Teach the method; never write a task's answer.
Reply with the whole SKILL.md and nothing else.
"""
CURATION_INSTRUCTIONS = """You curate an AI agent's skill library. Below are a proposed skill (a draft)
and the skills the agent has. Decide what happens to the draft:
- "accept": it covers ground no skill covers and is sound: it becomes a skill as it is;
- "merge": an existing skill covers the same ground: the draft's text is appended to that skill
  (name it in "into");
- "skip": it is wrong, vague or redundant: it is dropped.
Reply with one JSON object and nothing else: {"action": "accept" | "merge" | "skip", "into": "<skill
name, for merge>", "reason": "<one sentence>"}
"""


def _skill_md_from_reply(reply: str) -> str:
    """The SKILL.md a proposal reply holds: without an outer code fence, from its first '---' line."""
    lines = reply.strip().split("\n")
    if lines and lines[0].startswith("```"):
        lines = lines[1:]
        if lines and lines[-1].strip() == "```":
            lines = lines[:-1]
    start = next((i for i, line in enumerate(lines) if line.rstrip() == "---"), None)
    return "" if start is None else "\n".join(lines[start:]).strip("\n") + "\n"


class GuidedSynthesisEngine(_ModelEngine):
    """Guided Synthesis: memory first, skills later, curated.

    1. Each failed task (at most `max_failures` a cycle, spread over the categories) becomes one
       short lesson from the model (JSON {"lesson", "category"}), appended to memory/episodic.jsonl
       as {"lesson", "category", "task_id", "source": "guided"}. The benchmark's category wins
       over the model's when the task has one.
    2. A category with at least `min_lessons` lessons in episodic memory, no skill for it
       (skill_categories) and new lessons since its last proposal gets a skill proposal from the
       model, written to skills/_drafts/<name>.md (at most `max_proposals` a cycle).
    3. Every draft (the engine's and any the agent left) is curated against the existing skills:
       the model answers JSON {"action": accept | merge | skip, "into", "reason"}. accept:
       write_skill + delete_draft; merge: the draft's body is appended to the named skill, then
       the draft is deleted; skip: delete_draft. An answer that is not such JSON, a merge into no
       skill, or a draft whose front matter is invalid is a skip, with the reason recorded.
    """

    name = "guided"

    def __init__(self, preset: str = "anthropic", model: str = "", effort: str = "off",
                 max_failures: int = 4, min_lessons: int = 2, max_proposals: int = 1) -> None:
        super().__init__(preset, model, effort, max_turns=1)
        self.max_failures, self.min_lessons = int(max_failures), int(min_lessons)
        self.max_proposals = int(max_proposals)
        self.proposed: dict[str, int] = {}  # category -> its lesson count when last proposed (this run)

    def step(self, workspace: Any, observations: list[Observation], history: Any, trial: Any) -> StepResult:
        usage, notes = _Usage(), []
        layers = set(workspace.manifest.evolvable_layers)
        lessons: list[dict[str, str]] = []
        if "memory" in layers:
            lessons = self._lessons(workspace, observations, usage, notes)
        else:
            notes.append("memory is not an evolvable layer: no lessons written")
        drafted: list[str] = []
        curated: list[dict[str, str]] = []
        if "skills" in layers:
            drafted = self._propose(workspace, usage, notes)
            curated = self._curate(workspace, usage)
        else:
            notes.append("skills is not an evolvable layer: no proposals, no curation")
        parts = [f"{len(lessons)} lesson{'s' if len(lessons) != 1 else ''} written"]
        if drafted:
            parts.append(f"drafted {', '.join(drafted)}")
        for verdict, done in (("accept", "accepted"), ("merge", "merged"), ("skip", "skipped")):
            names = [c["draft"] + (f" into {c['into']}" if verdict == "merge" else "")
                     for c in curated if c["action"] == verdict]
            if names:
                parts.append(f"{done} {', '.join(names)}")
        mutated = bool(lessons or drafted or curated)
        metadata = {"lessons": lessons, "drafted": drafted, "curated": curated, "notes": notes,
                    **usage.as_dict()}
        return StepResult(mutated, "; ".join(parts), metadata)

    def _lessons(self, workspace: Any, observations: list[Observation], usage: _Usage,
                 notes: list[str]) -> list[dict[str, str]]:
        failed = [o for o in observations if not o.feedback.success]
        chosen = _spread(failed, max(0, self.max_failures))
        if len(chosen) < len(failed):
            notes.append(f"{len(failed) - len(chosen)} of {len(failed)} failures left out (max_failures "
                         f"{self.max_failures})")
        written = []
        for observation in chosen:
            reply = self._converse(LESSON_INSTRUCTIONS, _observation_text(observation), usage, label="lesson")
            answer = _json_object(reply)
            lesson = answer.get("lesson") if answer else None
            if not isinstance(lesson, str) or not lesson.strip():
                notes.append(f"{observation.task.task_id}: no lesson (the answer is not JSON with a "
                             f"'lesson'): {reply[:120]!r}")
                continue
            category = (_category_name(observation.task.category) or _category_name(answer.get("category"))
                        or "general")
            entry = {"lesson": lesson.strip()[:600], "category": category,
                     "task_id": observation.task.task_id, "source": self.name}
            workspace.add_memory(entry, "episodic")
            written.append({"task_id": observation.task.task_id, "category": category})
        return written

    def _propose(self, workspace: Any, usage: _Usage, notes: list[str]) -> list[str]:
        from evolve_app.workspace import WorkspaceError, skill_front_matter

        by_category: dict[str, list[str]] = {}
        for entry in workspace.read_memories("episodic"):
            category, lesson = entry.get("category"), entry.get("lesson")
            if isinstance(category, str) and category and isinstance(lesson, str):
                by_category.setdefault(category, []).append(lesson)
        covered: set[str] = set()
        for skill in workspace.list_skills():
            covered |= skill_categories(skill.name, workspace.read_skill(skill.name), by_category)
        for draft in workspace.list_drafts():
            covered |= skill_categories(draft["name"], draft["content"], by_category)
        due = [c for c, found in by_category.items() if len(found) >= self.min_lessons and c not in covered
               and len(found) > self.proposed.get(c, 0)]
        due.sort(key=lambda c: -len(by_category[c]))  # stable: ties keep first-seen order
        drafted = []
        for category in due[: max(0, self.max_proposals)]:
            self.proposed[category] = len(by_category[category])
            lessons = "\n".join(f"- {lesson}" for lesson in by_category[category][-20:])
            prefix = PROPOSAL_INSTRUCTIONS + "\n# The agent's skills\n" + _skills_text(workspace)
            suffix = f"Category: {category}\nLessons ({len(by_category[category])}):\n{lessons}\n"
            text = _skill_md_from_reply(self._converse(prefix, suffix, usage, label="proposal"))
            data, issues = skill_front_matter(text) if text else (None, [(1, 1, "no SKILL.md in the reply")])
            if issues or not isinstance(data, dict):
                notes.append(f"the proposal for {category} is not a valid SKILL.md: {issues[0][2]}")
                continue
            try:
                workspace.write_draft(data["name"], text)
            except WorkspaceError as error:
                notes.append(f"the proposal for {category} could not be drafted: {error}")
                continue
            drafted.append(data["name"])
        return drafted

    def _curate(self, workspace: Any, usage: _Usage) -> list[dict[str, str]]:
        from evolve_app.workspace import WorkspaceError

        decisions = []
        for draft in workspace.list_drafts():
            name, content = draft["name"], draft["content"]
            skills = {skill.name for skill in workspace.list_skills()}
            prefix = CURATION_INSTRUCTIONS + "\n# The agent's skills\n" + _skills_text(workspace, 1500)
            reply = self._converse(prefix, f"# The draft skills/_drafts/{name}.md\n{content}", usage,
                                   label="curation")
            answer = _json_object(reply)
            action = answer.get("action") if answer else None
            reason = str(answer.get("reason", "")).strip()[:300] if answer else ""
            into = answer.get("into") if answer else None
            decision = {"draft": name, "action": "skip", "reason": reason}
            if action not in ("accept", "merge", "skip"):
                decision["reason"] = f"the curation answer is not JSON with an action: {reply[:160]!r}"
            elif action == "accept" and name in skills:
                decision["reason"] = f"accepting would replace the skill {name}; skipped ({reason})"
            elif action == "accept":
                try:
                    workspace.write_skill(name, content)
                    decision["action"] = "accept"
                except WorkspaceError as error:
                    decision["reason"] = f"accepted, but the draft is not a valid skill: {error}"
            elif action == "merge" and (not isinstance(into, str) or into not in skills):
                decision["reason"] = f"merge into {into!r}, which is no skill of the agent; skipped"
            elif action == "merge":
                merged = workspace.read_skill(into).rstrip("\n") + "\n\n" + _skill_body(content) + "\n"
                workspace.write_skill(into, merged)
                decision.update(action="merge", into=into)
            workspace.delete_draft(name)
            decisions.append(decision)
        return decisions


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


def _size_knob(engine: Any) -> str:
    """The engine's setting for how much it changes in a cycle ("" when it has none)."""
    return next((knob for knob in SIZE_KNOBS if isinstance(getattr(engine, knob, None), int)), "")


def _accepts_guidance(engine: Any) -> bool:
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

    def step(self, workspace: Any, observations: list[Observation], history: Any, trial: Any) -> StepResult:
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


# ---------------------------------------------------------------------------------------- adaptive skill

ADAPTIVE_SKILL_INSTRUCTIONS = """You build an AI agent's skill library. The agent reads every
skills/<name>/SKILL.md: YAML front matter between two '---' lines with `name` (the folder's name:
lowercase letters, digits and '-'), `description` (one line saying when to use it) and `category`
(the task category it serves), then the skill's text, which the agent applies as written. Below are
its system prompt and its skills. Edit only files under skills/ with the `editor` tool (view, create,
str_replace, insert). Teach the method; never write a task's answer. When you are done, reply with
one sentence saying what you changed.
"""


class AdaptiveSkillEngine(_ModelEngine):
    """Adaptive Skill: the skill library, grown where the agent fails.

    1. Gap analysis: the failure rate of each task category in this cycle's observations;
       categories failing more than `threshold` are gaps, worst first (at most `max_gaps` a cycle).
    2. For each gap the model, with the editor restricted to skills/, creates a skill when none
       covers the category (skill_categories), or refines the covering skill when it exists but
       the category still fails.
    3. Library management, without the model: skills that serve exactly the same non-empty set
       of categories are merged (the others' bodies appended to the first by name, preferring
       skills older than this cycle; the others deleted); a skill is pruned once `prune_after`
       cycles have passed since a task of one of its categories was last seen (0: never). Unused
       is kept simple: a skill none of whose categories has any task in a cycle is unused in that
       cycle; the count starts when the engine first sees the skill.
    """

    name = "adaptive-skill"

    def __init__(self, preset: str = "anthropic", model: str = "", effort: str = "medium",
                 max_turns: int = 12, threshold: float = 0.5, max_gaps: int = 2,
                 prune_after: int = 3) -> None:
        super().__init__(preset, model, effort, max_turns)
        self.threshold, self.max_gaps, self.prune_after = float(threshold), int(max_gaps), int(prune_after)
        self.cycle = 0
        self.seen: set[str] = set()  # every category a task of this run had
        self.last_used: dict[str, int] = {}  # skill -> the last cycle one of its categories had a task

    @staticmethod
    def gap_analysis(observations: list[Observation]) -> dict[str, dict[str, Any]]:
        """{category: {"failed", "total", "rate"}} (tasks without one are "uncategorized")."""
        stats: dict[str, dict[str, Any]] = {}
        for observation in observations:
            entry = stats.setdefault(observation.task.category or "uncategorized", {"failed": 0, "total": 0})
            entry["total"] += 1
            entry["failed"] += 0 if observation.feedback.success else 1
        for entry in stats.values():
            entry["rate"] = round(entry["failed"] / entry["total"], 6)
        return stats

    def step(self, workspace: Any, observations: list[Observation], history: Any, trial: Any) -> StepResult:
        self.cycle += 1
        stats = self.gap_analysis(observations)
        self.seen |= set(stats)
        gaps = sorted((c for c, s in stats.items() if s["rate"] > self.threshold),
                      key=lambda c: (-stats[c]["rate"], -stats[c]["failed"], c))
        metadata: dict[str, Any] = {"failure_rates": stats, "gaps": gaps, "threshold": self.threshold}
        if "skills" not in set(workspace.manifest.evolvable_layers):
            return StepResult(False, "adaptive-skill: skills is not an evolvable layer", metadata)
        usage = _Usage()
        before = self._library(workspace)
        worked = [self._fill(workspace, category, stats[category], observations, usage)
                  for category in gaps[: max(0, self.max_gaps)]]
        merged = self._merge(workspace, before)
        pruned = self._prune(workspace, set(stats))
        after = self._library(workspace)
        created = sorted(set(after) - set(before))
        changed = sorted(n for n in set(after) & set(before) if after[n] != before[n])
        deleted = sorted(set(before) - set(after))
        parts = [f"gaps: {', '.join(gaps) or 'none'}"]
        parts += [f"{w['action']} for {w['category']}: {', '.join(w['changed']) or 'no change'}"
                  for w in worked]
        parts += [f"merged {', '.join(m['merged'])} into {m['into']}" for m in merged]
        if pruned:
            parts.append(f"pruned {', '.join(pruned)}")
        served = {name: sorted(skill_categories(name, text, self.seen)) for name, text in after.items()}
        metadata.update({"worked": worked, "merged": merged, "pruned": pruned, "created": created,
                         "modified": changed, "deleted": deleted, "skill_categories": served,
                         **usage.as_dict()})
        return StepResult(bool(created or changed or deleted), "; ".join(parts)[:500], metadata)

    @staticmethod
    def _library(workspace: Any) -> dict[str, str]:
        return {skill.name: workspace.read_skill(skill.name) for skill in workspace.list_skills()}

    def _fill(self, workspace: Any, category: str, stat: dict[str, Any], observations: list[Observation],
              usage: _Usage) -> dict[str, Any]:
        before = self._library(workspace)
        covering = sorted(n for n, text in before.items() if category in skill_categories(n, text, self.seen))
        failed = [o for o in observations if (o.task.category or "uncategorized") == category
                  and not o.feedback.success][:6]
        passed = [o for o in observations if (o.task.category or "uncategorized") == category
                  and o.feedback.success][:2]
        rate = f"{stat['failed']} of {stat['total']} tasks of category `{category}` failed this cycle"
        if covering:
            action = "refine"
            ask = (f"{rate}, although skills/{covering[0]}/SKILL.md is meant for it. Refine that skill "
                   "(or the other skills of the category) so the agent solves these tasks.")
        else:
            action = "create"
            ask = (f"{rate}, and no skill covers it. Create one skill for it: skills/<name>/SKILL.md with "
                   f"`category: {category}` in its front matter.")
        prefix = (ADAPTIVE_SKILL_INSTRUCTIONS + f"\n## prompts/system.md\n{workspace.read_prompt()}\n\n"
                  + _skills_text(workspace, 6000))
        suffix = ask + "\n\n" + "\n".join(_observation_text(o) for o in failed + passed)
        said = self._converse(prefix, suffix, usage, label=action, workspace=workspace,
                              write_roots=("skills",))
        after = self._library(workspace)
        changed = sorted(n for n in after if before.get(n) != after[n])
        return {"category": category, "action": action, "skill": covering[0] if covering else "",
                "rate": stat["rate"], "changed": changed, "said": said[:300]}

    def _merge(self, workspace: Any, before: dict[str, str]) -> list[dict[str, Any]]:
        library = self._library(workspace)
        groups: dict[frozenset, list[str]] = {}
        for name, text in library.items():
            categories = frozenset(skill_categories(name, text, self.seen))
            if categories:
                groups.setdefault(categories, []).append(name)
        merges = []
        for categories, names in groups.items():
            if len(names) < 2:
                continue
            names.sort(key=lambda n: (n not in before, n))  # older skills first, then by name
            keep, others = names[0], names[1:]
            text = library[keep].rstrip("\n")
            for other in others:
                text += "\n\n" + _skill_body(library[other])
                workspace.delete_skill(other)
                self.last_used.pop(other, None)
            workspace.write_skill(keep, text + "\n")
            merges.append({"into": keep, "merged": others, "categories": sorted(categories)})
        return merges

    def _prune(self, workspace: Any, present: set[str]) -> list[str]:
        pruned = []
        for name, text in self._library(workspace).items():
            if skill_categories(name, text, self.seen) & present:
                self.last_used[name] = self.cycle
            else:
                self.last_used.setdefault(name, self.cycle)
            if self.prune_after > 0 and self.cycle - self.last_used[name] >= self.prune_after:
                workspace.delete_skill(name)
                self.last_used.pop(name)
                pruned.append(name)
        return pruned


# ---------------------------------------------------------------------------------------- search

_COPY_IGNORED = (".git", "evolution", "__pycache__")


def _layer_files(root: Path, layers: Iterable[str]) -> dict[str, bytes]:
    """{relative path: bytes} of the regular files under the given layer folders (no symlinks)."""
    files = {}
    for layer in layers:
        top = root / layer
        if not top.is_dir() or top.is_symlink():
            continue
        for path in sorted(top.rglob("*")):
            if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts:
                files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


def workspace_delta(before: dict[str, bytes], after: dict[str, bytes]) -> dict[str, Any]:
    """What changed between two layer-file maps: written (added or modified), deleted, and the
    change's size as (files, bytes): the bytes of the written files plus those of deleted ones."""
    written = sorted(p for p in after if before.get(p) != after[p])
    deleted = sorted(p for p in before if p not in after)
    size = sum(len(after[p]) for p in written) + sum(len(before[p]) for p in deleted)
    return {"written": written, "deleted": deleted, "files": len(written) + len(deleted), "bytes": size}


def search_winner(candidates: list[dict[str, Any]], baseline: float) -> dict[str, Any] | None:
    """The best candidate: the highest score, ties going to the smallest change (files, then
    bytes), then the first; None unless it beats `baseline` (leaving the workspace as it is
    is the smallest change of all)."""
    scored = [c for c in candidates if c.get("score") is not None and c.get("files", 0) > 0]
    if not scored:
        return None
    best = min(scored, key=lambda c: (-c["score"], c["files"], c["bytes"], c["candidate"]))
    return best if best["score"] > baseline else None


class SearchEngine(EvolutionEngine):
    """The evolve step as an experimental search over candidate mutations.

    `n` throwaway copies of the workspace (without .git and evolution/) are each mutated by a
    fresh inner engine (`inner`, default textbook; other keyword options go to it): an inner
    engine with a size setting (SIZE_KNOBS, e.g. textbook's per_cycle) gets the values of
    `per_cycle_values` in turn ("1,2,3"; default 1..n), one whose step() takes `guidance`
    (skillforge) is told which candidate it is, any other runs as configured. Each copy is then
    scored by a TrialRunner pointed at it on the cycle's failed tasks plus up to `successes`
    of its passing ones (spread over the categories), so a mutation that breaks passing tasks
    loses. The best candidate wins (ties: the smallest change), if it beats the unchanged
    workspace on the same tasks (its score is the cycle's own); its changed files in the
    evolvable layers are copied back to the real workspace and the files it deleted deleted.
    A candidate whose inner engine raises is recorded with its error; if every one does, the
    step raises and the cycle fails.
    """

    name = "search"

    def __init__(self, inner: str = "textbook", n: int = 3, successes: int = 3, per_cycle_values: str = "",
                 *, trusted: bool = False, **inner_options: Any) -> None:
        self.options_check({"n": n, "per_cycle_values": per_cycle_values})
        self.inner_name, self.inner_options, self.trusted = inner, dict(inner_options), trusted
        self.n, self.successes = int(n), int(successes)
        self.per_cycle_values = self._values(per_cycle_values) or list(range(1, self.n + 1))
        engine_get(inner, trusted=trusted, **self.inner_options)  # a bad inner engine fails here, not later

    @classmethod
    def options_check(cls, options: Mapping[str, Any]) -> None:
        if not 1 <= int(options.get("n", 3)) <= 16:
            raise EngineError("search: n is 1 to 16 candidates")
        cls._values(options.get("per_cycle_values", ""))

    @staticmethod
    def _values(per_cycle_values: Any) -> list[int]:
        try:
            return [int(v) for v in str(per_cycle_values).replace(" ", "").split(",") if v]
        except ValueError:
            raise EngineError(f"search: per_cycle_values {per_cycle_values!r} is not a list like 1,2,3") \
                from None

    def _scratch(self) -> Path:
        try:
            from django.conf import settings

            base = Path(settings.DATA_DIR) / "evolve" / "search"
            base.mkdir(parents=True, exist_ok=True)
        except Exception:  # no Django settings: the system's temporary folder
            base = None
        return Path(tempfile.mkdtemp(prefix="search-", dir=base))

    def step(self, workspace: Any, observations: list[Observation], history: Any, trial: Any) -> StepResult:
        from evolve_app.loop import TrialRunner
        from evolve_app.workspace import AgentWorkspace

        failed = [o for o in observations if not o.feedback.success]
        if not failed:
            return StepResult(False, "search: no failed tasks to search on", {"inner": self.inner_name})
        if trial is None:
            raise EngineError("search needs the loop's trial runner to score its candidates")
        judged = failed + _spread([o for o in observations if o.feedback.success], max(0, self.successes))
        tasks = [o.task for o in judged]
        baseline = _mean_score(judged)
        layers = list(workspace.manifest.evolvable_layers)
        original = _layer_files(workspace.root, layers)
        candidates: list[dict[str, Any]] = []
        copies: dict[int, Path] = {}
        scratch = self._scratch()
        try:
            for index in range(self.n):
                copy = scratch / f"candidate-{index + 1}"
                shutil.copytree(workspace.root, copy, symlinks=True, ignore=lambda folder, names: [
                    name for name in names if Path(folder) == workspace.root and name in _COPY_IGNORED])
                copies[index + 1] = copy
                candidates.append(self._candidate(index, copy, observations, history, trial, tasks, original,
                                                  layers, AgentWorkspace, TrialRunner))
            if all(c.get("error") for c in candidates):
                raise EngineError(f"search: every candidate failed; the first: {candidates[0]['error']}")
            winner = search_winner(candidates, baseline)
            applied: dict[str, list[str]] = {"written": [], "deleted": []}
            if winner is not None:
                applied = self._apply(workspace, copies[winner["candidate"]], layers, original)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        metadata = {"inner": self.inner_name, "baseline": baseline,
                    "judged_tasks": [t.task_id for t in tasks], "candidates": candidates,
                    "winner": winner["candidate"] if winner else None,
                    "applied": applied}
        scores = ", ".join(f"#{c['candidate']} " + (f"{c['score']:.3f}" if c.get("score") is not None
                                                    else "failed" if c.get("error") else "no change")
                           for c in candidates)
        if winner is None:
            summary = f"search: no candidate beat the current workspace ({baseline:.3f}; {scores})"
        else:
            summary = (f"search: candidate {winner['candidate']} of {self.n} won ({scores}; baseline "
                       f"{baseline:.3f}): {winner['summary']}")
        return StepResult(winner is not None, summary[:500], metadata)

    def _candidate(self, index: int, copy: Path, observations: list[Observation], history: Any, trial: Any,
                   tasks: list[Task], original: dict[str, bytes], layers: list[str], workspace_class: Any,
                   runner_class: Any) -> dict[str, Any]:
        record: dict[str, Any] = {"candidate": index + 1, "setting": {}, "score": None, "files": 0,
                                  "bytes": 0}
        try:
            engine = engine_get(self.inner_name, trusted=self.trusted, **self.inner_options)
            trusted = getattr(trial, "trusted", False)  # the copies' agents are chosen with the run's trust
            inner_trial = runner_class(copy, trial.benchmark, trial.concurrency, trusted=trusted)
            knob = _size_knob(engine)
            if knob:
                setattr(engine, knob, self.per_cycle_values[index % len(self.per_cycle_values)])
                record["setting"] = {knob: getattr(engine, knob)}
                result = engine.step(workspace_class(copy), observations, history, inner_trial)
            elif _accepts_guidance(engine):
                note = (f"This is candidate {index + 1} of {self.n} in a search: each candidate is scored on "
                        "the failed tasks and some passing ones, and the best is kept."
                        + (" Try a different approach from the most obvious one." if index else ""))
                record["setting"] = {"guidance": note}
                result = engine.step(workspace_class(copy), observations, history, inner_trial, guidance=note)
            else:
                result = engine.step(workspace_class(copy), observations, history, inner_trial)
        except Exception as error:  # one candidate's failure is a result of the search, not its end
            record["error"] = f"{type(error).__name__}: {error}"[:500]
            return record
        delta = workspace_delta(original, _layer_files(copy, layers))
        record.update(summary=result.summary[:300], files=delta["files"], bytes=delta["bytes"])
        if delta["files"]:
            judged = runner_class(copy, trial.benchmark, trial.concurrency, trusted=trusted).run(tasks)
            record["passed"] = sum(1 for _, feedback in judged if feedback.success)
            record["score"] = round(sum(f.score for _, f in judged) / len(judged), 6) if judged else 0.0
        return record

    @staticmethod
    def _apply(workspace: Any, copy: Path, layers: list[str], original: dict[str, bytes]
               ) -> dict[str, list[str]]:
        """Copy the winner's changed layer files (content and mode) into the real workspace;
        delete the files it deleted, and the folders that leaves empty."""
        from evolve_app.workspace import WorkspaceError

        chosen = _layer_files(copy, layers)
        delta = workspace_delta(original, chosen)
        for rel in delta["written"]:
            target = workspace._path(rel)  # the workspace's own check: no path through a symlink
            if target.is_dir():
                raise WorkspaceError(f"{rel}: a directory is in the way")
            target.parent.mkdir(parents=True, exist_ok=True)
            workspace._path(rel)  # the folders just made are checked again
            temporary = target.with_name(f".{target.name}.search.tmp")
            temporary.write_bytes(chosen[rel])
            os.chmod(temporary, stat.S_IMODE((copy / rel).stat().st_mode))
            os.replace(temporary, target)
        for rel in delta["deleted"]:
            workspace._path(rel).unlink(missing_ok=True)
        for rel in delta["deleted"]:  # folders a deletion left empty
            folder = (workspace.root / rel).parent
            while folder != workspace.root and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
                folder = folder.parent
        return {"written": delta["written"], "deleted": delta["deleted"]}


ENGINES = {"textbook": TextbookEngine, "skillforge": SkillForgeEngine, "guided": GuidedSynthesisEngine,
           "adaptive": AdaptiveEvolutionEngine, "adaptive-skill": AdaptiveSkillEngine, "search": SearchEngine}


# A built-in named by its dotted path is the built-in: found by lookup, not imported.
_BUILTIN_PATHS = {f"{cls.__module__}{sep}{cls.__name__}": name for name, cls in ENGINES.items()
                  for sep in (".", ":")}
RESERVED_OPTIONS = ("trusted",)  # set by the runtime from where the run was started
_SETTABLE = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def engine_names() -> list[str]:
    """The engines the web and API may name: the built-ins (those whose package is installed),
    then installed entry points."""
    offered = [name for name, cls in ENGINES.items() if getattr(cls, "offered", lambda: True)()]
    return [*offered, *sorted(name for name in installed(ENGINE_GROUP) if name not in ENGINES)]


def _builtin(name: str) -> str | None:
    return name if name in ENGINES else _BUILTIN_PATHS.get(name)


def _value_check(engine: str, key: str, value: Any, default: Any) -> None:
    """A value the constructor would turn into its default's type (int() or float())."""
    kind = type(default)
    if kind not in (int, float):
        return
    try:
        kind(value)
    except (TypeError, ValueError):
        wanted = "a whole number" if kind is int else "a number"
        raise EngineError(f"{engine}: option {key} must be {wanted}, got {value!r}") from None


def _options_check(name: str, cls: type[EvolutionEngine], options: dict[str, Any], trusted: bool) -> None:
    """A built-in's options against its signature (inspected, never called), its own bounds, its
    path options (under CRUCIBLE_REPO_ROOTS unless trusted), and its inner engine, if it has one."""
    parameters = inspect.signature(cls).parameters
    settable = {key: p for key, p in parameters.items()
                if p.kind in _SETTABLE and key not in RESERVED_OPTIONS}
    passes_on = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    unknown = [key for key in options if key not in settable]
    if unknown and not passes_on:
        raise EngineError(f"{name} has no option {', '.join(map(repr, unknown))}; its options: "
                          f"{', '.join(settable) or 'none'}")
    missing = [key for key, p in settable.items() if p.default is p.empty and key not in options]
    if missing:
        raise EngineError(f"{name} needs the option {', '.join(missing)}")
    for key, value in options.items():
        if key in settable:
            _value_check(name, key, value, settable[key].default)
    for key in cls.PATH_OPTIONS:
        if options.get(key) not in (None, ""):
            server_path(str(options[key]), trusted=trusted, what=f"{name} {key} file", error=EngineError)
    cls.options_check(options)
    if passes_on and "inner" in settable:
        inner = str(options.get("inner", settable["inner"].default))
        rest = {key: value for key, value in options.items() if key not in settable}
        try:
            engine_check(inner, rest, trusted=trusted)
        except EngineError as error:
            raise EngineError(f"{name}'s inner engine: {error}") from None


def engine_check(name: str, options: Mapping[str, Any] | None = None, *, trusted: bool = False) -> None:
    """Raise EngineError unless `name` is an engine this caller may name, with options it takes.

    A name lookup and signature checks only: nothing is imported, constructed or called. A
    built-in's options are checked in full; an entry point's or a dotted path's are its own,
    checked when a worker makes it. A dotted path needs `trusted` (the CLI) or its exact
    spelling in CRUCIBLE_ALLOWED_EXTENSIONS."""
    options = dict(options or {})
    reserved = [key for key in options if key in RESERVED_OPTIONS]
    if reserved:
        raise EngineError(f"{', '.join(reserved)} is set by the runtime, not an engine option")
    builtin = _builtin(name)
    if builtin is not None:
        _options_check(builtin, ENGINES[builtin], options, trusted)
    elif name in installed(ENGINE_GROUP):
        return
    elif is_dotted(name):
        if not dotted_allowed(name, trusted=trusted):
            raise EngineError(dotted_refusal("engine", name, engine_names()))
    else:
        raise EngineError(f"unknown engine {name!r}: use one of {', '.join(engine_names())}")


def engine_get(name: str, *, trusted: bool = False, **options: Any) -> EvolutionEngine:
    """The engine `name` names, made with `options` (in a worker or the CLI, never to check a
    request). It is checked first, with the trust the run has, so a stored row or option that
    names a dotted path nobody allowed is refused, not imported."""
    engine_check(name, options, trusted=trusted)
    builtin = _builtin(name)
    if builtin is not None:
        factory: Any = ENGINES[builtin]
        if "trusted" in inspect.signature(factory).parameters:  # its inner engines get the same trust
            options = {**options, "trusted": trusted}
    else:
        point = installed(ENGINE_GROUP).get(name)
        try:
            factory = point.load() if point is not None else dotted_load(name, EngineError)
        except EngineError as error:
            raise EngineError(f"engine {name!r} cannot be loaded: {error}") from None
        except Exception as error:  # an installed package's own failure to load
            raise EngineError(f"engine {name!r} cannot be loaded: {type(error).__name__}: {error}") from None
    engine = factory(**options)
    if not hasattr(engine, "step"):
        raise EngineError(f"{name!r} is not an evolution engine (it has no step())")
    return engine


# A-Evolve's engines through the adapter (offered when the a-evolve extra is installed): the module
# builds on the classes above and adds its engines to ENGINES, so it is imported last.
import evolve_app.aevolve  # noqa: E402, F401
