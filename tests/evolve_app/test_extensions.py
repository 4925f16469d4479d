"""An operator cannot make the server import or call anything by naming it: engines, benchmarks
and agent classes are named, not imported, from the API and the start form; a dotted path works
only from the CLI or when an administrator lists it; benchmark paths obey CRUCIBLE_REPO_ROOTS
and say nothing about files outside them; the worker checks again, so a stored row or a changed
manifest cannot smuggle an import. Written as the attacker would, through the real API (bearer
token) and the real form (logged in)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import sys
import uuid
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from django.db import connections

from evolve_app import extensions, services
from evolve_app.agents import AgentError
from evolve_app.demo import SEED_WORKSPACE
from evolve_app.engines import ENGINES, EngineError
from evolve_app.models import EvolutionRun
from tests.evolve_app.helpers import SEED_MANIFEST
from tests.evolve_app.test_api import bearer, post
from tests.helpers import login

pytestmark = pytest.mark.django_db(transaction=True)

PROBE_SOURCE = '''"""Records that it was imported: the attacker's module with side effects."""
import pathlib

pathlib.Path(__file__).with_name("imported").write_text("imported")

from evolve_app.agents import CommandAgent
from evolve_app.benchmarks import BenchmarkAdapter
from evolve_app.engines import EvolutionEngine
from evolve_app.types import StepResult


class Engine(EvolutionEngine):
    name = "probe"

    def step(self, workspace, observations, history, trial):
        return StepResult(False, "the probe engine ran", {})


class Agent(CommandAgent):
    pass


class Bench(BenchmarkAdapter):
    pass
'''


@dataclasses.dataclass
class Probe:
    name: str
    folder: Path

    def imported(self) -> bool:
        return self.name in sys.modules or (self.folder / "imported").exists()


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """A module of our own on sys.path (a new name each test) that records its import."""
    name = f"crucible_probe_{uuid.uuid4().hex[:10]}"
    folder = tmp_path / "probe" / name
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(PROBE_SOURCE)
    monkeypatch.syspath_prepend(str(folder.parent))
    yield Probe(name, folder)
    sys.modules.pop(name, None)



def allow(settings, *paths: str) -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, allowed_extensions=tuple(paths))


def start(user, agent, **body):
    return post(bearer(user), f"/api/agents/{agent.pk}/runs", {"cycles": 1, **body})


def manifest_set(agent, agent_section: str) -> None:
    text = (SEED_WORKSPACE / "manifest.yaml").read_text()
    old = "agent:\n  type: command\n  entrypoint: evolve_app.agents.CommandAgent\n"
    assert old in text
    (Path(agent.path) / "manifest.yaml").write_text(text.replace(old, agent_section))


def in_a_child(call):
    """(the child's wait status, what `call` returned) for `call` run in a forked child, so an
    attack that kills its process fails the test instead of ending the test run."""
    connections.close_all()  # SQLite handles must not cross a fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read)
            os.write(write, json.dumps(call()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        said = pipe.read()
    _, status = os.waitpid(pid, 0)
    return status, json.loads(said) if said else None


# ------------------------------------------------------------------------------------- engines


def test_os_system_named_as_the_engine_never_runs_its_command(personas, demo_agent, tmp_path):
    marker = tmp_path / "owned"
    response = start(personas.member, demo_agent, engine="os.system",
                     config={"engine_options": {"command": f"touch {marker}"}})
    assert not marker.exists()
    assert response.status_code == 400
    message = response.json()["errors"]["engine"][0]
    assert "'os.system' is a dotted path" in message and "nothing was imported" in message
    assert "CRUCIBLE_ALLOWED_EXTENSIONS" in message
    assert not EvolutionRun.objects.exists()


def test_os_abort_named_as_the_engine_is_a_400_and_the_server_lives_on(personas, demo_agent):
    client = bearer(personas.member)
    url = f"/api/agents/{demo_agent.pk}/runs"

    def attack():
        response = post(client, url, {"cycles": 1, "engine": "os.abort"})
        return [response.status_code, response.json()]

    status, said = in_a_child(attack)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the request killed its process ({status})"
    assert said[0] == 400 and "'os.abort' is a dotted path" in said[1]["errors"]["engine"][0]


def test_the_start_form_refuses_os_abort_and_a_dotted_engine_without_importing_it(
        personas, demo_agent, probe):
    form = {"benchmark": "demo", "cycles": "1"}
    client = login(personas.member)
    url = f"/agents/{demo_agent.pk}/runs/start/"

    def attack():
        response = client.post(url, {**form, "engine": "os.abort"})
        return [response.status_code, response.context["start_form"].errors.get("engine", [])]

    status, said = in_a_child(attack)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the request killed its process ({status})"
    assert said[0] == 400 and "'os.abort' is a dotted path" in said[1][0]
    response = client.post(url, {**form, "engine": f"{probe.name}.Engine"})
    assert response.status_code == 400
    assert "is a dotted path" in response.context["start_form"].errors["engine"][0]
    assert not probe.imported()
    response = client.post(url, {**form, "benchmark": "jsonl:/etc/passwd", "engine": "textbook"})
    assert response.status_code == 400
    assert "under an allowed directory" in response.context["start_form"].errors["benchmark"][0]
    assert not EvolutionRun.objects.exists()


def test_an_inner_engine_or_a_smuggled_trust_option_is_refused_too(personas, demo_agent, probe):
    for engine, options in (("adaptive", {"inner": f"{probe.name}.Engine"}),
                            ("search", {"inner": "adaptive", "trusted": 1}),
                            ("evolve_app.engines.SearchEngine", {"inner": f"{probe.name}:Engine"})):
        response = start(personas.member, demo_agent, engine=engine, config={"engine_options": options})
        assert response.status_code == 400, (engine, options)
        assert set(response.json()["errors"]) == {"engine"}
    assert not probe.imported()


def test_a_textbook_path_outside_the_roots_is_refused_alike_whether_it_exists_or_not(
        personas, demo_agent, roots):
    said = []
    for path in ("/etc/passwd", "/nonexistent/textbook.json"):
        response = start(personas.member, demo_agent, engine="textbook",
                         config={"engine_options": {"textbook": path}})
        assert response.status_code == 400
        said.append(response.json()["errors"]["engine"])
    assert said[0] == said[1] and "under an allowed directory" in said[0][0]


def _never(init):
    @functools.wraps(init)  # the signature stays inspectable
    def never(*args, **kwargs):
        raise AssertionError("an engine was constructed to check a request")

    return never


def test_built_in_engines_are_checked_by_their_signature_without_being_made(monkeypatch):
    from evolve_app.engines import engine_check  # here: the attacks above also run against older code

    for cls in ENGINES.values():
        monkeypatch.setattr(cls, "__init__", _never(cls.__init__))
    engine_check("search", {"inner": "adaptive", "n": 2, "window": 2, "model": "m"})
    engine_check("adaptive", {"inner": "textbook", "per_cycle": 2})
    engine_check("evolve_app.engines.TextbookEngine", {"per_cycle": 2})
    for options, message in (({"n": 0}, "n is 1 to 16"), ({"n": "many"}, "must be a whole number"),
                             ({"bogus": 1}, "textbook has no option 'bogus'")):
        with pytest.raises(EngineError, match=message):
            engine_check("search", options)


# ---------------------------------------------------------------------------------- benchmarks


@pytest.mark.parametrize("spec", ["os.system", "subprocess.getoutput", "subprocess:getoutput"])
def test_a_dotted_benchmark_name_is_a_400_that_imports_nothing(personas, demo_agent, spec):
    response = start(personas.member, demo_agent, benchmark=spec)
    assert response.status_code == 400
    message = response.json()["errors"]["benchmark"][0]
    assert f"benchmark {spec!r} is a dotted path, and the web and API may name only registered" in message


def test_a_benchmark_module_of_the_attackers_is_never_imported(personas, demo_agent, probe):
    for spec in (f"{probe.name}:Bench", f"{probe.name}.Bench"):
        assert start(personas.member, demo_agent, benchmark=spec).status_code == 400
    assert not probe.imported()


@pytest.mark.parametrize("configured", [True, False], ids=["roots set", "no roots"])
def test_benchmark_paths_outside_the_roots_get_one_answer_whether_they_exist_or_not(
        personas, demo_agent, roots, settings, configured):
    if not configured:
        settings.CONFIG = dataclasses.replace(settings.CONFIG, repo_roots=[])
    answers = {}
    for spec in ("jsonl:/etc/passwd", "jsonl:/nonexistent/x", "folder:/etc", "folder:/nonexistent",
                 f"jsonl:{roots}{'/..' * 12}/etc/passwd"):
        response = start(personas.member, demo_agent, benchmark=spec)
        assert response.status_code == 400, spec
        answers[spec] = response.json()["errors"]["benchmark"]
    said = {json.dumps(said) for said in answers.values()}
    assert len(said) == 1, answers
    assert "passwd" not in said.pop() and "under an allowed directory" in answers["jsonl:/etc/passwd"][0]


def test_a_benchmark_under_the_roots_is_accepted_from_the_api(personas, demo_agent, roots):
    tasks = roots / "tasks.jsonl"
    tasks.write_text('{"task_id": "t1", "input": "6 x 7?", "expected": "42"}\n')
    response = start(personas.member, demo_agent, benchmark=f"jsonl:{tasks}")
    assert response.status_code == 202, response.json()
    missing = start(personas.owner, demo_agent, benchmark=f"jsonl:{roots / 'missing.jsonl'}")
    assert missing.status_code == 400 and "no such file" in missing.json()["errors"]["benchmark"][0]


# --------------------------------------------------------------------------------- agent types


def test_a_manifest_naming_os_system_as_its_agent_is_refused_when_the_run_is_requested(
        personas, demo_agent):
    manifest_set(demo_agent, "agent:\n  type: os.system\n  entrypoint: os.system\n")
    response = start(personas.member, demo_agent)
    assert response.status_code == 400
    message = response.json()["errors"]["agent"][0]
    assert "agent.type 'os.system' names a Python class" in message
    assert "CRUCIBLE_ALLOWED_EXTENSIONS" in message
    assert not EvolutionRun.objects.exists()


def test_the_start_form_shows_why_the_workspace_agent_is_refused(personas, demo_agent):
    manifest_set(demo_agent, "agent:\n  type: os.system\n  entrypoint: os.system\n")
    response = login(personas.member).post(f"/agents/{demo_agent.pk}/runs/start/", {
        "benchmark": "demo", "engine": "textbook", "cycles": "1"})
    assert response.status_code == 400
    shown = response.context["start_form"].non_field_errors()
    assert "agent.type 'os.system' names a Python class" in shown[0]
    assert not EvolutionRun.objects.exists()


def test_an_a_evolve_workspace_imports_and_its_class_is_stood_in_for_never_imported(
        personas, roots, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://api.anthropic.com")
    shutil.copytree(SEED_WORKSPACE, roots / "swe", ignore=shutil.ignore_patterns("__pycache__"))
    (roots / "swe" / "manifest.yaml").write_text(SEED_MANIFEST)
    member = bearer(personas.member)
    imported = post(member, "/api/agents/import", {"project": personas.alpha.pk, "path": str(roots / "swe")})
    assert imported.status_code == 201, imported.json()
    refused = post(member, f"/api/agents/{imported.json()['id']}/runs", {"cycles": 1})
    assert refused.status_code == 400
    message = refused.json()["errors"]["agent"][0]
    # Not the class (Crucible's reference agent stands in for it): what the run would lack.
    assert "names a Python class" not in message
    assert "no model" in message and "has no key here" in message
    # The agent's module is never imported (A-Evolve's engines may be, by the adapter's tests).
    assert not [name for name in sys.modules if name.startswith("agent_evolve.agents")]


def test_an_agent_class_of_the_attackers_is_never_imported(personas, demo_agent, probe):
    for section in (f"agent:\n  type: {probe.name}.Agent\n  entrypoint: {probe.name}.Agent\n",
                    f"agent:\n  type: command\n  entrypoint: {probe.name}.Agent\n"):
        manifest_set(demo_agent, section)
        assert start(personas.member, demo_agent).status_code == 400
    assert not probe.imported()


# ------------------------------------------------------------------------- allowed and trusted


def test_installed_entry_points_are_chosen_by_name_and_loaded_only_by_the_worker(
        personas, demo_agent, probe, monkeypatch):
    points = {group: [EntryPoint(name="probe", value=f"{probe.name}:{attribute}", group=group)]
              for group, attribute in (("crucible.engines", "Engine"), ("crucible.agents", "Agent"),
                                       ("crucible.benchmarks", "Bench"))}
    monkeypatch.setattr(extensions, "entry_points", lambda group: points.get(group, []))
    # The entry point is the class: the manifest's dotted entrypoint is neither needed nor imported.
    manifest_set(demo_agent, "agent:\n  type: probe\n  entrypoint: probe.Agent\n")
    response = start(personas.member, demo_agent, engine="probe", benchmark="probe:anything")
    assert response.status_code == 202, response.json()
    assert not probe.imported()  # metadata only
    EvolutionRun.objects.filter(pk=response.json()["id"]).update(benchmark="demo")  # Bench has no tasks
    run = services.evolution_run_execute(response.json()["id"])
    assert run.status == "finished", run.reason
    assert probe.imported() and run.cycles.get().summary == "the probe engine ran"



def test_an_administrator_listed_dotted_path_works_from_the_api_and_only_the_worker_imports_it(
        personas, demo_agent, probe, settings):
    engine = f"{probe.name}.Engine"
    allow(settings, engine)
    response = start(personas.member, demo_agent, engine=engine)
    assert response.status_code == 202, response.json()
    assert not probe.imported()  # the request checked the name only
    run = services.evolution_run_execute(response.json()["id"])
    assert (run.status, run.trusted) == ("finished", False)
    assert probe.imported()
    assert run.cycles.get().summary == "the probe engine ran"
    # The exact spelling is listed, nothing more.
    other = start(personas.member, demo_agent, engine=f"{probe.name}:Engine")
    assert other.status_code == 400


def test_an_allowed_agent_class_is_honoured(personas, demo_agent, probe, settings):
    manifest_set(demo_agent, f"agent:\n  type: command\n  entrypoint: {probe.name}.Agent\n")
    assert start(personas.member, demo_agent).status_code == 400
    allow(settings, f"{probe.name}.Agent")
    response = start(personas.member, demo_agent)
    assert response.status_code == 202 and not probe.imported()
    run = services.evolution_run_execute(response.json()["id"])
    assert run.status == "finished" and run.cycles.get().score == 0.25 and probe.imported()


def test_the_worker_refuses_a_dotted_path_written_into_the_run_row_afterwards(personas, demo_agent, probe):
    response = start(personas.member, demo_agent)
    assert response.status_code == 202
    EvolutionRun.objects.filter(pk=response.json()["id"]).update(engine=f"{probe.name}.Engine")
    run = services.evolution_run_execute(response.json()["id"])
    assert run.status == "failed" and "is a dotted path" in run.reason
    assert not probe.imported()


def test_the_worker_refuses_a_manifest_changed_after_the_run_was_checked(personas, demo_agent, probe):
    response = start(personas.member, demo_agent)
    assert response.status_code == 202
    manifest_set(demo_agent, f"agent:\n  type: command\n  entrypoint: {probe.name}.Agent\n")
    run = services.evolution_run_execute(response.json()["id"])
    assert run.status == "failed" and "names a Python class" in run.reason
    assert not probe.imported()


def test_a_trusted_start_may_name_a_dotted_path_and_keeps_its_trust(personas, demo_agent, probe):
    from evolve_app.agents import agent_check

    manifest_set(demo_agent, f"agent:\n  type: command\n  entrypoint: {probe.name}.Agent\n")
    with pytest.raises(AgentError, match="names a Python class"):
        agent_check(demo_agent.path)
    run = services.evolution_run_start(personas.owner, demo_agent, engine=f"{probe.name}.Engine", cycles=1,
                                       enqueue=False, trusted=True)
    assert run.trusted and not probe.imported()
    run = services.evolution_run_execute(run.pk)
    assert run.status == "finished" and probe.imported()
