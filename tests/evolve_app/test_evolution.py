"""Evolution runs on the offline demo, end to end: real workspaces under git, the real sandbox,
the loop's guarantees (convergence, evolvable layers, holdout gate, engine failure), review
mode and rollback, checked with the git CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from evolve_app import services
from evolve_app.engines import EvolutionEngine
from evolve_app.history import EvolutionHistory
from evolve_app.models import Cycle, ObservationRecord
from evolve_app.types import StepResult
from evolve_app.workspace import WorkspaceError
from runtime_app.models import AuditEntry
from tests.evolve_app.helpers import git

pytestmark = pytest.mark.django_db(transaction=True)




def run_inline(user, agent, cycles: int, engine: str = "textbook", trusted: bool = False, **config):
    """A run started and executed here; `trusted` as the CLI starts it (a test engine's dotted path)."""
    run = services.evolution_run_start(user, agent, engine=engine, cycles=cycles, config=config,
                                       enqueue=False, trusted=trusted)
    return services.evolution_run_execute(run.pk)


class ManifestVandal(EvolutionEngine):
    """Adds a skill (allowed) and also edits the manifest and a new top-level file (not allowed)."""

    def step(self, workspace, observations, history, trial):
        workspace.write_skill("dates", "---\nname: dates\ndescription: nothing useful\n---\nHello.\n")
        (workspace.root / "manifest.yaml").write_text("agent: {type: hacked, entrypoint: x.y}\n")
        (workspace.root / "notes.txt").write_text("sneaky\n")
        return StepResult(True, "vandalised")


class SkillRemover(EvolutionEngine):
    """Deletes the one skill that works: the holdout score falls."""

    def step(self, workspace, observations, history, trial):
        workspace.delete_skill("unit-conversions")
        return StepResult(True, "removed unit-conversions")


class Broken(EvolutionEngine):
    def step(self, workspace, observations, history, trial):
        workspace.write_prompt("half-written")
        raise RuntimeError("the model went away")


def test_the_demo_agent_really_improves_over_cycles_and_its_tags_are_in_git(personas, demo_agent):
    run = run_inline(personas.owner, demo_agent, cycles=4, egl_window=3)
    cycles = list(Cycle.objects.filter(run=run).order_by("number"))
    assert [c.score for c in cycles] == [0.25, 0.5, 0.75, 1.0]
    added = [c.skills_added for c in cycles[:3]]
    assert added == [["date-arithmetic"], ["string-transforms"], ["number-bases"]]
    assert all(c.mutated for c in cycles[:3]) and not cycles[3].mutated
    assert run.status == "finished"
    path = Path(demo_agent.path)
    tags = set(git(path, "tag").split())
    assert {"evo-0", *(f"pre-evo-{n}" for n in range(1, 5)), *(f"evo-{n}" for n in range(1, 5))} <= tags
    assert git(path, "rev-parse", "pre-evo-2^{commit}") != git(path, "rev-parse", "evo-2^{commit}")
    assert "skills/string-transforms/SKILL.md" in git(path, "diff", "--name-only", "pre-evo-2", "evo-2")
    # Observations: in the database and as JSONL batches, never in the workspace's history.
    assert ObservationRecord.objects.filter(cycle__run=run, split="train").count() == 4 * 12
    batch = json.loads((path / "evolution" / "observations" / "batch_0001.jsonl")
                       .read_text().splitlines()[0])
    assert set(batch) == {"task_id", "task_input", "agent_output", "steps", "conversation", "success",
                          "score", "feedback_detail", "timestamp", "task", "trajectory", "feedback"}
    assert git(path, "ls-files", "evolution") == ""


def test_a_run_converges_on_a_plateau_using_the_threshold(personas, demo_agent):
    run = run_inline(personas.owner, demo_agent, cycles=10, egl_window=2, egl_threshold=0.05)
    scores = list(Cycle.objects.filter(run=run).order_by("number").values_list("score", flat=True))
    assert scores == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert run.converged and "egl_threshold 0.05" in run.reason


def test_edits_outside_the_evolvable_layers_are_reverted_and_reported(personas, demo_agent):
    before = (Path(demo_agent.path) / "manifest.yaml").read_text()
    run = run_inline(personas.owner, demo_agent, cycles=1,
                     engine="tests.evolve_app.test_evolution.ManifestVandal", trusted=True)
    cycle = Cycle.objects.get(run=run)
    assert sorted(cycle.reverted_paths) == ["manifest.yaml", "notes.txt"]
    assert cycle.skills_added == ["dates"] and cycle.mutated
    path = Path(demo_agent.path)
    assert (path / "manifest.yaml").read_text() == before and not (path / "notes.txt").exists()
    assert git(path, "diff", "--name-only", "pre-evo-1", "evo-1") == "skills/dates/SKILL.md"


def test_a_mutation_that_lowers_the_holdout_score_is_rolled_back(personas, demo_agent):
    run = run_inline(personas.owner, demo_agent, cycles=1, holdout_size=8,
                     engine="tests.evolve_app.test_evolution.SkillRemover", trusted=True)
    cycle = Cycle.objects.get(run=run)
    assert cycle.status == "rejected" and not cycle.mutated
    assert (cycle.holdout_score, cycle.holdout_after) == (0.25, 0.0) and "rolled back" in cycle.reason
    assert (Path(demo_agent.path) / "skills" / "unit-conversions" / "SKILL.md").exists()
    assert git(demo_agent.path, "diff", "--name-only", "pre-evo-1", "evo-1") == ""


class BadResult(EvolutionEngine):
    """Mutates, then hands back metadata the loop cannot record: the cycle itself fails."""

    def step(self, workspace, observations, history, trial):
        workspace.write_skill("dates", "---\nname: dates\ndescription: d\n---\nx\n")
        return StepResult(True, "odd", metadata=["not", "a", "mapping"])


def test_a_cycle_that_fails_after_the_engine_is_reverted_to_pre_evo(personas, demo_agent):
    run = run_inline(personas.owner, demo_agent, cycles=1, engine="tests.evolve_app.test_evolution.BadResult",
                     trusted=True)
    cycle = Cycle.objects.get(run=run)
    assert cycle.status == "failed" and not cycle.mutated and cycle.reason.startswith("the cycle failed")
    assert not (Path(demo_agent.path) / "skills" / "dates").exists()
    assert git(demo_agent.path, "diff", "--name-only", "pre-evo-1", "evo-1") == ""


def test_an_engine_failure_leaves_the_workspace_at_pre_evo_and_the_run_goes_on(personas, demo_agent):
    prompt = (Path(demo_agent.path) / "prompts" / "system.md").read_text()
    run = run_inline(personas.owner, demo_agent, cycles=2, engine="tests.evolve_app.test_evolution.Broken",
                     trusted=True)
    cycles = list(Cycle.objects.filter(run=run).order_by("number"))
    assert [c.status for c in cycles] == ["failed", "failed"] and not any(c.mutated for c in cycles)
    assert "the model went away" in cycles[0].reason and run.status == "finished"
    assert (Path(demo_agent.path) / "prompts" / "system.md").read_text() == prompt


def test_review_mode_waits_for_an_approver_and_a_rejection_rolls_back(personas, demo_agent, approver):
    run = run_inline(personas.owner, demo_agent, cycles=2, review_mode=True)
    assert run.status == "awaiting_review"
    cycle = Cycle.objects.get(run=run, number=1)
    assert cycle.status == "awaiting_review" and "evo-1" not in git(demo_agent.path, "tag").split()
    with pytest.raises(PermissionDenied):
        services.cycle_decide(personas.member, cycle, approve=True)  # an operator, not an approver
    services.cycle_decide(approver, cycle, approve=False)
    cycle.refresh_from_db()
    assert cycle.status == "rejected"
    assert not (Path(demo_agent.path) / "skills" / "date-arithmetic").exists()
    # evo-1 says what it holds; the engine's words stay in the metadata; history.jsonl has its line.
    message = git(demo_agent.path, "log", "-1", "--format=%s", "evo-1")
    who = approver.get_username()
    assert message == f"Cycle 1: rejected by {who} in review; the engine's change was not committed"
    assert "date-arithmetic" in cycle.engine_metadata["engine_summary"]
    assert "date-arithmetic" not in cycle.summary
    history = (Path(demo_agent.path) / "evolution" / "history.jsonl").read_text().splitlines()
    assert [(json.loads(line)["cycle"], json.loads(line)["mutated"]) for line in history] == [(1, False)]
    run = services.evolution_run_execute(run.pk)  # the task the decision queued
    second = Cycle.objects.get(run=run, number=2)
    assert second.status == "awaiting_review"
    services.cycle_decide(approver, second, approve=True)
    second.refresh_from_db()
    assert second.status == "accepted" and second.skills_added == ["date-arithmetic"]
    assert AuditEntry.objects.filter(action__startswith="evolution.cycle_").count() == 2


def test_a_rollback_makes_a_new_commit_and_keeps_history(personas, demo_agent):
    run_inline(personas.owner, demo_agent, cycles=3)
    path = Path(demo_agent.path)
    commits = len(git(path, "log", "--oneline").splitlines())
    with pytest.raises(PermissionDenied):
        services.agent_rollback(personas.member, demo_agent, "evo-1")
    sha = services.agent_rollback(personas.owner, demo_agent, "evo-1")
    assert len(git(path, "log", "--oneline").splitlines()) == commits + 1
    assert git(path, "rev-parse", f"{sha}^{{tree}}") == git(path, "rev-parse", "evo-1^{tree}")
    assert "evo-3" in git(path, "tag").split()  # nothing rewritten
    with pytest.raises(ValidationError):
        services.agent_rollback(personas.owner, demo_agent, "HEAD; rm -rf /")


def test_importing_a_workspace_reports_every_problem_with_file_and_line(personas, tmp_path, settings):
    folder = tmp_path / "broken"
    (folder / "prompts").mkdir(parents=True)
    (folder / "manifest.yaml").write_text(
        "agent:\n  type: command\nevolvable_layer: [skills]\nreload_strategy: warm\n")
    with pytest.raises(ValidationError) as raised:
        services.agent_import(personas.owner, personas.alpha, str(folder), trusted=True)
    problems = raised.value.message_dict["path"]
    assert any(p.startswith("manifest.yaml:3") and "evolvable_layers" in p for p in problems)
    assert any(p.startswith("manifest.yaml:4") for p in problems)
    assert any(p.startswith("prompts/system.md") for p in problems)
    with pytest.raises(ValidationError, match=r"not under an allowed directory|No directories are allowed"):
        services.agent_import(personas.owner, personas.alpha, str(folder))


def test_a_run_with_bad_settings_is_refused_with_reasons(personas, demo_agent):
    with pytest.raises(ValidationError) as raised:
        services.evolution_run_start(personas.owner, demo_agent, benchmark="nope", engine="nope", cycles=0,
                                     config={"egl_window": 1, "bogus": 2}, enqueue=False)
    assert set(raised.value.message_dict) == {"benchmark", "engine", "cycles", "config"}


def test_skillforge_lets_a_model_edit_the_workspace_through_the_editor(personas, demo_agent, monkeypatch):
    """The LLM engine against the loopback fake: it reads the failures and writes a skill."""
    from evolve_app.demo import textbook_load
    from runtime_app.models import Receipt
    from tests.fakes.anthropic_server import FakeAnthropic

    key = "sk-ant-evolve-secret-0123456789"
    skill = textbook_load()["dates"]
    seen: list[str] = []

    def script(request, _candidate):
        seen.append(json.dumps(request["system"]))
        last = request["messages"][-1]
        if isinstance(last["content"], list) and any(b.get("type") == "tool_result" for b in last["content"]):
            return [{"type": "text", "text": "Added a date-arithmetic skill for the failing date tasks."}]
        return [{"type": "tool_use", "id": "toolu_0001", "name": "editor",
                 "input": {"command": "create", "path": "skills/date-arithmetic/SKILL.md",
                           "file_text": skill["skill_md"]}}]

    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    with FakeAnthropic(script=script) as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        run = run_inline(personas.owner, demo_agent, cycles=2, engine="skillforge",
                         engine_options={"preset": "anthropic", "model": "fake-sonnet"})
    cycles = list(Cycle.objects.filter(run=run).order_by("number"))
    assert [c.score for c in cycles] == [0.25, 0.5]
    assert cycles[0].skills_added == ["date-arithmetic"]
    assert cycles[0].summary.startswith("Added a date-arithmetic skill")
    assert "unit-conversions" in seen[0] and "prompts/system.md" in seen[0]  # the workspace is the context
    calls = Receipt.objects.filter(kind="llm_call", label__startswith="skillforge")
    assert calls.count() >= 2 and key not in json.dumps([r.as_dict() for r in calls])


def test_the_history_answers_from_the_recorded_cycles(personas, demo_agent):
    from evolve_app.history import EvolutionHistory

    run_inline(personas.owner, demo_agent, cycles=3)
    history = EvolutionHistory(demo_agent.path)
    assert history.get_score_curve() == [(1, 0.25), (2, 0.5), (3, 0.75)]
    failures = history.get_observations(last_n_cycles=1, only_failures=True)
    assert len(failures) == 3 and not any(o["success"] for o in failures)  # only bases still fails
    assert len(history.get_observations(last_n_cycles=2)) == 24
    assert "string-transforms" in history.get_workspace_diff("evo-1", "evo-3")
    assert history.read_file_at("evo-0", "skills/date-arithmetic/SKILL.md") is None


def test_a_second_run_numbers_its_cycles_after_the_first(personas, demo_agent):
    run_inline(personas.owner, demo_agent, cycles=2)
    second = run_inline(personas.owner, demo_agent, cycles=2)
    assert second.status == "finished"
    assert list(Cycle.objects.filter(run=second).values_list("number", "score")) == [(3, 0.75), (4, 1.0)]
    assert {"pre-evo-4", "evo-4"} <= set(git(demo_agent.path, "tag").split())


def test_a_review_decided_again_after_a_failure_past_evo_n_reuses_the_tag(personas, demo_agent, approver,
                                                                           monkeypatch):
    run = run_inline(personas.owner, demo_agent, cycles=1, review_mode=True)
    cycle = Cycle.objects.get(run=run, number=1)

    def broken(self, old, new):
        raise WorkspaceError("the history could not be read")

    monkeypatch.setattr(EvolutionHistory, "layer_changes", broken)
    services.cycle_decide(approver, cycle, approve=True)  # evo-1 is made, its summary is lost
    cycle.refresh_from_db()
    assert cycle.status == "accepted" and "could not be read" in cycle.reason
    monkeypatch.undo()
    tagged = git(demo_agent.path, "rev-parse", "evo-1^{commit}")
    assert cycle.post_commit == tagged
    # A decision whose transaction rolled back after evo-1 was made is decided again on that tag.
    Cycle.objects.filter(pk=cycle.pk).update(status="awaiting_review")
    services.cycle_decide(approver, cycle, approve=True)
    cycle.refresh_from_db()
    assert cycle.status == "accepted" and cycle.post_commit == tagged
    assert cycle.skills_added == ["date-arithmetic"]
    Cycle.objects.filter(pk=cycle.pk).update(status="awaiting_review")
    services.cycle_decide(approver, cycle, approve=False)  # rejected after evo-1: a new commit undoes it
    cycle.refresh_from_db()
    assert cycle.status == "rejected" and "a new commit undid evo-1" in cycle.reason
    assert not (Path(demo_agent.path) / "skills" / "date-arithmetic").exists()
    assert git(demo_agent.path, "status", "--porcelain") == ""
