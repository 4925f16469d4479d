"""A full search whose writers are a real coding-agent CLI (the `claude-code` preset): Claude Code
runs in the sandbox (bubblewrap), edits the candidate's worktree with its own tools, and reaches
the loopback fake only through the step's egress proxy, which injects the key and meters usage.

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
from runtime_app.fleet import PLACEHOLDER_KEY, PRESETS
from runtime_app.models import Event, Receipt
from search_app import services
from search_app.execution import stream_json_transcript
from tests.conftest import service_missing
from tests.fakes.anthropic_server import FakeAnthropic, claude_code_plan_script
from tests.search_app.runs import plan_repo, spec_text

pytestmark = pytest.mark.django_db(transaction=True)
KEY = "sk-ant-test-secret-claude-code-5f3e9a1c77"  # distinctive: grepped for everywhere afterwards
# What the CLI says at the end: a usage line a command writer's receipt would be charged by.
FAKE_USAGE = '{"input_tokens": 1, "output_tokens": 1, "cost_microusd": 987654321}'


def agent_spec(**options) -> str:
    return spec_text(**options).replace('provider = "command"\ncommand = "python scripts/writer.py"',
                                        'provider = "claude-code"\nmodel = "fake-sonnet"')


@pytest.fixture
def claude(settings) -> Path:
    """The installed Claude Code and a working bubblewrap, or a skip with the install hint."""
    cli_dir = os.environ.get("AGENT_CLI_DIR")  # as tests/search_app/test_agent_clis.py looks it up
    if cli_dir:
        settings.CONFIG = dataclasses.replace(django_settings.CONFIG, agent_cli_dir=Path(cli_dir))
    path = PRESETS["claude-code"].cli_path()
    if not os.access(path, os.X_OK):
        service_missing(f"{path} is not installed: run scripts/install_agent_clis.sh "
                        f"{settings.CONFIG.agent_cli_dir}")
    available, reason = sandbox.bubblewrap_probe()
    if not available:
        service_missing(reason)
    return path


@pytest.fixture
def fake(monkeypatch, tmp_path, settings, claude):
    settings.DATA_DIR = tmp_path / "data"
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    plan = {"cand_001": ("code/answer.py", "return 2", "return 5"),
            "cand_002": ("code/answer.py", "return 2", "return 9")}
    with FakeAnthropic(script=claude_code_plan_script(plan, final=FAKE_USAGE)) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        yield server


def test_claude_code_writes_in_the_sandbox_through_the_egress_proxy(personas, tmp_path, fake):
    repo = plan_repo(tmp_path / "repo", {})
    search = services.search_freeze(personas.owner, personas.alpha, agent_spec(population=2, rounds=[2, 1]),
                                    "HEAD", repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    run = services.search_run_inline(search)
    fate = {c.candidate_id: c for c in search.candidates.all()}
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002", \
        {cid: (c.state, c.reason) for cid, c in fate.items()}
    assert b"return 9" in bytes(fate["cand_002"].patch) and fate["cand_002"].files == ["code/answer.py"]

    writers = list(Receipt.objects.filter(label__endswith=" writer").order_by("pk"))
    assert len(writers) == 2
    for writer in writers:
        assert writer.isolation == "bubblewrap" and writer.succeeded, writer.stderr_excerpt[-2000:]
        egress = writer.detail["egress"]
        assert egress["kind"] == "anthropic" and egress["upstream"] == fake.base_url
        assert egress["client_env"] == ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"]
        assert "only the egress proxy" in writer.detail["sandbox"]["network"]
        records = egress["records"]
        # Claude Code's turns (read, edit, finish) all went through the proxy, and nothing else.
        assert [record["path"] for record in records].count("/v1/messages") >= 3
        assert all(record["status"] == 200 and not record.get("refused") for record in records)
        assert all(record.get("client_credentials_dropped") for record in records)
        # Usage and cost are the proxy's, not the CLI's final usage line.
        assert writer.cost_microusd == sum(record["cost_microusd"] for record in records) > 0
        for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"):
            assert getattr(writer, name) == sum(record[name] for record in records)
        assert writer.output_tokens > 0 and writer.cache_write_tokens + writer.cache_read_tokens > 0
        # Its last line is Claude Code's own result (its list-price estimate), ending with FAKE_USAGE.
        result = json.loads(writer.stdout_excerpt.strip().splitlines()[-1])
        assert result["type"] == "result" and result["result"] == FAKE_USAGE
        assert round(result["total_cost_usd"] * 1e6) != writer.cost_microusd
        # The plain settings passed the env allow-list; the key-like names never did.
        assert "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC" in writer.env_names
        assert not any(name.startswith("ANTHROPIC_") for name in writer.env_names)
    for candidate in (fate["cand_001"], fate["cand_002"]):
        writer = next(w for w in writers if w.label.startswith(candidate.candidate_id))
        assert candidate.cost_microusd == writer.cost_microusd != 987654321
        step = search.steps.get(candidate=candidate, kind="generate")
        roles = [entry["role"] for entry in step.result["transcript"]]
        assert roles[:3] == ["assistant", "tool_call", "tool_result"] and "tool_call" in roles[3:]
        assert step.result["transcript"][-1]["text"] == FAKE_USAGE
    run.refresh_from_db()
    assert run.spent_cost_microusd == sum(w.cost_microusd for w in writers)

    # Every call reached the provider with the server's key, never the CLI's placeholder.
    assert fake.keys_seen() == {KEY}
    assert PLACEHOLDER_KEY not in {h.get("x-api-key") for h in fake.request_headers}
    # The key appears in no receipt, event or patch, and nowhere under the data dir.
    for receipt in Receipt.objects.all():
        assert KEY not in f"{receipt.argv} {receipt.stdout_excerpt} {receipt.stderr_excerpt} {receipt.detail}"
    assert not any(KEY in str(event.payload) for event in Event.objects.all())
    assert not any(KEY.encode() in bytes(c.patch or b"") for c in search.candidates.all())
    leaked = [path for path in Path(django_settings.DATA_DIR).rglob("*")
              if path.is_file() and KEY.encode() in path.read_bytes()]
    assert not leaked


def test_the_stream_json_transcript_is_the_llm_writers_shape_and_bounded():
    lines = [
        '{"type": "system", "subtype": "init"}',
        '{"type": "assistant", "message": {"content": [{"type": "text", "text": "Reading."}, '
        '{"type": "tool_use", "name": "Read", "input": {"file_path": "/t/a.py"}}]}}',
        '{"type": "user", "message": {"content": [{"type": "tool_result", "content": '
        '[{"type": "text", "text": "1 def a()"}]}]}}',
        "… 10 bytes not kept …",
        '{"type": "result", "total_cost_usd": 3.5}',
    ]
    assert stream_json_transcript("\n".join(lines)) == [
        {"role": "assistant", "text": "Reading."},
        {"role": "tool_call", "text": '{"tool": "Read", "input": {"file_path": "/t/a.py"}}'},
        {"role": "tool_result", "text": "1 def a()"}]
    many = "\n".join(['{"type": "assistant", "message": {"content": "x"}}'] * 1000)
    assert len(stream_json_transcript(many)) == 401
