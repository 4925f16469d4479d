"""crucible.aevolve (evolve_app/dropin.py): A-Evolve's `Evolver(agent, benchmark, config, engine)` with
every form of each argument it takes, run under Crucible in this process; the mapping of every key of
A-Evolve's EvolveConfig; and the refusals, each with a message naming what and why."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from agent_evolve import (
    BaseAgent,
    BenchmarkAdapter,
    EvolutionEngine,
    EvolveConfig,
    Feedback,
    StepResult,
    Task,
)
from agent_evolve import Trajectory as UpTrajectory
from agent_evolve.algorithms.guided_synth.engine import GuidedSynthesisEngine
from agent_evolve.algorithms.skillforge.engine import AEvolveEngine
from django.test import Client
from django.utils import timezone

from evolve_app import aevolve, dropin, services
from evolve_app.benchmarks import JsonlBenchmark
from evolve_app.demo import SEED_WORKSPACE
from evolve_app.engines import TextbookEngine
from evolve_app.models import Agent, Cycle, EvolutionRun
from runtime_app import sandbox
from tests.evolve_app.helpers import files_write
from tests.helpers import service_missing

pytestmark = pytest.mark.django_db(transaction=True)


# ------------------------------------------------------------------ an A-Evolve user's own classes


class MultiplyBench(BenchmarkAdapter):
    """A user's benchmark: 'what is 6 x 7?' tasks, judged on the answer 42."""

    def get_tasks(self, split: str = "train", limit: int = 10) -> list[Task]:
        return [Task(id=f"{split}-{n}", input=f"Task {n}: what is 6 x 7?", metadata={"kind": "multiply"})
                for n in range(1, limit + 1)]

    def evaluate(self, task: Task, trajectory: UpTrajectory) -> Feedback:
        assert isinstance(task, Task) and task.metadata == {"kind": "multiply"}  # its own Task, back
        right = trajectory.output.strip() == "42"
        return Feedback(success=right, score=1.0 if right else 0.0, detail="expected 42")


class SkillfulAgent(BaseAgent):
    """A user's agent: answers right only once a `multiply` skill is in its workspace."""

    def solve(self, task: Task) -> UpTrajectory:
        assert isinstance(task, Task)
        knows = any(skill.name == "multiply" for skill in self.skills)
        self.remember(f"solved {task.id}")
        return UpTrajectory(task_id=task.id, output="42" if knows else "41", conversation=[{"role": "user"}])


NO_HOLDOUT = {"holdout_ratio": 0}
ONE_TASK = {"batch_size": 1, **NO_HOLDOUT}
MULTIPLY_SKILL = "---\nname: multiply\ndescription: Multiply the two numbers.\n---\n\n6 x 7 = 42\n"


class SkillWriter(EvolutionEngine):
    """A user's own engine: writes the multiply skill through A-Evolve's workspace interface."""

    def __init__(self) -> None:
        self.ends: list[tuple[bool, float]] = []

    def step(self, workspace, observations, history, trial) -> StepResult:
        assert all(o.task.metadata == {"kind": "multiply"} for o in observations)
        if workspace.read_skill("multiply"):
            return StepResult(mutated=False, summary="nothing to add")
        workspace.write_skill("multiply", MULTIPLY_SKILL)
        return StepResult(mutated=True, summary="added skill multiply")

    def on_cycle_end(self, accepted: bool, score: float) -> None:
        self.ends.append((accepted, score))


def tree_bytes(root: Path) -> dict[str, str]:
    """Every file and folder under root: its path and the SHA-256 of its bytes (folders: '')."""
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            if path.is_file() else "" for path in sorted(root.rglob("*"))}


@pytest.fixture
def user_folder(tmp_path) -> Path:
    """An A-Evolve user's workspace without manifest.yaml (A-Evolve's BaseAgent needs none)."""
    folder = tmp_path / "my_workspace"
    files_write(folder, {"prompts/system.md": "You multiply.\n", "memory/episodic.jsonl": ""})
    return folder


@pytest.fixture
def bubblewrap():
    ready, reason = sandbox.bubblewrap_probe()
    if not ready:
        service_missing(reason)


# ------------------------------------------------------------------ the config


def test_every_key_of_a_evolves_config_is_mapped_to_what_crucible_honours():
    config = EvolveConfig(batch_size=8, max_cycles=7, holdout_ratio=0.25, evolve_prompts=False,
                          evolve_tools=True, trajectory_only=True, evolver_model="claude-sonnet-4-5",
                          evolver_max_tokens=4096, egl_threshold=0.02, egl_window=4,
                          extra={"max_skills": 3, "review_mode": True, "concurrency": 2,
                                 "holdout_tolerance": 0.1})
    mapped = dropin.config_map(config)
    assert set(mapped.notes) == {f.name for f in dataclasses.fields(EvolveConfig)} | {"convergence"}
    assert mapped.settings == {"batch_size": 8, "holdout_size": 2, "egl_threshold": 0.02, "egl_window": 4,
                               "evolve_layers": ["skills", "memory", "tools"], "trajectory_only": True,
                               "convergence": "a-evolve", "review_mode": True, "concurrency": 2,
                               "holdout_tolerance": 0.1}
    assert mapped.max_cycles == 7
    # Crucible's own settings are taken out of extra; the rest goes to the engine as it is.
    assert mapped.aevolve_options == {"preset": "anthropic", "model": "claude-sonnet-4-5",
                                      "evolver_max_tokens": 4096, "extra": '{"max_skills": 3}'}


def test_the_defaults_map_as_a_evolve_runs_them():
    mapped = dropin.config_map(EvolveConfig())
    assert mapped.settings["holdout_size"] == 2  # round(0.2 x 10)
    assert mapped.settings["evolve_layers"] == ["prompts", "skills", "memory"]  # evolve_tools is off upstream
    assert mapped.max_cycles == 20
    # A-Evolve's default evolver model is a Bedrock id: its provider is Bedrock, so is the preset.
    assert mapped.aevolve_options["preset"] == "bedrock"
    assert dropin.config_map(EvolveConfig(), preset="anthropic").aevolve_options["preset"] == "anthropic"


@pytest.mark.parametrize(("change", "named"), [
    ({"batch_size": 0}, "batch_size"),
    ({"max_cycles": 500}, "max_cycles"),
    ({"holdout_ratio": 1.0}, "holdout_ratio"),
    ({"egl_window": 1}, "egl_window"),
    ({"egl_threshold": float("nan")}, "egl_threshold"),
    ({"evolve_skills": "yes"}, "evolve_skills"),
    ({"evolver_max_tokens": 10}, "evolver_max_tokens"),
    ({"extra": {"review_mode": "please"}}, "review_mode"),
    ({"extra": {"convergence": "never"}}, "convergence"),
    ({"extra": {"callback": object()}}, "extra"),
])
def test_a_value_crucible_cannot_honour_is_refused_naming_the_key(change, named):
    with pytest.raises(ValueError, match=named) as refused:
        dropin.config_map(EvolveConfig(**change))
    assert "cannot" in str(refused.value)


def test_the_config_is_read_from_a_evolves_yaml_a_dict_or_nothing(tmp_path):
    path = tmp_path / "evolve.yaml"
    path.write_text("batch_size: 3\nmax_cycles: 2\nreview_mode: true\nmax_skills: 4\n")
    read = dropin.config_read(path)
    assert (read.batch_size, read.max_cycles, read.extra) == (3, 2, {"review_mode": True, "max_skills": 4})
    assert dropin.config_map(read).settings["review_mode"] is True
    assert dropin.config_read({"batch_size": 5, "region": "eu-west-1"}).extra == {"region": "eu-west-1"}
    assert dropin.config_read(None) == EvolveConfig()
    with pytest.raises(ValueError, match="not a file"):
        dropin.config_read(tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="give A-Evolve's EvolveConfig"):
        dropin.config_read(42)


def test_the_layer_gates_and_trajectory_only_become_crucible_s_settings():
    config, warnings = dropin.crucible_config(dropin.config_map(EvolveConfig(evolve_memory=False,
                                                                             trajectory_only=True)))
    assert config.trajectory_only is True and config.evolve_layers == ["prompts", "skills"]
    assert config.convergence == "a-evolve" and warnings == []


# ------------------------------------------------------------------ the agent, benchmark and engine


def test_an_a_evolve_agent_benchmark_and_engine_run_under_crucible(data_dir, user_folder):
    before = tree_bytes(user_folder)
    engine = SkillWriter()
    evolver = dropin.Evolver(agent=SkillfulAgent(str(user_folder)), benchmark=MultiplyBench(),
                             config=EvolveConfig(batch_size=3, max_cycles=2, holdout_ratio=0.0),
                             engine=engine)
    result = evolver.run()
    assert (result.cycles_completed, result.score_history, result.final_score) == (2, [0.0, 1.0], 1.0)
    assert result.converged is False
    run = EvolutionRun.objects.get(pk=result.details["run_id"])
    assert (run.driver, run.status, run.trusted) == ("script", "finished", True)
    assert run.engine.endswith("SkillWriter") and run.benchmark.endswith("MultiplyBench")
    assert result.details["url"].endswith(run.get_absolute_url())
    cycles = list(Cycle.objects.filter(run=run).order_by("number"))
    assert [(c.status, c.score, c.mutated) for c in cycles] == [("accepted", 0.0, True),
                                                                 ("accepted", 1.0, False)]
    assert cycles[0].skills_added == ["multiply"]
    assert cycles[0].observations.count() == 3
    assert engine.ends == [(True, 0.0), (True, 1.0)]
    # Crucible's own copy was evolved (with the manifest it inferred, and the agent's memories); the
    # user's folder is byte for byte as it was.
    copy = Path(run.agent.path)
    assert copy.is_relative_to(data_dir) and run.agent.source_path == str(user_folder)
    assert (copy / "skills" / "multiply" / "SKILL.md").read_text() == MULTIPLY_SKILL
    assert "solved train-1" in (copy / "memory" / "episodic.jsonl").read_text()
    assert (copy / "manifest.yaml").is_file()
    assert tree_bytes(user_folder) == before
    assert not Path("evolution_workdir").exists()
    # The run's page and API say a script drove it.
    client = Client()
    client.force_login(run.started_by)
    page = client.get(run.get_absolute_url()).content.decode()
    assert 'id="run-driver">a Python script' in page
    assert client.get(f"/api/runs/{run.pk}").json()["driver"] == "script"


def test_a_second_evolver_of_the_same_folder_goes_on_with_crucibles_copy(data_dir, user_folder):
    first = dropin.Evolver(SkillfulAgent(user_folder), MultiplyBench(), {"batch_size": 2, "max_cycles": 1,
                                                                         "holdout_ratio": 0}, SkillWriter())
    first.run()
    second = dropin.Evolver(SkillfulAgent(user_folder), MultiplyBench(), {"batch_size": 2, "max_cycles": 1,
                                                                          "holdout_ratio": 0}, SkillWriter())
    result = second.run()
    assert second.agent_row.pk == first.agent_row.pk and result.details["run_number"] == 2
    assert result.score_history == [1.0]  # the skill cycle 1 of the first run wrote


def test_a_workspace_path_runs_with_crucibles_benchmark_key_and_engine_name(data_dir, tmp_path):
    """A path to a folder with its own manifest (Crucible's demo agent, a sandboxed command agent), the
    `demo` benchmark by key and Crucible's `textbook` engine by name."""
    folder = tmp_path / "demo-agent"
    shutil.copytree(SEED_WORKSPACE, folder)
    before = tree_bytes(folder)
    evolver = dropin.Evolver(str(folder), "demo", EvolveConfig(batch_size=4, max_cycles=2, holdout_ratio=0.5),
                             engine="textbook")
    assert isinstance(evolver.engine, TextbookEngine)
    result = evolver.run(cycles=1)
    run = EvolutionRun.objects.get(pk=result.details["run_id"])
    assert (run.benchmark, run.engine, run.cycles_planned) == ("demo", "textbook", 1)
    cycle = Cycle.objects.get(run=run)
    assert cycle.holdout_score is not None  # the holdout gate ran on round(0.5 x 4) tasks
    assert cycle.observations.filter(split="holdout").count() == 2
    assert tree_bytes(folder) == before


def test_a_crucible_benchmark_instance_is_taken_as_it_is(data_dir, user_folder, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"task_id": "m-1", "input": "6 x 7?", "expected": "42"}\n')
    benchmark = JsonlBenchmark(str(tasks))
    evolver = dropin.Evolver(SkillfulAgent(user_folder), benchmark, {"holdout_ratio": 0}, SkillWriter())
    assert evolver.benchmark is benchmark


def test_a_seed_name_imports_a_copy_of_a_evolves_seed_and_never_writes_into_the_package(data_dir, settings,
                                                                                         monkeypatch):
    seed = dropin.SEEDS_DIR / "terminal"
    before = tree_bytes(seed)
    # A-Evolve's seeds name no model of their own: without one here the run is refused at once, saying so.
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    settings.CONFIG = dataclasses.replace(settings.CONFIG, agent_model="")
    with pytest.raises(ValueError, match="cannot run: no model"):
        dropin.Evolver(agent="terminal", benchmark="demo", engine="textbook")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-dropin")
    settings.CONFIG = dataclasses.replace(settings.CONFIG, agent_model="anthropic:fake-sonnet")
    evolver = dropin.Evolver(agent="terminal-bench", benchmark="demo", engine="textbook")
    agent = Agent.objects.get(pk=evolver.agent_row.pk)
    assert agent.source_path == str(seed) and Path(agent.path).is_relative_to(data_dir)
    registry = "tools/registry.yaml"
    assert (Path(agent.path) / registry).read_bytes() == (seed / registry).read_bytes()
    assert tree_bytes(seed) == before


@pytest.mark.parametrize(("agent", "message"), [
    (42, "Cannot resolve agent: got int"),
    ("no-such-agent", "neither a folder nor an A-Evolve seed name"),
    ("hle", "A-Evolve's seed 'reasoning' is not in the installed a-evolve package"),
    (None, "Cannot resolve agent"),
])
def test_a_bad_agent_argument_is_refused_with_a_clear_message(data_dir, agent, message):
    with pytest.raises(ValueError, match=message):
        dropin.Evolver(agent=agent, benchmark="demo")


def test_a_bad_benchmark_or_engine_argument_is_refused_with_a_clear_message(data_dir, user_folder):
    agent = SkillfulAgent(user_folder)
    with pytest.raises(ValueError, match="benchmark: give a registry key"):
        dropin.Evolver(agent, benchmark=3.5)
    with pytest.raises(ValueError, match="benchmark 'no-such-bench'"):
        dropin.Evolver(agent, benchmark="no-such-bench")
    # A-Evolve's own key, whose package part is missing here: refused at once, naming what is missing.
    with pytest.raises(ValueError, match=r"benchmark 'mcp-atlas'.*(strands|docker|Docker)"):
        dropin.Evolver(agent, benchmark="mcp-atlas")
    with pytest.raises(ValueError, match="engine: give an A-Evolve EvolutionEngine"):
        dropin.Evolver(agent, MultiplyBench(), engine=object())
    with pytest.raises(ValueError, match="engine 'no-such-engine' cannot run here"):
        dropin.Evolver(agent, MultiplyBench(), engine="no-such-engine")


def test_each_engine_form_becomes_crucibles_engine(data_dir, bubblewrap):
    mapped = dropin.config_map(EvolveConfig(evolver_model="claude-haiku-4-5", extra={"max_skills": 2}))
    default, label, _ = dropin.engine_resolve(None, mapped)
    assert isinstance(default, aevolve.AEvolveSkillForgeEngine) and label == "aevolve-skillforge"
    assert (default.preset, default.model) == ("anthropic", "claude-haiku-4-5")
    assert default.extra == {"max_skills": 2}
    # One of A-Evolve's four engines: its adapter, with the engine's own config kept.
    own = AEvolveEngine(EvolveConfig(evolver_model="claude-opus-4-5", evolver_max_tokens=2048))
    adapted, label, _ = dropin.engine_resolve(own, mapped)
    assert label == "aevolve-skillforge"
    assert (adapted.model, adapted.evolver_max_tokens) == ("claude-opus-4-5", 2048)
    curator = GuidedSynthesisEngine(EvolveConfig(), write_memory=False)
    guided, label, _ = dropin.engine_resolve(curator, mapped)
    assert label == "aevolve-guided" and guided.specific["write_memory"] is False
    # Any other A-Evolve engine is stepped through the generic wrapper; Crucible's by name or as is.
    wrapped, _, _ = dropin.engine_resolve(SkillWriter(), mapped)
    assert isinstance(wrapped, dropin.UpstreamEngine)
    assert isinstance(dropin.engine_resolve("textbook", mapped)[0], TextbookEngine)
    mine = TextbookEngine()
    assert dropin.engine_resolve(mine, mapped)[0] is mine


class OwnEvaluation(SkillWriter):
    """A-Evolve HEAD's engines that evaluate by themselves, and ask to stop."""

    manages_own_evaluation = True

    def step(self, workspace, observations, history, trial) -> StepResult:
        result = super().step(workspace, observations, history, trial)
        result.stop = True  # type: ignore[attr-defined]  # HEAD's StepResult field
        return result


def test_the_generic_engine_wrapper_passes_on_manages_own_evaluation_and_stop(data_dir, user_folder):
    wrapped = dropin.UpstreamEngine(OwnEvaluation())
    assert wrapped.manages_own_evaluation is True
    result = dropin.Evolver(SkillfulAgent(user_folder), MultiplyBench(), {"batch_size": 2, **NO_HOLDOUT},
                            OwnEvaluation()).run(cycles=3)
    run = EvolutionRun.objects.get(pk=result.details["run_id"])
    assert result.cycles_completed == 1 and run.reason == "the engine asked to stop"


# ------------------------------------------------------------------ review mode and the lease


def test_a_cycle_awaiting_review_pauses_run_and_run_again_goes_on_once_decided(data_dir, user_folder):
    evolver = dropin.Evolver(SkillfulAgent(user_folder), MultiplyBench(),
                             EvolveConfig(batch_size=2, max_cycles=2, holdout_ratio=0,
                                          extra={"review_mode": True}),
                             SkillWriter())
    paused = evolver.run()
    assert paused.details["awaiting_review"] == 1 and paused.details["status"] == "awaiting_review"
    assert paused.cycles_completed == 1
    again = evolver.run()  # nobody decided yet: still waiting, nothing ran
    assert again.details["awaiting_review"] == 1 and again.cycles_completed == 1
    cycle = Cycle.objects.get(run_id=paused.details["run_id"], number=1)
    services.cycle_decide(evolver.user, cycle, approve=True)
    run = EvolutionRun.objects.get(pk=paused.details["run_id"])
    assert (run.status, run.enqueued_at) == ("queued", None)  # left for its script, not a worker
    # Another script on the same folder meanwhile is refused, naming the run that holds the agent.
    other = dropin.Evolver(SkillfulAgent(user_folder), MultiplyBench(), ONE_TASK, SkillWriter())
    with pytest.raises(ValueError, match=r"already has a run in progress \(run 1, queued, /agents/"):
        other.run()
    done = evolver.run()
    assert done.details["run_id"] == paused.details["run_id"] and done.details["status"] == "finished"
    assert done.score_history == [0.0, 1.0]
    assert evolver.engine.engine.ends == [(True, 0.0), (True, 1.0)]  # the engine heard the approval


def test_the_reconciler_fails_a_script_run_whose_lease_passed_instead_of_handing_it_to_a_worker(
        data_dir, user_folder):
    evolver = dropin.Evolver(SkillfulAgent(user_folder), MultiplyBench(), ONE_TASK, SkillWriter())
    run = services.evolution_run_script(
        evolver.user, evolver.agent_row, solver=evolver.agent, benchmark=evolver.benchmark,
        engine=evolver.engine, config=evolver.settings, cycles=1, labels={"benchmark": "b", "engine": "e"})[0]
    EvolutionRun.objects.filter(pk=run.pk).update(status="running", finished_at=None,
                                                  lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert services.evolution_runs_reconcile() == []
    run.refresh_from_db()
    assert (run.status, run.reason) == ("failed", services.SCRIPT_LOST)


def test_a_worker_never_claims_a_script_driven_run(data_dir, user_folder):
    evolver = dropin.Evolver(SkillfulAgent(user_folder), MultiplyBench(), ONE_TASK, SkillWriter())
    run = evolver.run(cycles=1)
    EvolutionRun.objects.filter(pk=run.details["run_id"]).update(status="queued")
    assert services.evolution_run_claim(run.details["run_id"], "worker") is False


class Interrupted(SkillWriter):
    def step(self, workspace, observations, history, trial) -> StepResult:
        raise KeyboardInterrupt


def test_ctrl_c_in_the_script_cancels_its_run_at_once(data_dir, user_folder):
    evolver = dropin.Evolver(SkillfulAgent(user_folder), MultiplyBench(), ONE_TASK, Interrupted())
    with pytest.raises(KeyboardInterrupt):
        evolver.run(cycles=2)
    run = EvolutionRun.objects.get(agent=evolver.agent_row)
    assert (run.status, run.reason) == ("cancelled", "the script that drove it was interrupted")
