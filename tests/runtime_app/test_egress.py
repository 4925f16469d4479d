"""The egress proxy, attacked from a real command under the real sandbox.

A Python client runs under bubblewrap (no network of its own), reaches the proxy only through
the forwarder on the sandbox's loopback, and the proxy talks to a loopback fake provider with a
key the sandbox never sees. Each test is what a hostile writer would try.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from django.db import connection

from runtime_app import sandbox, services
from runtime_app.egress import EgressError, EgressProxy
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.openai_server import FakeOpenAI
from tests.helpers import service_missing

# Distinctive, and under a name that does not look secret: only the proxy's own redaction and
# the fact that it never enters the sandbox keep it out of what is recorded.
KEY = "sk-egress-CANARY-9f27c4e1b85d"
KEY_VARIABLE = "CRUCIBLE_TEST_PROVIDER_CANARY"

# Runs in the sandbox: performs the requests listed in a JSON file, prints what came back.
CLIENT = r'''
import http.client, json, os, socket, sys, time
from urllib.parse import urlsplit

url = urlsplit(os.environ["CRUCIBLE_EGRESS_URL"])
results = []
for spec in json.load(open(sys.argv[1])):
    if spec.get("connect"):  # straight to a host and port, not through the proxy
        host, port = spec["connect"]
        try:
            socket.create_connection((host, port), timeout=3).close()
            results.append({"connect": spec["connect"], "outcome": "connected"})
        except OSError as error:
            results.append({"connect": spec["connect"], "outcome": type(error).__name__})
        continue
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    started = time.monotonic()
    body = json.dumps(spec["body"]).encode() if "body" in spec else None
    conn.request(spec.get("method", "POST"), spec["path"], body=body,
                 headers={"content-type": "application/json", **spec.get("headers", {})})
    response = conn.getresponse()
    arrivals, chunks = [], []
    while chunk := response.read1(65536):
        arrivals.append(round(time.monotonic() - started, 3))
        chunks.append(chunk)
    text = b"".join(chunks).decode()
    result = {"path": spec["path"], "status": response.status, "arrivals": arrivals,
              "content_type": response.getheader("content-type", "")}
    if "event-stream" in result["content_type"]:
        result["events"] = [json.loads(line[5:]) for line in text.splitlines()
                            if line.startswith("data:") and line[5:].strip() != "[DONE]"]
    else:
        result["json"] = json.loads(text) if text else None
    results.append(result)
    conn.close()
print(json.dumps(results))
'''

# Runs in the sandbox: looks for the key anywhere it can read that a key would be kept.
SEARCH = r'''
import os, sys
key = (sys.argv[1] + sys.argv[2]).encode()  # in halves: its own command line must not hold it
found = [name for name, value in os.environ.items() if key in value.encode()]
roots = ["/run", "/tmp", os.getcwd(), "/proc/self", "/proc/1", os.path.expanduser("~")]
for root in roots:
    for folder, dirs, files in os.walk(root):
        if folder.startswith("/proc") and folder.count("/") > 3:
            continue
        for name in files:
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as handle:
                    if key in handle.read(1 << 20):
                        found.append(path)
            except OSError:
                pass
print("FOUND " + " ".join(found) if found else "ABSENT")
'''


@pytest.fixture
def bubblewrap() -> str:
    available, reason = sandbox.bubblewrap_probe()
    if not available:
        service_missing(reason)
    return "required"


@pytest.fixture
def tree(data_dir) -> Path:
    path = data_dir / "worktrees" / "cand_001"
    path.mkdir(parents=True)
    (path / "client.py").write_text(CLIENT)
    (path / "search.py").write_text(SEARCH)
    return path


@pytest.fixture
def key(monkeypatch) -> str:
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    return KEY


@pytest.fixture
def anthropic_fake():
    with FakeAnthropic() as fake:
        yield fake


@pytest.fixture
def openai_fake():
    with FakeOpenAI() as fake:
        yield fake


def _client(tree: Path, proxy: EgressProxy, specs: list[dict], isolation: str, **options):
    """Run the client in the sandbox behind `proxy`; (receipt, its results)."""
    (tree / "requests.json").write_text(json.dumps(specs))
    receipt = sandbox.run(["python", "client.py", "requests.json"], cwd=tree, timeout=120,
                          isolation=isolation, egress=proxy, **options)
    assert receipt.exit_code == 0, receipt.stderr_excerpt
    return receipt, json.loads(receipt.stdout_excerpt)


def _message(model: str = "claude-sonnet-4-5", **extra) -> dict:
    return {"path": "/v1/messages", "body": {"model": model, "max_tokens": 256, **extra,
                                             "messages": [{"role": "user", "content": "You are cand_001."}]}}


def _anthropic(fake: FakeAnthropic, **options) -> EgressProxy:
    return EgressProxy("anthropic", fake.base_url, key_variable=KEY_VARIABLE, **options)


# ------------------------------------------------------------------------------ real answers


@pytest.mark.django_db(transaction=True)
def test_a_sandboxed_client_gets_real_answers_streamed_as_they_come_and_the_receipt_has_their_cost(
        tree, key, anthropic_fake, bubblewrap):
    anthropic_fake.stream_pause = 0.3  # seven events: about two seconds from first to last
    cached = {"model": "claude-sonnet-4-5", "max_tokens": 256, "stream": True,
              "system": [{"type": "text", "text": "x" * 400, "cache_control": {"type": "ephemeral"}}],
              "messages": [{"role": "user", "content": "You are cand_001."}]}
    with _anthropic(anthropic_fake) as proxy:
        receipt, results = _client(tree, proxy, [_message(), {"path": "/v1/messages", "body": cached},
                                                 {"path": "/v1/messages", "body": cached}], bubblewrap)
    plain, first, _ = results
    assert plain["status"] == 200 and plain["json"]["content"][0]["text"] == "cand_001: done."
    assert first["status"] == 200 and "text/event-stream" in first["content_type"]
    assert first["events"][0]["type"] == "message_start"
    assert first["events"][-1]["type"] == "message_stop"
    # Passed on event by event: the first arrived long before the last was sent.
    assert len(first["arrivals"]) >= 5 and first["arrivals"][-1] - first["arrivals"][0] > 1.2
    assert anthropic_fake.keys_seen() == {KEY}

    records = receipt.detail["egress"]["records"]
    assert [(r["method"], r["path"], r["status"]) for r in records] == [("POST", "/v1/messages", 200)] * 3
    assert records[0]["model"] == "claude-sonnet-4-5" and records[0]["resolved_model"].endswith("-20261201")
    assert all(r["input_tokens"] > 0 and r["output_tokens"] > 0 and r["cost_microusd"] > 0 for r in records)
    assert records[1]["stream"] and records[1]["cache_write_tokens"] > 0 == records[1]["cache_read_tokens"]
    assert records[2]["cache_read_tokens"] == records[1]["cache_write_tokens"]
    assert records[2]["cache_write_tokens"] == 0
    # The stream's output count is message_delta's final figure, not message_start's 1.
    assert records[1]["output_tokens"] == first["events"][-2]["usage"]["output_tokens"] > 1
    assert all(r["bytes_in"] > 0 and r["bytes_out"] > 0 and r["latency_seconds"] > 0 for r in records)
    assert receipt.cost_microusd == sum(r["cost_microusd"] for r in records) > 0
    assert receipt.input_tokens == sum(r["input_tokens"] for r in records)
    assert receipt.price_table_version and receipt.detail["egress"]["usage"]["requests"] == 3
    assert receipt.detail["sandbox"]["network"].startswith("only the egress proxy")


@pytest.mark.django_db(transaction=True)
def test_openai_chat_completions_and_responses_pass_with_their_usage_streamed_or_not(
        tree, key, openai_fake, bubblewrap):
    chat = {"model": "gpt-5-mini", "messages": [{"role": "system", "content": "s" * 300},
                                                {"role": "user", "content": "You are cand_001."}]}
    responses = {"model": "gpt-5", "instructions": "i" * 400, "input": "hello"}
    specs = [{"path": "/v1/chat/completions", "body": chat},
             {"path": "/v1/chat/completions",
              "body": {**chat, "stream": True, "stream_options": {"include_usage": True}}},
             {"path": "/responses", "body": responses},  # a client whose base URL has no /v1
             {"path": "/v1/responses", "body": {**responses, "stream": True}}]
    with EgressProxy("openai", openai_fake.base_url, key_variable=KEY_VARIABLE) as proxy:
        receipt, results = _client(tree, proxy, specs, bubblewrap)
    assert [result["status"] for result in results] == [200] * 4
    assert results[0]["json"]["choices"][0]["message"]["content"] == "cand_001: done."
    assert results[1]["events"][-1]["usage"]["prompt_tokens"] > 0
    assert results[3]["events"][-1]["type"] == "response.completed"
    assert openai_fake.keys_seen() == {KEY}
    chat_plain, chat_stream, resp_plain, resp_stream = receipt.detail["egress"]["records"]
    usage = results[0]["json"]["usage"]
    assert chat_plain["input_tokens"] == usage["prompt_tokens"] and chat_plain["cache_read_tokens"] == 0
    assert chat_plain["output_tokens"] == usage["completion_tokens"]
    # The second sight of the same system prompt is read from the cache, counted apart from input.
    cached = results[1]["events"][-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert chat_stream["stream"] and chat_stream["cache_read_tokens"] == cached > 0
    assert chat_stream["input_tokens"] == results[1]["events"][-1]["usage"]["prompt_tokens"] - cached
    assert resp_plain["path"] == "/responses" and resp_plain["input_tokens"] > 0
    assert resp_stream["cache_read_tokens"] > 0 and resp_stream["output_tokens"] > 0
    assert all(r["cost_microusd"] > 0 for r in (chat_plain, chat_stream, resp_plain, resp_stream))


# ---------------------------------------------------------------------------------- attacks


@pytest.mark.django_db(transaction=True)
def test_paths_off_the_allow_list_are_refused_and_the_client_s_own_credentials_never_reach_the_provider(
        tree, key, anthropic_fake, bubblewrap):
    stolen = "sk-ant-someone-elses-key-0000"
    specs = [{"method": "GET", "path": "/v1/models"},
             {"path": "/v1/complete", "body": {"model": "claude-2"}},
             {"path": "/v1/messages/../../admin", "body": {}},
             {"path": "/v1/messages/batches", "body": {}},
             {"path": "/v1/files", "body": {}},
             {"method": "GET", "path": "http://169.254.169.254/latest/meta-data/"},  # as to a forward proxy
             {"path": "http://evil.example/v1/messages", "body": _message()["body"]},
             {"method": "CONNECT", "path": "evil.example:443"},
             {**_message(), "headers": {"authorization": f"Bearer {stolen}", "x-api-key": stolen,
                                        "cookie": "session=abc"}}]
    with _anthropic(anthropic_fake) as proxy:
        receipt, results = _client(tree, proxy, specs, bubblewrap)
    assert [result["status"] for result in results] == [403] * 8 + [200]
    assert "does not forward GET /v1/models" in results[0]["json"]["error"]["message"]
    assert results[0]["json"]["error"]["type"] == "permission_error"
    # The provider saw one request only, with the runtime's key and nothing the client sent.
    assert len(anthropic_fake.request_headers) == 1
    assert anthropic_fake.keys_seen() == {KEY}
    assert "cookie" not in anthropic_fake.request_headers[0]
    records = receipt.detail["egress"]["records"]
    assert [bool(r.get("refused")) for r in records] == [True] * 8 + [False]
    assert records[0]["refused"].startswith("the egress proxy does not forward GET /v1/models")
    assert records[-1]["client_credentials_dropped"] and receipt.detail["egress"]["usage"]["refused"] == 8
    assert stolen not in json.dumps(receipt.detail)


@pytest.mark.django_db(transaction=True)
def test_from_inside_the_sandbox_no_other_host_or_port_can_be_reached(tree, key, anthropic_fake, bubblewrap):
    fake_port = anthropic_fake.server.server_address[1]
    targets = [["127.0.0.1", fake_port], ["169.254.169.254", 80], ["127.0.0.1", 6379], ["127.0.0.1", 5432],
               ["10.0.0.1", 443], ["8.8.8.8", 53], ["localhost", fake_port]]
    with _anthropic(anthropic_fake) as proxy:
        _, results = _client(tree, proxy, [{"connect": target} for target in targets], bubblewrap)
        # What the sandbox can see of the host's sockets: only the proxy's own folder.
        listing = sandbox.run("ls -a /run; test -S /run/crucible-egress/proxy.sock && echo socket; "
                              "ls /var/run/postgresql /tmp/.s.PGSQL* /var/run/redis 2>&1", cwd=tree,
                              timeout=30, isolation=bubblewrap, egress=proxy)
    assert [result["outcome"] for result in results] != [] and "connected" not in {
        result["outcome"] for result in results}, results
    assert anthropic_fake.request_headers == []
    shown = listing.stdout_excerpt.split("\n")
    assert shown[:4] == [".", "..", "crucible-egress", "socket"], shown
    assert all("No such file or directory" in line for line in shown[4:] if line), shown


@pytest.mark.django_db(transaction=True)
def test_the_key_is_nowhere_in_the_sandbox_nor_in_any_receipt_or_file_of_the_data_dir(
        tree, key, anthropic_fake, bubblewrap, data_dir):
    (tree / "requests.json").write_text(json.dumps([_message(), _message(stream=True)]))
    with _anthropic(anthropic_fake) as proxy:
        searched = services.command_run(["python", "search.py", KEY[:10], KEY[10:]], cwd=tree, timeout=120,
                                        isolation=bubblewrap, egress=proxy, label="search")
        called = services.command_run(["python", "client.py", "requests.json"], cwd=tree, timeout=120,
                                      isolation=bubblewrap, egress=proxy, label="client")
        socket_dir = proxy.socket_path.parent
    assert searched.exit_code == 0, searched.stderr_excerpt
    assert searched.stdout_excerpt.strip() == "ABSENT"
    assert called.exit_code == 0 and anthropic_fake.keys_seen() == {KEY}
    assert not socket_dir.exists()  # the proxy's folder is gone with it
    for receipt in (searched, called):
        receipt.refresh_from_db()
        assert KEY not in json.dumps({field.name: str(getattr(receipt, field.name))
                                      for field in receipt._meta.fields})
    database = Path(connection.settings_dict["NAME"])
    connection.close()
    found = subprocess.run(["grep", "-r", "-l", "-a", KEY, str(data_dir), str(database.parent)],
                           capture_output=True, text=True, check=False)
    assert found.returncode == 1 and found.stdout == "", found.stdout


# ----------------------------------------------------------------------- budget and faults


@pytest.mark.django_db(transaction=True)
def test_once_the_step_s_budget_is_spent_the_next_call_is_refused_and_recorded(
        tree, key, anthropic_fake, bubblewrap):
    with _anthropic(anthropic_fake, max_tokens=10) as proxy:
        receipt, results = _client(tree, proxy, [_message(), _message()], bubblewrap)
    assert [result["status"] for result in results] == [200, 429], receipt.detail["egress"]
    assert "the step's budget is spent" in results[1]["json"]["error"]["message"]
    assert len(anthropic_fake.requests) == 1
    records = receipt.detail["egress"]["records"]
    assert records[1]["status"] == 429 and records[1]["refused"].startswith("the step's budget is spent")
    with _anthropic(anthropic_fake, max_cost_microusd=1) as proxy:
        _, results = _client(tree, proxy, [_message(), _message(), _message()], bubblewrap)
    assert [result["status"] for result in results] == [200, 429, 429]


@pytest.mark.django_db(transaction=True)
def test_upstream_rate_limits_are_retried_overload_is_passed_on_and_a_malformed_answer_is_a_502(
        tree, key, anthropic_fake, bubblewrap):
    anthropic_fake.fail_next(("429", 0), ("429", 0))
    with _anthropic(anthropic_fake, max_attempts=3) as proxy:
        receipt, results = _client(tree, proxy, [_message()], bubblewrap)
        assert results[0]["status"] == 200 and len(anthropic_fake.requests) == 3
        assert receipt.detail["egress"]["records"][0]["retries"] == 2
        anthropic_fake.fail_next(*[("529", 0)] * 5)
        receipt, results = _client(tree, proxy, [_message()], bubblewrap)
        assert results[0]["status"] == 529 and results[0]["json"]["error"]["type"] == "overloaded_error"
        assert len(anthropic_fake.requests) == 6  # three more tries, then the provider's answer
        anthropic_fake.faults.clear()
        anthropic_fake.fail_next(("malformed",))
        receipt, results = _client(tree, proxy, [_message()], bubblewrap)
    assert results[0]["status"] == 502 and results[0]["json"]["error"]["type"] == "bad_gateway"
    assert receipt.detail["egress"]["records"][0]["status"] == 502


# ------------------------------------------------------------------------ without a sandbox


def _unix_post(proxy: EgressProxy, path: str, body: dict) -> tuple[int, dict]:
    class Connection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(str(proxy.socket_path))

    conn = Connection("sandbox", timeout=30)
    conn.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_step_s_proxy_stops_a_call_waiting_out_a_retry_and_refuses_more(
        key, anthropic_fake, data_dir):
    cancel = threading.Event()
    anthropic_fake.fail_next(("429", 30))
    with _anthropic(anthropic_fake, cancel=cancel) as proxy:
        threading.Timer(0.5, cancel.set).start()
        started = time.monotonic()
        status, answer = _unix_post(proxy, "/v1/messages", _message()["body"])
        assert status == 503 and time.monotonic() - started < 10 and answer["error"]["type"] == "cancelled"
        assert _unix_post(proxy, "/v1/messages", _message()["body"])[0] == 503
    assert [r["refused"] for r in proxy.records] == ["the step was cancelled"] * 2


def test_a_named_key_that_is_missing_refuses_to_start(monkeypatch, data_dir, db):
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    with pytest.raises(EgressError, match=KEY_VARIABLE):
        EgressProxy("anthropic", "http://127.0.0.1:9", key_variable=KEY_VARIABLE).start()
    with pytest.raises(EgressError):
        EgressProxy("anthropic", "file:///etc/passwd", key_variable=None)


@pytest.mark.django_db(transaction=True)
def test_the_command_s_exit_code_and_fatal_signal_come_through_the_forwarder(
        tree, key, anthropic_fake, bubblewrap):
    with _anthropic(anthropic_fake) as proxy:
        exited = sandbox.run("exit 7", cwd=tree, timeout=30, isolation=bubblewrap, egress=proxy)
        killed = sandbox.run("kill -TERM $$", cwd=tree, timeout=30, isolation=bubblewrap, egress=proxy)
        # With rlimits only there is no namespace: the forwarder takes a free port of the host.
        _, results = _client(tree, proxy, [_message()], "off")
    assert exited.exit_code == 7 and exited.argv == ["/bin/sh", "-c", "exit 7"]
    assert killed.signal == 15
    assert exited.detail["egress"]["forwarder"]["port"] == 8787 and exited.detail["egress"]["records"] == []
    assert results[0]["status"] == 200


@pytest.mark.django_db(transaction=True)
def test_the_forwarder_sets_the_client_env_with_its_own_url_which_the_env_allow_list_would_refuse(
        tree, key, anthropic_fake, bubblewrap):
    client_env = {"ANTHROPIC_BASE_URL": "{url}", "ANTHROPIC_API_KEY": "placeholder"}
    command = 'echo "$ANTHROPIC_BASE_URL $ANTHROPIC_API_KEY"'
    with _anthropic(anthropic_fake, client_env=client_env) as proxy:
        inside = sandbox.run(command, cwd=tree, timeout=30, isolation=bubblewrap, egress=proxy)
        plain = sandbox.run(command, cwd=tree, timeout=30, isolation=bubblewrap,
                            env={"ANTHROPIC_BASE_URL": "x"})
    assert inside.stdout_excerpt == "http://127.0.0.1:8787 placeholder\n"
    assert inside.detail["egress"]["client_env"] == ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"]
    assert plain.env_refused == ["ANTHROPIC_BASE_URL"] and plain.stdout_excerpt == " \n"
    # A client environment that would carry the provider key refuses to start.
    with pytest.raises(EgressError, match="may not carry the provider key"):
        _anthropic(anthropic_fake, client_env={"TOKEN": f"x{key}"}).start()


@pytest.mark.django_db(transaction=True)
def test_calls_in_flight_keep_to_the_account_s_concurrency(key, anthropic_fake, data_dir):
    anthropic_fake.fail_next(("slow", 1.0), ("slow", 1.0))
    statuses: list[int] = []
    with _anthropic(anthropic_fake, account="egress-test", account_limit=1) as proxy:
        started = time.monotonic()
        calls = [threading.Thread(target=lambda: statuses.append(
            _unix_post(proxy, "/v1/messages", _message()["body"])[0])) for _ in range(2)]
        for call in calls:
            call.start()
        for call in calls:
            call.join()
    assert statuses == [200, 200] and time.monotonic() - started >= 2.0  # one after the other


def test_usage_is_read_from_every_answer_shape():
    from runtime_app.egress import _Meter

    meter = _Meter()
    start = {"type": "message_start", "message": {"model": "claude-x", "usage": {
        "input_tokens": 10, "output_tokens": 1, "cache_read_input_tokens": 70,
        "cache_creation_input_tokens": 5}}}
    delta = {"type": "message_delta", "usage": {"output_tokens": 42}}
    stream = f"event: message_start\r\ndata: {json.dumps(start)}\r\n\r\nevent: message_delta\r\ndata: "
    meter.feed_events(stream.encode())
    meter.feed_events(f"{json.dumps(delta)}\r".encode())  # an event split across chunks, even its CRLF
    meter.feed_events(b"\n\r\n")
    assert meter.usage().__dict__ == {"input_tokens": 10, "output_tokens": 42, "cache_write_tokens": 5,
                                      "cache_read_tokens": 70} and meter.resolved_model == "claude-x"
    meter = _Meter()
    meter.feed_events(b'data: {"type": "response.completed", "response": {"model": "gpt-5", "usage": '
                      b'{"input_tokens": 100, "output_tokens": 7, '
                      b'"input_tokens_details": {"cached_tokens": 60}}}}\n\ndata: [DONE]\n\n')
    assert (meter.input_tokens, meter.cache_read_tokens, meter.output_tokens) == (40, 60, 7)
    meter = _Meter()
    meter.document({"object": "chat.completion", "model": "m", "choices": [], "usage": {
        "prompt_tokens": 30, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}}})
    assert (meter.input_tokens, meter.output_tokens, meter.seen) == (30, 3, True)
