"""`manage.py evolve …` as real subprocesses against the test database: the demo agent evolving
cycle by cycle, JSON output, status, history, rollback, cancel, and one-line refusals."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evolve_app import services
from evolve_app.demo import SEED_WORKSPACE
from evolve_app.engines import EvolutionEngine
from evolve_app.models import Agent, EvolutionRun
from evolve_app.types import StepResult
from runtime_app import access
from runtime_app.models import ProjectMembership
from runtime_app.selectors import page_url
from tests.evolve_app.import_shapes import tree_snapshot
from tests.helpers import REPO_ROOT, ctrl_c_reaches_it, subprocess_env
from tests.search_app.fixtures import demo  # noqa: F401  (the admin user and the demo project)

pytestmark = pytest.mark.django_db(transaction=True)


def evolve(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    from django.conf import settings

    return subprocess.run([sys.executable, "manage.py", "evolve", *args], cwd=REPO_ROOT,
                          env=subprocess_env(CRUCIBLE_DATA_DIR=str(settings.DATA_DIR)),
                          capture_output=True, text=True, timeout=timeout)


def git(path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    return settings.DATA_DIR


@pytest.fixture
def admin(demo):  # noqa: F811
    return demo.created_by


@pytest.fixture
def demo_agent(demo, admin, data_dir):  # noqa: F811
    return services.demo_agent_create(admin, demo)


def test_the_demo_agent_evolves_three_cycles_printing_each_score_and_a_final_table(demo, data_dir):  # noqa: F811
    made = evolve("demo")
    assert made.returncode == 0, made.stderr
    agent_id = int(re.search(r"^agent id\s+(\d+)$", made.stdout, re.M).group(1))
    agent = Agent.objects.get(pk=agent_id)
    assert f"path      {agent.path}" in made.stdout and agent.path.startswith(str(data_dir))

    done = evolve("run", str(agent_id), "--cycles", "3")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    run = EvolutionRun.objects.get()
    url = page_url(f"/agents/{agent.pk}/runs/{run.number}/")
    assert lines[0] == f"Started run {run.number} of {agent.name} (id {run.pk}): {url}"
    assert lines[1] == f"{agent.name} run {run.number}: textbook on demo, 3 cycles"
    assert lines[2] == "cycle 1: score 0.25, accepted (+date-arithmetic): added skill date-arithmetic"
    assert lines[3].startswith("cycle 2: score 0.5, accepted (+string-transforms)")
    assert lines[4].startswith("cycle 3: score 0.75, accepted (+number-bases)")
    assert f"{agent.name} run {run.number} (textbook on demo): finished" in done.stdout
    assert "score 0.25 → 0.75" in done.stdout and "3 cycles done" in done.stdout
    assert {"evo-3", "pre-evo-3"} <= set(git(agent.path, "tag").split())


def test_run_json_status_history_and_cancel_agree_with_the_database(demo_agent):
    done = evolve("run", str(demo_agent.pk), "--cycles", "2", "--batch-size", "8", "--egl-window", "2",
                  "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    started = f"Started run {report['number']} of {demo_agent.name} (id {report['id']}): http"
    assert started in done.stderr  # stdout stays JSON
    assert (report["status"], report["agent_id"], report["config"]["batch_size"]) == ("finished",
                                                                                      demo_agent.pk, 8)
    assert [(c["number"], c["score"], c["train_count"]) for c in report["cycles"]] == [(1, 0.25, 8),
                                                                                     (2, 0.5, 8)]

    status = evolve("status", str(report["id"]), "--json")
    assert json.loads(status.stdout)["cycles"] == report["cycles"]
    table = evolve("status", str(report["id"])).stdout
    assert f"{demo_agent.name} run {report['number']} (textbook on demo): finished" in table
    assert "+string-transforms" in table

    history = json.loads(evolve("history", str(demo_agent.pk), "--json").stdout)
    assert [v["tag"] for v in history["versions"]] == ["evo-0", "pre-evo-1", "evo-1", "pre-evo-2", "evo-2"]
    assert [(p["cycle"], p["score"]) for p in history["score_curve"]] == [(1, 0.25), (2, 0.5)]
    shown = evolve("history", str(demo_agent.pk)).stdout
    assert "Cycle 2: added skill string-transforms" in shown and "0.25 0.5" in shown

    over = evolve("cancel", str(report["id"]))
    assert over.returncode == 1
    assert over.stderr.strip() == f"Run {report['number']} is finished: nothing to cancel."


def test_history_dates_its_versions_as_every_page_does_in_utc(demo_agent):
    from evolve_app.selectors import agent_report
    from runtime_app.templatetags.crucible_dates import when

    shown = evolve("history", str(demo_agent.pk))
    assert shown.returncode == 0, shown.stderr
    first = agent_report(demo_agent)["versions"][0]
    row = next(line for line in shown.stdout.splitlines() if " evo-0 " in line)
    assert when(first["date"]).endswith(" UTC") and when(first["date"]) in row
    assert not re.search(r"\d\d:\d\d:\d\d", shown.stdout)  # never a second format, to the second


def test_a_workspace_path_is_imported_and_run_in_one_command(demo, data_dir, tmp_path):  # noqa: F811
    folder = tmp_path / "my-agent"
    shutil.copytree(SEED_WORKSPACE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    before = tree_snapshot(folder)
    done = evolve("run", str(folder), "--cycles", "1", "--json")
    assert done.returncode == 0, done.stderr
    agent = Agent.objects.get(source_path=str(folder))
    assert json.loads(done.stdout)["agent_id"] == agent.pk and agent.project == demo
    assert git(agent.path, "tag").split() == ["evo-0", "evo-1", "pre-evo-1"]
    assert tree_snapshot(folder) == before  # the runs happen in Crucible's copy
    again = evolve("run", str(folder), "--cycles", "1", "--json")  # the same agent, its second run
    assert again.returncode == 0, again.stderr
    assert Agent.objects.get().pk == agent.pk and git(agent.path, "tag").split()[-1] == "pre-evo-2"


class QuietEngine(EvolutionEngine):
    """An engine of our own, named by its dotted path from the CLI."""

    def step(self, workspace, observations, history, trial):
        return StepResult(False, "the quiet engine ran", {})


def test_the_cli_may_name_an_engine_and_a_benchmark_by_dotted_path(demo_agent):
    done = evolve("run", str(demo_agent.pk), "--cycles", "1", "--json",
                  "--engine", "tests.evolve_app.test_cli.QuietEngine",
                  "--benchmark", "tests.evolve_app.test_benchmarks:TinyBenchmark")
    assert done.returncode == 0, done.stderr
    run = EvolutionRun.objects.get()
    assert (run.status, run.trusted) == ("finished", True)
    assert run.engine == "tests.evolve_app.test_cli.QuietEngine"
    cycle = run.cycles.get()
    assert cycle.summary == "the quiet engine ran" and cycle.observations.get().task_id == "tiny-1"


def test_the_cli_may_name_a_benchmark_file_outside_the_allowed_directories(demo_agent, tmp_path):
    tasks = tmp_path / "elsewhere" / "tasks.jsonl"
    tasks.parent.mkdir()
    tasks.write_text('{"task_id": "t1", "input": "Convert 1 km to m.", "expected": "1000"}\n')
    done = evolve("run", str(demo_agent.pk), "--cycles", "1", "--json", "--benchmark", f"jsonl:{tasks}")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["benchmark"] == f"jsonl:{tasks}"


def test_rollback_needs_an_approver_then_makes_a_new_commit(demo_agent, admin):
    assert evolve("run", str(demo_agent.pk), "--cycles", "2", "--json").returncode == 0
    refused = evolve("rollback", str(demo_agent.pk), "evo-1")
    assert refused.returncode == 1
    assert refused.stderr.strip() == "admin: This needs the approver role in demo (yours is operator)."
    ProjectMembership.objects.filter(user=admin, project=demo_agent.project).update(role=access.APPROVER)
    bad = evolve("rollback", str(demo_agent.pk), "main")
    assert (bad.returncode, bad.stderr.strip()) == (1, "tag: Roll back to a tag like evo-3.")
    done = evolve("rollback", str(demo_agent.pk), "evo-1")
    assert done.returncode == 0, done.stderr
    sha = done.stdout.strip().rsplit(" ", 1)[-1]
    assert done.stdout.startswith(f"{demo_agent.name} (agent {demo_agent.pk}) rolled back to evo-1")
    assert git(demo_agent.path, "rev-parse", f"{sha}^{{tree}}") == git(demo_agent.path, "rev-parse",
                                                                         "evo-1^{tree}")


def test_review_mode_stops_at_the_first_mutation_and_cancel_ends_the_waiting_run(demo_agent):
    done = evolve("run", str(demo_agent.pk), "--cycles", "3", "--review-mode")
    assert done.returncode == 0, done.stderr
    run = EvolutionRun.objects.get()
    cycle = run.cycles.get()
    assert run.status == "awaiting_review" and cycle.status == "awaiting_review"
    assert "cycle 1: score 0.25, awaiting review" in done.stdout
    assert f"cycle 1 (id {cycle.pk}) awaits an approver" in done.stdout
    cancelled = evolve("cancel", str(run.pk))
    assert (cancelled.returncode, cancelled.stdout.strip()) == (0, f"run {run.number}: cancelled")
    run.refresh_from_db()
    assert run.status == "cancelled" and run.reason == "cancelled by admin"


def test_a_broken_workspace_is_refused_with_every_problem_as_file_and_line(demo, data_dir, tmp_path):  # noqa: F811
    folder = tmp_path / "broken"
    (folder / "prompts").mkdir(parents=True)
    (folder / "manifest.yaml").write_text("agent:\n  type: command\nevolvable_layer: [skills]\n"
                                          "reload_strategy: warm\n")
    done = evolve("import", str(folder))
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert "manifest.yaml:3:1: missing required key 'evolvable_layers' (a list from prompts, skills, " \
           "memory, tools); 'evolvable_layer' on line 3 looks like a misspelling of it" in lines
    assert any(line.startswith("manifest.yaml:4:18: reload_strategy: 'warm'") for line in lines)
    assert any(line.startswith("prompts/system.md: missing") for line in lines)
    assert lines[-1] == f"{folder}: {len(lines) - 1} problems, nothing imported"
    assert not Agent.objects.exists() and not (folder / ".git").exists()
    missing = evolve("import", str(tmp_path / "nope"))
    assert (missing.returncode, missing.stderr.strip()) == (1, f"{tmp_path / 'nope'}: no such folder.")


def test_bad_run_settings_are_refused_with_one_line_each(demo_agent):
    done = evolve("run", str(demo_agent.pk), "--cycles", "0", "--egl-window", "1", "--engine", "nope")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert "cycles: Give 1 to 200 cycles." in lines
    assert any(line.startswith("config: egl_window:") for line in lines)
    assert any(line.startswith("engine: unknown engine 'nope'") for line in lines)
    assert not EvolutionRun.objects.exists()


@pytest.mark.parametrize(("args", "message"), [
    (("status", "999"), "no evolution run 999 that admin can see"),
    (("cancel", "999"), "no evolution run 999 that admin can see"),
    (("history", "999"), "no agent 999 that admin can see"),
    (("rollback", "999", "evo-1"), "no agent 999 that admin can see"),
    (("run", "999"), "no agent 999 that admin can see"),
    (("demo", "--project", "nope"), "no project named 'nope': create it first (`manage.py crucible_setup` "
                                    "makes `demo`) or pass --project"),
    (("demo", "--user", "nobody"), "no user named 'nobody': pass --user with an existing account"),
])
def test_an_unknown_object_is_one_line_and_exit_1(demo, data_dir, args, message):  # noqa: F811
    done = evolve(*args)
    assert (done.returncode, done.stderr.strip()) == (1, message)


def test_interrupting_a_run_cancels_it_between_cycles_and_exits_130(demo_agent):
    import signal
    import time

    from django.conf import settings

    process = subprocess.Popen(
        # The most cycles a run may have: a starved test process must still find it running.
        [sys.executable, "manage.py", "evolve", "run", str(demo_agent.pk), "--cycles", "200",
         "--egl-threshold", "0", "--json"], cwd=REPO_ROOT,
        env=subprocess_env(CRUCIBLE_DATA_DIR=str(settings.DATA_DIR)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_it)
    try:
        deadline = time.monotonic() + 120
        while not EvolutionRun.objects.filter(cycles__number=1).exists():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    run = EvolutionRun.objects.get()
    assert process.returncode == 130 and out == "", (run.status, run.reason, err[-2000:])
    assert run.status == "cancelled" and 1 <= run.cycles.count() < 200
    done = run.cycles.count()
    cycles = f"{done} cycle{'s' if done > 1 else ''}"
    assert err.splitlines()[-1] == (f"run {run.number} cancelled after {cycles}: "
                                    f"`manage.py evolve status {run.pk}` shows them")
    # Stopped between cycles: every recorded cycle has its evo-N, and nothing is left uncommitted.
    tags = set(git(demo_agent.path, "tag").split())
    assert {f"evo-{n}" for n in range(1, run.cycles.count() + 1)} <= tags
    assert git(demo_agent.path, "status", "--porcelain") == ""


class OptionsEngine(EvolutionEngine):
    """Says which options it was made with."""

    def __init__(self, model: str = "", preset: str = "", rounds: int = 0, careful: bool = False,
                 temperature: float = 0.0) -> None:
        self.options = {"model": model, "preset": preset, "rounds": rounds, "careful": careful,
                        "temperature": temperature}

    def step(self, workspace, observations, history, trial):
        return StepResult(False, json.dumps(self.options, sort_keys=True), {})


def test_engine_options_come_from_a_file_and_from_option_flags_which_win(demo_agent, tmp_path):
    options = tmp_path / "engine.toml"
    options.write_text('model = "from-file"\npreset = "anthropic"\nrounds = 2\n')
    done = evolve("run", str(demo_agent.pk), "--cycles", "1", "--json", "--engine",
                  "tests.evolve_app.test_cli.OptionsEngine", "--options", str(options),
                  "--option", "model=claude-x", "--option", "careful=true", "--option", "temperature=0.5")
    assert done.returncode == 0, done.stderr
    run = EvolutionRun.objects.get()
    expected = {"model": "claude-x", "preset": "anthropic", "rounds": 2, "careful": True, "temperature": 0.5}
    assert run.config["engine_options"] == expected
    assert json.loads(run.cycles.get().summary) == expected
    as_json = tmp_path / "engine.json"
    as_json.write_text('{"rounds": 3, "careful": false}')
    done = evolve("run", str(demo_agent.pk), "--cycles", "1", "--json", "--engine",
                  "tests.evolve_app.test_cli.OptionsEngine", "--options", str(as_json))
    assert done.returncode == 0, done.stderr
    latest = EvolutionRun.objects.order_by("-pk").first()
    assert latest.config["engine_options"] == {"rounds": 3, "careful": False}


def test_bad_engine_options_are_refused_before_anything_runs(demo, data_dir, demo_agent, tmp_path):  # noqa: F811
    bad = evolve("run", str(demo_agent.pk), "--engine", "textbook", "--option", "per_cycle=many")
    assert (bad.returncode, bad.stderr.strip()) == (
        1, "engine: textbook: option per_cycle must be a whole number, got 'many'")
    folder = tmp_path / "not-yet-imported"
    shutil.copytree(SEED_WORKSPACE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    unknown = evolve("run", str(folder), "--engine", "textbook", "--option", "colour=red")
    assert unknown.returncode == 1 and unknown.stderr.startswith("engine: textbook has no option 'colour'")
    assert not (folder / ".git").exists() and not Agent.objects.filter(path=str(folder)).exists()
    toml = tmp_path / "broken.toml"
    toml.write_text('model = "x"\n[section\nrounds = 2\n')
    broken = evolve("run", str(demo_agent.pk), "--options", str(toml))
    assert broken.returncode == 1 and broken.stderr.startswith(f"{toml}:2:9: ")
    json_file = tmp_path / "broken.json"
    json_file.write_text('{\n  "model": "x",\n  "rounds": \n}\n')
    broken = evolve("run", str(demo_agent.pk), "--options", str(json_file))
    assert broken.returncode == 1 and broken.stderr.startswith(f"{json_file}:4:1: Expecting value")
    for args, message in ((("--option", "novalue"), "--option 'novalue': give KEY=VALUE"),
                          (("--options", str(tmp_path / "x.yaml")), "takes a .toml or .json file")):
        refused = evolve("run", str(demo_agent.pk), *args)
        assert refused.returncode == 1 and message in refused.stderr
    layers = evolve("run", str(demo_agent.pk), "--convergence", "a-evolve", "--evolve-layers", "skills,infra")
    assert layers.returncode == 1 and "evolve_layers: Value error, 'infra': the layers are" in layers.stderr
    window = evolve("run", str(demo_agent.pk), "--convergence", "crucible", "--egl-window", "1")
    assert window.returncode == 1 and "a window of 1 needs convergence a-evolve" in window.stderr
    assert not EvolutionRun.objects.exists()


def test_skillforge_runs_with_a_model_and_preset_given_as_options(demo_agent):
    from django.conf import settings

    from tests.fakes.anthropic_server import FakeAnthropic

    def script(request, _candidate):
        return [{"type": "text", "text": "The workspace is fine as it is."}]

    with FakeAnthropic(script=script) as fake:
        done = subprocess.run(
            [sys.executable, "manage.py", "evolve", "run", str(demo_agent.pk), "--cycles", "1", "--json",
             "--engine", "skillforge", "--option", "preset=anthropic", "--option", "model=fake-sonnet",
             "--option", "effort=off"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
            env=subprocess_env(CRUCIBLE_DATA_DIR=str(settings.DATA_DIR), ANTHROPIC_BASE_URL=fake.base_url,
                               ANTHROPIC_API_KEY="sk-ant-cli-options-0123456789"))
    assert done.returncode == 0, done.stderr
    cycle = EvolutionRun.objects.get().cycles.get()
    assert cycle.status == "accepted" and cycle.summary.startswith("The workspace is fine"), cycle.reason


def test_an_a_evolve_style_engine_runs_from_the_cli_until_it_asks_to_stop(demo_agent):
    done = evolve("run", str(demo_agent.pk), "--cycles", "5", "--json",
                  "--engine", "tests.evolve_app.test_loop_contract.AEvolveStyle")
    assert done.returncode == 0, done.stderr
    run = EvolutionRun.objects.get()
    assert (run.status, run.reason) == ("finished", "the engine asked to stop")
    assert list(run.cycles.order_by("number").values_list("number", "status")) == [
        (1, "accepted"), (2, "accepted")]
    assert sorted(p.name for p in (Path(demo_agent.path) / "evolution" / "observations").iterdir()) == [
        "batch_0001.jsonl", "batch_0002.jsonl"]
