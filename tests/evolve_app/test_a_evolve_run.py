"""A-Evolve workspaces run as they are: built in tmp dirs in the shapes A-Evolve ships (its swe,
terminal, mcp, mcp_mh and arc seeds), each runs a cycle with Crucible's reference agent against the
loopback fake provider, its tools really running in the sandbox; the run records and shows which
mapping it used; what a run cannot honour is refused when it is requested (page, API, CLI)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

from evolve_app import benchmarks, services
from evolve_app.agents import agent_for, agent_mapping, agent_run_problems, tool_plan
from evolve_app.models import EvolutionRun
from evolve_app.types import Task
from evolve_app.workspace import workspace_validate
from runtime_app.services import api_token_create
from tests.evolve_app.helpers import files_write
from tests.fakes.anthropic_server import FakeAnthropic
from tests.helpers import REPO_ROOT, login, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "sk-ant-test-secret-a-evolve-0123"
ANSWER = "42"


def manifest(entrypoint: str, layers: tuple[str, ...] = ("prompts", "skills", "memory"),
             name: str = "agent", extra: str = "") -> str:
    """A-Evolve's manifest shape (`extra` lines added to `agent:`)."""
    text = (f"name: {name}\nversion: 0.1.0\ncontract_version: \"1.0\"\n\nagent:\n  type: reference\n"
            f"  entrypoint: {entrypoint}\n{extra}")
    text += "\nevolvable_layers:\n" + "".join(f"  - {layer}\n" for layer in layers)
    return text + "\nreload_strategy: hot\n"


STRANDS_TOOL = ('"""{name} tool -- inside the SWE-bench Docker container."""\nimport subprocess\n\n'
                "from strands import tool\n\n\n@tool\ndef {name}(command: str) -> str:\n"
                '    return subprocess.run(["docker", "exec", "c", "bash", "-c", command]).stdout\n')
TERMINAL_TOOL = ('"""{name} tool executor for Terminal-Bench 2.0."""\n\n\n'
                 "def execute(container_name: str, tool_input: dict, log) -> str:\n"
                 "    return tool_input.get('answer', '')\n")
SKILL = ("---\nname: debug-and-fix\ndescription: Strategies for debugging build failures.\n---\n\n"
         "# Debug and Fix Skill\n\nRead the error first.\n")

SHAPES: dict[str, dict[str, str]] = {
    # tools/registry.yaml with `file:` entries whose modules import strands and docker
    "swe": {
        "manifest.yaml": manifest("agent_evolve.agents.swe.agent.SweAgent", name="swe-coding-agent"),
        "prompts/system.md": "You are an expert software engineer. Submit your answer with `submit`.\n",
        "tools/registry.yaml": (
            "tools:\n"
            "  - name: bash\n    description: Execute a bash command inside the SWE-bench Docker container.\n"
            "    file: bash.py\n"
            "  - name: text_editor\n    description: Edit files with structured commands (view, create, "
            "str_replace, insert, undo_edit).\n    file: text_editor.py\n"
            "  - name: python_exec\n    description: Execute Python code directly.\n"
            "    file: python_exec.py\n"
            "  - name: submit\n    description: Submit your solution and end the task.\n"
            "    file: submit.py\n"),
        **{f"tools/{name}.py": STRANDS_TOOL.format(name=name)
           for name in ("bash", "text_editor", "python_exec", "submit", "sequentialthinking")},
    },
    # a registry with `parameters`/`required`, skills and memories
    "terminal": {
        "manifest.yaml": manifest("agent_evolve.agents.terminal.agent.TerminalAgent",
                                  name="terminal-bench-agent"),
        "prompts/system.md": "You are a terminal expert. Use bash, then submit the answer.\n",
        "skills/debug-and-fix/SKILL.md": SKILL,
        "memory/memories.jsonl": '{"lesson": "check the exit code"}\n',
        "tools/registry.yaml": (
            "tools:\n  - name: bash\n    description: \"Use this function to execute bash commands.\"\n"
            "    parameters:\n      cmd:\n        type: string\n        description: \"The bash command.\"\n"
            "    required: [cmd]\n\n"
            "  - name: python\n    description: >\n      Use the python function to execute Python code.\n"
            "    parameters:\n      code:\n        type: string\n        description: \"The code.\"\n"
            "    required: [code]\n\n"
            "  - name: submit\n    description: \"Submit an answer for evaluation.\"\n"
            "    parameters:\n      answer:\n        type: string\n"
            "        description: \"Submitted answer.\"\n"
            "    required: [answer]\n"),
        **{f"tools/{name}.py": TERMINAL_TOOL.format(name=name) for name in ("bash", "python", "submit")},
    },
    # `tools: []` and an empty memories.jsonl
    "mcp": {
        "manifest.yaml": manifest("agent_evolve.agents.mcp.agent.McpAgent",
                                  ("prompts", "skills", "tools", "memory"), name="mcp-tool-agent"),
        "prompts/system.md": "You are a tool-using agent.\n",
        "memory/memories.jsonl": "",
        "tools/registry.yaml": "tools: []\n",
    },
    # a registry that is only comments
    "mcp_mh": {
        "manifest.yaml": manifest("agent_evolve.agents.mcp_mh.agent.McpMHAgent",
                                  ("prompts", "skills", "tools", "memory"), name="mcp-mh-agent"),
        "prompts/system.md": "You are a tool-using agent with a harness.\n",
        "memory/memories.jsonl": "",
        "tools/registry.yaml": ("# Tool registry — MCP tools are discovered dynamically from the MCP-Atlas "
                                "service.\n# This file is intentionally empty; it exists to satisfy the "
                                "workspace contract.\n"),
    },
    # a prompt only
    "arc": {
        "manifest.yaml": manifest("agent_evolve.agents.arc.agent.ArcAgent", name="arc-agi-3-agent"),
        "prompts/system.md": "You play ARC-AGI-3 games.\n",
    },
}


@pytest.fixture
def roots(tmp_path, settings) -> Path:
    folder = tmp_path / "roots"
    folder.mkdir()
    settings.CONFIG = dataclasses.replace(settings.CONFIG, repo_roots=[folder], agent_model="")
    return folder


@pytest.fixture
def keyed(monkeypatch, settings, roots) -> None:
    """A key, and the server's model for reference agents whose manifest names none (A-Evolve's
    seeds name none: they run as they are)."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    settings.CONFIG = dataclasses.replace(settings.CONFIG, agent_model="anthropic:fake-sonnet")


@pytest.fixture
def keyless(monkeypatch, settings) -> None:
    """No Anthropic key anywhere, and the real API's address (not a model server of one's own)."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://api.anthropic.com")
    monkeypatch.delenv("CRUCIBLE_AGENT_MODEL", raising=False)


def shape(roots: Path, name: str, **changes: str | None) -> Path:
    folder = roots / name
    folder.mkdir()
    files = {**SHAPES[name], **changes}
    files_write(folder, {path: text for path, text in files.items() if text is not None})
    return folder


def tasks_file(roots: Path) -> Path:
    path = roots / "tasks.jsonl"
    path.write_text("".join(json.dumps({"task_id": f"t-{n}", "input": f"Task {n}: what is 6 x 7?",
                                        "expected": ANSWER}) + "\n" for n in (1, 2)))
    return path


def bearer(user) -> Client:
    _, plain = api_token_create(user, "tests")
    return Client(HTTP_AUTHORIZATION=f"Bearer {plain}")


def start(user, agent, benchmark: str, **body):
    return bearer(user).post(f"/api/agents/{agent.pk}/runs", {"benchmark": benchmark, "cycles": 1,
                                                               "config": {"batch_size": 2}, **body},
                             content_type="application/json")


# --------------------------------------------------------------------- what the fake model does


def _results(request: dict) -> list[str]:
    texts = []
    for message in request["messages"]:
        if isinstance(message["content"], list):
            for block in message["content"]:
                if block.get("type") == "tool_result":
                    content = block.get("content")
                    texts.append(content if isinstance(content, str) else json.dumps(content))
    return texts


def _argument(request: dict, tool: str) -> str:
    """The argument the registry's schema (or the default) names first: cmd, command, code …"""
    schema = next(t["input_schema"] for t in request["tools"] if t["name"] == tool)
    return (schema.get("required") or list(schema["properties"]))[0]


def agent_script(request: dict, _candidate: str) -> list[dict]:
    """Uses whatever tools it is offered, in order, each really running, then submits what they
    found; without tools it answers in text."""
    offered = [tool["name"] for tool in request.get("tools", [])]
    done = _results(request)
    plan = []
    if "text_editor" in offered:
        plan.append(("text_editor", {"command": "create", "path": "work/answer.txt", "file_text": "4\n"}))
        plan.append(("text_editor", {"command": "str_replace", "path": "work/answer.txt",
                                     "old_str": "4", "new_str": "42"}))
    for tool, code in (("python_exec", "print(open('work/answer.txt').read().strip())"),
                       ("python", "print(6 * 7)")):
        if tool in offered:
            plan.append((tool, {_argument(request, tool): code}))
    if "bash" in offered:
        command = "cat work/answer.txt" if "text_editor" in offered else "echo $((6 * 7)) | tee out.txt"
        plan.append(("bash", {_argument(request, "bash"): command}))
    if "sequentialthinking" in offered:
        plan.insert(0, ("sequentialthinking", {"thought": "read the task"}))
    if not offered:
        return [{"type": "text", "text": ANSWER}]
    if len(done) < len(plan):
        tool, arguments = plan[len(done)]
        return [{"type": "tool_use", "id": f"toolu_{len(done)}", "name": tool, "input": arguments}]
    found = done[-1].strip() if done else ""
    return [{"type": "tool_use", "id": "toolu_submit", "name": "submit",
             "input": {_argument(request, "submit"): found}}]


def cycle_run(user, agent, roots: Path, monkeypatch) -> tuple[EvolutionRun, FakeAnthropic]:
    """One cycle of the agent on two JSONL tasks, started through the API and executed here, the
    model the loopback fake playing `agent_script`."""
    with FakeAnthropic(script=agent_script) as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        response = start(user, agent, f"jsonl:{tasks_file(roots)}")
        assert response.status_code == 202, response.json()
        run = services.evolution_run_execute(response.json()["id"])
    assert run.status == "finished", run.reason
    return run, fake


# --------------------------------------------------------------------------- each shape, a cycle


@pytest.mark.parametrize("name", ["swe", "terminal", "mcp", "mcp_mh", "arc"])
def test_each_a_evolve_seed_shape_imports_and_runs_a_cycle_with_its_tools_sandboxed(
        name, personas, roots, data_dir, keyed, monkeypatch):
    folder = shape(roots, name)
    assert workspace_validate(folder) == []
    agent = services.agent_import(personas.member, personas.alpha, str(folder))
    run, fake = cycle_run(personas.member, agent, roots, monkeypatch)
    cycle = run.cycles.get()
    observations = list(cycle.observations.all())
    assert len(observations) == 2
    assert all(o.success and o.agent_output == ANSWER for o in observations), \
        [(o.agent_output, o.feedback_detail) for o in observations]
    steps = observations[0].steps
    system = "".join(block["text"] for block in fake.requests[0]["system"])
    assert SHAPES[name]["prompts/system.md"].strip() in system
    offered = [tool["name"] for tool in fake.requests[0].get("tools", [])]
    if name == "swe":
        assert offered == ["bash", "text_editor", "python_exec", "submit"]
        ran = [(s["tool"], s.get("as"), s.get("exit_code")) for s in steps if s["tool"] != "llm"]
        editor = ("text_editor", "sandboxed file editor", 0)
        assert ran == [editor, editor, ("python_exec", "sandboxed python", 0), ("bash", "sandboxed shell", 0),
                       ("submit", "final answer", None)]
        bash = fake.requests[0]["tools"][0]["input_schema"]
        assert bash["required"] == ["command"]  # the registry gives no parameters: the default schema
    elif name == "terminal":
        assert offered == ["bash", "python", "submit"]
        assert fake.requests[0]["tools"][0]["input_schema"] == {
            "type": "object", "required": ["cmd"],
            "properties": {"cmd": {"type": "string", "description": "The bash command."}}}
        assert [(s["tool"], s.get("exit_code")) for s in steps if s["tool"] != "llm"] == [
            ("python", 0), ("bash", 0), ("submit", None)]
        assert "Debug and Fix Skill" in system and "check the exit code" in system
    else:
        assert offered == [] and [s["tool"] for s in steps] == ["llm"]
    # The workspace itself is untouched by the tools: they worked on a scratch copy.
    assert not (folder / "work").exists() and not (folder / "out.txt").exists()
    assert run.agent_mapping["a_evolve"] is True
    assert KEY not in json.dumps([o.steps for o in observations])


def test_the_tools_of_a_crucible_workspace_stay_programs_and_a_evolve_names_are_mapped(tmp_path):
    registry = [{"name": "bash", "file": "bash.py"}, {"name": "solve"},
                {"name": "web_search", "file": "w.py"}, {"name": "lookup"}, {"name": "think"}]
    files_write(tmp_path, {"tools/solve.py": "print(1)\n", "tools/bash.py": "print(2)\n"})
    offered, unavailable = tool_plan(tmp_path, registry, a_evolve=True)
    assert {name: spec["kind"] for name, spec in offered.items()} == {
        "bash": "shell", "tool_solve": "program", "think": "think"}
    assert [entry["name"] for entry in unavailable] == ["web_search", "lookup"]
    assert "A-Evolve tool module" in unavailable[0]["why"]
    offered, unavailable = tool_plan(tmp_path, registry, a_evolve=False)
    assert list(offered) == ["tool_solve"]  # a Crucible workspace: programs only, as before
    assert [entry["name"] for entry in unavailable] == ["bash", "web_search", "lookup", "think"]


def test_the_editor_and_shell_cannot_reach_outside_the_task_s_copy(roots, data_dir, keyed, monkeypatch,
                                                                  tmp_path):
    secret = tmp_path / "outside.txt"
    secret.write_text("do not touch\n")
    folder = shape(roots, "swe")
    calls = iter([("text_editor", {"command": "view", "path": "../../../outside.txt"}),
                  ("text_editor", {"command": "create", "path": str(secret), "file_text": "changed"}),
                  ("text_editor", {"command": "undo_edit", "path": "prompts/system.md"}),
                  ("bash", {"command": "exit 3"}),
                  ("submit", {"answer": "done"})])

    def script(request, _candidate):
        tool, arguments = next(calls)
        return [{"type": "tool_use", "id": f"toolu_{tool}", "name": tool, "input": arguments}]

    with FakeAnthropic(script=script) as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        trajectory = agent_for(folder).solve(Task("t-1", "go"))
    results = _results(fake.requests[-1])
    assert all("outside the task's workspace copy" in result for result in results[:2])
    assert "use view, create, str_replace or insert" in results[2]
    assert results[3].endswith("[exit code: 3]")
    assert secret.read_text() == "do not touch\n"
    assert trajectory.output == "done" and trajectory.error == ""


# ------------------------------------------------------------------------------- the mapping


def test_the_run_page_and_api_say_which_mapping_the_run_used(personas, roots, data_dir, keyed):
    folder = shape(roots, "swe", **{"tools/registry.yaml": SHAPES["swe"]["tools/registry.yaml"] + (
        "  - name: web_search\n    description: Search the web.\n    file: web_search.py\n"),
        "tools/web_search.py": STRANDS_TOOL.format(name="web_search")})
    agent = services.agent_import(personas.member, personas.alpha, str(folder))
    response = start(personas.member, agent, "demo")
    assert response.status_code == 202, response.json()
    mapping = response.json()["agent_mapping"]
    summary = ("A-Evolve agent agent_evolve.agents.swe.agent.SweAgent → Crucible reference agent "
               "(anthropic:fake-sonnet); tools: bash → sandboxed shell, text_editor → sandboxed file editor, "
               "python_exec → sandboxed python, submit → final answer; not available: web_search "
               "(tools/web_search.py is an A-Evolve tool module")
    assert mapping["summary"].startswith(summary)
    assert mapping["unavailable"][0]["name"] == "web_search"
    run = EvolutionRun.objects.get(pk=response.json()["id"])
    assert run.agent_mapping == mapping == agent_mapping(folder)
    assert bearer(personas.member).get(f"/api/runs/{run.pk}").json()["agent_mapping"] == mapping
    page = login(personas.member).get(f"/agents/{agent.pk}/runs/{run.number}/").content.decode()
    assert "A-Evolve agent agent_evolve.agents.swe.agent.SweAgent → Crucible reference agent" in page
    assert "python_exec → sandboxed python" in page and "not available: web_search" in page
    agent_page = login(personas.member).get(f"/agents/{agent.pk}/").content.decode()
    assert "Runs as" in agent_page and "text_editor → sandboxed file editor" in agent_page


def test_a_crucible_agent_s_mapping_says_it_runs_as_itself(personas, demo_agent):
    run = services.evolution_run_start(personas.member, demo_agent, cycles=1, enqueue=False)
    assert run.agent_mapping["summary"] == "Crucible command agent"
    assert run.agent_mapping["a_evolve"] is False


# -------------------------------------------------------------------------- refused up front


def test_a_seed_as_shipped_without_a_model_or_a_key_is_refused_naming_what_is_missing(
        personas, roots, data_dir, keyless, settings):
    agent = services.agent_import(personas.member, personas.alpha, str(shape(roots, "terminal")))
    refused = start(personas.member, agent, "demo")
    assert refused.status_code == 400
    message = refused.json()["errors"]["agent"][0]
    assert "no model: set agent.model in manifest.yaml" in message and "CRUCIBLE_AGENT_MODEL" in message
    assert "preset anthropic has no key here: set ANTHROPIC_API_KEY" in message
    # The server's default model stands in for the manifest's; the key is still missing.
    settings.CONFIG = dataclasses.replace(settings.CONFIG, agent_model="anthropic:fake-sonnet")
    message = start(personas.member, agent, "demo").json()["errors"]["agent"][0]
    assert "no model" not in message and "has no key here" in message
    assert not EvolutionRun.objects.exists()


def test_a_reference_agent_whose_preset_is_not_a_model_provider_is_refused(personas, roots, data_dir, keyed):
    folder = shape(roots, "arc")
    agent = services.agent_import(personas.member, personas.alpha, str(folder))
    (Path(agent.path) / "manifest.yaml").write_text(manifest("agent_evolve.agents.arc.agent.ArcAgent",
                                                   extra="  preset: command\n"))
    refused = start(personas.member, agent, "demo")
    assert refused.status_code == 400
    assert "preset 'command' is not a model provider" in refused.json()["errors"]["agent"][0]
    assert not EvolutionRun.objects.exists()


def test_an_a_evolve_agent_none_of_whose_tools_can_run_is_refused(personas, roots, data_dir, keyed):
    folder = shape(roots, "swe", **{"tools/registry.yaml": (
        "tools:\n  - name: browser\n    file: browser.py\n  - name: web_search\n    file: web_search.py\n"),
        **{f"tools/{name}.py": STRANDS_TOOL.format(name=name) for name in ("browser", "web_search")}})
    assert agent_run_problems(folder)[-1].startswith(
        "A-Evolve agent agent_evolve.agents.swe.agent.SweAgent acts through the tools its "
        "tools/registry.yaml lists, and Crucible can run none of them: browser: tools/browser.py is an "
        "A-Evolve tool module")
    agent = services.agent_import(personas.member, personas.alpha, str(folder))
    refused = start(personas.member, agent, "demo")
    assert refused.status_code == 400 and "can run none of them" in refused.json()["detail"]


def test_a_benchmark_needing_docker_on_a_host_without_it_is_refused_on_the_page_and_api(
        personas, demo_agent, roots, monkeypatch):
    folder = roots / "swe-tasks"
    files_write(folder, {"benchmark.yaml": "requires: [docker]\n", "train/t-1/input.md": "fix it\n",
                         "train/t-1/check": "true\n"})
    monkeypatch.setattr(benchmarks, "host_has", lambda requirement: requirement != "docker")
    refused = start(personas.member, demo_agent, f"folder:{folder}")
    assert refused.status_code == 400
    assert refused.json()["errors"]["benchmark"] == [
        f"benchmark folder:{folder} needs docker, which this host does not have"]
    page = login(personas.member).post(f"/agents/{demo_agent.pk}/runs/start/", {
        "benchmark": f"folder:{folder}", "engine": "textbook", "cycles": "1"})
    assert page.status_code == 400
    assert "needs docker, which this host does not have" in page.context["start_form"].errors["benchmark"][0]
    monkeypatch.setattr(benchmarks, "host_has", lambda requirement: True)
    assert start(personas.member, demo_agent, f"folder:{folder}").status_code == 202
    assert EvolutionRun.objects.count() == 1


def test_the_start_form_shows_an_a_evolve_agent_s_refusal(personas, roots, data_dir, keyless):
    agent = services.agent_import(personas.member, personas.alpha, str(shape(roots, "arc")))
    response = login(personas.member).post(f"/agents/{agent.pk}/runs/start/", {
        "benchmark": "demo", "engine": "textbook", "cycles": "1"})
    assert response.status_code == 400
    shown = response.context["start_form"].non_field_errors()
    assert "cannot run" in shown[0] and "has no key here: set ANTHROPIC_API_KEY" in shown[0]
    assert not EvolutionRun.objects.exists()


def test_the_cli_refuses_what_cannot_be_honoured_with_exit_1_and_the_message(
        personas, roots, data_dir, keyless, settings):
    folder = shape(roots, "mcp")
    done = subprocess.run([sys.executable, "manage.py", "evolve", "run", str(folder), "--project", "alpha",
                           "--user", "owner", "--cycles", "1"], cwd=REPO_ROOT,
                          env=subprocess_env(CRUCIBLE_DATA_DIR=str(settings.DATA_DIR)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no model: set agent.model in manifest.yaml" in done.stderr
    assert "has no key here" in done.stderr
    assert not EvolutionRun.objects.exists()
