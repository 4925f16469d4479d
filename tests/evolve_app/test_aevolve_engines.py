"""A-Evolve's own engines (the a-evolve extra) through evolve_app/aevolve.py: each runs real cycles
of Crucible's Evolver on the offline demo agent (a git workspace in a tmp dir), its model being the
loopback Anthropic fake; its workspace bash runs in Crucible's sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evolve_app import aevolve
from evolve_app.demo import textbook_load
from evolve_app.engines import EngineError, engine_check, engine_get, engine_names
from evolve_app.loop import Evolver
from evolve_app.models import Cycle
from runtime_app import sandbox
from runtime_app.models import Receipt
from tests.evolve_app.helpers import FAKE_KEY
from tests.evolve_app.test_engines import run_inline
from tests.helpers import service_missing

pytestmark = pytest.mark.django_db(transaction=True)

LLM = {"preset": "anthropic", "model": "fake-sonnet", "effort": "off"}
DATES = textbook_load()["dates"]
BASH_ENGINES = ("aevolve-skillforge", "aevolve-adaptive", "aevolve-adaptive-skill")


@pytest.fixture(autouse=True)
def no_upstream_model_or_host_bash(monkeypatch):
    """What would run outside Crucible's control upstream fails the test if it is ever reached:
    agent_evolve's own LLM clients and its host `bash -c`. (agent_evolve is imported here: it is
    the optional extra, which `make setup` installs; without it these tests skip, or fail in CI.)"""
    if not aevolve.available():
        service_missing("the a-evolve extra is not installed: pip install -e '.[a-evolve]'")
    from agent_evolve.algorithms.adaptive_evolve import engine as adaptive_engine
    from agent_evolve.algorithms.adaptive_skill import engine as adaptive_skill_engine
    from agent_evolve.algorithms.skillforge import engine as skillforge_engine
    from agent_evolve.llm import anthropic as ae_anthropic
    from agent_evolve.llm import bedrock as ae_bedrock
    from agent_evolve.llm import openai as ae_openai

    def forbidden(*args, **kwargs):
        raise AssertionError("agent_evolve's own model client or host bash was used")

    for module, name in ((skillforge_engine, "make_workspace_bash"),
                         (skillforge_engine, "create_default_llm"),
                         (adaptive_skill_engine, "make_workspace_bash"),
                         (adaptive_skill_engine, "create_default_llm"),
                         (adaptive_engine, "_make_workspace_bash"), (adaptive_engine, "_create_default_llm")):
        monkeypatch.setattr(module, name, forbidden)
    for provider in (ae_anthropic.AnthropicProvider, ae_bedrock.BedrockProvider, ae_openai.OpenAIProvider):
        monkeypatch.setattr(provider, "__init__", forbidden)



@pytest.fixture
def bubblewrap():
    available, reason = sandbox.bubblewrap_probe()
    if not available:
        service_missing(reason)


def tool_results(request) -> list[str]:
    last = request["messages"][-1]
    if not isinstance(last["content"], list):
        return []
    return [str(block.get("content", "")) for block in last["content"] if block.get("type") == "tool_result"]


def bash_script(commands: list[str], done: str = "Added a date-arithmetic skill."):
    """A model that runs `commands` with workspace_bash, one a turn, then says `done`."""
    seen: list[dict] = []

    def script(request, _candidate):
        seen.append(request)
        assert [tool["name"] for tool in request.get("tools", [])] == ["workspace_bash"]
        turn = sum(1 for m in request["messages"] if m["role"] == "assistant")
        if turn < len(commands):
            return [{"type": "tool_use", "id": f"toolu_{turn:04d}", "name": "workspace_bash",
                     "input": {"command": commands[turn]}}]
        return [{"type": "text", "text": done}]

    return script, seen


WRITE_SKILL = f"mkdir -p skills/date-arithmetic && cat > skills/date-arithmetic/SKILL.md <<'EOF'\n" \
              f"{DATES['skill_md']}EOF\nls skills"


@pytest.mark.parametrize("engine", BASH_ENGINES)
def test_an_aevolve_engine_writes_a_skill_with_its_sandboxed_bash(engine, personas, demo_agent, fake_llm,
                                                                   monkeypatch, bubblewrap):
    """Two cycles: in the first the scripted model writes the date skill with workspace_bash (in
    the sandbox), so the second cycle scores higher; every call and command has a receipt."""
    script, seen = bash_script([WRITE_SKILL])
    fake = fake_llm(script)
    run = run_inline(personas.owner, demo_agent, cycles=2, engine=engine, batch_size=4, egl_window=5,
                     engine_options=LLM)
    first, second = Cycle.objects.filter(run=run).order_by("number")
    assert run.status == "finished", run.reason if hasattr(run, "reason") else run
    assert first.status == "accepted", first.reason
    assert "date-arithmetic" in first.skills_added
    text = (Path(demo_agent.path) / "skills" / "date-arithmetic" / "SKILL.md").read_text()
    assert text == DATES["skill_md"]
    assert (first.score, second.score) == (0.25, 0.5)
    assert "date-arithmetic" in tool_results(seen[1])[0]  # `ls skills` saw the file the command wrote
    metadata = first.engine_metadata
    assert metadata["upstream"].startswith("agent_evolve.algorithms.") and metadata["model"] == "fake-sonnet"
    assert metadata["calls"] >= 2 and metadata["tokens"] > 0
    # The history facade: cycle 2 is A-Evolve's evo 2 and sees cycle 1's batch and its own.
    assert (metadata["aevolve"]["evo_number"], metadata["aevolve"]["tasks_analyzed"]) == (1, 4)
    later = second.engine_metadata["aevolve"]
    assert (later["evo_number"], later["tasks_analyzed"]) == (2, 8)
    calls = Receipt.objects.filter(kind="llm_call", label__startswith=f"{engine} evolver call")
    commands = Receipt.objects.filter(label=f"{engine} workspace_bash")
    assert calls.count() >= 4 and commands.count() >= 2
    assert set(metadata["receipts"]) >= {r.pk for r in calls.filter(pk__in=metadata["receipts"])}
    assert commands.first().detail["sandbox"]["network"].startswith("none")
    assert FAKE_KEY not in json.dumps([r.as_dict() for r in Receipt.objects.all()])
    assert fake.keys_seen() == {FAKE_KEY}
    assert "prompts/system.md" in json.dumps(seen[0]["system"])  # A-Evolve's own evolver prompt


def test_the_sandboxed_bash_cannot_reach_outside_the_workspace(personas, demo_agent, fake_llm, monkeypatch,
                                                              bubblewrap, tmp_path):
    """A scripted model tries to write next to the workspace, read a secret beside it and ~/.ssh,
    reach the network, and rewrite the workspace's git history: none of it lands."""
    outside = tmp_path / "outside.txt"
    secret = tmp_path / "secret.txt"
    secret.write_text("the-host-secret-42\n")
    root = Path(demo_agent.path)
    tags_before = sorted(p.name for p in (root / ".git" / "refs" / "tags").iterdir())
    fake = fake_llm(lambda request, candidate: [{"type": "text", "text": "unused"}])
    port = fake.server.server_address[1]
    attack = [
        f"echo pwned > {outside}; echo pwned > /tmp/aevolve-pwned; cat {secret}; ls -a ~/.ssh /root/.ssh",
        f"(exec 3<>/dev/tcp/127.0.0.1/{port}) && echo CONNECTED || echo no-network",
        "echo '#!/bin/sh' > .git/hooks/post-commit; rm -rf .git/refs/tags; echo x > manifest.yaml; "
        "ln -s / skills/escape; echo ok",
    ]
    script, seen = bash_script(attack, done="Tried.")
    fake.script = script
    run = run_inline(personas.owner, demo_agent, cycles=1, engine="aevolve-skillforge", batch_size=4,
                     engine_options=LLM)
    assert run.status == "finished"
    results = [text for request in seen for text in tool_results(request)]
    assert len(results) == 3
    assert not outside.exists() and not Path("/tmp/aevolve-pwned").exists()
    assert "the-host-secret-42" not in json.dumps(results)
    assert "CONNECTED" not in results[1] and "no-network" in results[1]
    assert "Read-only file system" in results[2] or "Permission denied" in results[2]
    assert not (root / ".git" / "hooks" / "post-commit").exists()
    assert sorted(p.name for p in (root / ".git" / "refs" / "tags").iterdir()) >= tags_before
    assert "agent:" in (root / "manifest.yaml").read_text()
    assert not (root / "skills" / "escape").is_symlink()  # skills/ is writable, but the loop reverts links


def test_guided_synthesis_curates_a_draft_the_agent_left(personas, demo_agent, fake_llm, monkeypatch):
    """Guided Synthesis writes a memory line per observation, offers the agent's draft to the
    curator model, and accepts it as a skill (its name as A-Evolve spells it); the draft is gone."""
    root = Path(demo_agent.path)
    (root / "skills" / "_drafts").mkdir()
    (root / "skills" / "_drafts" / "date-arithmetic.md").write_text(DATES["skill_md"])
    asked: list[str] = []

    def script(request, _candidate):
        asked.append(json.dumps(request))
        assert "SKILL CURATOR" in json.dumps(request["system"]) and not request.get("tools")
        return [{"type": "text", "text": "ACCEPT: date_arithmetic"}]

    fake_llm(script)
    run = run_inline(personas.owner, demo_agent, cycles=2, engine="aevolve-guided", batch_size=4,
                     egl_window=5, engine_options=LLM)
    first, second = Cycle.objects.filter(run=run).order_by("number")
    assert first.status == "accepted", first.reason
    assert first.skills_added == ["date_arithmetic"]
    skill = (root / "skills" / "date_arithmetic" / "SKILL.md").read_text()
    assert skill.startswith("---\nname: date_arithmetic\ndescription: Add days to a date")
    assert "```rule" in skill
    assert not (root / "skills" / "_drafts" / "date-arithmetic.md").exists()
    memory = [json.loads(line) for line in (root / "memory" / "episodic.jsonl").read_text().splitlines()]
    assert len([m for m in memory if "approach_summary" in m]) == 8  # 4 tasks a cycle, no draft
    assert (first.score, second.score) == (0.25, 0.5)
    assert len(asked) == 1 and "date_arithmetic" in asked[0]  # the second cycle had no proposal
    assert first.engine_metadata["notes"] == ["drafts offered as proposals: date-arithmetic"]
    assert Receipt.objects.filter(kind="llm_call", label__startswith="aevolve-guided complete").count() == 1


def test_on_cycle_end_takes_both_interfaces(personas, demo_agent, fake_llm, monkeypatch, bubblewrap):
    """Crucible's loop calls on_cycle_end(accepted); an A-Evolve loop calls it with the score too:
    the adapter passes A-Evolve's engine (accepted, score) either way."""
    script, _ = bash_script([WRITE_SKILL])
    fake_llm(script)
    engine = engine_get("aevolve-adaptive", **LLM)
    result = Evolver(demo_agent.path, "demo", {"batch_size": 4}, engine=engine).run(cycles=1)
    assert result.cycles[0].status == "accepted", result.cycles[0].reason
    calls = []
    monkeypatch.setattr(engine._engine, "on_cycle_end",
                        lambda accepted, score: calls.append((accepted, score)))
    engine.on_cycle_end(True)
    engine.on_cycle_end(False, 0.75)
    assert calls == [(True, 0.25), (False, 0.75)]


def test_engine_check_names_the_options_and_the_missing_package(monkeypatch):
    monkeypatch.setattr(sandbox, "bubblewrap_probe", lambda: (True, "bubblewrap starts"))
    assert set(BASH_ENGINES) | {"aevolve-guided"} <= set(engine_names())
    engine_check("aevolve-skillforge", {**LLM, "max_skills": 8, "protect_skills": "true",
                                        "extra": '{"a": 1}'})
    with pytest.raises(EngineError, match=r"aevolve-skillforge has no option 'bogus'; its options: preset, "
                                          r"model, effort, max_turns, evolver_max_tokens, max_skills"):
        engine_check("aevolve-skillforge", {"bogus": 1})
    with pytest.raises(EngineError, match="option write_memory: 'maybe' is not true or false"):
        engine_check("aevolve-guided", {"write_memory": "maybe"})
    with pytest.raises(EngineError, match="extra must be a JSON object"):
        engine_check("aevolve-adaptive", {"extra": "[1]"})
    with pytest.raises(EngineError, match="memory_cap must be a whole number"):
        engine_check("aevolve-adaptive", {"memory_cap": "many"})

    monkeypatch.setattr(sandbox, "bubblewrap_probe", lambda: (False, "bubblewrap (bwrap) is not installed"))
    with pytest.raises(EngineError, match=r"aevolve-adaptive runs A-Evolve's workspace bash only in the "
                                          r"bubblewrap sandbox, and bubblewrap \(bwrap\) is not installed"):
        engine_check("aevolve-adaptive", LLM)
    engine_check("aevolve-guided", LLM)  # no bash, no sandbox needed

    monkeypatch.setattr(aevolve, "available", lambda: False)
    assert not any(name.startswith("aevolve-") for name in engine_names())
    with pytest.raises(EngineError, match=r"needs the a-evolve package \(agent_evolve\), which is not "
                                          r"installed: install it with pip install -e '\.\[a-evolve\]'"):
        engine_check("aevolve-guided", LLM)
    with pytest.raises(EngineError, match=r"pip install -e '\.\[a-evolve\]'"):
        aevolve.upstream()


def test_the_workspace_and_trial_facades_answer_as_a_evolve_does(imported_workspace):
    """Reads answer "" or [] for what is missing, writes go through Crucible's checks (a colon in
    an unquoted description is written again as YAML), and the trial facade converts tasks and
    observations both ways."""
    from agent_evolve import types as ae

    from evolve_app.aevolve_upstream import TrialFacade, WorkspaceFacade
    from evolve_app.types import Feedback, Task, Trajectory
    from evolve_app.workspace import AgentWorkspace, WorkspaceError

    facade = WorkspaceFacade(AgentWorkspace(imported_workspace))
    assert facade.read_skill("nope") == "" and facade.read_fragment("nope.md") == ""
    facade.delete_skill("nope")  # upstream: nothing to delete is no error
    facade.write_skill("dates", "---\nname: dates\ndescription: Use when: a date is asked\n---\n\nAdd days\n")
    assert "description: 'Use when: a date is asked'" in facade.read_skill("dates")
    assert "dates" in [skill.name for skill in facade.list_skills()]
    facade.write_draft("idea", "draft")
    facade.clear_drafts()
    assert facade.list_drafts() == []
    with pytest.raises(WorkspaceError):
        facade.write_skill("../escape", "---\nname: x\ndescription: y\n---\n")
    (imported_workspace / "skills" / "link").symlink_to(imported_workspace / "skills" / "code-search")
    assert "link" not in [skill.name for skill in facade.list_skills()]

    class Bench:
        def get_tasks(self, split, limit):
            return [Task("t1", "do it", "dates", {"level": 2})][:limit]

    class Trial:
        benchmark = Bench()

        def run(self, tasks):
            assert tasks == [Task("t1", "do it", "dates", {"level": 2})]
            return [(Trajectory("t1", "42", [{"tool": "x"}]), Feedback(True, 1.0, "right"))]

    trial = TrialFacade(Trial())
    (task,) = trial.get_tasks("train", 5)
    assert (task.id, task.input, task.metadata) == ("t1", "do it", {"level": 2, "category": "dates"})
    (done,) = trial.run_tasks([task])
    assert isinstance(done, ae.Observation) and done.task.id == "t1"
    assert (done.trajectory.output, done.feedback.success, done.feedback.score) == ("42", True, 1.0)
    assert TrialFacade(None).get_tasks() == [] and TrialFacade(None).run_tasks([task]) == []


def test_the_history_facade_numbers_cycles_and_reads_the_batches(imported_workspace):
    from evolve_app.aevolve_upstream import HistoryFacade
    from evolve_app.history import EvolutionHistory
    from evolve_app.types import Feedback, Observation, Task, Trajectory
    from evolve_app.workspace import workspace_snapshot

    root = imported_workspace
    for tag in ("pre-evo-1", "evo-1", "pre-evo-2"):
        workspace_snapshot(root, tag, tag)
    batches = root / "evolution" / "observations"
    batches.mkdir(parents=True)
    old = {"task_id": "a", "task_input": "x", "agent_output": "1", "steps": [], "success": False,
           "score": 0.0, "feedback_detail": "wrong"}
    (batches / "batch_0001_0001.jsonl").write_text(json.dumps(old) + "\nnot json\n")
    now = [Observation(Task("b", "y"), Trajectory("b", "2"), Feedback(True, 1.0, "right"))]
    history = HistoryFacade(EvolutionHistory(root), root, now)
    assert history.latest_cycle == 1 and history.list_versions() == ["evo-1", "evo-0"]
    records = history.get_observations(last_n_cycles=2)
    assert [(r["task_id"], r["success"], r["task"]["id"], r["feedback"]["detail"]) for r in records] == [
        ("a", False, "a", "wrong"), ("b", True, "b", "right")]
    assert [r["task_id"] for r in history.get_observations(last_n_cycles=1)] == ["b"]
    assert [r["task_id"] for r in history.get_observations(only_failures=True)] == ["a"]
    assert history.read_file_at("evo-0", "no/such.md") == ""
    assert history.get_score_curve() == [0.0]  # no run recorded: the batches' mean scores
    # A loop that wrote this cycle's batch before the step: it is not counted twice.
    (batches / "batch_0001_0002.jsonl").write_text(json.dumps(now[0].as_record()) + "\n")
    assert [r["task_id"] for r in history.get_observations(last_n_cycles=3)] == ["a", "b"]
    assert history.get_summary_stats()["total"] == 2


def test_the_adaptive_engines_own_writes_go_through_the_checked_workspace(imported_workspace, tmp_path):
    """Upstream's adaptive engine writes seeded skills, corrections and pruned memory with open();
    here they go through the workspace's checks, so a link cannot carry them outside it."""
    from types import SimpleNamespace

    from evolve_app.aevolve_upstream import CrucibleLLM, WorkspaceFacade, _CheckedAutoCorrector, engine_make
    from evolve_app.workspace import AgentWorkspace, WorkspaceError

    root = imported_workspace
    facade = WorkspaceFacade(AgentWorkspace(root))
    engine = engine_make("aevolve-adaptive", {"extra": {}}, CrucibleLLM(lambda *a, **k: ("", {}, []), None),
                         {"memory_cap": 2})
    seeded = "---\nname: entity-verification\ndescription: d\n---\nx\n"
    engine._write_skill(facade, "entity-verification", seeded)
    assert (root / "skills" / "entity-verification" / "SKILL.md").read_text().endswith("x\n")
    (root / "memory" / "episodic.jsonl").write_text("".join(f'{{"n": {n}}}\n' for n in range(5)))
    assert engine._prune_memory(facade) == 1
    assert (root / "memory" / "episodic.jsonl").read_text() == '{"n": 3}\n{"n": 4}\n'

    analysis = SimpleNamespace(param_errors=[{"tool": "search", "error": "bad query"}])
    fixes = _CheckedAutoCorrector().apply(facade, analysis, {"name_corrections": {"serch": "search"}})
    assert fixes == 2
    assert "| `serch` | `search` |" in facade.read_skill("tool-name-corrections")
    assert json.loads((root / "memory" / "tool_param_errors.jsonl").read_text())["tool"] == "search"

    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "skills" / "multi-requirement-handler").symlink_to(outside, target_is_directory=True)
    with pytest.raises(WorkspaceError, match="symlink"):
        engine._write_skill(facade, "multi-requirement-handler", "---\nname: m\ndescription: d\n---\n")
    assert list(outside.iterdir()) == []
