"""Any BenchmarkAdapter runs under Crucible: an A-Evolve `BenchmarkAdapter` subclass (by instance
or dotted path) is wrapped, its Task/Trajectory/Feedback converted both ways in the cycle and the
trial runner; a verdict that is not a score from 0 to 1, or an exception, is a failed observation;
A-Evolve's registry keys resolve to their classes or are refused at request, naming what this
host lacks (page, API, CLI), and the start form offers them with what they need."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from agent_evolve.benchmarks.base import BenchmarkAdapter as UpstreamAdapter
from agent_evolve.types import Feedback as AeFeedback
from agent_evolve.types import Task as AeTask
from agent_evolve.types import Trajectory as AeTrajectory

from evolve_app import benchmarks
from evolve_app.benchmarks import (
    AEVOLVE_BENCHMARKS,
    BenchmarkError,
    Need,
    UpstreamBenchmark,
    UpstreamKey,
    benchmark_adapt,
    benchmark_check,
    benchmark_choices,
    benchmark_get,
)
from evolve_app.loop import Evolver, TrialRunner, solve_batch
from evolve_app.models import EvolutionRun
from evolve_app.types import Task, Trajectory
from tests.evolve_app.test_api import bearer, post
from tests.evolve_app.test_loop_contract import demo_copy
from tests.helpers import REPO_ROOT, login, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)

REAL_HOST_HAS = benchmarks.host_has
SEEN: list[tuple[str, str, str]] = []  # (task type, trajectory type, task id) evaluate was handed


class EchoBench(UpstreamAdapter):
    """An A-Evolve benchmark, written as its users write one: its own Task, Trajectory, Feedback."""

    def get_tasks(self, split: str = "train", limit: int = 10) -> list[AeTask]:
        tasks = [AeTask(id=f"{split}-{n}", input=f"Convert {n} degrees Celsius to Fahrenheit.\nAnswer with "
                        "the number only.", metadata={"category": "units", "n": n}) for n in range(1, 4)]
        return tasks[:limit]

    def evaluate(self, task: AeTask, trajectory: AeTrajectory) -> AeFeedback:
        SEEN.append((f"{type(task).__module__}.{type(task).__name__}",
                     f"{type(trajectory).__module__}.{type(trajectory).__name__}", task.id))
        assert isinstance(trajectory.conversation, list) and trajectory.task_id == task.id
        assert trajectory.output.strip() == f"{task.metadata['n'] * 1.8 + 32:g}", trajectory.output
        good = task.metadata["n"] != 2
        return AeFeedback(success=good, score=1.0 if good else 0.25, detail=f"checked {task.id}",
                          raw={"n": task.metadata["n"], "output": trajectory.output[:20]})


class OddScores(UpstreamAdapter):
    """Verdicts no benchmark should give: out of range, not numbers, an exception, no Feedback."""

    VERDICTS = {"a": 1.5, "b": "high", "c": math.nan, "d": -0.1, "e": True}

    def get_tasks(self, split: str = "train", limit: int = 10) -> list[AeTask]:
        return [AeTask(id=key, input="x") for key in [*self.VERDICTS, "boom", "none"]]

    def evaluate(self, task: AeTask, trajectory: AeTrajectory) -> AeFeedback:
        if task.id == "boom":
            raise RuntimeError("the judge is down")
        if task.id == "none":
            return None  # type: ignore[return-value]
        return AeFeedback(success=True, score=self.VERDICTS[task.id], detail="odd")


class NotABenchmark:
    """Has neither get_tasks nor evaluate."""


class Answers:
    """An agent that answers each task's input back, or fails on one task."""

    workspace_path = ""

    def solve(self, task: Task) -> Trajectory:
        if task.task_id.endswith("-2"):
            raise RuntimeError("the agent crashed")
        return Trajectory(task.task_id, output=f"answer to {task.input}", steps=[{"tool": "say"}])


def test_an_a_evolve_benchmark_instance_runs_a_cycle_with_its_types_converted_both_ways(personas, tmp_path):
    SEEN.clear()
    root = demo_copy(tmp_path)
    evolver = Evolver(root, EchoBench(), {"batch_size": 3, "holdout_size": 0}, engine="textbook")
    assert isinstance(evolver.benchmark, UpstreamBenchmark)
    cycle = evolver.run(cycles=1).cycles[0]
    tasks = [o.task for o in cycle.observations]
    assert [(t.task_id, t.category, t.metadata["n"]) for t in tasks] == [
        ("train-1", "units", 1), ("train-2", "units", 2), ("train-3", "units", 3)]
    assert all(isinstance(t, Task) for t in tasks)
    # evaluate got A-Evolve's own Task objects back, and A-Evolve's Trajectory
    assert {(task, trajectory) for task, trajectory, _ in SEEN} == {
        ("agent_evolve.types.Task", "agent_evolve.types.Trajectory")}
    scores = {o.task.task_id: (o.feedback.success, o.feedback.score, getattr(o.feedback, "raw", None))
              for o in cycle.observations}
    assert scores["train-2"][:2] == (False, 0.25) and scores["train-2"][2]["n"] == 2
    assert scores["train-1"][0] is True and scores["train-1"][2]["n"] == 1


def test_the_trial_runner_converts_an_a_evolve_benchmark_s_tasks_too(personas, tmp_path):
    root = demo_copy(tmp_path)
    Evolver(root, EchoBench(), {"batch_size": 1}, engine="textbook").run(cycles=1)
    trial = TrialRunner(root, benchmark_adapt(EchoBench()), 2)
    tasks = trial.get_tasks("holdout", 2)
    assert [t.task_id for t in tasks] == ["holdout-1", "holdout-2"]
    assert all(isinstance(t, Task) for t in tasks)
    observations = trial.run_tasks(tasks)
    assert [o.feedback.detail for o in observations] == ["checked holdout-1", "checked holdout-2"]


def test_a_verdict_out_of_range_not_a_number_or_an_exception_is_a_failed_observation_with_the_reason():
    observations = solve_batch(Answers(), benchmark_adapt(OddScores(), "odd"),
                               benchmark_adapt(OddScores(), "odd").get_tasks("train", 10), 2)
    said = {o.task.task_id: (o.feedback.success, o.feedback.score, o.feedback.detail) for o in observations}
    assert said["a"] == (False, 0.0, "benchmark odd gave score 1.5, outside 0 to 1: odd")
    assert said["b"] == (False, 0.0, "benchmark odd gave score 'high', not a number: odd")
    assert said["c"][:2] == (False, 0.0) and "nan, not a number" in said["c"][2]
    assert said["d"] == (False, 0.0, "benchmark odd gave score -0.1, outside 0 to 1: odd")
    assert said["e"] == (False, 0.0, "benchmark odd gave score True, not a number: odd")
    assert said["boom"] == (False, 0.0,
                            "the benchmark could not evaluate it: RuntimeError: the judge is down")
    assert said["none"] == (False, 0.0,
                            "benchmark odd gave NoneType, not a Feedback (success, score, detail)")


def test_a_cycle_s_error_handler_takes_a_evolve_tasks_and_tasks_without_an_id():
    class Bench:  # judges Crucible's types: whatever it is handed must have task_id
        def evaluate(self, task, trajectory):
            return benchmarks.feedback_make(not trajectory.error, 0.0 if trajectory.error else 1.0,
                                            trajectory.error or "ok")

    tasks = [AeTask(id="t-1", input="a"), AeTask(id="t-2", input="b"), object()]
    observations = solve_batch(Answers(), Bench(), tasks, 2)
    assert [o.task.task_id for o in observations] == ["t-1", "t-2", "task-3"]
    assert observations[1].trajectory.error == "RuntimeError: the agent crashed"
    assert (observations[1].feedback.success, observations[0].feedback.success) == (False, True)
    assert observations[2].feedback.detail == "a task of type object has no id"


def test_an_agent_that_failed_is_not_shown_to_the_upstream_benchmark():
    SEEN.clear()
    wrapped = benchmark_adapt(EchoBench())
    task = wrapped.get_tasks("train", 1)[0]
    feedback = wrapped.evaluate(task, Trajectory(task.task_id, error="TimeoutError: too slow"))
    assert (feedback.success, feedback.score) == (False, 0.0) and "too slow" in feedback.detail and not SEEN


def test_a_task_the_benchmark_did_not_give_reaches_it_in_its_own_types():
    SEEN.clear()
    wrapped = benchmark_adapt(EchoBench())
    made_here = Task("train-7", "Convert 7 degrees Celsius to Fahrenheit.", "units", {"n": 7})
    feedback = wrapped.evaluate(made_here, Trajectory("train-7", output="44.6"))
    assert SEEN == [("agent_evolve.types.Task", "agent_evolve.types.Trajectory", "train-7")]
    assert feedback.score == 1.0
    assert getattr(feedback, "raw", None) == {"n": 7, "output": "44.6"}


def test_a_dotted_path_to_an_a_evolve_subclass_is_a_benchmark_and_a_plain_object_is_refused():
    made = benchmark_get("tests.evolve_app.test_benchmarks_upstream:EchoBench", trusted=True)
    assert isinstance(made, UpstreamBenchmark) and isinstance(made.inner, EchoBench)
    assert [t.task_id for t in made.get_tasks("train", 2)] == ["train-1", "train-2"]
    with pytest.raises(BenchmarkError, match="is not a benchmark"):
        benchmark_get("tests.evolve_app.test_benchmarks_upstream.NotABenchmark", trusted=True)
    with pytest.raises(BenchmarkError, match="gave NotABenchmark, which has no get_tasks/evaluate"):
        benchmark_adapt(NotABenchmark())
    crucible_own = benchmark_get("demo")
    assert benchmark_adapt(crucible_own) is crucible_own  # Crucible's adapters as they are


# ----------------------------------------------------------------------- A-Evolve's registry keys

# What each key names as missing on a host with a-evolve 0.1.0 and nothing else the keys need.
MISSING = {
    "swe-verified": ["the module agent_evolve.benchmarks.swe_verified", "the Python package swebench",
                     "the Python package datasets", "Docker (the docker command and a daemon that answers)"],
    "mcp-atlas": ["the Python package datasets", "the Python package litellm",
                  "the environment variable EVAL_LLM_API_KEY or LLM_API_KEY", "a server at localhost:1984"],
    "hle": ["the module agent_evolve.benchmarks.hle"],
    "terminal2": ["Docker", "a local dataset folder named by TB2_CHALLENGES_DIR"],
    "terminal-bench": ["Docker", "a local dataset folder named by TB2_CHALLENGES_DIR"],
    "skill-bench": ["Docker", "a local dataset folder named by SKILLBENCH_TASKS_DIR or SKILLBENCH_REPO_DIR"],
    "arc-agi-3": ["the module agent_evolve.benchmarks.arc_agi3", "the Python package arc_agi"],
    "arc-agi3": ["the module agent_evolve.benchmarks.arc_agi3"],
    "arc": ["the module agent_evolve.benchmarks.arc_agi3"],
}


def bare_host(requirement: str) -> bool:
    """This host as the keys see it: a-evolve 0.1.0's own files, and nothing else they need."""
    return requirement.startswith(("python:agent_evolve", "module:")) and REAL_HOST_HAS(requirement)


@pytest.mark.parametrize("key", sorted(MISSING))
def test_each_a_evolve_key_is_refused_naming_what_this_host_lacks(key, monkeypatch):
    monkeypatch.setattr(benchmarks, "host_has", bare_host)
    with pytest.raises(BenchmarkError) as refused:
        benchmark_check(key)
    message = str(refused.value)
    assert message.startswith(f"benchmark {key} (A-Evolve's ") and "cannot run on this host" in message
    for piece in MISSING[key]:
        assert piece in message


def test_every_key_of_a_evolve_s_registry_is_in_the_table():
    from agent_evolve.api import _BENCHMARK_REGISTRY

    assert set(_BENCHMARK_REGISTRY) <= set(AEVOLVE_BENCHMARKS)
    for key, path in _BENCHMARK_REGISTRY.items():
        assert AEVOLVE_BENCHMARKS[key].paths[0] == path


@pytest.fixture
def test_key(monkeypatch):
    """A registry entry for a test benchmark that needs Docker, and a host that has it or not."""
    monkeypatch.setitem(AEVOLVE_BENCHMARKS, "echo-bench", UpstreamKey(
        ("tests.evolve_app.test_benchmarks_upstream.EchoBench",),
        (Need("docker", "its tasks run in containers"),), "a test benchmark"))
    has = {"docker": True}
    monkeypatch.setattr(benchmarks, "host_has", lambda requirement: has["docker"] if requirement == "docker"
                        else REAL_HOST_HAS(requirement))
    return has


def test_a_key_whose_requirements_are_met_resolves_to_its_class_wrapped(test_key):
    benchmark_check("echo-bench")
    made = benchmark_get("echo-bench")
    assert isinstance(made, UpstreamBenchmark) and isinstance(made.inner, EchoBench)
    test_key["docker"] = False
    with pytest.raises(BenchmarkError, match=(
            r"echo-bench \(a test benchmark\) cannot run on this host, which lacks Docker \(the docker "
            r"command and a daemon that answers\) — its tasks run in containers")):
        benchmark_get("echo-bench")


def start(user, agent, benchmark: str):
    return post(bearer(user), f"/api/agents/{agent.pk}/runs", {"benchmark": benchmark, "cycles": 1})


def test_a_key_is_refused_on_the_api_and_the_page_and_offered_with_what_it_needs(
        personas, demo_agent, test_key):
    test_key["docker"] = False
    refused = start(personas.member, demo_agent, "echo-bench")
    assert refused.status_code == 400
    assert "lacks Docker" in refused.json()["errors"]["benchmark"][0]
    page = login(personas.member).post(f"/agents/{demo_agent.pk}/runs/start/", {
        "benchmark": "echo-bench", "engine": "textbook", "cycles": "1"})
    assert page.status_code == 400 and "lacks Docker" in page.context["start_form"].errors["benchmark"][0]
    assert not EvolutionRun.objects.exists()
    offered = {name: (what, argument) for name, what, argument in benchmark_choices()}
    assert offered["echo-bench"] == ("a test benchmark; this host lacks Docker (the docker command and a "
                                     "daemon that answers)", None)
    assert "this host lacks the module agent_evolve.benchmarks.hle" in offered_now("hle")
    form = login(personas.member).get(f"/agents/{demo_agent.pk}/").content.decode()
    assert "hle — A-Evolve&#x27;s Humanity&#x27;s Last Exam; this host lacks" in form
    test_key["docker"] = True
    assert start(personas.member, demo_agent, "echo-bench").status_code == 202


def offered_now(name: str) -> str:
    return next(what for key, what, _ in benchmark_choices() if key == name)


def test_the_cli_refuses_a_key_at_once_with_exit_1_and_no_run(personas, demo_agent, settings):
    command = [sys.executable, "manage.py", "evolve", "run", str(demo_agent.pk), "--cycles", "1",
               "--benchmark", "hle", "--json", "--user", "owner"]
    env = subprocess_env(CRUCIBLE_DATA_DIR=str(settings.DATA_DIR))
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1, done.stdout
    assert "benchmark hle (A-Evolve's Humanity's Last Exam) cannot run on this host" in done.stderr
    assert "the module agent_evolve.benchmarks.hle" in done.stderr
    assert not EvolutionRun.objects.exists()
    assert json.loads(done.stdout or "null") is None
