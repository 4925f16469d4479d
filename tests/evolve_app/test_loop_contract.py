"""The loop's contract with engines and workspaces: engines written to A-Evolve's interface, cycles
that fail after their `evo-N` snapshot, what an engine may not leave in a workspace (symlinks,
special files, oversized files), and the Python Evolver doing what the services do (observation
batches, cycle numbering). Real workspaces under git in tmp dirs, checked with the git CLI."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from evolve_app import services
from evolve_app.benchmarks import benchmark_get
from evolve_app.demo import SEED_WORKSPACE
from evolve_app.engines import EvolutionEngine
from evolve_app.history import EvolutionHistory
from evolve_app.loop import Evolver, as_task, observations_write
from evolve_app.models import Cycle, ObservationRecord
from evolve_app.types import Feedback, Observation, StepResult, Task, Trajectory
from evolve_app.workspace import MAX_FILE_BYTES, MAX_MEMORY_LINES, MAX_WORKSPACE_BYTES
from tests.evolve_app.helpers import git

pytestmark = pytest.mark.django_db(transaction=True)

SKILL = "---\nname: {name}\ndescription: a test skill\n---\nUse it.\n"


def run_inline(user, agent, cycles: int, engine: str, **config):
    """A run started as the CLI starts it (a test engine's dotted path) and executed here."""
    run = services.evolution_run_start(user, agent, engine=engine, cycles=cycles, config=config,
                                       enqueue=False, trusted=True)
    return services.evolution_run_execute(run.pk)


def demo_copy(tmp_path: Path, name: str = "agent", manifest: str | None = None) -> Path:
    root = tmp_path / name
    shutil.copytree(SEED_WORKSPACE, root, ignore=shutil.ignore_patterns("__pycache__"))
    if manifest is not None:
        (root / "manifest.yaml").write_text(manifest)
    return root


def consistent(path) -> bool:
    """HEAD, the index and the files agree: nothing to commit, nothing untracked."""
    return git(path, "status", "--porcelain", "--untracked-files=all") == ""


# ------------------------------------------------------------------------------ A-Evolve's interface


class AEvolveStyle:
    """Written as A-Evolve's EvolutionEngine subclasses are (agent_evolve/engine/base.py): it
    reads `history.get_observations(last_n_cycles=2)` and `history.latest_cycle`, tries tasks
    with `trial.get_tasks` / `run_tasks` / `run_single`, names tasks by `task.id`, uses A-Evolve's
    workspace calls, takes `on_cycle_end(accepted, score)` and asks to stop after two cycles."""

    calls: list[dict] = []
    ends: list[tuple[bool, float]] = []

    def step(self, workspace, observations, history, trial):
        recent_logs = history.get_observations(last_n_cycles=2)
        cycle_num = history.latest_cycle + 1
        tasks = trial.get_tasks(split="train", limit=2)
        tried = trial.run_tasks(tasks)
        single = trial.run_single(tasks[0])
        failed = [o.task.id for o in observations if not o.feedback.success]
        drafts = workspace.list_drafts()
        workspace.write_draft("idea", "maybe a skill\n")
        workspace.clear_drafts()
        workspace.add_memory({"cycle": cycle_num, "failed": failed[:2]}, category="episodic")
        type(self).calls.append({
            "cycle": cycle_num, "recent": len(recent_logs), "tried": [o.task.id for o in tried],
            "single": single.task.id, "failed": len(failed), "drafts": len(drafts),
            "memory_dir": workspace.memory_dir == workspace.root / "memory",
        })
        return StepResult(mutated=True, summary=f"A-Evolve style: cycle {cycle_num}",
                          metadata={"evo_number": cycle_num}, stop=cycle_num >= 2)

    def on_cycle_end(self, accepted: bool, score: float) -> None:
        type(self).ends.append((accepted, score))


@pytest.fixture
def aevolve_style():
    AEvolveStyle.calls, AEvolveStyle.ends = [], []
    return AEvolveStyle


def test_tasks_have_a_evolves_id_and_can_be_made_with_it():
    task = Task(id="t-1", input="do it", metadata={"k": 1})
    assert (task.id, task.task_id, task.metadata) == ("t-1", "t-1", {"k": 1})
    assert Task("t-2", "x", "cat").id == "t-2" and Task(task_id="t-3", input="y").id == "t-3"
    with pytest.raises(TypeError):
        Task(input="no id")

    @dataclass
    class UpstreamTask:  # agent_evolve.types.Task
        id: str
        input: str
        metadata: dict = field(default_factory=dict)

    assert as_task(UpstreamTask("u-1", "in", {"category": "dates"})) == Task(
        "u-1", "in", "dates", {"category": "dates"})


def test_the_history_answers_a_evolves_questions_for_a_python_run(personas, tmp_path):
    root = demo_copy(tmp_path)
    Evolver(root, "demo", {}, engine="textbook").run(cycles=2)
    history = EvolutionHistory(root)
    assert history.latest_cycle == 2 and history.list_versions() == ["evo-2", "evo-1", "evo-0"]
    assert history.get_summary_stats() == {"total": 24, "success_rate": 0.375, "avg_score": 0.375}
    assert len(history.get_observations(last_n_cycles=1, only_failures=True)) == 6
    assert "Cycle 2: added skill string-transforms" in history.get_version_log(5)


def test_an_a_evolve_style_engine_runs_through_the_python_evolver(personas, tmp_path, aevolve_style):
    root = demo_copy(tmp_path)
    result = Evolver(root, "demo", {"batch_size": 12}, engine=AEvolveStyle()).run(cycles=5)
    assert [c.number for c in result.cycles] == [1, 2] and result.stopped
    assert result.reason == "the engine asked to stop" and not result.converged
    assert [c.status for c in result.cycles] == ["accepted", "accepted"]
    first, second = aevolve_style.calls
    assert (first["cycle"], second["cycle"]) == (1, 2)
    assert (first["recent"], second["recent"]) == (12, 24)  # this cycle's batch is there already
    assert first["tried"] == [task.id for task in benchmark_get("demo").get_tasks("train", 2)]
    assert first["single"] == first["tried"][0] and first["memory_dir"]
    assert aevolve_style.ends == [(True, 0.25), (True, 0.25)]
    assert not (root / "skills" / "_drafts").exists()
    assert {"evo-1", "evo-2"} <= set(git(root, "tag").split()) and "pre-evo-3" not in git(root, "tag")


def test_an_a_evolve_style_engine_runs_through_the_services(personas, demo_agent, aevolve_style):
    run = run_inline(personas.owner, demo_agent, cycles=5, engine=f"{__name__}.AEvolveStyle")
    cycles = list(Cycle.objects.filter(run=run).order_by("number"))
    assert [(c.number, c.status) for c in cycles] == [(1, "accepted"), (2, "accepted")]
    assert (run.status, run.reason) == ("finished", "the engine asked to stop")
    assert cycles[1].engine_metadata == {"evo_number": 2}
    assert len(aevolve_style.ends) == 2 and consistent(demo_agent.path)


class StopByMetadata(EvolutionEngine):
    """An engine written before A-Evolve's signature: on_cycle_end takes only `accepted`."""

    seen: list[bool] = []

    def step(self, workspace, observations, history, trial):
        return StepResult(False, "done", {"stop": len(type(self).seen) >= 1})

    def on_cycle_end(self, accepted):
        type(self).seen.append(accepted)


def test_an_engine_may_ask_to_stop_through_its_metadata_and_an_old_callback_still_works(personas, tmp_path):
    StopByMetadata.seen = []
    result = Evolver(demo_copy(tmp_path), "demo", {}, engine=StopByMetadata()).run(cycles=4)
    assert len(result.cycles) == 2 and result.reason == "the engine asked to stop"
    assert StopByMetadata.seen == [True, True]


# ------------------------------------------------------------------- failures after the snapshot


class FailsAtCycleEnd(EvolutionEngine):
    """Writes a skill, then its on_cycle_end raises the first time: after evo-N was made."""

    raised = 0
    steps = 0

    def step(self, workspace, observations, history, trial):
        type(self).steps += 1
        name = f"tried-{type(self).steps}"
        workspace.write_skill(name, SKILL.format(name=name))
        return StepResult(True, f"added skill {name}")

    def on_cycle_end(self, accepted, score):
        if not type(self).raised:
            type(self).raised += 1
            raise RuntimeError("the callback broke")


def test_a_failure_after_the_snapshot_records_the_cycle_failed_and_keeps_head_and_files_agreeing(
        personas, demo_agent):
    FailsAtCycleEnd.raised = FailsAtCycleEnd.steps = 0
    path = Path(demo_agent.path)
    run = run_inline(personas.owner, demo_agent, cycles=2, engine=f"{__name__}.FailsAtCycleEnd")
    assert run.status == "finished", run.reason
    first, second = Cycle.objects.filter(run=run).order_by("number")
    assert first.status == "failed" and not first.mutated and first.skills_added == []
    assert "on_cycle_end failed" in first.reason and "the callback broke" in first.reason
    assert not (path / "skills" / "tried-1").exists()
    rolled_back = git(path, "rev-parse", f"{first.post_commit}^{{tree}}")
    assert rolled_back == git(path, "rev-parse", "pre-evo-1^{tree}")
    assert second.status == "accepted" and second.skills_added == ["tried-2"]
    assert git(path, "rev-parse", "HEAD") == git(path, "rev-parse", "evo-2^{commit}")
    assert consistent(path)


class AddsSkill(EvolutionEngine):
    steps = 0

    def step(self, workspace, observations, history, trial):
        type(self).steps += 1
        name = f"kept-{type(self).steps}"
        workspace.write_skill(name, SKILL.format(name=name))
        return StepResult(True, f"added skill {name}")


def test_a_failure_reading_what_the_cycle_changed_is_recorded_and_the_next_cycle_works(
        personas, demo_agent, monkeypatch):
    AddsSkill.steps = 0
    real = EvolutionHistory.layer_changes
    failures = iter([True])

    def flaky(self, a, b):
        if next(failures, False):
            raise OSError("disk hiccup")
        return real(self, a, b)

    monkeypatch.setattr(EvolutionHistory, "layer_changes", flaky)
    run = run_inline(personas.owner, demo_agent, cycles=2, engine=f"{__name__}.AddsSkill")
    first, second = Cycle.objects.filter(run=run).order_by("number")
    assert first.status == "failed" and "disk hiccup" in first.reason
    assert second.status == "accepted" and second.skills_added == ["kept-2"]
    assert not (Path(demo_agent.path) / "skills" / "kept-1").exists() and consistent(demo_agent.path)


# ------------------------------------------------------------------- what an engine may not leave


class Unsafe(EvolutionEngine):
    """Inside the evolvable layers (skills, memory): a symlink out of the workspace, a symlinked
    folder, a fifo, a sparse file over the size limit, a memory file over the line limit; and
    one honest skill."""

    def step(self, workspace, observations, history, trial):
        root = workspace.root
        os.symlink("/etc/hostname", root / "memory" / "link.jsonl")
        os.symlink("/etc", root / "skills" / "elsewhere")
        os.mkfifo(root / "memory" / "pipe.jsonl")
        big = root / "skills" / "huge" / "SKILL.md"
        big.parent.mkdir()
        big.write_text(SKILL.format(name="huge"))
        os.truncate(big, MAX_FILE_BYTES + 1)
        (root / "memory" / "long.jsonl").write_text("{}\n" * (MAX_MEMORY_LINES + 1))
        workspace.write_skill("honest", SKILL.format(name="honest"))
        return StepResult(True, "added skill honest, huge")


def test_symlinks_special_and_oversized_files_an_engine_writes_are_reverted(personas, demo_agent):
    path = Path(demo_agent.path)
    run = run_inline(personas.owner, demo_agent, cycles=1, engine=f"{__name__}.Unsafe")
    cycle = Cycle.objects.get(run=run)
    unsafe = ["memory/link.jsonl", "memory/long.jsonl", "memory/pipe.jsonl", "skills/elsewhere",
              "skills/huge/SKILL.md"]
    assert cycle.reverted_paths == unsafe
    assert "memory/link.jsonl (a symlink)" in cycle.reason
    assert "memory/pipe.jsonl (a special file" in cycle.reason
    assert f"over the {MAX_FILE_BYTES}-byte limit" in cycle.reason
    assert f"over the {MAX_MEMORY_LINES}-line limit" in cycle.reason
    assert cycle.status == "accepted" and cycle.skills_added == ["honest"]
    assert "huge" not in cycle.summary
    assert cycle.engine_metadata["engine_summary"] == "added skill honest, huge"
    for rel in unsafe:
        assert not os.path.lexists(path / rel), rel
    assert not (path / "skills" / "huge").exists()
    assert git(path, "ls-tree", "-r", "--name-only", "evo-1").count("honest") == 1
    assert "link" not in git(path, "ls-tree", "-r", "--name-only", "evo-1") and consistent(path)
    again = run_inline(personas.owner, demo_agent, cycles=1, engine="textbook")
    assert again.status == "finished" and Cycle.objects.get(run=again).status == "accepted"


class Bulk(EvolutionEngine):
    """Many files, each under the per-file limit, that together pass the workspace's limit."""

    def step(self, workspace, observations, history, trial):
        folder = workspace.root / "skills" / "bulk"
        folder.mkdir(parents=True)
        (folder / "SKILL.md").write_text(SKILL.format(name="bulk"))
        for n in range(MAX_WORKSPACE_BYTES // (MAX_FILE_BYTES - 1) + 1):
            with open(folder / f"part-{n}.md", "wb") as handle:
                handle.truncate(MAX_FILE_BYTES - 1)  # sparse: the size counts, no disk is used
        return StepResult(True, "added skill bulk")


def test_an_engine_that_grows_the_workspace_past_its_limit_is_rolled_back(personas, tmp_path):
    root = demo_copy(tmp_path)
    cycle = Evolver(root, "demo", {}, engine=Bulk()).run(cycles=1).cycles[0]
    assert cycle.status == "rejected" and not cycle.mutated
    assert "MAX_WORKSPACE_BYTES" in cycle.reason and "rolled back" in cycle.reason
    assert not (root / "skills" / "bulk").exists()
    assert "bulk" not in git(root, "ls-tree", "-r", "--name-only", "evo-1") and consistent(root)


class SkillWriter(EvolutionEngine):
    def step(self, workspace, observations, history, trial):
        workspace.write_skill("dates", SKILL.format(name="dates"))
        workspace.add_memory({"lesson": "dates are hard"})
        return StepResult(True, "added skill dates")


def test_a_reverted_skill_leaves_no_folder_and_no_added_claim(personas, tmp_path):
    manifest = (SEED_WORKSPACE / "manifest.yaml").read_text().replace("  - skills\n", "")
    root = demo_copy(tmp_path, manifest=manifest)
    cycle = Evolver(root, "demo", {}, engine=SkillWriter()).run(cycles=1).cycles[0]
    assert cycle.reverted_paths == ["skills/dates/SKILL.md"] and "outside evolvable_layers" in cycle.reason
    assert not (root / "skills" / "dates").exists()
    assert cycle.skills_added == [] and "added skill" not in cycle.summary
    assert cycle.mutated and "1 other file changed" in cycle.summary  # the memory entry
    assert "dates" not in git(root, "log", "-1", "--format=%B", "evo-1")


def test_a_deleted_skill_leaves_no_empty_folder(personas, tmp_path):
    class Deleter(EvolutionEngine):
        def step(self, workspace, observations, history, trial):
            (workspace.root / "skills" / "unit-conversions" / "SKILL.md").unlink()
            return StepResult(True, "deleted unit-conversions")

    root = demo_copy(tmp_path)
    cycle = Evolver(root, "demo", {}, engine=Deleter()).run(cycles=1).cycles[0]
    assert cycle.skills_deleted == ["unit-conversions"]
    assert not (root / "skills" / "unit-conversions").exists()


# ------------------------------------------------------------------------ the Evolver and the CLI


def batch(root: Path, name: str) -> list[dict]:
    text = (root / "evolution" / "observations" / name).read_text()
    return [json.loads(line) for line in text.splitlines()]


def stable(records: list[dict]) -> list[dict]:
    """The records without what differs from one solve to the next (timings, receipt ids, the
    batch's timestamps)."""
    drop = ("duration_seconds", "receipt_id")

    def steps(given: list[dict]) -> list[dict]:
        return [{k: v for k, v in step.items() if k not in drop} for step in given]

    out = []
    for r in records:
        record = {k: v for k, v in r.items() if k != "timestamp"}
        record["steps"] = steps(r["steps"])
        if "trajectory" in r:
            record["trajectory"] = {**r["trajectory"], "steps": steps(r["trajectory"]["steps"])}
        out.append(record)
    return out


def test_the_evolver_writes_the_observation_batches_the_services_write(personas, demo_agent, tmp_path):
    alone = demo_copy(tmp_path, "alone")
    Evolver(alone, "demo", {}, engine="textbook").run(cycles=2)
    run = run_inline(personas.owner, demo_agent, cycles=2, engine="textbook")
    served = Path(demo_agent.path)
    names = sorted(p.name for p in (alone / "evolution" / "observations").iterdir())
    assert names == ["batch_0001.jsonl", "batch_0002.jsonl"]
    assert sorted(p.name for p in (served / "evolution" / "observations").iterdir()) == names
    for name in names:
        mine, theirs = batch(alone, name), batch(served, name)
        assert [set(record) for record in mine] == [set(record) for record in theirs]
        assert stable(mine) == stable(theirs) and len(mine) == 12
    # The services keep their database rows, the same records.
    rows = ObservationRecord.objects.filter(cycle__run=run, cycle__number=1, split="train").order_by("id")
    flat = [{key: record[key] for key in rows[0].as_record()} for record in batch(served, "batch_0001.jsonl")]
    assert stable([row.as_record() for row in rows]) == stable(flat)
    assert EvolutionHistory(alone).get_score_curve() == [(1, 0.25), (2, 0.5)]


def test_the_evolver_numbers_cycles_after_the_tags_a_workspace_has(personas, tmp_path):
    root = demo_copy(tmp_path)
    Evolver(root, "demo", {}, engine="textbook").run(cycles=2)
    assert {"evo-1", "evo-2"} <= set(git(root, "tag").split())
    result = Evolver(root, "demo", {}, engine="textbook").run(cycles=1)
    assert [c.number for c in result.cycles] == [3] and result.cycles[0].score == 0.75
    assert {"pre-evo-3", "evo-3"} <= set(git(root, "tag").split())
    assert (root / "evolution" / "observations" / "batch_0003.jsonl").exists()


def test_the_observation_writer_names_a_batch_by_its_cycle(tmp_path):
    task = Task("t1", "in")
    observed = Observation(task, Trajectory("t1", "out"), Feedback(True, 1.0))
    written = observations_write(tmp_path, 7, [observed])
    assert written == tmp_path / "evolution" / "observations" / "batch_0007.jsonl"
    assert json.loads(written.read_text())["task_id"] == "t1"


class RaisesInStep:
    ends: list[tuple[bool, float]] = []

    def step(self, workspace, observations, history, trial):
        workspace.write_prompt("half-written")
        raise RuntimeError("the model went away")

    def on_cycle_end(self, accepted, score):
        type(self).ends.append((accepted, score))


def test_a_failed_cycle_is_still_ended_for_the_engine_with_accepted_false(personas, tmp_path):
    RaisesInStep.ends = []
    root = demo_copy(tmp_path)
    cycle = Evolver(root, "demo", {}, engine=RaisesInStep()).run(cycles=1).cycles[0]
    assert cycle.status == "failed" and cycle.reason == "the engine failed: RuntimeError: the model went away"
    assert RaisesInStep.ends == [(False, 0.25)] and consistent(root)
    assert git(root, "log", "-1", "--format=%s", "evo-1") == (
        "Cycle 1: failed (the engine failed: RuntimeError: the model went away); "
        "the files are as before the cycle")
