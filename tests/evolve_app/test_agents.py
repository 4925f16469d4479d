"""Agents: the command agent on the demo workspace in the real sandbox, and the reference LLM
agent through the real SDKs against the loopback fakes (tests/fakes/)."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import yaml

from evolve_app.agents import AgentError, BaseAgent, CommandAgent, ReferenceLLMAgent, agent_for, agent_names
from evolve_app.benchmarks import benchmark_get
from evolve_app.demo import SEED_WORKSPACE, textbook_load
from evolve_app.types import Task
from evolve_app.workspace import AgentWorkspace, workspace_validate
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.openai_server import FakeOpenAI

KEY = "sk-ant-test-secret-0123456789"


@pytest.fixture
def data_dir(tmp_path, settings) -> Path:
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    return settings.DATA_DIR


@pytest.fixture
def seed(tmp_path) -> Path:
    """A copy of the demo seed workspace (the shipped one is never changed by a test)."""
    return Path(shutil.copytree(SEED_WORKSPACE, tmp_path / "seed"))


def files_of(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file()}


def set_agent(workspace: Path, **agent: object) -> None:
    manifest = yaml.safe_load((workspace / "manifest.yaml").read_text())
    manifest["agent"] = agent
    (workspace / "manifest.yaml").write_text(yaml.safe_dump(manifest))


def run_split(agent: BaseAgent, split: str) -> dict[str, bool]:
    bench = benchmark_get("demo")
    results = {}
    for task in bench.get_tasks(split, limit=None):
        results[task.task_id] = bench.evaluate(task, agent.solve(task)).success
    return results


# ------------------------------------------------------------------------------ the demo seed


def test_the_demo_seed_is_a_valid_command_workspace_and_the_agent_loads_its_state(seed, data_dir):
    assert workspace_validate(seed) == []
    agent = agent_for(seed)
    assert type(agent) is CommandAgent and agent.workspace_path == seed
    assert [skill.name for skill in agent.skills] == ["unit-conversions"]
    assert agent.system_prompt.startswith("You solve small, exactly checkable tasks")
    assert agent.memories == [] and agent.tools[0]["name"] == "solve"
    assert "x * 9 / 5 + 32" in agent.get_skill_content("unit-conversions")


def test_the_command_agent_solves_exactly_the_categories_it_has_skills_for(seed, data_dir):
    before = files_of(seed)
    agent = agent_for(seed)
    train = run_split(agent, "train")
    assert {task_id for task_id, passed in train.items() if passed} == {"units-001", "units-002", "units-003"}
    assert sum(train.values()) / len(train) == 0.25  # the demo's starting score
    dates = agent.solve(benchmark_get("demo").get_tasks("train")[1])
    assert dates.output == "" and dates.error.startswith("the agent's command failed (exit 3): no rule")
    step = dates.steps[0]
    assert step["command"] == ["python", "tools/solve.py"]
    assert step["exit_code"] == 3 and step["timed_out"] is False
    assert files_of(seed) == before  # it ran on a read-only copy

    workspace = AgentWorkspace(seed)
    for entry in textbook_load().values():  # what a deterministic engine would write
        workspace.write_skill(entry["skill"], entry["skill_md"])
    agent.reload_from_fs()
    assert len(agent.skills) == 4
    results = {**run_split(agent, "train"), **run_split(agent, "holdout")}
    assert len(results) == 20 and all(results.values()), results
    assert workspace_validate(seed) == []


def test_a_rule_in_memory_teaches_the_command_agent_as_a_skill_would(seed, data_dir):
    bench = benchmark_get("demo")
    task = bench.get_tasks("train")[3]  # bases-001: 255 in hexadecimal
    agent = agent_for(seed)
    assert not bench.evaluate(task, agent.solve(task)).success
    for rule in textbook_load()["bases"]["rules"]:
        agent.remember({"rule": rule, "category": "bases"}, "semantic")
    assert agent.export_to_fs() == 3
    trajectory = agent.solve(task)
    assert trajectory.output == "ff\n" and bench.evaluate(task, trajectory).success
    assert "memory/semantic.jsonl:1" in trajectory.steps[0]["stderr"]


def test_remember_buffers_memories_until_export_writes_them_through_the_workspace(seed, data_dir):
    agent = agent_for(seed)
    agent.remember("dates need the leap day")
    agent.remember({"lesson": "y is not a vowel"}, "semantic")
    assert (seed / "memory" / "episodic.jsonl").read_text() == ""
    assert not (seed / "memory" / "semantic.jsonl").exists()
    assert agent.export_to_fs() == 2 and agent.export_to_fs() == 0
    workspace = AgentWorkspace(seed)
    assert workspace.read_memories("episodic") == [{"content": "dates need the leap day"}]
    assert workspace.read_memories("semantic") == [{"lesson": "y is not a vowel"}]
    agent.reload_from_fs()
    assert [entry["_category"] for entry in agent.memories] == ["episodic", "semantic"]
    with pytest.raises(ValueError, match="memory category"):
        agent.remember("x", "../outside")


# ----------------------------------------------------------------------------- command agents


@pytest.mark.parametrize("isolation", [None, "off"])  # the setting's choice (bubblewrap here), rlimits only
def test_a_command_line_agent_cannot_change_its_workspace_or_see_the_server_s_secrets(
        seed, data_dir, monkeypatch, isolation):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    set_agent(seed, type="command", entrypoint="cat; echo; env; touch skills/planted.md; ls .git evolution")
    (seed / "evolution").mkdir()
    (seed / "evolution" / "batch_0001.jsonl").write_text('{"task_id": "t"}\n')
    before = files_of(seed)
    trajectory = agent_for(seed, isolation=isolation).solve(Task("t-1", "the task text", category="demo"))
    assert trajectory.output.startswith("the task text\n")
    assert "CRUCIBLE_TASK_ID=t-1" in trajectory.output and "CRUCIBLE_TASK_CATEGORY=demo" in trajectory.output
    assert KEY not in json.dumps(asdict(trajectory)) and "ANTHROPIC_API_KEY" not in trajectory.output
    assert trajectory.error  # `ls` finds no .git or evolution/ in the copy (touch fails under bwrap)
    assert files_of(seed) == before and not (seed / "skills" / "planted.md").exists()


@pytest.mark.parametrize(("agent", "error"), [
    ({"type": "command", "entrypoint": "sleep 30", "timeout_seconds": 1}, "the agent timed out after 1 s"),
    ({"type": "command", "entrypoint": "tools/missing.py"},
     "the agent could not run: the command 'tools/missing.py' does not exist in the workspace"),
    ({"type": "command", "entrypoint": "../outside.py"},
     "the agent could not run: the command '../outside.py' must be a path inside the workspace"),
    ({"type": "command", "entrypoint": "evolve_app.agents.CommandAgent", "timeout_seconds": -1},
     "the agent could not run: timeout_seconds -1"),
])
def test_a_command_agent_that_cannot_run_or_times_out_reports_it_in_the_trajectory(
        seed, data_dir, agent, error):
    set_agent(seed, **agent)
    trajectory = agent_for(seed).solve(Task("t-1", "x"))
    assert trajectory.error.startswith(error) and trajectory.output == ""


# --------------------------------------------------------------------------- reference agents


@pytest.fixture
def reference(seed) -> Path:
    set_agent(seed, type="reference", entrypoint="evolve_app.agents.ReferenceLLMAgent", preset="anthropic",
              model="fake-sonnet")
    (seed / "prompts" / "fragments").mkdir()
    (seed / "prompts" / "fragments" / "style.md").write_text("Write numbers without units.\n")
    AgentWorkspace(seed).add_memory({"lesson": "Fahrenheit tasks want a bare number"})
    return seed


@pytest.mark.django_db
def test_the_reference_agent_sends_the_workspace_as_system_prompt_and_the_task_as_the_message(
        reference, data_dir, monkeypatch):
    from runtime_app import services
    from runtime_app.models import Receipt

    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    with FakeAnthropic(script=lambda request, candidate: [{"type": "text", "text": "212"}]) as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        agent = agent_for(reference)
        agent.record = lambda receipt: services.receipt_record(receipt, label="demo agent")
        task = benchmark_get("demo").get_tasks("train")[0]
        trajectory = agent.solve(task)
    assert type(agent) is ReferenceLLMAgent
    assert trajectory.output == "212" and trajectory.error == ""
    assert benchmark_get("demo").evaluate(task, trajectory).success
    request = fake.requests[0]
    system = "".join(block["text"] for block in request["system"])
    assert system.startswith("You solve small, exactly checkable tasks")
    for part in ("Write numbers without units.", "## Skill unit-conversions: Convert temperatures",
                 "answer: x * 9 / 5 + 32", "Fahrenheit tasks want a bare number"):
        assert part in system
    assert request["messages"] == [{"role": "user", "content": task.input}]
    assert [tool["name"] for tool in request["tools"]] == ["tool_solve"]  # the registry's tools
    step = trajectory.steps[0]
    assert step["model"] == "fake-sonnet" and step["resolved_model"] == "fake-sonnet-20261201"
    assert step["input_tokens"] + step["cache_write_tokens"] > 0 and step["receipt_id"] is not None
    assert fake.keys_seen() == {KEY}
    assert KEY not in json.dumps(asdict(trajectory))
    assert KEY not in json.dumps(Receipt.objects.get(pk=step["receipt_id"]).as_dict())


@pytest.mark.django_db
def test_the_reference_agent_uses_the_registry_s_tools_in_the_sandbox(reference, data_dir, monkeypatch):
    def script(request, _candidate):
        last = request["messages"][-1]["content"]
        results = [b for b in last if isinstance(b, dict) and b.get("type") == "tool_result"] \
            if isinstance(last, list) else []
        if results:
            return [{"type": "text", "text": str(results[0]["content"]).strip()}]
        return [{"type": "tool_use", "id": "toolu_1", "name": "tool_solve",
                 "input": {"input": request["messages"][0]["content"]}}]

    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    with FakeAnthropic(script=script) as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        task = benchmark_get("demo").get_tasks("train")[0]  # a units task: the seed's solver knows it
        trajectory = agent_for(reference).solve(task)
    assert [step["tool"] for step in trajectory.steps] == ["llm", "tool_solve", "llm"]
    assert trajectory.steps[1]["exit_code"] == 0
    assert benchmark_get("demo").evaluate(task, trajectory).success


@pytest.mark.django_db
def test_a_failed_model_call_is_the_trajectory_s_error_without_the_key(reference, data_dir, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    with FakeAnthropic() as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        fake.fail_next(*[("529", 0)] * 6)
        trajectory = agent_for(reference).solve(Task("t-1", "What is 6 x 7?"))
    assert trajectory.output == "" and "529 6 times" in trajectory.error
    assert KEY not in json.dumps(asdict(trajectory))
    not_a_provider = ReferenceLLMAgent(reference, preset="command").solve(Task("t-1", "x"))
    assert "preset 'command' is not a model provider" in not_a_provider.error
    a_cli = ReferenceLLMAgent(reference, preset="claude-code", model="x").solve(Task("t-1", "x"))
    assert "preset 'claude-code' is not a model provider" in a_cli.error


@pytest.mark.django_db
def test_the_reference_agent_speaks_to_an_openai_compatible_server_named_by_its_preset(
        reference, data_dir, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    set_agent(reference, type="reference", preset="openai", model="fake-gpt")
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        trajectory = agent_for(reference).solve(Task("t-1", "What is 6 x 7?"))
    assert trajectory.output == "unknown: done." and trajectory.error == ""
    messages = fake.requests[0]["messages"]
    assert messages[0]["role"] == "system" and "answer: x * 9 / 5 + 32" in messages[0]["content"]
    assert messages[1] == {"role": "user", "content": "What is 6 x 7?"}
    assert fake.keys_seen() == {KEY} and KEY not in json.dumps(asdict(trajectory))


# ----------------------------------------------------------------------------------- agent_for


class EchoAgent(BaseAgent):
    def solve(self, task):
        from evolve_app.types import Trajectory

        return Trajectory(task.task_id, output=task.input)


def test_agent_for_follows_the_manifest_to_a_class_and_refuses_what_is_not_an_agent(seed):
    set_agent(seed, type="tests.evolve_app.test_agents.EchoAgent")
    assert agent_for(seed, trusted=True).solve(Task("t", "hi")).output == "hi"
    set_agent(seed, type="python", entrypoint="tests.evolve_app.test_agents.EchoAgent")
    assert type(agent_for(seed, trusted=True)) is EchoAgent
    for agent, message in (
        ({"type": "wizard"}, "agent.type 'wizard': use command, reference, or a dotted path"),
        ({"type": "os.path.join"}, "'os.path.join' is not a BaseAgent subclass"),
        ({"type": "no_such_package.Agent"}, "cannot be loaded"),
        ({"type": "command", "entrypoint": "evolve_app.agents.ReferenceLLMAgent"}, "is not a CommandAgent"),
    ):
        set_agent(seed, **agent)
        with pytest.raises(AgentError, match=message):
            agent_for(seed, trusted=True)


def test_the_built_in_agent_types_are_installed_entry_points():
    installed = {point.name: point.value for point in entry_points(group="crucible.agents")}
    assert installed == {"command": "evolve_app.agents:CommandAgent",
                         "reference": "evolve_app.agents:ReferenceLLMAgent"}
    assert agent_names() == ["command", "reference"]


def test_an_untrusted_caller_gets_the_built_in_classes_by_path_and_no_other(seed):
    set_agent(seed, type="command", entrypoint="evolve_app.agents.CommandAgent")
    assert type(agent_for(seed)) is CommandAgent
    set_agent(seed, type="python", entrypoint="tests.evolve_app.test_agents.EchoAgent")
    with pytest.raises(AgentError, match=r"agent.entrypoint 'tests.evolve_app.test_agents.EchoAgent' names a "
                                         r"Python class.*CRUCIBLE_ALLOWED_EXTENSIONS"):
        agent_for(seed)
