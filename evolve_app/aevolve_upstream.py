"""The agent_evolve side of evolve_app/aevolve.py: imported only when the a-evolve package is
installed (evolve_app.aevolve.upstream()), so it imports agent_evolve at the top.

Here are the conversions between Crucible's types and A-Evolve's, the facades A-Evolve's engines
step on (workspace, history, trial), the LLMProvider that sends their calls to Crucible's model
machinery, and subclasses of the four engines that replace the upstream parts that would run
outside Crucible's control: `_run_llm` (upstream: a `bash -c` on the host, and a Bedrock or SDK
client of its own) and the adaptive engine's direct file writes.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from agent_evolve import types as ae
from agent_evolve.algorithms.adaptive_evolve.base_analysis import McpAutoCorrector
from agent_evolve.algorithms.adaptive_evolve.engine import AdaptiveEvolveEngine
from agent_evolve.algorithms.adaptive_skill.engine import AdaptiveSkillEngine
from agent_evolve.algorithms.adaptive_skill.prompts import (
    DEFAULT_EVOLVER_SYSTEM_PROMPT as ADAPTIVE_SKILL_SYSTEM_PROMPT,
)
from agent_evolve.algorithms.guided_synth.engine import GuidedSynthesisEngine
from agent_evolve.algorithms.skillforge.engine import AEvolveEngine
from agent_evolve.algorithms.skillforge.prompts import (
    DEFAULT_EVOLVER_SYSTEM_PROMPT as SKILLFORGE_SYSTEM_PROMPT,
)
from agent_evolve.algorithms.skillforge.tools import BASH_TOOL_SPEC
from agent_evolve.config import EvolveConfig
from agent_evolve.llm.base import LLMMessage, LLMProvider, LLMResponse

from evolve_app import benchmarks
from evolve_app.benchmarks import feedback_down
from evolve_app.types import Feedback, Observation, Task, Trajectory
from evolve_app.workspace.files import AgentWorkspace, _name
from evolve_app.workspace.validation import DRAFTS_DIR, WorkspaceError, skill_front_matter

DRAFT_TASK = "draft:"  # the task id prefix of a proposal made from a draft in skills/_drafts/
MAX_BATCH_BYTES = 16 * 1024 * 1024  # an observation batch larger than this is not read
_T = TypeVar("_T")


# ---------------------------------------------------------------------------------------- types


def task_up(task: Task) -> ae.Task:
    return ae.Task(id=task.task_id, input=task.input, metadata={**task.metadata, "category": task.category})


def task_down(task: ae.Task) -> Task:
    """A-Evolve's Task as Crucible's (benchmarks.task_down), its category moved out of the metadata
    (task_up puts it back), so a round trip gives the same task."""
    made = benchmarks.task_down(task)
    metadata = {key: value for key, value in made.metadata.items() if key != "category"}
    return Task(made.task_id, made.input, made.category, metadata)


def trajectory_up(trajectory: Trajectory) -> ae.Trajectory:
    """Crucible's Trajectory as A-Evolve's: task_id, output (the error, if the agent failed), steps
    (the error as a last step) and conversation (Crucible's, where its Trajectory has one)."""
    steps = list(trajectory.steps)
    if trajectory.error:
        steps.append({"error": trajectory.error})
    conversation = getattr(trajectory, "conversation", None)
    conversation = list(conversation) if isinstance(conversation, list) else []
    return ae.Trajectory(task_id=trajectory.task_id, output=trajectory.output or trajectory.error,
                         steps=steps, conversation=conversation)


def observation_up(observation: Observation) -> ae.Observation:
    trajectory = observation.trajectory
    upstream = trajectory_up(trajectory)
    proposal = next((step["skill_proposal"] for step in trajectory.steps if isinstance(step, dict)
                     and isinstance(step.get("skill_proposal"), str)), "")
    if proposal:
        # What Guided Synthesis reads from a solver (getattr): upstream's Trajectory does not declare it.
        upstream._skill_proposal = proposal  # type: ignore[attr-defined]
    feedback = observation.feedback
    raw = getattr(feedback, "raw", None)
    return ae.Observation(task_up(observation.task), upstream,
                          ae.Feedback(success=feedback.success, score=feedback.score, detail=feedback.detail,
                                      raw=dict(raw) if isinstance(raw, dict) else {}))


def observation_down(observation: ae.Observation) -> tuple[Trajectory, Feedback]:
    trajectory = observation.trajectory
    return (Trajectory(trajectory.task_id, trajectory.output, list(trajectory.steps),
                       conversation=list(getattr(trajectory, "conversation", None) or [])),
            feedback_down(observation.feedback))


def record_of(seed: dict[str, Any]) -> dict[str, Any]:
    """An observation record as A-Evolve's Observer writes it (flat and nested), from the seed's
    format (task_id, task_input, agent_output, steps, success, score, feedback_detail); a record
    already in A-Evolve's format (the batches Crucible writes) keeps its task metadata,
    conversation and claims."""
    steps = seed.get("steps") if isinstance(seed.get("steps"), list) else []
    if isinstance(seed.get("task"), dict) and isinstance(seed.get("trajectory"), dict):
        given = seed.get("feedback")
        feedback: dict[str, Any] = given if isinstance(given, dict) else {}
        return {**seed, "steps": steps, "success": bool(seed.get("success")), "score": seed.get("score", 0.0),
                "feedback_detail": seed.get("feedback_detail", ""),
                "feedback": {"success": bool(seed.get("success")), "score": seed.get("score", 0.0),
                             "detail": seed.get("feedback_detail", ""), "claims": [], "raw": {}, **feedback}}
    return {
        "task_id": seed.get("task_id", ""), "task_input": seed.get("task_input", ""),
        "agent_output": seed.get("agent_output", ""), "steps": steps, "conversation": [],
        "success": bool(seed.get("success")), "score": seed.get("score", 0.0),
        "feedback_detail": seed.get("feedback_detail", ""),
        "task": {"id": seed.get("task_id", ""), "input": seed.get("task_input", ""), "metadata": {}},
        "trajectory": {"output": seed.get("agent_output", ""), "steps": steps},
        "feedback": {"success": bool(seed.get("success")), "score": seed.get("score", 0.0),
                     "detail": seed.get("feedback_detail", ""), "claims": [], "raw": {}},
    }


# ---------------------------------------------------------------------------------------- facades


class WorkspaceFacade:
    """agent_evolve.contract.workspace.AgentWorkspace's interface over Crucible's AgentWorkspace:
    reads answer as upstream does ("" or [] for what is missing), writes go through Crucible's
    checks (names, no symlinks, valid SKILL.md front matter, atomic)."""

    def __init__(self, workspace: Any) -> None:
        self.crucible: AgentWorkspace = workspace  # Crucible's, or one that answers as it does
        self.root = Path(workspace.root)
        self.prompts_dir = self.root / "prompts"
        self.skills_dir = self.root / "skills"
        self.drafts_dir = self.skills_dir / DRAFTS_DIR
        self.tools_dir = self.root / "tools"
        self.memory_dir = self.root / "memory"
        self.evolution_dir = self.root / "evolution"

    def __getattr__(self, name: str) -> Any:  # manifest, validate, read_draft, delete_draft ...
        return getattr(self.crucible, name)

    def _or_empty(self, read: Callable[[], _T], empty: _T) -> _T:
        try:
            return read()
        except WorkspaceError:
            return empty

    def read_prompt(self) -> str:
        return self._or_empty(self.crucible.read_prompt, "")

    def write_prompt(self, content: str) -> None:
        self.crucible.write_prompt(content)

    def read_fragment(self, name: str) -> str:
        return self._or_empty(lambda: self.crucible.read_fragment(name), "")

    def write_fragment(self, name: str, content: str) -> None:
        self.crucible.write_fragment(name, content)

    def list_fragments(self) -> list[str]:
        return self.crucible.list_fragments()

    def list_skills(self) -> list[Any]:
        return self.crucible.list_skills()

    def read_skill(self, name: str) -> str:
        return self._or_empty(lambda: self.crucible.read_skill(name), "")

    def write_skill(self, name: str, content: str) -> None:
        """Crucible's write_skill; front matter that is not valid YAML (A-Evolve's engines write
        `description: <text>` unquoted, colons and all) is written again as YAML, once."""
        try:
            self.crucible.write_skill(name, content)
        except WorkspaceError:
            repaired = _front_matter_repaired(content)
            if repaired is None:
                raise
            self.crucible.write_skill(name, repaired)

    def delete_skill(self, name: str) -> None:
        if self.read_skill(name):
            self.crucible.delete_skill(name)

    def list_drafts(self) -> list[dict[str, str]]:
        return self.crucible.list_drafts()

    def write_draft(self, name: str, content: str) -> None:
        self.crucible.write_draft(name, content)

    def clear_drafts(self) -> None:
        for draft in self.crucible.list_drafts():
            self.crucible.delete_draft(draft["name"])

    def read_tool_registry(self) -> list[dict[str, Any]]:
        return self._or_empty(self.crucible.read_tool_registry, [])

    def write_tool_registry(self, tools: list[dict[str, Any]]) -> None:
        self.crucible.write_tool_registry(tools)

    def read_tool(self, name: str) -> str:
        return self._or_empty(lambda: self.crucible.read_tool(name), "")

    def write_tool(self, name: str, content: str) -> None:
        self.crucible.write_tool(name, content)

    def add_memory(self, entry: dict[str, Any], category: str = "episodic") -> None:
        self.crucible.add_memory(entry, category)

    def read_memories(self, category: str = "episodic", limit: int = 100) -> list[dict[str, Any]]:
        return self._or_empty(lambda: self.crucible.read_memories(category, limit), [])

    def read_all_memories(self, limit: int = 100) -> list[dict[str, Any]]:
        return self._or_empty(lambda: self.crucible.read_all_memories(limit), [])

    def read_evolution_history(self) -> list[dict[str, Any]]:
        return []  # Crucible's cycles live in its database and the workspace's tags

    def read_evolution_metrics(self) -> dict[str, Any]:
        return {}

    def write_text(self, rel: str, text: str) -> None:
        """Write a layer file as it is (no front matter check), through the symlink checks."""
        self.crucible._write(rel, text)

    def memory_categories(self) -> list[str]:
        return sorted({str(entry.get("_category")) for entry in self.read_all_memories(limit=0)
                       if entry.get("_category")})


def _front_matter_repaired(content: str) -> str | None:
    """`---` lines of `key: value`, as plain text, dumped again as YAML; None when there is no
    front matter to repair."""
    lines = content.split("\n")
    if not lines or lines[0].rstrip() != "---":
        return None
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() == "---"), None)
    if end is None:
        return None
    data = {}
    for line in lines[1:end]:
        key, sep, value = line.partition(":")
        if not sep or not key.strip():
            return None
        data[key.strip()] = value.strip()
    header = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=10_000)
    return "---\n" + header + "---" + "\n".join(["", *lines[end + 1:]])


class HistoryFacade:
    """agent_evolve.engine.history.EvolutionHistory's queries, answered from Crucible's history
    (git tags, diffs, files at a version) and the workspace's observation batches
    (evolution/observations/*.jsonl, one a cycle, written after it), the current cycle's
    observations — handed to step(), not yet recorded — coming last."""

    def __init__(self, history: Any, root: Path, current: list[Observation]) -> None:
        self.crucible, self.root = history, root
        self.current = [record_of(o.as_record()) for o in current]
        self.versions = history.version_log() if history is not None else []

    @property
    def latest_cycle(self) -> int:
        """The last finished cycle: the one before the cycle being evolved (its pre-evo-N)."""
        pre = [v["cycle"] for v in self.versions if v["kind"] == "pre"]
        post = [v["cycle"] for v in self.versions if v["kind"] == "post"]
        return max(pre) - 1 if pre else max(post, default=0)

    @property
    def cycles(self) -> list[ae.CycleRecord]:
        return [ae.CycleRecord(cycle=c, score=s, mutated=False) for c, s in self._curve()]

    def _batches(self) -> list[list[dict[str, Any]]]:
        folder = self.root / "evolution" / "observations"
        if not folder.is_dir() or folder.is_symlink():
            return []
        batches = []
        for path in sorted(folder.glob("batch_*.jsonl")):
            if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_BATCH_BYTES:
                continue
            records = []
            for line in path.read_text(errors="replace").splitlines():
                try:
                    value = json.loads(line)
                except ValueError:
                    continue
                if isinstance(value, dict):
                    records.append(record_of(value))
            batches.append(records)
        return batches

    def _earlier(self) -> list[list[dict[str, Any]]]:
        """The batches before this cycle's (a loop that writes the batch before the engine steps,
        as A-Evolve's does, has written this cycle's already: it is not counted twice)."""
        batches = self._batches()

        def key(batch: list[dict[str, Any]]) -> list[tuple[Any, Any, Any]]:
            return [(r["task_id"], r["agent_output"], r["score"]) for r in batch]

        if batches and self.current and key(batches[-1]) == key(self.current):
            batches.pop()
        return batches

    def get_observations(self, last_n_cycles: int = 3, only_failures: bool = False) -> list[dict[str, Any]]:
        earlier = self._earlier()[-(last_n_cycles - 1):] if last_n_cycles > 1 else []
        records = [r for batch in earlier for r in batch] + self.current
        return [r for r in records if not r["success"]] if only_failures else records

    def get_summary_stats(self) -> dict[str, Any]:
        records = [r for batch in self._earlier() for r in batch] + self.current
        if not records:
            return {"total": 0, "success_rate": 0.0, "avg_score": 0.0}
        return {"total": len(records), "success_rate": sum(r["success"] for r in records) / len(records),
                "avg_score": sum(float(r["score"] or 0) for r in records) / len(records)}

    def _curve(self) -> list[tuple[int, float]]:
        try:
            return list(self.crucible.get_score_curve())
        except Exception:  # no database here (e.g. a Python Evolver without Django): no curve
            return []

    def get_score_curve(self) -> list[float]:
        return [score for _, score in self._curve()]

    def get_workspace_diff(self, from_label: str, to_label: str) -> str:
        diff: str = self.crucible.get_workspace_diff(from_label, to_label)
        return diff

    def read_file_at(self, version_label: str, path: str) -> str:
        return self.crucible.read_file_at(version_label, path) or ""

    def list_versions(self) -> list[str]:
        return [v["tag"] for v in reversed(self.versions) if v["kind"] == "post"]

    def get_version_log(self, n: int = 30) -> str:
        newest = list(reversed(self.versions))[:n]
        return "\n".join(f"{v['sha'][:7]} ({v['tag']}) {v['message']}" for v in newest)


class TrialFacade:
    """agent_evolve.engine.trial.TrialRunner's interface over Crucible's TrialRunner (the agent
    as the workspace is now, in the sandbox)."""

    def __init__(self, trial: Any) -> None:
        self.crucible = trial

    def get_tasks(self, split: str = "train", limit: int = 5) -> list[ae.Task]:
        if self.crucible is None:
            return []
        return [task_up(task) for task in self.crucible.benchmark.get_tasks(split, limit)]

    def run_tasks(self, tasks: list[ae.Task]) -> list[ae.Observation]:
        if self.crucible is None or not tasks:
            return []
        done = self.crucible.run([task_down(task) for task in tasks])
        return [observation_up(Observation(task_down(task), trajectory, feedback))
                for task, (trajectory, feedback) in zip(tasks, done, strict=False)]

    def run_single(self, task: ae.Task) -> ae.Observation:
        results = self.run_tasks([task])
        if not results:
            raise RuntimeError(f"TrialRunner: task {task.id} produced no observation")
        return results[0]


# ---------------------------------------------------------------------------------------- the model


def _split(messages: list[LLMMessage]) -> tuple[str, str]:
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    rest = [m for m in messages if m.role != "system"]
    user = rest[0].content if len(rest) == 1 else "\n\n".join(f"[{m.role}]\n{m.content}" for m in rest)
    return system, user


class CrucibleLLM(LLMProvider):
    """A-Evolve's LLMProvider, answered by Crucible's engine (`chat`: the run's preset, ToolChat,
    receipts). `converse_loop` (the tool loop upstream runs with Bedrock) answers `workspace_bash`
    with the sandboxed bash it was given, whatever executor the caller passes."""

    def __init__(self, chat: Callable[..., tuple[str, dict[str, int], list[dict[str, Any]]]],
                 bash: Callable[[str], str] | None) -> None:
        self._chat, self._bash = chat, bash

    def complete(self, messages: list[LLMMessage], max_tokens: int = 4096, temperature: float = 0.0,
                 **kwargs: Any) -> LLMResponse:
        system, user = _split(messages)
        text, usage, _ = self._chat(system, user, tools=[], executors={}, max_tokens=max_tokens, max_turns=1,
                                    label="complete")
        return LLMResponse(content=text, usage=usage)

    def complete_with_tools(self, messages: list[LLMMessage], tools: list[dict[str, Any]],
                            max_tokens: int = 4096, **kwargs: Any) -> LLMResponse:
        """One turn with the tools offered; the tool calls it asks for come back in `raw`, unrun."""
        system, user = _split(messages)
        text, usage, calls = self._chat(system, user, tools=tools, executors={}, max_tokens=max_tokens,
                                        max_turns=1, label="tools")
        return LLMResponse(content=text, usage=usage, raw={"tool_calls": calls})

    def converse_loop(self, system_prompt: str, user_message: str, tools: list[dict[str, Any]],
                      tool_executor: dict[str, Any] | None = None, max_tokens: int = 16384,
                      max_turns: int = 50) -> LLMResponse:
        executors = {"workspace_bash": self._bash} if self._bash is not None else {}
        offered = [tool for tool in tools if tool.get("name") in executors]
        text, usage, _ = self._chat(system_prompt, user_message, tools=offered, executors=executors,
                                    max_tokens=max_tokens, max_turns=max_turns, label="evolver")
        return LLMResponse(content=text, usage=usage)


# ---------------------------------------------------------------------------------------- engines


class _Sandboxed:
    """Mixin: the evolver's tool loop through CrucibleLLM.converse_loop (sandboxed bash), never
    upstream's `make_workspace_bash`; and no default LLM: the provider is always Crucible's."""

    SYSTEM_PROMPT = SKILLFORGE_SYSTEM_PROMPT
    config: EvolveConfig  # both set by the upstream engine this is mixed into (engine_make, engine_rebind)
    _llm: LLMProvider | None

    @property
    def llm(self) -> CrucibleLLM:
        if not isinstance(self._llm, CrucibleLLM):  # engine_make and engine_rebind give it one, or none
            raise RuntimeError("an A-Evolve engine in Crucible has no model of its own")
        return self._llm

    def _system(self) -> str:
        return self.SYSTEM_PROMPT

    def _run_llm(self, prompt: str, workspace_root: Path) -> dict[str, Any]:
        response = self.llm.converse_loop(system_prompt=self._system(), user_message=prompt,
                                          tools=[BASH_TOOL_SPEC], tool_executor={},
                                          max_tokens=self.config.evolver_max_tokens)
        return {"content": response.content, "usage": response.usage}


class SkillForge(_Sandboxed, AEvolveEngine):
    pass


class AdaptiveSkill(_Sandboxed, AdaptiveSkillEngine):
    SYSTEM_PROMPT = ADAPTIVE_SKILL_SYSTEM_PROMPT


class Guided(GuidedSynthesisEngine):
    @property
    def llm(self) -> LLMProvider:
        if self._llm is None:
            raise RuntimeError("an A-Evolve engine in Crucible has no model of its own")
        return self._llm

    def _write_minimal_memory(self, workspace: Any, obs: ae.Observation) -> None:
        if not str(obs.task.id).startswith(DRAFT_TASK):  # a draft is not a task the agent ran
            super()._write_minimal_memory(workspace, obs)


class _CheckedAutoCorrector(McpAutoCorrector):
    """Upstream's auto-corrector writes with open(); here it writes into a scratch copy of the
    files it touches, which are then written through the workspace facade."""

    FILES = ("skills/tool-name-corrections/SKILL.md", "memory/tool_param_errors.jsonl")

    def apply(self, workspace: Any, analysis: Any, accumulated_state: dict[str, Any]) -> int:
        with tempfile.TemporaryDirectory(prefix="aevolve-") as scratch:
            root = Path(scratch)
            for rel in self.FILES:
                try:
                    text = workspace.crucible._read(rel)
                except WorkspaceError:
                    continue
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                (root / rel).write_text(text)
            before = {rel: (root / rel).read_text() if (root / rel).is_file() else None for rel in self.FILES}
            fixes = super().apply(_Root(root), analysis, accumulated_state)
            for rel in self.FILES:
                after = (root / rel).read_text() if (root / rel).is_file() else None
                if after is not None and after != before[rel]:
                    workspace.write_text(rel, after)
        return fixes


class _Root:
    def __init__(self, root: Path) -> None:
        self.root = root


class Adaptive(_Sandboxed, AdaptiveEvolveEngine):
    def _system(self) -> str:
        return self._system_prompt

    def _write_skill(self, workspace: Any, skill_name: str, content: str) -> None:
        workspace.write_text(f"skills/{_name(skill_name, 'skill')}/SKILL.md", content)

    def _prune_memory(self, workspace: Any) -> int:
        pruned = 0
        for category in workspace.memory_categories():
            rel = f"memory/{_name(category, 'memory category')}.jsonl"
            lines = [line for line in workspace.crucible._read(rel).splitlines() if line.strip()]
            if len(lines) > self._memory_cap:
                workspace.write_text(rel, "\n".join(lines[-self._memory_cap:]) + "\n")
                pruned += len(lines) - self._memory_cap
        return min(pruned, 1)


def engine_make(name: str, config: dict[str, Any], llm: CrucibleLLM, specific: dict[str, Any]) -> Any:
    """The A-Evolve engine a Crucible engine `name` wraps, made with Crucible's LLM provider."""
    settings = EvolveConfig(**config)
    if name == "aevolve-guided":
        return Guided(settings, llm, write_memory=specific.get("write_memory", True),
                      verification_focus=specific.get("verification_focus", False))
    if name == "aevolve-adaptive":
        return Adaptive(settings, llm, auto_corrector=_CheckedAutoCorrector(),
                        memory_cap=specific.get("memory_cap", 15),
                        improvement_threshold=specific.get("improvement_threshold", 0.02),
                        stagnation_window=specific.get("stagnation_window", 5))
    if name == "aevolve-adaptive-skill":
        return AdaptiveSkill(settings, llm)
    return SkillForge(settings, llm)


def engine_rebind(engine: Any, config: dict[str, Any], llm: CrucibleLLM) -> None:
    """A new cycle: this step's provider (its receipts and usage) and the manifest's layers."""
    engine.config, engine._llm = EvolveConfig(**config), llm


def engine_step(engine: Any, workspace: Any, observations: list[Observation], history: Any,
                trial: Any) -> tuple[ae.StepResult, list[str]]:
    """Convert, step, and (Guided Synthesis) consume the drafts it curated. Returns upstream's
    StepResult and notes on what the adapter did."""
    facade = WorkspaceFacade(workspace)
    upstream = [observation_up(o) for o in observations]
    notes: list[str] = []
    drafts: list[str] = []
    if isinstance(engine, Guided) and engine.config.evolve_skills:
        for draft in facade.list_drafts():
            upstream.append(_draft_observation(draft))
            drafts.append(draft["name"])
        if drafts:
            notes.append(f"drafts offered as proposals: {', '.join(drafts)}")
    root = Path(workspace.root)
    result = engine.step(facade, upstream, HistoryFacade(history, root, observations), TrialFacade(trial))
    for name in drafts:
        try:
            workspace.delete_draft(name)
        except WorkspaceError:
            continue
    return result, notes


def _draft_observation(draft: dict[str, str]) -> ae.Observation:
    """A draft in skills/_drafts/ as the proposal a solver would have made (Guided Synthesis'
    format: ACTION, CONFIDENCE, TYPE, NAME, DESCRIPTION, CONTENT)."""
    name, content = draft["name"], draft["content"]
    data, _ = skill_front_matter(content)
    description = str(data.get("description", "")).strip() if isinstance(data, dict) else ""
    lines = content.split("\n")
    body = content
    if lines and lines[0].rstrip() == "---":
        end = next((i for i in range(1, len(lines)) if lines[i].rstrip() in ("---", "...")), None)
        if end is not None:
            body = "\n".join(lines[end + 1:]).strip("\n")
    proposal = (f"ACTION: NEW\nCONFIDENCE: MEDIUM\nTYPE: skill\nNAME: {name}\n"
                f"DESCRIPTION: {description or name}\nCONTENT:\n{body}")
    trajectory = ae.Trajectory(task_id=f"{DRAFT_TASK}{name}", output="")
    trajectory._skill_proposal = proposal  # type: ignore[attr-defined]  # undeclared upstream, as above
    return ae.Observation(ae.Task(id=f"{DRAFT_TASK}{name}", input=f"skills/{DRAFTS_DIR}/{name}.md"),
                          trajectory, ae.Feedback(success=False, score=0.0, detail=""))
