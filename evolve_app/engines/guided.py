"""Guided Synthesis: failures become lessons, lessons drafted skills, drafts curated."""

from __future__ import annotations

from evolve_app.engines.model import (
    _category_name,
    _json_object,
    _ModelEngine,
    _observation_text,
    _skill_body,
    _skills_text,
    _spread,
    _Usage,
    skill_categories,
)
from evolve_app.types import History, Observation, StepResult, Trial, Workspace
from evolve_app.workspace import WorkspaceError, skill_front_matter

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

    def step(self, workspace: Workspace, observations: list[Observation], history: History,
             trial: Trial | None) -> StepResult:
        usage = _Usage()
        notes: list[str] = []
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

    def _lessons(self, workspace: Workspace, observations: list[Observation], usage: _Usage,
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
            if answer is None or not isinstance(lesson, str) or not lesson.strip():
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

    def _propose(self, workspace: Workspace, usage: _Usage, notes: list[str]) -> list[str]:
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

    def _curate(self, workspace: Workspace, usage: _Usage) -> list[dict[str, str]]:
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
            elif action == "merge" and isinstance(into, str):
                merged = workspace.read_skill(into).rstrip("\n") + "\n\n" + _skill_body(content) + "\n"
                workspace.write_skill(into, merged)
                decision.update(action="merge", into=into)
            workspace.delete_draft(name)
            decisions.append(decision)
        return decisions
