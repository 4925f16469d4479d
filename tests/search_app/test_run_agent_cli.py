"""A full search whose writers are a real coding-agent CLI (the `claude-code`, `codex` and `aider` presets):
the CLI runs in the sandbox (bubblewrap), edits the candidate's worktree with its own tools, and
reaches the loopback fake only through the step's egress proxy, which injects the key and meters
usage.

The CLI comes from scripts/install_agent_clis.sh in CRUCIBLE_AGENT_CLI_DIR (default
var/agent-clis); a missing one (or no bubblewrap) skips, or fails under CRUCIBLE_REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from runtime_app import sandbox
from runtime_app.fleet import PRESETS
from runtime_app.models import Event, Receipt
from search_app import services
from search_app.execution import agent_transcript
from tests.fakes.anthropic_server import FakeAnthropic, claude_code_plan_script
from tests.fakes.openai_server import FakeOpenAI, aider_plan_script, codex_plan_script
from tests.helpers import service_missing
from tests.search_app.runs import plan_repo, spec_text

pytestmark = pytest.mark.django_db(transaction=True)
KEY = "sk-ant-test-secret-claude-code-5f3e9a1c77"  # distinctive: grepped for everywhere afterwards
# What the CLI says at the end: a usage line a command writer's receipt would be charged by.
FAKE_USAGE = '{"input_tokens": 1, "output_tokens": 1, "cost_microusd": 987654321}'


@dataclasses.dataclass(frozen=True)
class Case:
    """How one agent-CLI preset is driven against its fake."""

    model: str
    key_variable: str
    url_variable: str
    api: str
    client_env: list[str]
    path: str  # the one API path its turns call
    turns: int  # calls each writer makes at least (read/edit/finish, or patch/finish)


CASES = {
    "claude-code": Case("fake-sonnet", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "anthropic",
                        ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"], "/v1/messages", 3),
    "codex": Case("gpt-5.5", "OPENAI_API_KEY", "OPENAI_BASE_URL", "openai", ["CRUCIBLE_PROVIDER_KEY"],
                  "/v1/responses", 2),
    "aider": Case("fake-gpt", "OPENAI_API_KEY", "OPENAI_BASE_URL", "openai",
                  ["OPENAI_API_BASE", "OPENAI_API_KEY"], "/v1/chat/completions", 1),
}
PLAN = {"cand_001": ("code/answer.py", "    return 2", "    return 5"),
        "cand_002": ("code/answer.py", "    return 2", "    return 9")}


def agent_spec(provider: str, **options) -> str:
    return spec_text(**options).replace('provider = "command"\ncommand = "python scripts/writer.py"',
                                        f'provider = "{provider}"\nmodel = "{CASES[provider].model}"')


@pytest.fixture(params=list(CASES))
def provider(request, settings) -> str:
    """An installed agent CLI and a working bubblewrap, or a skip with the install hint."""
    cli_dir = os.environ.get("AGENT_CLI_DIR")  # as tests/search_app/test_agent_clis.py looks it up
    if cli_dir:
        settings.CONFIG = dataclasses.replace(django_settings.CONFIG, agent_cli_dir=Path(cli_dir))
    path = PRESETS[request.param].cli_path()
    if not os.access(path, os.X_OK):
        service_missing(f"{path} is not installed: run scripts/install_agent_clis.sh "
                        f"{settings.CONFIG.agent_cli_dir}")
    available, reason = sandbox.bubblewrap_probe()
    if not available:
        service_missing(reason)
    return request.param


@pytest.fixture
def fake(monkeypatch, tmp_path, settings, provider):
    settings.DATA_DIR = tmp_path / "data"
    case = CASES[provider]
    monkeypatch.setenv(case.key_variable, KEY)
    server: FakeAnthropic | FakeOpenAI
    if provider == "claude-code":
        server = FakeAnthropic(script=claude_code_plan_script(PLAN, final=FAKE_USAGE))
    elif provider == "codex":
        server = FakeOpenAI(responses_script=codex_plan_script(PLAN, final=FAKE_USAGE))
    else:
        server = FakeOpenAI(text_script=aider_plan_script(PLAN, final=FAKE_USAGE))
    with server:
        monkeypatch.setenv(case.url_variable, server.base_url)
        yield server


def test_an_agent_cli_writes_in_the_sandbox_through_the_egress_proxy(personas, tmp_path, provider, fake):
    case = CASES[provider]
    repo = plan_repo(tmp_path / "repo", {})
    search = services.search_freeze(personas.owner, personas.alpha,
                                    agent_spec(provider, population=2, rounds=[2, 1]), "HEAD",
                                    repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    run = services.search_run_inline(search)
    fate = {c.candidate_id: c for c in search.candidates.all()}
    writers = list(Receipt.objects.filter(label__endswith=" writer").order_by("pk"))
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002", \
        ({cid: (c.state, c.reason) for cid, c in fate.items()},
         [(w.exit_code, w.error, w.stdout_excerpt[-3000:], w.stderr_excerpt[-3000:]) for w in writers])
    assert b"return 9" in bytes(fate["cand_002"].patch) and fate["cand_002"].files == ["code/answer.py"]

    assert len(writers) == 2
    for writer in writers:
        assert writer.isolation == "bubblewrap" and writer.succeeded, writer.stderr_excerpt[-2000:]
        egress = writer.detail["egress"]
        assert egress["kind"] == case.api and egress["upstream"] == fake.base_url
        assert egress["client_env"] == case.client_env
        assert "only the egress proxy" in writer.detail["sandbox"]["network"]
        records = egress["records"]
        # The CLI's turns all went through the proxy, and nothing else.
        assert [record["path"] for record in records].count(case.path) >= case.turns
        assert all(record["status"] == 200 and not record.get("refused") for record in records)
        assert all(record.get("client_credentials_dropped") for record in records)
        # Usage and cost are the proxy's, not anything the CLI printed.
        assert writer.cost_microusd == sum(record["cost_microusd"] for record in records) > 0
        for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"):
            assert getattr(writer, name) == sum(record[name] for record in records)
        assert writer.output_tokens > 0
        if provider == "claude-code":  # its last line is its own result and list-price estimate
            result = json.loads(writer.stdout_excerpt.strip().splitlines()[-1])
            assert result["type"] == "result" and result["result"] == FAKE_USAGE
            assert round(result["total_cost_usd"] * 1e6) != writer.cost_microusd
        # The key-like names never passed the env allow-list; the forwarder set them.
        assert not set(case.client_env) & set(writer.env_names)
    for candidate in (fate["cand_001"], fate["cand_002"]):
        writer = next(w for w in writers if w.label.startswith(candidate.candidate_id))
        assert candidate.cost_microusd == writer.cost_microusd != 987654321
        step = search.steps.get(candidate=candidate, kind="generate")
        transcript = step.result["transcript"]
        # The CLI ended by saying a usage line; it is in the transcript, and counted nowhere.
        if provider == "aider":  # plain text: its output is the transcript
            assert FAKE_USAGE in transcript[-1]["text"]
            continue
        roles = [entry["role"] for entry in transcript]
        assert "tool_call" in roles and "tool_result" in roles
        assert transcript[-1]["text"] == FAKE_USAGE
    run.refresh_from_db()
    assert run.spent_cost_microusd == sum(w.cost_microusd for w in writers)

    # Every call reached the provider with the server's key, never the CLI's placeholder.
    assert fake.keys_seen() == {KEY}
    # The key appears in no receipt, event or patch, and nowhere under the data dir.
    for receipt in Receipt.objects.all():
        assert KEY not in f"{receipt.argv} {receipt.stdout_excerpt} {receipt.stderr_excerpt} {receipt.detail}"
    assert not any(KEY in str(event.payload) for event in Event.objects.all())
    assert not any(KEY.encode() in bytes(c.patch or b"") for c in search.candidates.all())
    leaked = [path for path in Path(django_settings.DATA_DIR).rglob("*")
              if path.is_file() and KEY.encode() in path.read_bytes()]
    assert not leaked


def test_the_agent_transcript_is_the_llm_writers_shape_and_bounded():
    lines = [
        '{"type": "system", "subtype": "init"}',
        '{"type": "assistant", "message": {"content": [{"type": "text", "text": "Reading."}, '
        '{"type": "tool_use", "name": "Read", "input": {"file_path": "/t/a.py"}}]}}',
        '{"type": "user", "message": {"content": [{"type": "tool_result", "content": '
        '[{"type": "text", "text": "1 def a()"}]}]}}',
        "… 10 bytes not kept …",
        '{"type": "result", "total_cost_usd": 3.5}',
    ]
    assert agent_transcript("\n".join(lines)) == [
        {"role": "assistant", "text": "Reading."},
        {"role": "tool_call", "text": '{"tool": "Read", "input": {"file_path": "/t/a.py"}}'},
        {"role": "tool_result", "text": "1 def a()"}]
    many = "\n".join(['{"type": "assistant", "message": {"content": "x"}}'] * 1000)
    assert len(agent_transcript(many)) == 401


@pytest.mark.parametrize("provider", ["claude-code"], indirect=True)  # one CLI shows the refusal reaches it
def test_an_agent_cli_writer_stops_at_its_budget_reservation(personas, tmp_path, provider, fake):
    """The proxy refuses the call after the one that spent the step's reservation; the CLI's work
    stops there, and the search is charged at most the reservation."""
    budget = "[budget]\nmax_cost_microusd = 20000\n"  # less than Claude Code's first call
    repo = plan_repo(tmp_path / "repo", {})
    search = services.search_freeze(personas.owner, personas.alpha,
                                    agent_spec(provider, population=2, rounds=[2, 1], budget=budget), "HEAD",
                                    repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    run = services.search_run_inline(search)
    writers = list(Receipt.objects.filter(label__endswith=" writer"))
    assert writers
    for writer in writers:
        records = writer.detail["egress"]["records"]
        assert records[0]["status"] == 200 and records[-1]["status"] == 429
        assert "budget is spent" in records[-1]["refused"]
        assert writer.cost_microusd == records[0]["cost_microusd"]  # refused calls cost nothing
    run.refresh_from_db()
    assert run.spent_cost_microusd <= 20000
    assert all("changed nothing" in c.reason for c in search.candidates.exclude(number=0))


@pytest.mark.parametrize("provider", ["claude-code"], indirect=True)  # the same generate path for each CLI
def test_a_promoted_candidate_s_agent_cli_refines_its_own_patch(personas, tmp_path, settings, monkeypatch,
                                                                 provider):
    """In a later round the CLI runs on the worktree with the candidate's patch applied, told so."""
    settings.DATA_DIR = tmp_path / "data"
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    refined = {"cand_002": ("code/answer.py", "    return 9", "    return 11")}
    with FakeAnthropic(script=claude_code_plan_script(PLAN, refined=refined)) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        repo = plan_repo(tmp_path / "repo", {})
        search = services.search_freeze(personas.owner, personas.alpha,
                                        agent_spec(provider, population=2, rounds=[2, 1], refine=True),
                                        "HEAD", repository_path=str(repo))
        services.search_start(personas.owner, search, enqueue=False)
        run = services.search_run_inline(search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002"
    winner = search.candidates.get(candidate_id="cand_002")
    assert b"+    return 11" in bytes(winner.patch) and winner.patch_round == 1
    refining = search.steps.get(candidate=winner, kind="generate", round=1)
    assert refining.result["refining"].startswith("Your patch from round 0 is already applied")
    writer = Receipt.objects.get(label="cand_002 writer", pk__in=refining.result["receipts"])
    assert writer.detail["egress"]["records"] and writer.cost_microusd > 0


@pytest.mark.parametrize("provider", ["claude-code"], indirect=True)
def test_without_the_provider_s_key_no_cli_runs_and_the_receipt_says_why(personas, tmp_path, settings,
                                                                          monkeypatch, provider):
    settings.DATA_DIR = tmp_path / "data"
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    repo = plan_repo(tmp_path / "repo", {})
    search = services.search_freeze(personas.owner, personas.alpha,
                                    agent_spec(provider, population=2, rounds=[2, 1]), "HEAD",
                                    repository_path=str(repo), without_key=True)
    services.search_start(personas.owner, search, enqueue=False)  # started anyway
    run = services.search_run_inline(search)
    assert run.outcome != "winner"
    writers = list(Receipt.objects.filter(label__endswith=" writer"))
    assert len(writers) == 2 and all("no provider key: set ANTHROPIC_API_KEY" in w.error for w in writers)
    assert all("changed nothing" in c.reason for c in search.candidates.exclude(number=0))
