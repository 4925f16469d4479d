"""Adaptive Skill: skill-gap analysis per task category, skills created or refined for the gaps,
overlapping skills merged, unused ones pruned."""

from __future__ import annotations

from typing import Any

from evolve_app.engines.model import (
    _ModelEngine,
    _observation_text,
    _skill_body,
    _skills_text,
    _Usage,
    skill_categories,
)
from evolve_app.types import History, Observation, StepResult, Trial, Workspace

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

    def step(self, workspace: Workspace, observations: list[Observation], history: History,
             trial: Trial | None) -> StepResult:
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
    def _library(workspace: Workspace) -> dict[str, str]:
        return {skill.name: workspace.read_skill(skill.name) for skill in workspace.list_skills()}

    def _fill(self, workspace: Workspace, category: str, stat: dict[str, Any],
              observations: list[Observation], usage: _Usage) -> dict[str, Any]:
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

    def _merge(self, workspace: Workspace, before: dict[str, str]) -> list[dict[str, Any]]:
        library = self._library(workspace)
        groups: dict[frozenset[str], list[str]] = {}
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

    def _prune(self, workspace: Workspace, present: set[str]) -> list[str]:
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
