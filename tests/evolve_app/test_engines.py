"""The engines beyond textbook and skillforge (guided, adaptive, adaptive-skill, search), run for
real on the offline demo through the services, the LLM ones against the loopback Anthropic fake
with scripted answers; their pure helpers checked on synthetic observations."""

from __future__ import annotations

import json
import re
import shutil
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from evolve_app import services
from evolve_app.demo import SEED_WORKSPACE, textbook_load
from evolve_app.engines import (
    ENGINES,
    AdaptiveEvolutionEngine,
    AdaptiveSkillEngine,
    EngineError,
    EvolutionEngine,
    GuidedSynthesisEngine,
    SearchEngine,
    engine_get,
    engine_names,
    intervention_size,
    observations_filter,
    search_winner,
    skill_categories,
)
from evolve_app.loop import Evolver
from evolve_app.models import Cycle
from evolve_app.types import Feedback, Observation, StepResult, Task, Trajectory
from evolve_app.workspace import AgentWorkspace
from tests.evolve_app.helpers import git

pytestmark = pytest.mark.django_db(transaction=True)

LLM = {"preset": "anthropic", "model": "fake-sonnet"}
TEXTBOOK = textbook_load()





def run_inline(user, agent, cycles: int, engine: str, trusted: bool = False, **config):
    """A run started and executed here; `trusted` as the CLI starts it (a test engine's dotted path)."""
    run = services.evolution_run_start(user, agent, engine=engine, cycles=cycles, config=config,
                                       enqueue=False, trusted=trusted)
    return services.evolution_run_execute(run.pk)


def cycles_of(run) -> list[Cycle]:
    return list(Cycle.objects.filter(run=run).order_by("number"))


def system_of(request) -> str:
    return json.dumps(request["system"])


def user_text(request) -> str:
    return json.dumps(request["messages"][0]["content"])


def has_tool_result(request) -> bool:
    last = request["messages"][-1]
    return isinstance(last["content"], list) and any(b.get("type") == "tool_result" for b in last["content"])


def text(value: str) -> list[dict]:
    return [{"type": "text", "text": value}]


def observation(task_id: str, category: str, success: bool, detail: str = "") -> Observation:
    return Observation(Task(task_id, f"do {task_id}", category), Trajectory(task_id, output="x"),
                       Feedback(success, 1.0 if success else 0.0, detail))


def seed_copy(tmp_path: Path, extra: dict[str, str] | None = None) -> AgentWorkspace:
    root = tmp_path / "seed-copy"
    shutil.copytree(SEED_WORKSPACE, root, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, content in (extra or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content)
    return AgentWorkspace(root)


# ------------------------------------------------------------------------------------------ guided


def test_guided_synthesis_writes_lessons_then_drafts_a_skill_and_accepts_it(personas, demo_agent, fake_llm):
    """Cycle 1: one lesson for each failing category, too few for a skill. Cycle 2: a second
    lesson each, so one category gets a drafted skill, which curation accepts: the score rises.
    Cycle 3: the curation answer is not JSON, so that draft is skipped with the reason."""
    curations = []

    def script(request, _candidate):
        system, user = system_of(request), user_text(request)
        if "You extract one lesson" in system:
            task = re.search(r"### (\S+) \((\w+)\)", user)
            return text(json.dumps({"lesson": f"Learn the rule behind {task.group(1)}.", "category": "misc"}))
        if "You propose a skill" in system:
            category = re.search(r"Category: (\w+)", user).group(1)
            return text(f"```markdown\n{TEXTBOOK[category]['skill_md']}```")
        if "You curate" in system:
            curations.append(user)
            if len(curations) == 1:
                return text('{"action": "accept", "reason": "no skill covers date tasks"}')
            return text("I would accept this one, it looks fine.")
        raise AssertionError(f"unexpected request: {system[:200]}")

    fake_llm(script)
    run = run_inline(personas.owner, demo_agent, cycles=3, engine="guided",
                     engine_options={**LLM, "max_failures": 3, "min_lessons": 2, "max_proposals": 1})
    first, second, third = cycles_of(run)
    path = Path(demo_agent.path)

    assert [c.status for c in (first, second, third)] == ["accepted"] * 3
    assert [c.score for c in (first, second, third)] == [0.25, 0.25, 0.5]
    # Cycle 1: lessons only, filed under the benchmark's category (not the model's "misc").
    categories = [lesson["category"] for lesson in first.engine_metadata["lessons"]]
    assert categories == ["dates", "strings", "bases"]
    assert first.engine_metadata["drafted"] == [] and first.skills_added == []
    assert "3 lessons written" in first.summary
    lessons = [json.loads(line) for line in git(path, "show", "evo-1:memory/episodic.jsonl").splitlines()]
    assert len(lessons) == 3 and all(entry["source"] == "guided" for entry in lessons)
    # Cycle 2: dates reaches two lessons first: drafted, then accepted into the skills.
    assert second.engine_metadata["drafted"] == ["date-arithmetic"]
    assert second.engine_metadata["curated"] == [
        {"draft": "date-arithmetic", "action": "accept", "reason": "no skill covers date tasks"}]
    assert second.skills_added == ["date-arithmetic"] and "accepted date-arithmetic" in second.summary
    assert "skills/_drafts/date-arithmetic.md" in curations[0]
    # Cycle 3: the malformed curation answer is a skip, with its reason; the draft is gone.
    assert third.engine_metadata["drafted"] == ["string-transforms"]
    (skipped,) = third.engine_metadata["curated"]
    assert skipped["action"] == "skip" and "not JSON" in skipped["reason"]
    assert "I would accept" in skipped["reason"]
    assert third.skills_added == [] and AgentWorkspace(path).list_drafts() == []
    assert len((path / "memory" / "episodic.jsonl").read_text().splitlines()) == 9


def test_guided_synthesis_survives_answers_that_are_not_json(personas, tmp_path, fake_llm):
    """Lessons, proposals and curation all get garbage: nothing is written, nothing crashes."""
    fake_llm(lambda request, _candidate: text("Sorry, I cannot help with that."))
    workspace = seed_copy(tmp_path, {"skills/_drafts/stray.md": "---\nname: stray\ndescription: s\n---\nx\n"})
    failures = [observation(f"dates-{n}", "dates", False, "wrong") for n in range(3)]
    engine = GuidedSynthesisEngine(**LLM, min_lessons=1)
    result = engine.step(workspace, failures, None, None)
    assert result.metadata["lessons"] == [] and workspace.read_memories("episodic") == []
    assert all("no lesson" in note for note in result.metadata["notes"])
    assert result.metadata["curated"][0]["action"] == "skip" and workspace.list_drafts() == []
    assert result.metadata["calls"] == 4 and len(result.metadata["receipts"]) == 4


def test_guided_curation_merges_a_draft_into_an_existing_skill_and_skips_a_merge_into_nothing(
        personas, tmp_path, fake_llm):
    def script(request, _candidate):
        if "skills/_drafts/inches.md" in user_text(request):
            return text('{"action": "merge", "into": "unit-conversions", "reason": "same ground"}')
        return text('Here: {"action": "merge", "into": "no-such-skill", "reason": "?"}')

    fake_llm(script)
    workspace = seed_copy(tmp_path, {
        "skills/_drafts/inches.md": "---\nname: inches\ndescription: i\n---\nFeet are 12 inches.\n",
        "skills/_drafts/other.md": "---\nname: other\ndescription: o\n---\nOther.\n"})
    result = GuidedSynthesisEngine(**LLM).step(workspace, [], None, None)
    assert result.metadata["curated"] == [
        {"draft": "inches", "action": "merge", "into": "unit-conversions", "reason": "same ground"},
        {"draft": "other", "action": "skip",
         "reason": "merge into 'no-such-skill', which is no skill of the agent; skipped"}]
    assert workspace.read_skill("unit-conversions").endswith("```\n\nFeet are 12 inches.\n")
    assert workspace.list_drafts() == [] and [s.name for s in workspace.list_skills()] == ["unit-conversions"]
    assert result.summary == "0 lessons written; merged inches into unit-conversions; skipped other"


# ---------------------------------------------------------------------------------------- adaptive


def test_the_adaptive_filter_keeps_one_failure_per_category_and_signature_and_drops_successes_near_failures():
    observations = [
        observation("d1", "dates", False, "expected '2024-02-29', got '2024-03-01'"),
        observation("d2", "dates", False, "expected '2025-01-01', got '2024-12-31'"),  # same shape as d1
        observation("d3", "dates", False, "the agent did not finish: no rule matches"),
        observation("d4", "dates", True),  # near the date failures: dropped
        observation("u1", "units", True),
        observation("u2", "units", True),  # one success per category is enough
        observation("s1", "strings", False, "expected 'abc', got 'cba'"),
    ]
    kept = [o.task.task_id for o in observations_filter(observations)]
    assert kept == ["d1", "d3", "s1", "u1"]


def test_the_intervention_grows_on_a_plateau_and_shrinks_while_improving():
    assert intervention_size([0.25], 1, window=3) == (1, "too few cycles")
    assert intervention_size([0.5, 0.5, 0.5], 1, window=3) == (2, "plateau")
    assert intervention_size([0.5, 0.5, 0.5], 4, window=3, max_size=4) == (4, "plateau")  # bounded
    assert intervention_size([0.25, 0.5], 3, window=3) == (2, "improving")
    assert intervention_size([0.25, 0.5], 1, window=3) == (1, "improving")  # never below 1
    assert intervention_size([0.5, 0.75, 0.5], 2, window=3) == (2, "steady")  # a drop: unchanged
    assert intervention_size([0.5, 0.5], 2, window=2, epsilon=0.01) == (3, "plateau")


def test_an_adaptive_engine_on_a_plateau_fixes_two_categories_in_one_cycle(personas, demo_agent):
    """The curve is kept on the engine: a plateau before this run's first cycle doubles the
    textbook's per_cycle; the improvement that follows brings it back to one."""
    engine = AdaptiveEvolutionEngine(inner="textbook", window=2)
    engine.scores = [0.25]  # as if an earlier cycle of this engine had scored the same
    result = Evolver(demo_agent.path, "demo", {"egl_window": 5}, engine=engine).run(cycles=2)
    first, second = result.cycles
    assert [c.score for c in result.cycles] == [0.25, 0.75]
    assert (first.engine_metadata["size"], first.engine_metadata["size_reason"]) == (2, "plateau")
    assert first.engine_metadata["size_applied_as"] == "per_cycle"
    assert first.engine_metadata["kept"] == ["dates-001", "strings-001", "bases-001", "units-001"]
    assert sorted(first.skills_added) == ["date-arithmetic", "string-transforms"]
    assert (second.engine_metadata["size"], second.engine_metadata["size_reason"]) == (1, "improving")
    assert second.engine_metadata["score_curve"] == [0.25, 0.25, 0.75]
    assert second.skills_added == ["number-bases"]


def test_an_adaptive_run_by_dotted_path_delegates_to_the_textbook(personas, demo_agent):
    dotted = "evolve_app.engines.AdaptiveEvolutionEngine"
    run = run_inline(personas.owner, demo_agent, cycles=2, engine=dotted,
                     engine_options={"inner": "textbook"})
    first, second = cycles_of(run)
    assert [first.score, second.score] == [0.25, 0.5]
    assert first.engine_metadata["size_reason"] == "too few cycles" and first.engine_metadata["size"] == 1
    assert second.engine_metadata["size_reason"] == "improving"
    assert first.summary.startswith("adaptive (size 1, too few cycles; 4 of 12 observations) via textbook")


def test_adaptive_gives_skillforge_its_budget_as_a_sentence(personas, demo_agent, fake_llm):
    seen = []

    def script(request, _candidate):
        seen.append(user_text(request))
        if has_tool_result(request):
            return text("Added date rules.")
        return [{"type": "tool_use", "id": "toolu_0001", "name": "editor",
                 "input": {"command": "create", "path": "skills/date-arithmetic/SKILL.md",
                           "file_text": TEXTBOOK["dates"]["skill_md"]}}]

    fake_llm(script)
    run = run_inline(personas.owner, demo_agent, cycles=1, engine="adaptive",
                     engine_options={"inner": "skillforge", **LLM, "effort": "off"})
    (cycle,) = cycles_of(run)
    assert cycle.engine_metadata["size_applied_as"] == "guidance"
    assert "Budget for this cycle: at most 1 focused change " in seen[0]
    assert "Recent tasks (4, failures first)" in seen[0]  # the filtered observations, not all 12
    assert cycle.skills_added == ["date-arithmetic"] and cycle.summary.endswith("Added date rules.")


# ---------------------------------------------------------------------------------- adaptive skill


def test_adaptive_skill_finds_the_demo_gaps_and_creates_a_skill_for_one(personas, demo_agent, fake_llm):
    refused = []

    def script(request, _candidate):
        assert "You build an AI agent's skill library" in system_of(request)
        if has_tool_result(request):
            results = request["messages"][-1]["content"]
            refused.extend(r["content"] for r in results if r.get("is_error"))
            return text("Created the skill.")
        category = re.search(r"category `(\w+)` failed", user_text(request)).group(1)
        return [{"type": "tool_use", "id": "toolu_0001", "name": "editor",
                 "input": {"command": "create", "path": "memory/notes.jsonl", "file_text": "{}\n"}},
                {"type": "tool_use", "id": "toolu_0002", "name": "editor",
                 "input": {"command": "create", "path": f"skills/{TEXTBOOK[category]['skill']}/SKILL.md",
                           "file_text": TEXTBOOK[category]["skill_md"]}}]

    fake_llm(script)
    run = run_inline(personas.owner, demo_agent, cycles=2, engine="adaptive-skill",
                     engine_options={**LLM, "effort": "off", "max_gaps": 1})
    first, second = cycles_of(run)
    assert [first.score, second.score] == [0.25, 0.5]
    meta = first.engine_metadata
    assert meta["gaps"] == ["bases", "dates", "strings"]  # all failing 3 of 3; units passes
    assert meta["failure_rates"]["units"] == {"failed": 0, "total": 3, "rate": 0.0}
    assert [(w["category"], w["action"], w["changed"]) for w in meta["worked"]] == [
        ("bases", "create", ["number-bases"])]
    assert first.skills_added == ["number-bases"] and meta["skill_categories"]["number-bases"] == ["bases"]
    assert meta["skill_categories"]["unit-conversions"] == ["units"]
    assert refused and "outside the paths you may change (skills)" in refused[0]
    assert not (Path(demo_agent.path) / "memory" / "notes.jsonl").exists()
    assert second.engine_metadata["gaps"] == ["dates", "strings"]
    assert second.skills_added == ["date-arithmetic"]


def test_adaptive_skill_refines_the_skill_that_covers_a_failing_category(personas, tmp_path, fake_llm):
    broken = "---\nname: date-arithmetic\ndescription: Date tasks.\ncategory: dates\n---\nNo rules yet.\n"
    workspace = seed_copy(tmp_path, {"skills/date-arithmetic/SKILL.md": broken})
    asked = []

    def script(request, _candidate):
        if has_tool_result(request):
            return text("Refined it.")
        asked.append(user_text(request))
        return [{"type": "tool_use", "id": "toolu_0001", "name": "editor",
                 "input": {"command": "str_replace", "path": "skills/date-arithmetic/SKILL.md",
                           "old_str": "No rules yet.", "new_str": "Count days with add_days(d, n)."}}]

    fake_llm(script)
    observations = [observation("d1", "dates", False, "wrong"), observation("d2", "dates", True),
                    observation("u1", "units", True)]
    result = AdaptiveSkillEngine(**LLM, effort="off").step(workspace, observations, None, None)
    assert result.metadata["gaps"] == [] and not result.mutated  # 1 of 2 is not above 0.5
    result = AdaptiveSkillEngine(**LLM, effort="off", threshold=0.4).step(workspace, observations, None, None)
    assert result.metadata["gaps"] == ["dates"]
    assert [(w["action"], w["skill"]) for w in result.metadata["worked"]] == [("refine", "date-arithmetic")]
    assert "although skills/date-arithmetic/SKILL.md is meant for it" in asked[0]
    assert result.metadata["modified"] == ["date-arithmetic"] and result.metadata["created"] == []
    assert "add_days" in workspace.read_skill("date-arithmetic")


def test_adaptive_skill_merges_overlapping_skills_and_prunes_unused_ones(tmp_path):
    workspace = seed_copy(tmp_path, {
        "skills/dates-a/SKILL.md": "---\nname: dates-a\ndescription: Dates, one.\ncategory: dates\n---\nA.\n",
        "skills/dates-b/SKILL.md": "---\nname: dates-b\ndescription: Dates, two.\ncategory: dates\n---\nB.\n",
        "skills/poetry/SKILL.md": "---\nname: poetry\ndescription: Write sonnets.\n---\nRhyme.\n",
    })
    engine = AdaptiveSkillEngine(prune_after=2)  # no gaps below: the model is never called
    passing = [observation("d1", "dates", True), observation("u1", "units", True)]
    first = engine.step(workspace, passing, None, None)
    assert first.metadata["merged"] == [{"into": "dates-a", "merged": ["dates-b"], "categories": ["dates"]}]
    assert workspace.read_skill("dates-a").endswith("A.\n\nB.\n")
    assert first.metadata["deleted"] == ["dates-b"] and first.metadata["pruned"] == []
    assert engine.step(workspace, passing, None, None).metadata["pruned"] == []  # one cycle unused
    third = engine.step(workspace, [observation("u1", "units", True)], None, None)
    assert third.metadata["pruned"] == ["poetry"]  # two cycles unused; dates-a one, so it stays
    assert sorted(s.name for s in workspace.list_skills()) == ["dates-a", "unit-conversions"]
    assert "pruned poetry" in third.summary and third.mutated


def test_a_skill_serves_the_categories_its_front_matter_or_description_names():
    known = ["dates", "strings", "bases", "units"]
    assert skill_categories("number-bases", TEXTBOOK["bases"]["skill_md"], known) == {"bases"}
    assert skill_categories("date-arithmetic", TEXTBOOK["dates"]["skill_md"], known) == {"dates"}
    explicit = "---\nname: helper\ndescription: Dates and strings.\ncategory: [units]\n---\n"
    assert skill_categories("helper", explicit, known) == {"units"}
    assert skill_categories("database", "---\nname: database\ndescription: SQL.\n---\n", known) == set()


# ------------------------------------------------------------------------------------------ search


class Variants(EvolutionEngine):
    """A search's inner engine whose per_cycle picks a mutation: 1 fixes the dates and breaks the
    units, 2 fixes the dates, 3 fixes the dates and adds a skill that changes nothing."""

    def __init__(self, per_cycle: int = 1) -> None:
        self.per_cycle = per_cycle

    def step(self, workspace, observations, history, trial):
        workspace.write_skill("date-arithmetic", TEXTBOOK["dates"]["skill_md"])
        if self.per_cycle == 1:
            workspace.delete_skill("unit-conversions")
        if self.per_cycle == 3:
            workspace.write_skill("notes", "---\nname: notes\ndescription: Nothing.\n---\n" + "x" * 400)
        return StepResult(True, f"variant {self.per_cycle}")


def test_search_with_the_textbook_keeps_the_candidate_that_fixes_the_most_tasks(personas, demo_agent):
    run = run_inline(personas.owner, demo_agent, cycles=2, engine="search",
                     engine_options={"inner": "textbook", "n": 3})
    first, second = cycles_of(run)
    assert [first.score, second.score] == [0.25, 1.0]
    meta = first.engine_metadata
    assert meta["baseline"] == 0.25 and len(meta["judged_tasks"]) == 12  # 9 failed + 3 passing
    assert [(c["setting"], c["score"], c["passed"]) for c in meta["candidates"]] == [
        ({"per_cycle": 1}, 0.5, 6), ({"per_cycle": 2}, 0.75, 9), ({"per_cycle": 3}, 1.0, 12)]
    assert meta["winner"] == 3 and first.summary.startswith("search: candidate 3 of 3 won")
    assert sorted(first.skills_added) == ["date-arithmetic", "number-bases", "string-transforms"]
    assert "skills/number-bases/SKILL.md" in meta["applied"]["written"]
    assert second.engine_metadata == {"inner": "textbook"} and not second.mutated  # nothing failed
    assert not list((Path(demo_agent.path).parent.parent / "evolve" / "search").iterdir())  # copies gone


def test_search_prefers_the_smallest_of_the_best_and_a_mutation_that_breaks_passing_tasks_loses(
        personas, demo_agent):
    run = run_inline(personas.owner, demo_agent, cycles=1, engine="evolve_app.engines.SearchEngine",
                     trusted=True, engine_options={"inner": "tests.evolve_app.test_engines.Variants",
                                                   "n": 3, "per_cycle_values": "3,1,2"})
    (cycle,) = cycles_of(run)
    scores = {c["setting"]["per_cycle"]: c["score"] for c in cycle.engine_metadata["candidates"]}
    assert scores == {3: 0.5, 1: 0.25, 2: 0.5}  # breaking the units costs what the dates gained
    assert cycle.engine_metadata["winner"] == 3  # per_cycle 2: as good as per_cycle 3, and smaller
    assert cycle.skills_added == ["date-arithmetic"] and cycle.skills_deleted == []
    assert sorted(s.name for s in AgentWorkspace(demo_agent.path).list_skills()) == [
        "date-arithmetic", "unit-conversions"]
    changed = git(demo_agent.path, "diff", "--name-only", "pre-evo-1", "evo-1")
    assert changed == "skills/date-arithmetic/SKILL.md"


def test_search_keeps_the_workspace_when_no_candidate_beats_it():
    candidates = [{"candidate": 1, "score": 0.25, "files": 1, "bytes": 10},
                  {"candidate": 2, "score": None, "files": 0, "bytes": 0},
                  {"candidate": 3, "score": None, "error": "boom", "files": 0, "bytes": 0}]
    assert search_winner(candidates, baseline=0.25) is None
    assert search_winner(candidates, baseline=0.2)["candidate"] == 1


def test_applying_the_winner_copies_its_changed_layer_files_back_and_deletes_what_it_deleted(tmp_path):
    from evolve_app.engines import _layer_files

    workspace = seed_copy(tmp_path, {"skills/old/SKILL.md": "---\nname: old\ndescription: o\n---\n"})
    copy = tmp_path / "winner"
    shutil.copytree(workspace.root, copy)
    shutil.rmtree(copy / "skills" / "old")
    (copy / "skills" / "new").mkdir()
    (copy / "skills" / "new" / "SKILL.md").write_text("---\nname: new\ndescription: n\n---\n")
    (copy / "memory" / "episodic.jsonl").write_text('{"lesson": "x"}\n')
    (copy / "tools" / "solve.py").write_text("print('not a layer of this agent')\n")
    layers = list(workspace.manifest.evolvable_layers)
    applied = SearchEngine._apply(workspace, copy, layers, _layer_files(workspace.root, layers))
    assert applied == {"written": ["memory/episodic.jsonl", "skills/new/SKILL.md"],
                       "deleted": ["skills/old/SKILL.md"]}
    assert sorted(s.name for s in workspace.list_skills()) == ["new", "unit-conversions"]
    assert not (workspace.root / "skills" / "old").exists()
    assert workspace.read_memories("episodic") == [{"lesson": "x"}]
    assert "not a layer" not in (workspace.root / "tools" / "solve.py").read_text()


# ------------------------------------------------------------------------------- by name and path

ENGINE_CASES = [
    ("guided", GuidedSynthesisEngine, LLM),
    ("adaptive", AdaptiveEvolutionEngine, {"inner": "textbook", "window": 2}),
    ("adaptive-skill", AdaptiveSkillEngine, {**LLM, "max_gaps": 1}),
    ("search", SearchEngine, {"inner": "textbook", "n": 2}),
]


@pytest.mark.parametrize(("name", "cls", "options"), ENGINE_CASES)
def test_every_engine_loads_by_name_and_by_dotted_path_with_its_options(personas, demo_agent, name, cls,
                                                                         options):
    for spelling in (name, f"evolve_app.engines.{cls.__name__}"):
        engine = engine_get(spelling, **options)
        assert isinstance(engine, cls)
        run = services.evolution_run_start(personas.owner, demo_agent, engine=spelling, cycles=1,
                                           config={"engine_options": options}, enqueue=False)
        assert run.engine == spelling
        run.status = "cancelled"
        run.save(update_fields=["status"])


def test_the_built_in_engines_are_installed_entry_points():
    installed = {point.name: point.value for point in entry_points(group="crucible.engines")}
    assert installed == {name: f"evolve_app.engines:{cls.__name__}" for name, cls in ENGINES.items()
                         if cls.__module__.startswith("evolve_app.engines.")}  # not the A-Evolve adapters
    assert engine_names() == list(ENGINES)


def test_bad_engine_options_are_refused_when_the_run_starts(personas, demo_agent):
    for engine, options in (("adaptive", {"inner": "nope"}), ("search", {"inner": "textbook", "n": 0}),
                            ("search", {"per_cycle_values": "one,two"}), ("guided", {"bogus": 1})):
        with pytest.raises(ValidationError) as raised:
            services.evolution_run_start(personas.owner, demo_agent, engine=engine, cycles=1,
                                         config={"engine_options": options}, enqueue=False)
        assert set(raised.value.message_dict) == {"engine"}
    with pytest.raises(EngineError):
        engine_get("adaptive", inner="nope")


# ------------------------------------------------------------------------------------------ failure

FAILING_CASES = [
    ("guided", LLM),
    ("adaptive", {"inner": "skillforge", **LLM, "effort": "off"}),
    ("adaptive-skill", {**LLM, "effort": "off"}),
    ("search", {"inner": "skillforge", "n": 1, **LLM, "effort": "off"}),
]


@pytest.mark.parametrize(("engine", "options"), FAILING_CASES)
def test_a_model_call_that_fails_fails_the_cycle_and_leaves_the_workspace_at_pre_evo(
        personas, demo_agent, fake_llm, engine, options):
    """The first call succeeds and writes something; every call after it gets 529 six times."""
    path = Path(demo_agent.path)
    memory_before = (path / "memory" / "episodic.jsonl").read_text()
    state = {"answered": False}

    def script(request, _candidate):
        if state["answered"]:
            return text("done")
        state["answered"] = True
        fake.fail_next(*[("529", 0)] * 6)
        if "You extract one lesson" in system_of(request):
            return text('{"lesson": "Check the calendar.", "category": "dates"}')
        return [{"type": "tool_use", "id": "toolu_0001", "name": "editor",
                 "input": {"command": "create", "path": "skills/junk/SKILL.md",
                           "file_text": "---\nname: junk\ndescription: junk\n---\njunk\n"}}]

    fake = fake_llm(script)
    run = run_inline(personas.owner, demo_agent, cycles=1, engine=engine, engine_options=options)
    (cycle,) = cycles_of(run)
    assert cycle.status == "failed" and not cycle.mutated and run.status == "finished"
    assert "the model call failed" in cycle.reason and "529" in cycle.reason
    assert not (path / "skills" / "junk").exists()
    assert (path / "memory" / "episodic.jsonl").read_text() == memory_before
    assert git(path, "diff", "--name-only", "pre-evo-1", "evo-1") == ""
    assert git(path, "status", "--porcelain") == ""
