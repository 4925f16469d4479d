"""An engine named by a dotted path is decided when the run is asked for, not in the worker:
A-Evolve's four engine classes by their own paths are Crucible's adapters of them (and the run
records which), and any other class whose constructor needs what the run's options do not give
is refused at once, with the missing names, without importing or calling it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import uuid

import pytest

from evolve_app import services
from evolve_app.aevolve import AEvolveSkillForgeEngine
from evolve_app.engines import EngineError, EvolutionEngine, engine_check, engine_get, engine_resolve
from evolve_app.models import EvolutionRun
from evolve_app.types import StepResult
from runtime_app.models import Event
from tests.evolve_app.test_api import bearer, post
from tests.helpers import REPO_ROOT, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)

UPSTREAM = {
    "agent_evolve.algorithms.skillforge.AEvolveEngine": "aevolve-skillforge",
    "agent_evolve.algorithms.skillforge.engine.AEvolveEngine": "aevolve-skillforge",
    "agent_evolve.algorithms.guided_synth:GuidedSynthesisEngine": "aevolve-guided",
    "agent_evolve.algorithms.adaptive_evolve.engine.AdaptiveEvolveEngine": "aevolve-adaptive",
    "agent_evolve.algorithms.adaptive_skill.AdaptiveSkillEngine": "aevolve-adaptive-skill",
}


class NeedsConfig(EvolutionEngine):
    """An engine written as A-Evolve's are: its constructor wants a config object."""

    def __init__(self, config, llm=None) -> None:
        self.config = config

    def step(self, workspace, observations, history, trial):
        return StepResult(False, "ran", {})


class Inherits(NeedsConfig):
    """The constructor it needs is its base's."""


def evolve(settings, *args: str) -> subprocess.CompletedProcess:
    env = subprocess_env(CRUCIBLE_DATA_DIR=str(settings.DATA_DIR))
    return subprocess.run([sys.executable, "manage.py", "evolve", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.mark.parametrize("path", sorted(UPSTREAM))
def test_a_evolve_s_engine_classes_by_their_dotted_path_are_crucible_s_adapters(path):
    assert engine_resolve(path)[0] == UPSTREAM[path]
    engine_check(path, {"model": "fake-sonnet"})  # a lookup: the web may name it, as a built-in
    assert type(engine_get(path, model="fake-sonnet")).name == UPSTREAM[path]


def test_a_run_asked_for_with_skillforge_s_upstream_path_records_the_adapter_it_runs(personas, demo_agent):
    path = "agent_evolve.algorithms.skillforge.AEvolveEngine"
    run = services.evolution_run_start(personas.owner, demo_agent, engine=path, cycles=1, enqueue=False,
                                       trusted=True, config={"engine_options": {"model": "fake-sonnet"}})
    assert run.engine == "aevolve-skillforge"
    queued = Event.objects.filter(kind="evolution.queued").get()
    assert f"{path} runs as aevolve-skillforge: A-Evolve's own engine, adapted" in queued.payload["message"]
    assert isinstance(engine_get(run.engine, **run.config["engine_options"]), AEvolveSkillForgeEngine)


def test_the_api_takes_a_evolve_s_engine_path_as_the_built_in(personas, demo_agent):
    response = post(bearer(personas.member), f"/api/agents/{demo_agent.pk}/runs", {
        "cycles": 1, "engine": "agent_evolve.algorithms.guided_synth.engine.GuidedSynthesisEngine",
        "config": {"engine_options": {"model": "fake-sonnet"}}})
    assert response.status_code == 202, response.content
    assert EvolutionRun.objects.get().engine == "aevolve-guided"


def test_the_cli_refuses_a_class_whose_constructor_needs_a_config_at_once(personas, demo_agent, settings):
    done = evolve(settings, "run", str(demo_agent.pk), "--cycles", "1", "--user", "owner",
                  "--engine", "tests.evolve_app.test_engines_upstream.NeedsConfig")
    assert done.returncode == 1, done.stdout
    assert ("engine tests.evolve_app.test_engines_upstream.NeedsConfig needs config, which the run's options "
            "do not give; nothing was made") in done.stderr
    assert not EvolutionRun.objects.exists()


def test_an_inherited_constructor_is_read_from_the_source_without_importing_it(tmp_path, monkeypatch):
    name = f"crucible_engine_{uuid.uuid4().hex[:8]}"
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("raise SystemExit('imported')\n")
    (package / "engines.py").write_text(
        "from agent_evolve.algorithms.skillforge import AEvolveEngine\n\n\n"
        "class Mine(AEvolveEngine):\n    pass\n\n\n"
        "class Free:\n    def __init__(self, *, depth: int = 2):\n        pass\n\n"
        "    def step(self):\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EngineError, match=rf"engine {name}.engines.Mine needs config, which the run's"):
        engine_check(f"{name}.engines.Mine", trusted=True)
    engine_check(f"{name}.engines:Free", {"depth": 3}, trusted=True)
    with pytest.raises(EngineError, match=r"has no option 'width'; its options: depth"):
        engine_check(f"{name}.engines:Free", {"width": 3}, trusted=True)
    assert name not in sys.modules


def test_the_api_refuses_an_allowed_class_whose_constructor_needs_more_with_a_400(
        personas, demo_agent, settings):
    path = "tests.evolve_app.test_engines_upstream.Inherits"
    settings.CONFIG = dataclasses.replace(settings.CONFIG, allowed_extensions=(path,))
    response = post(bearer(personas.member), f"/api/agents/{demo_agent.pk}/runs",
                    {"cycles": 1, "engine": path})
    assert response.status_code == 400
    assert response.json()["errors"]["engine"] == [
        f"engine {path} needs config, which the run's options do not give; nothing was made. A worker makes "
        "an engine with the run's engine options as keyword arguments only, so name one whose constructor "
        "needs nothing else"]
    assert not EvolutionRun.objects.exists()


def test_a_dotted_engine_whose_package_is_not_on_this_host_is_refused_at_request():
    with pytest.raises(EngineError, match="there is no module 'no_such_package_here' on this host"):
        engine_check("no_such_package_here.Engine", trusted=True)
