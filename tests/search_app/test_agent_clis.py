"""The real agent CLIs (Claude Code, Codex CLI, aider) edit a file against the loopback fakes.

Each CLI runs as a plain subprocess (no sandbox yet) in a temporary git repository, with the
prompt on stdin, a dummy key, its provider's base URL at a fake from tests/fakes/ and a fresh
HOME. The fake scripts a conversation that makes the CLI edit `greeting.txt` with its own
tools; the tests check the file on disk and the exact HTTP calls the fake saw (the paths the
runtime's egress proxy must allow). Every run also points HTTP(S)_PROXY at a recording
server, so any other traffic the CLI attempts shows up and fails the test.

The CLIs come from scripts/install_agent_clis.sh, looked up in AGENT_CLI_DIR (default
var/agent-clis; not CRUCIBLE_-prefixed because Crucible rejects CRUCIBLE_ names it does not
know); a missing one skips, or fails under CRUCIBLE_REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.anthropic_server import FakeAnthropic, Script, claude_code_script, tool_results
from tests.fakes.openai_server import FakeOpenAI, TextScript, aider_script, codex_script, tool_outputs
from tests.helpers import REPO_ROOT, service_missing

CLI_DIR = Path(os.environ.get("AGENT_CLI_DIR") or REPO_ROOT / "var" / "agent-clis")
PROMPT = "Change the greeting in greeting.txt from hello to goodbye.\n"
TIMEOUT = 180


def installed(relative: str) -> Path:
    """The CLI at CLI_DIR/relative, or a skip (a failure when services are required)."""
    path = CLI_DIR / relative
    if not os.access(path, os.X_OK):
        service_missing(f"{path} is not installed: run scripts/install_agent_clis.sh {CLI_DIR}")
    return path


class RecordingProxy:
    """Stands in for the internet: records each proxied request (CONNECT host or URL), refuses it."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return

            def refuse(self) -> None:
                proxy.seen.append(f"{self.command} {self.path}")
                self.send_response(403)
                self.send_header("content-length", "0")
                self.end_headers()

            do_CONNECT = do_GET = do_POST = do_HEAD = refuse

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy() -> Iterator[RecordingProxy]:
    recorder = RecordingProxy()
    yield recorder
    recorder.close()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A committed repository with greeting.txt, as a writer's worktree is."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "greeting.txt").write_text("hello world\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=root, check=True)
    return root


def base_env(home: Path, proxy: RecordingProxy, **extra: str) -> dict[str, str]:
    """No inherited keys or config: PATH, a fresh HOME, the recording proxy, and `extra`."""
    home.mkdir(parents=True, exist_ok=True)
    node = shutil.which("node")  # codex's npm entry point is a node script
    path = ":".join([*([str(Path(node).parent)] if node else []), "/usr/local/bin", "/usr/bin", "/bin"])
    return {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8",
            "HTTPS_PROXY": proxy.url, "HTTP_PROXY": proxy.url, "NO_PROXY": "127.0.0.1,localhost", **extra}


def run(command: list[str], repo: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    process = subprocess.run(command, input=PROMPT, cwd=repo, env=env, capture_output=True, text=True,
                             timeout=TIMEOUT)
    output = f"{process.stdout[-3000:]}\n{process.stderr[-3000:]}"
    assert process.returncode == 0, f"exit {process.returncode}\n{output}"
    return process


def changed_files(repo: Path) -> list[str]:
    """Paths git sees as changed or new (ignored files included), so stray CLI files show up."""
    out = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
                         cwd=repo, capture_output=True, text=True, check=True).stdout
    return sorted(line[3:] for line in out.splitlines())


def test_claude_code_edits_a_file_with_its_own_tools(repo: Path, tmp_path: Path,
                                                     proxy: RecordingProxy) -> None:
    claude = installed("node_modules/.bin/claude")
    target = repo / "greeting.txt"
    with FakeAnthropic(script=claude_code_script(str(target), "hello world", "goodbye world")) as fake:
        env = base_env(
            tmp_path / "home", proxy, ANTHROPIC_BASE_URL=fake.base_url, ANTHROPIC_API_KEY="sk-ant-test-dummy",
            # Tests and CI run as root, where Claude Code refuses to skip permissions unless told
            # it is in a sandbox; Crucible's sandbox is the boundary.
            IS_SANDBOX="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1")
        process = run([str(claude), "-p", "--output-format", "stream-json", "--verbose",
                       "--model", "claude-sonnet-4-5", "--dangerously-skip-permissions"], repo, env)
    assert target.read_text() == "goodbye world\n"
    assert changed_files(repo) == ["greeting.txt"]
    assert fake.calls == [("POST", "/v1/messages")] * 3
    assert all(request["stream"] and request["model"] == "claude-sonnet-4-5" for request in fake.requests)
    assert fake.keys_seen() == {"sk-ant-test-dummy"}
    # The prompt arrived from stdin as the user's last text block, and both tools succeeded.
    assert fake.requests[0]["messages"][0]["content"][-1]["text"] == PROMPT
    results = tool_results(fake.requests[-1])
    assert [result["tool_use_id"] for result in results] == ["toolu_fake_read", "toolu_fake_edit"]
    assert not any(result.get("is_error") for result in results)
    # The last stdout line is the result, with the usage Crucible can charge.
    result = json.loads(process.stdout.strip().splitlines()[-1])
    assert result["type"] == "result" and not result["is_error"] and result["num_turns"] == 3
    assert result["usage"]["output_tokens"] > 0
    assert proxy.seen == []


@pytest.mark.parametrize("model, tool", [("gpt-5.5", "custom_tool_call"), ("local-coder", "function_call")])
def test_codex_edits_a_file_with_apply_patch(repo: Path, tmp_path: Path, proxy: RecordingProxy,
                                             model: str, tool: str) -> None:
    """A model in Codex's bundled catalog gets the freeform apply_patch tool; any other model
    (fallback metadata) patches through exec_command."""
    codex = installed("node_modules/.bin/codex")
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    with FakeOpenAI(responses_script=codex_script("greeting.txt", "hello world", "goodbye world")) as fake:
        env = base_env(home, proxy, CODEX_HOME=str(home / ".codex"), CRUCIBLE_PROVIDER_KEY="sk-test-dummy")
        settings = {
            "model_provider": "crucible",
            "model_providers.crucible.name": "crucible",
            "model_providers.crucible.base_url": fake.base_url,
            "model_providers.crucible.env_key": "CRUCIBLE_PROVIDER_KEY",
            "model_providers.crucible.wire_api": "responses",
            "model_providers.crucible.request_max_retries": "0",
            "model_providers.crucible.stream_max_retries": "0",
            # Without these, Codex reaches ab.chatgpt.com (analytics), chatgpt.com and GitHub (plugins).
            "analytics.enabled": "false",
            "check_for_update_on_startup": "false",
            "features.plugins": "false",
        }
        overrides = [part for key, value in settings.items() for part in ("-c", f"{key}={value}")]
        process = run([str(codex), "exec", "--json", "--ephemeral", "--skip-git-repo-check",
                       "--dangerously-bypass-approvals-and-sandbox", "-m", model, *overrides, "-"], repo, env)
    assert (repo / "greeting.txt").read_text() == "goodbye world\n"
    assert changed_files(repo) == ["greeting.txt"]
    assert fake.calls == [("POST", "/v1/responses")] * 2
    assert all(request["stream"] and request["model"] == model for request in fake.requests)
    assert fake.keys_seen() == {"sk-test-dummy"}
    assert fake.requests[0]["input"][-1]["content"][0]["text"] == PROMPT
    assert [item["type"] for item in fake.requests[-1]["input"] if item["type"].endswith("call")] == [tool]
    [output] = tool_outputs(fake.requests[-1])
    assert "Success. Updated the following files" in output["output"]
    events = [json.loads(line) for line in process.stdout.splitlines() if line.startswith("{")]
    assert events[-1]["type"] == "turn.completed" and events[-1]["usage"]["output_tokens"] > 0
    assert proxy.seen == []


def text_of(message: dict[str, Any]) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "".join(block.get("text", "") for block in content)


def as_anthropic(text_script: TextScript) -> Script:
    """An aider text script served by the Anthropic fake: blocks flattened to text, one text reply."""

    def script(request: dict[str, Any], candidate: str) -> list[dict[str, Any]]:
        messages = [{"role": message["role"], "content": text_of(message)} for message in request["messages"]]
        return [{"type": "text", "text": text_script({"messages": messages})}]

    return script


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_aider_edits_a_file_with_a_search_replace_block(repo: Path, tmp_path: Path, proxy: RecordingProxy,
                                                        provider: str) -> None:
    aider = installed("aider/bin/aider")
    home = tmp_path / "home"
    # aider fetches litellm's model table from GitHub unless its cache holds one: seed the cache
    # with the copy litellm ships.
    [table] = (CLI_DIR / "aider").glob(
        "lib/python3*/site-packages/litellm/model_prices_and_context_window_backup.json")
    (home / ".aider" / "caches").mkdir(parents=True)
    shutil.copy(table, home / ".aider" / "caches" / "model_prices_and_context_window.json")
    edit = aider_script("greeting.txt", "hello world", "goodbye world")
    if provider == "openai":
        fake: FakeOpenAI | FakeAnthropic = FakeOpenAI(text_script=edit)
        model, path, served = "gpt-4o", "/v1/chat/completions", "gpt-4o"
        server = {"OPENAI_API_BASE": fake.base_url, "OPENAI_API_KEY": "sk-test-dummy"}
    else:
        fake = FakeAnthropic(script=as_anthropic(edit))
        model, path, served = "claude-sonnet-4-5", "/v1/messages", "claude-sonnet-4-5"
        server = {"ANTHROPIC_API_BASE": fake.base_url, "ANTHROPIC_API_KEY": "sk-test-dummy"}
    with fake:
        # litellm fetches the same table at import unless told to use its own copy.
        env = base_env(home, proxy, LITELLM_LOCAL_MODEL_COST_MAP="True", **server)
        process = run([
            str(aider), "--model", f"{provider}/{model}", "--weak-model", f"{provider}/{model}",
            "--edit-format", "diff", "--message-file", "/dev/stdin", "--yes-always",
            "--no-auto-commits", "--no-dirty-commits", "--no-gitignore", "--map-tokens", "0",
            "--chat-history-file", str(home / "chat.md"), "--input-history-file", str(home / "input.txt"),
            "--no-check-update", "--no-analytics", "--no-show-release-notes", "--no-pretty",
            "--no-fancy-input", "--no-detect-urls", "--disable-playwright"], repo, env)
    assert (repo / "greeting.txt").read_text() == "goodbye world\n"
    assert changed_files(repo) == ["greeting.txt"]
    assert "Applied edit to greeting.txt" in process.stdout
    assert fake.calls == [("POST", path)]
    [request] = fake.requests
    assert request["stream"] is True and request["model"] == served
    assert fake.keys_seen() == {"sk-test-dummy"}
    assert any(PROMPT in text_of(message) for message in request["messages"] if message["role"] == "user")
    assert proxy.seen == []
