"""A-Evolve's files and rules, as A-Evolve writes them: observation batches with its record (task
metadata, conversation, claims, timestamps) and `trajectories/`, `history.jsonl` and
`metrics.json`, its convergence rule (the default for A-Evolve agents), engines that manage their
own evaluation, `trajectory_only` and `evolve_layers`, and what a rejected cycle's `evo-N` says.

The last test runs A-Evolve 0.1.0's own Evolver (really) and Crucible's on copies of one of its
seeds with the same scripted agent, benchmark and engine, and compares the files field by field.
Real workspaces under git in tmp dirs, checked with the git CLI."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from django.test import Client

from evolve_app import services
from evolve_app.aevolve import AEvolveSkillForgeEngine
from evolve_app.agents import BaseAgent
from evolve_app.demo import SEED_WORKSPACE
from evolve_app.loop import EvolveConfig, Evolver, observations_write, score_converged, task_file_id
from evolve_app.models import EvolutionRun
from evolve_app.types import Feedback, Observation, StepResult, Task, Trajectory
from tests.evolve_app.helpers import git
from tests.helpers import login

pytestmark = pytest.mark.django_db

ae = pytest.importorskip("agent_evolve")
from agent_evolve.benchmarks.base import BenchmarkAdapter as UpstreamBenchmark  # noqa: E402
from agent_evolve.engine.loop import _is_score_converged  # noqa: E402
from agent_evolve.protocol.base_agent import BaseAgent as UpstreamAgent  # noqa: E402

SEEDS = Path(ae.__file__).resolve().parent.parent / "seed_workspaces"
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?")
SKILL = "---\nname: {name}\ndescription: how to answer {name} tasks\n---\n\nAnswer {name} tasks carefully.\n"

# (id, input, metadata, answer): "units" is always answered; the others once a skill of that name exists.
TASKS = [
    ("units/001", "Convert 100 C to F.", {"category": "units", "difficulty": 1}, "212"),
    ("dates-001", "45 days after 2024-01-15?", {"category": "dates", "source": "demo"}, "2024-02-29"),
    ("bases-001", "255 in hex?", {"category": "bases"}, "ff"),
]
ANSWERS = {task_id: answer for task_id, _, _, answer in TASKS}


def reply(task_id: str, category: str, skills: set[str]) -> tuple[str, list[dict], list[dict]]:
    """What the scripted agent says (output, steps, conversation): the same for both loops. A
    bases task leaves no conversation (A-Evolve writes its trajectory file only with one)."""
    output = ANSWERS[task_id] if category == "units" or category in skills else "I do not know"
    steps = [{"tool": "think", "skills": sorted(skills)}]
    conversation = (
        []
        if category == "bases"
        else [{"role": "user", "content": task_id}, {"role": "assistant", "content": output}]
    )
    return output, steps, conversation


def verdict(task_id: str, output: str) -> tuple[bool, float, str, dict]:
    right = output == ANSWERS[task_id]
    claim = {
        "claim": "the answer matches",
        "outcome": "fulfilled" if right else "not_fulfilled",
        "score": 1.0 if right else 0.0,
        "justification": f"expected {ANSWERS[task_id]}",
    }
    return right, 1.0 if right else 0.0, "right" if right else "wrong", {"per_claim": [claim]}


class ScriptedAgent(BaseAgent):
    """Crucible's side of the scripted agent (it stands in for the model)."""

    solved: list[str]

    def solve(self, task: Task) -> Trajectory:
        self.solved = [*getattr(self, "solved", []), task.task_id]
        output, steps, conversation = reply(
            task.task_id, task.metadata.get("category", ""), {skill.name for skill in self.skills}
        )
        return Trajectory(task.task_id, output, steps, conversation=conversation)


class ScriptedBenchmark:
    """Crucible's side of the benchmark; `holdout` tasks are answered only with every skill."""

    def __init__(self, holdout: list[tuple[str, str, dict, str]] | None = None):
        self.holdout = holdout or []

    def get_tasks(self, split: str = "train", limit: int = 10) -> list[Task]:
        rows = TASKS if split == "train" else self.holdout
        return [Task(task_id, text, meta["category"], dict(meta)) for task_id, text, meta, _ in rows[:limit]]

    def evaluate(self, task: Task, trajectory: Trajectory) -> Feedback:
        success, score, detail, raw = verdict(task.task_id, trajectory.output)
        return Feedback(success, score, detail, raw=raw)


class UpstreamScriptedAgent(UpstreamAgent):
    """A-Evolve's side of the same agent."""

    def solve(self, task):
        output, steps, conversation = reply(
            task.id, task.metadata.get("category", ""), {skill.name for skill in self.skills}
        )
        return ae.Trajectory(task_id=task.id, output=output, steps=steps, conversation=conversation)


class UpstreamScriptedBenchmark(UpstreamBenchmark):
    def get_tasks(self, split: str = "train", limit: int = 10):
        return [
            ae.Task(id=task_id, input=text, metadata=dict(meta)) for task_id, text, meta, _ in TASKS[:limit]
        ]

    def evaluate(self, task, trajectory):
        success, score, detail, raw = verdict(task.id, trajectory.output)
        return ae.Feedback(success=success, score=score, detail=detail, raw=raw)


class SkillPerFailure:
    """Written to A-Evolve's engine interface, so both loops run it: each cycle it writes a skill
    for the first failing category that has none (cycle 1 dates, cycle 2 bases), then nothing."""

    def step(self, workspace, observations, history, trial):
        have = {skill.name for skill in workspace.list_skills()}
        for observation in observations:
            category = observation.task.metadata["category"]
            if not observation.feedback.success and category not in have:
                workspace.write_skill(category, SKILL.format(name=category))
                return StepResult(True, f"added skill {category}")
        return StepResult(False, "nothing to add")

    def on_cycle_end(self, accepted, score):
        pass


def demo_copy(tmp_path: Path, name: str = "agent") -> Path:
    root = tmp_path / name
    shutil.copytree(SEED_WORKSPACE, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def seed_copy(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name / "terminal"
    shutil.copytree(SEEDS / "terminal", root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------------------ the batch files


def test_a_batch_line_is_a_evolve_s_record_with_metadata_conversation_claims_and_a_timestamp(tmp_path):
    task = Task("units/001", "Convert", "units", {"difficulty": 1})
    trajectory = Trajectory(
        "units/001", "212", [{"tool": "think"}], conversation=[{"role": "user", "content": "x"}]
    )
    raw = {"per_claim": [{"claim": "c", "outcome": "fulfilled", "score": 1.0, "justification": "j"}]}
    batch = observations_write(
        tmp_path, 1, [Observation(task, trajectory, Feedback(True, 1.0, "ok", raw=raw))]
    )
    record = lines(batch)[0]
    assert list(record) == [
        "task_id",
        "task_input",
        "agent_output",
        "steps",
        "conversation",
        "success",
        "score",
        "feedback_detail",
        "timestamp",
        "task",
        "trajectory",
        "feedback",
    ]
    assert ISO.fullmatch(record["timestamp"])
    assert record["task"] == {
        "id": "units/001",
        "input": "Convert",
        "metadata": {"difficulty": 1, "category": "units"},
    }
    assert record["trajectory"] == {"output": "212", "steps": [{"tool": "think"}]}
    assert record["conversation"] == [{"role": "user", "content": "x"}]
    assert record["feedback"] == {
        "success": True,
        "score": 1.0,
        "detail": "ok",
        "raw": raw,
        "claims": [{"claim": "c", "outcome": "fulfilled", "pass": True, "score": 1.0, "justification": "j"}],
    }
    folder = tmp_path / "evolution" / "trajectories" / "batch_0001"
    assert (folder / "patch_units_001.diff").read_text() == "212"
    assert json.loads((folder / "trajectory_units_001.json").read_text()) == [
        {"role": "user", "content": "x"}
    ]

    hidden = lines(
        observations_write(
            tmp_path, 2, [Observation(task, trajectory, Feedback(True, 1.0))], trajectory_only=True
        )
    )[0]
    assert (
        not {"success", "score", "feedback_detail", "feedback"} & set(hidden)
        and hidden["agent_output"] == "212"
    )


@pytest.mark.parametrize("task_id", ["..", "../../escape", "/etc/passwd", "a\0b", "", "x" * 400, "a/../../b"])
def test_a_task_id_never_names_a_file_outside_its_batch_folder(tmp_path, task_id):
    observed = Observation(
        Task(task_id, "in"), Trajectory(task_id, "out", conversation=[{"role": "user"}]), Feedback(True, 1.0)
    )
    observations_write(tmp_path / "ws", 1, [observed])
    folder = tmp_path / "ws" / "evolution" / "trajectories" / "batch_0001"
    written = sorted(p.name for p in folder.iterdir())
    assert written == [f"patch_{task_file_id(task_id)}.diff", f"trajectory_{task_file_id(task_id)}.json"]
    assert all(len(name.encode()) <= 255 and "/" not in name and "\0" not in name for name in written)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ws"]  # nothing landed beside the workspace
    assert task_file_id("a/b") == "a_b"  # as A-Evolve's observer
    assert task_file_id("x" * 400) != task_file_id("x" * 399 + "y")


def test_a_symlinked_trajectories_folder_is_replaced_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "ws" / "evolution").mkdir(parents=True)
    (tmp_path / "ws" / "evolution" / "trajectories").symlink_to(outside)
    observations_write(
        tmp_path / "ws", 1, [Observation(Task("t", "in"), Trajectory("t", "out"), Feedback(True, 1.0))]
    )
    assert list(outside.iterdir()) == []
    assert (
        tmp_path / "ws" / "evolution" / "trajectories" / "batch_0001" / "patch_t.diff"
    ).read_text() == "out"


# ------------------------------------------------------------------------------ convergence


def test_a_evolve_s_rule_is_its_is_score_converged():
    for scores in ([0.5] * 4, [0.5] * 3, [0.1, 0.5, 0.505, 0.509], [0.5, 0.5, 0.52, 0.5], [0.2, 0.3]):
        for window in (1, 2, 3):
            assert score_converged(scores, window) == _is_score_converged(scores, window=window)


@pytest.mark.parametrize(("rule", "cycles"), [("a-evolve", 4), ("crucible", 3)])
def test_flat_scores_stop_after_4_cycles_with_a_evolve_s_rule_and_3_with_crucible_s(tmp_path, rule, cycles):
    # Scores stay flat: the engine adds nothing (every category already has its skill).
    root = demo_copy(tmp_path)
    for category in ("dates", "bases"):
        (root / "skills" / category).mkdir(parents=True)
        (root / "skills" / category / "SKILL.md").write_text(SKILL.format(name=category))
    result = Evolver(
        ScriptedAgent(root),
        ScriptedBenchmark(),
        {"convergence": rule, "egl_window": 3},
        engine=SkillPerFailure(),
    ).run(cycles=10)
    assert result.converged and len(result.cycles) == cycles
    assert ("A-Evolve's rule" in result.reason) == (rule == "a-evolve")


def test_a_window_of_one_is_a_evolve_s_alone():
    with pytest.raises(ValueError, match="a window of 1 needs convergence a-evolve"):
        EvolveConfig(convergence="crucible", egl_window=1)
    assert EvolveConfig(convergence="a-evolve", egl_window=1).egl_window == 1
    with pytest.raises(ValueError, match="'infra': the layers are"):
        EvolveConfig(evolve_layers=["skills", "infra"])


def test_a_run_of_an_a_evolve_agent_uses_a_evolve_s_rule_unless_told_and_says_so(
    personas, demo_agent, tmp_path, settings
):
    # The demo agent is Crucible's: Crucible's rule, recorded.
    run = services.evolution_run_start(personas.member, demo_agent, cycles=1, enqueue=False)
    assert run.config["convergence"] == "crucible"
    # The same agent's manifest naming an A-Evolve agent class (as A-Evolve's seeds do).
    manifest = Path(demo_agent.path) / "manifest.yaml"
    manifest.write_text(
        manifest.read_text().replace(
            "type: command\n  entrypoint: evolve_app.agents.CommandAgent",
            "type: reference\n  entrypoint: agent_evolve.agents.swe.agent.SweAgent",
        )
    )
    assert EvolveConfig().convergence_for(demo_agent.path) == "a-evolve"
    assert EvolveConfig(convergence="crucible").convergence_for(demo_agent.path) == "crucible"


def test_the_run_page_and_api_show_the_rule_the_run_used(personas, demo_agent):
    run = services.evolution_run_start(
        personas.member,
        demo_agent,
        cycles=1,
        enqueue=False,
        config={"convergence": "a-evolve", "egl_window": 2},
    )
    page = login(personas.member).get(f"/agents/{demo_agent.pk}/runs/{run.number}/").content.decode()
    assert "A-Evolve's: the run stops when each of the last 2 train scores is within 0.01" in page
    assert "egl_threshold</code> is not used" in page
    client: Client = login(personas.member)
    assert client.get(f"/api/runs/{run.pk}").json()["config"]["convergence"] == "a-evolve"
    refused = client.post(
        f"/api/agents/{demo_agent.pk}/runs",
        {"cycles": 1, "config": {"egl_window": 1}},
        content_type="application/json",
    )
    assert (
        refused.status_code == 400 and "a window of 1 needs convergence a-evolve" in refused.content.decode()
    )
    # The start form names the agent's default rule, and refuses a window of 1 on its own field.
    agent_page = client.get(f"/agents/{demo_agent.pk}/").content.decode()
    assert "The agent&#x27;s default: Crucible&#x27;s" in agent_page
    EvolutionRun.objects.all().delete()
    started = client.post(
        f"/agents/{demo_agent.pk}/runs/start/",
        {"benchmark": "demo", "engine": "textbook", "cycles": "1", "egl_window": "1"},
    )
    assert "a window of 1 needs convergence a-evolve" in str(
        started.context["start_form"].errors["egl_window"]
    )
    started = client.post(
        f"/agents/{demo_agent.pk}/runs/start/",
        {
            "benchmark": "demo",
            "engine": "textbook",
            "cycles": "1",
            "egl_window": "1",
            "convergence": "a-evolve",
            "trajectory_only": "on",
        },
    )
    run = EvolutionRun.objects.get()
    assert (run.config["convergence"], run.config["egl_window"], run.config["trajectory_only"]) == (
        "a-evolve",
        1,
        True,
    )


# ------------------------------------------------------------------------------ history and metrics


def test_history_and_metrics_are_written_after_every_cycle_as_a_evolve_writes_them(tmp_path):
    root = demo_copy(tmp_path)
    Evolver(ScriptedAgent(root), ScriptedBenchmark(), {"egl_window": 5}, engine=SkillPerFailure()).run(
        cycles=3
    )
    history = lines(root / "evolution" / "history.jsonl")
    assert [(h["cycle"], h["score"], h["mutated"]) for h in history] == [
        (1, 1 / 3, True),
        (2, 2 / 3, True),
        (3, 1.0, False),
    ]
    assert all(
        list(h) == ["cycle", "score", "mutated", "timestamp"] and ISO.fullmatch(h["timestamp"])
        for h in history
    )
    assert json.loads((root / "evolution" / "metrics.json").read_text()) == {
        "cycles_completed": 3,
        "latest_score": 1.0,
        "best_score": 1.0,
        "avg_score": 2 / 3,
    }
    # A second run goes on with Crucible's cycle numbers; the metrics cover every cycle recorded.
    Evolver(ScriptedAgent(root), ScriptedBenchmark(), {"egl_window": 5}, engine=SkillPerFailure()).run(
        cycles=1
    )
    assert [h["cycle"] for h in lines(root / "evolution" / "history.jsonl")] == [1, 2, 3, 4]
    assert json.loads((root / "evolution" / "metrics.json").read_text())["cycles_completed"] == 4


# ------------------------------------------------------------------------------ engines and settings


class OwnEvaluation:
    """HEAD's `manages_own_evaluation` engine (as GEPA): it evaluates with the trial runner."""

    manages_own_evaluation = True
    seen: list[int] = []

    def step(self, workspace, observations, history, trial):
        tried = trial.run_tasks(trial.get_tasks("train", 2))
        type(self).seen.append(len(observations))
        return StepResult(
            False, f"tried {len(tried)} tasks itself", {"tried": [o.task.id for o in tried]}, stop=True
        )


def test_an_engine_that_evaluates_on_its_own_gets_no_batch_and_uses_the_trial_runner(tmp_path):
    OwnEvaluation.seen = []
    root = demo_copy(tmp_path)
    agent = ScriptedAgent(root)
    result = Evolver(agent, ScriptedBenchmark(), {}, engine=OwnEvaluation()).run(cycles=3)
    cycle = result.cycles[0]
    assert result.stopped and len(result.cycles) == 1  # StepResult.stop, as HEAD
    assert OwnEvaluation.seen == [0] and cycle.engine_metadata["tried"] == ["units/001", "dates-001"]
    # The loop solved nothing: the agent solved only what the engine's trials gave it.
    assert agent.solved == ["units/001", "dates-001"] and cycle.score is None
    assert (root / "evolution" / "observations" / "batch_0001.jsonl").read_text() == ""
    assert lines(root / "evolution" / "history.jsonl")[0]["score"] == 0.0  # A-Evolve's number in its file


class Recorder:
    seen: list[list[tuple[bool, float, str]]] = []

    def step(self, workspace, observations, history, trial):
        type(self).seen.append(
            [(o.feedback.success, o.feedback.score, o.feedback.detail) for o in observations]
        )
        workspace.write_skill("dates", SKILL.format(name="dates"))
        workspace.add_memory({"lesson": "be brief"})
        return StepResult(True, "added skill dates; a memory")


def test_trajectory_only_hides_every_verdict_from_the_engine_and_the_batch(tmp_path):
    Recorder.seen = []
    root = demo_copy(tmp_path)
    result = Evolver(
        ScriptedAgent(root), ScriptedBenchmark(), {"trajectory_only": True}, engine=Recorder()
    ).run(cycles=1)
    assert Recorder.seen == [[(False, 0.0, "")] * 3]
    assert result.cycles[0].score == round(1 / 3, 6)  # the run still knows (pages, holdout, convergence)
    assert all(
        "score" not in r and "feedback" not in r
        for r in lines(root / "evolution" / "observations" / "batch_0001.jsonl")
    )


def test_evolve_layers_narrow_the_manifest_s_layers(tmp_path):
    root = demo_copy(tmp_path)
    cycle = (
        Evolver(
            ScriptedAgent(root),
            ScriptedBenchmark(),
            {"evolve_layers": ["memory", "prompts"]},
            engine=Recorder(),
        )
        .run(cycles=1)
        .cycles[0]
    )
    assert cycle.reverted_paths == ["skills/dates/SKILL.md"] and "outside evolvable_layers" in cycle.reason
    assert cycle.mutated and "be brief" in git(root, "show", "evo-1:memory/episodic.jsonl")


def test_the_a_evolve_adapters_take_the_run_s_layers_and_trajectory_only():
    engine = AEvolveSkillForgeEngine()
    assert engine.config({"prompts", "skills"})["trajectory_only"] is False
    engine.run_configure(layers={"prompts", "memory"}, trajectory_only=True)
    config = engine.config(engine.layers or set())
    assert config["trajectory_only"] is True
    assert [config[f"evolve_{name}"] for name in ("prompts", "skills", "memory", "tools")] == [
        True,
        False,
        True,
        False,
    ]


# ------------------------------------------------------------------------------ bug: rejected evo-N


class DeletesEverySkill:
    def step(self, workspace, observations, history, trial):
        for skill in workspace.list_skills():
            workspace.delete_skill(skill.name)
        return StepResult(True, "deleted every skill")


def test_a_rejected_cycle_s_evo_n_says_it_was_rolled_back_not_the_change_it_undid(tmp_path):
    root = demo_copy(tmp_path)
    (root / "skills" / "dates").mkdir(parents=True)
    (root / "skills" / "dates" / "SKILL.md").write_text(SKILL.format(name="dates"))
    holdout = [("dates-002", "30 days after 2024-01-01?", {"category": "dates"}, "2024-01-31")]
    ANSWERS["dates-002"] = "2024-01-31"
    try:
        cycle = (
            Evolver(
                ScriptedAgent(root),
                ScriptedBenchmark(holdout),
                {"holdout_size": 1},
                engine=DeletesEverySkill(),
            )
            .run(cycles=1)
            .cycles[0]
        )
    finally:
        del ANSWERS["dates-002"]
    assert cycle.status == "rejected" and git(root, "diff", "--stat", "pre-evo-1", "evo-1") == ""
    message = git(root, "log", "-1", "--format=%B", "evo-1")
    assert "deleted every skill" not in message
    assert message.startswith("Cycle 1: rejected (holdout fell from 1.000 to 0.000")
    assert "the engine's change was rolled back" in message
    assert cycle.engine_metadata["engine_summary"] == "deleted every skill"


# ------------------------------------------------------------------------------ side by side with A-Evolve


def test_crucible_writes_the_files_a_evolve_0_1_0_writes_for_the_same_seed_field_by_field(tmp_path):
    """A-Evolve's own Evolver and Crucible's run the terminal seed with the same scripted agent,
    benchmark and engine; both converge (A-Evolve's rule, Crucible's default for an A-Evolve seed)
    at cycle 6. Differences kept on purpose:
    - `evolution/trajectories/` is written by Crucible only: it is A-Evolve's newer (GitHub HEAD)
      observer's; 0.1.0 has none. It is checked against HEAD's rule instead.
    - timestamps differ in value (they are now), not in shape.
    - git: Crucible's snapshot commits carry its own messages and trailers; the tag names agree."""
    theirs, mine = seed_copy(tmp_path, "a-evolve"), seed_copy(tmp_path, "crucible")
    config = ae.EvolveConfig(batch_size=3, max_cycles=8, egl_window=3)
    upstream = ae.Evolver(
        agent=UpstreamScriptedAgent(theirs),
        benchmark=UpstreamScriptedBenchmark(),
        config=config,
        engine=SkillPerFailure(),
        work_dir=tmp_path / "unused",
    ).run()
    ours = Evolver(
        ScriptedAgent(mine), ScriptedBenchmark(), {"batch_size": 3, "egl_window": 3}, engine=SkillPerFailure()
    ).run(cycles=8)
    assert upstream.converged and upstream.cycles_completed == 6
    assert ours.converged and len(ours.cycles) == 6 and "A-Evolve's rule" in ours.reason

    def files(root: Path) -> set[str]:
        return {
            str(p.relative_to(root / "evolution")) for p in (root / "evolution").rglob("*") if p.is_file()
        }

    trajectories = {f for f in files(mine) if f.startswith("trajectories/")}
    assert files(mine) - trajectories == files(theirs)
    expected = {
        f"trajectories/batch_{n:04d}/{kind}_{tid}.{ext}"
        for n in range(1, 7)
        for task_id, _, meta, _ in TASKS
        for tid in [task_id.replace("/", "_")]
        for kind, ext in (("patch", "diff"), ("trajectory", "json"))
        if kind == "patch" or meta["category"] != "bases"
    }
    assert trajectories == expected

    for n in range(1, 7):
        name = f"observations/batch_{n:04d}.jsonl"
        a, b = lines(mine / "evolution" / name), lines(theirs / "evolution" / name)
        assert len(a) == len(b) == 3
        for record, their in zip(a, b, strict=True):
            assert list(record) == list(their)  # the same keys, in the same order
            assert ISO.fullmatch(record["timestamp"]) and ISO.fullmatch(their["timestamp"])
            for key in record:
                if key != "timestamp":
                    assert record[key] == their[key], (name, key)
        patch = mine / "evolution" / "trajectories" / f"batch_{n:04d}" / "patch_units_001.diff"
        assert patch.read_text() == b[0]["agent_output"]

    a, b = lines(mine / "evolution" / "history.jsonl"), lines(theirs / "evolution" / "history.jsonl")
    assert [list(entry) for entry in a] == [list(entry) for entry in b]
    assert [{k: v for k, v in e.items() if k != "timestamp"} for e in a] == [
        {k: v for k, v in e.items() if k != "timestamp"} for e in b
    ]
    assert all(ISO.fullmatch(entry["timestamp"]) for entry in a + b)
    assert json.loads((mine / "evolution" / "metrics.json").read_text()) == json.loads(
        (theirs / "evolution" / "metrics.json").read_text()
    )
    assert set(git(mine, "tag").split()) == set(git(theirs, "tag").split())
    for n in range(1, 7):  # the same skills at every evo-N
        assert git(mine, "ls-tree", "-r", "--name-only", f"evo-{n}", "skills") == git(
            theirs, "ls-tree", "-r", "--name-only", f"evo-{n}", "skills"
        )
