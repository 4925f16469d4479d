"""The egress proxy: the one way out of the sandbox for a writer's model calls.

A coding-agent CLI runs inside the sandbox, which has no network. For one writer step the runtime
starts an `EgressProxy` outside the sandbox: an HTTP/1.1 reverse proxy listening on a Unix socket
in a fresh private directory, which `sandbox.run(..., egress=proxy)` binds into the sandbox, where
runtime_app/egress_forwarder.py turns it into http://127.0.0.1:<port> on the sandbox's own
loopback. The proxy

- forwards only an allow-list of (method, path) to ONE upstream base URL; anything else is
  refused (403) and recorded;
- strips whatever credentials the client sent and injects the provider key itself, read from
  the server's environment (or stored keys) by name: the key never enters the sandbox, a record
  or a log line;
- streams answers through as they come (SSE event by event) and reads their usage on the way:
  Anthropic Messages, OpenAI Responses and Chat Completions, streaming or not;
- records one entry per request (tokens, cost in micro-USD from the price table, latency, bytes,
  refusal) and refuses more (429) once the step's budget reservation is spent;
- holds an `llm.account_slot` per upstream attempt and retries 429/529/5xx with the SDK writers'
  backoff (honouring retry-after), a bounded number of times, before passing the error through;
  a malformed answer becomes a 502; a cancel event stops it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import shutil
import socket
import socketserver
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.db import connections

from runtime_app import llm
from runtime_app.keys import provider_key
from runtime_app.prices import Usage
from runtime_app.sandbox import FORWARDER_NAME, SOCKET_NAME, sandbox_identity

logger = logging.getLogger(__name__)
FORWARDER_SOURCE = Path(__file__).resolve().parent / "egress_forwarder.py"
MAX_REQUEST_BYTES = 32 << 20
MAX_JSON_RESPONSE_BYTES = 64 << 20  # a non-streaming answer is read whole to check it and its usage
UPSTREAM_TIMEOUT_SECONDS = 600.0
RECORDS_KEPT = 1000  # per receipt; the totals count every request
_CHUNK = 65536
# Paths relative to the upstream base URL, by provider kind. A client may also send them under
# "/v1/" (an OpenAI SDK's base URL ends in /v1); the upstream gets base URL + "/" + path.
RULES: dict[str, tuple[tuple[str, str], ...]] = {
    "anthropic": (("POST", "v1/messages"), ("POST", "v1/messages/count_tokens")),
    "openai": (("POST", "responses"), ("POST", "chat/completions")),
}
# Request headers never sent upstream: the client's credentials and hop-by-hop headers.
_DROP_REQUEST = frozenset({
    "authorization", "proxy-authorization", "x-api-key", "api-key", "x-goog-api-key", "cookie",
    "host", "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
    "upgrade", "content-length", "accept-encoding", "expect",
})
_DROP_RESPONSE = frozenset({
    "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
    "content-length", "set-cookie", "server", "date",
})


_OPENAI_OBJECTS = ("response", "chat.completion", "chat.completion.chunk")


class EgressError(Exception):
    """The proxy could not be started (no key, a bad upstream URL, an unknown provider kind)."""


@dataclass
class _Meter:
    """Usage read from one answer as it passes: whole JSON, or SSE events one by one."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    resolved_model: str = ""
    seen: bool = False
    malformed: str = ""
    _pending: bytearray = field(default_factory=bytearray)

    def usage(self) -> Usage:
        return Usage(input_tokens=self.input_tokens, output_tokens=self.output_tokens,
                     cache_write_tokens=self.cache_write_tokens, cache_read_tokens=self.cache_read_tokens)

    def document(self, data: dict[str, Any]) -> None:
        """A whole answer, or one event's data: whichever usage shape it carries."""
        kind = data.get("type")
        if kind == "message_start":  # Anthropic stream: input side, and output so far
            message = data.get("message") or {}
            self._model(message)
            self._anthropic(message.get("usage"))
        elif kind == "message_delta":  # Anthropic stream: cumulative output (and input, lately)
            self._anthropic(data.get("usage"))
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            response = data.get("response") or {}
            self._model(response)
            self._openai(response.get("usage"))
        elif kind == "message":  # Anthropic, not streamed
            self._model(data)
            self._anthropic(data.get("usage"))
        elif data.get("object") in _OPENAI_OBJECTS or "choices" in data:
            self._model(data)  # OpenAI Responses (not streamed), Chat Completions (and their chunks)
            self._openai(data.get("usage"))
        elif "input_tokens" in data and len(data) <= 2:  # Anthropic count_tokens: free
            self.seen = True

    def _model(self, data: dict[str, Any]) -> None:
        if isinstance(data.get("model"), str) and data["model"]:
            self.resolved_model = data["model"]

    def _anthropic(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        self.seen = True
        # message_delta repeats cumulative figures: the latest one given is the answer's.
        for name, attribute in (("input_tokens", "input_tokens"), ("output_tokens", "output_tokens"),
                                ("cache_read_input_tokens", "cache_read_tokens"),
                                ("cache_creation_input_tokens", "cache_write_tokens")):
            if isinstance(usage.get(name), int):
                setattr(self, attribute, usage[name])

    def _openai(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        self.seen = True
        prompt = usage.get("input_tokens", usage.get("prompt_tokens")) or 0
        details = usage.get("input_tokens_details") or usage.get("prompt_tokens_details") or {}
        cached = (details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
        # OpenAI counts cached tokens inside the prompt's; the price table prices them apart.
        self.input_tokens = max(int(prompt) - int(cached), 0)
        self.cache_read_tokens = int(cached)
        self.output_tokens = int(usage.get("output_tokens", usage.get("completion_tokens")) or 0)

    def feed_events(self, chunk: bytes) -> None:
        """SSE bytes as they arrive; complete events are read, the rest waits for more."""
        self._pending += chunk
        if b"\r" in self._pending:  # CRLF lines, even when a chunk ends between the two
            self._pending[:] = self._pending.replace(b"\r\n", b"\n")
        while (end := self._pending.find(b"\n\n")) >= 0:
            event = bytes(self._pending[:end])
            del self._pending[: end + 2]
            lines = event.split(b"\n")
            data = b"\n".join(line[5:].lstrip(b" ") for line in lines if line.startswith(b"data:"))
            if not data or data.strip() == b"[DONE]":
                continue
            try:
                parsed = json.loads(data)
            except ValueError:
                self.malformed = "an event that is not JSON"
                continue
            if isinstance(parsed, dict):
                self.document(parsed)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = False
    proxy: EgressProxy


class EgressProxy:
    """One writer step's way to its model provider. Use as a context manager:

        with EgressProxy("anthropic", base_url, key_variable="ANTHROPIC_API_KEY",
                         max_cost_microusd=500_000) as proxy:
            receipt = sandbox.run(argv, cwd=tree, timeout=600, egress=proxy)

    `kind` picks the allow-list (RULES) and how the key is sent (anthropic: x-api-key; openai:
    Authorization: Bearer); `key_variable=None` sends none (a local model server). `allow`
    replaces the kind's (method, path) rules. `account`/`account_limit` are the provider account
    whose concurrency `llm.account_slot` bounds; `price_model` prices every call as that model.
    `client_env` is set by the forwarder for the command ("{url}" becomes its URL): a CLI's base-URL
    variable and placeholder key, whose names the sandbox's env allow-list refuses; never a key.
    """

    def __init__(self, kind: str, base_url: str, *, key_variable: str | None, account: str = "",
                 account_limit: int = 0, max_cost_microusd: int | None = None, max_tokens: int | None = None,
                 cancel: threading.Event | None = None, allow: Sequence[tuple[str, str]] | None = None,
                 price_model: str = "", max_attempts: int = llm.MAX_ATTEMPTS, port: int = 0,
                 client_env: dict[str, str] | None = None) -> None:
        if kind not in RULES:
            raise EgressError(f"provider kind {kind!r}; use one of {', '.join(RULES)}")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EgressError(f"upstream base URL {base_url!r} must be http(s)://host[:port][/path]")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise EgressError("the upstream base URL may not carry credentials, a query or a fragment")
        self.kind, self.account, self.account_limit = kind, account or kind, account_limit
        self.upstream = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._netloc = parts.netloc  # the Host header (brackets kept for an IPv6 address)
        self._base_path = parts.path.rstrip("/")
        self.key_variable = key_variable
        self.max_cost_microusd, self.max_tokens = max_cost_microusd, max_tokens
        self.cancel = cancel or threading.Event()
        self.rules = frozenset((method.upper(), path.strip("/")) for method, path in (allow or RULES[kind]))
        self.price_model = price_model
        self.max_attempts = max(1, max_attempts)
        self.port = port  # the forwarder's port inside the sandbox (0: any free one)
        self.client_env = dict(client_env or {})
        for name, value in self.client_env.items():
            if not name.isidentifier() or "=" in name or "\0" in value:
                raise EgressError(f"client environment {name!r} is not a valid variable")
        self.directory: Path | None = None
        self._key: str | None = None
        self._lock = threading.Lock()
        self._quiet = threading.Condition(self._lock)
        self._serving_count = 0  # requests being served: their records are not written yet
        self._records: list[dict[str, Any]] = []
        self._spent_cost = self._spent_tokens = 0
        self._idle: list[http.client.HTTPConnection] = []
        self._active: set[http.client.HTTPConnection] = set()
        self._server: _Server | None = None
        self._threads: list[threading.Thread] = []
        self._stopped = threading.Event()

    # ------------------------------------------------------------------------ lifecycle

    @property
    def socket_path(self) -> Path:
        if self.directory is None:
            raise EgressError("the egress proxy is not started")
        return self.directory / SOCKET_NAME

    @property
    def forwarder_path(self) -> Path:
        return self.socket_path.parent / FORWARDER_NAME

    def start(self) -> EgressProxy:
        if self.key_variable:
            self._key = provider_key(self.key_variable)
            if not self._key:
                raise EgressError(f"no provider key: set {self.key_variable} in the server's environment")
            if any(self._key in value for value in self.client_env.values()):
                raise EgressError("the client environment may not carry the provider key")
        identity = sandbox_identity()
        # Its own directory, listable by no one else: only the socket and the forwarder are in it.
        self.directory = Path(tempfile.mkdtemp(prefix="crucible-egress-"))
        try:
            shutil.copyfile(FORWARDER_SOURCE, self.forwarder_path)
            self.forwarder_path.chmod(0o644)
            server = _Server(str(self.socket_path), _Handler)  # made in a 0700 folder: no one else yet
            server.proxy = self
            self.socket_path.chmod(0o600)
            if identity is not None:  # the sandbox's uid may connect, and pass through the folder
                os.chown(self.socket_path, *identity)
                self.directory.chmod(0o711)
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        self._server = server
        self._threads = [threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                          name="egress-proxy", daemon=True),
                         threading.Thread(target=self._watch_cancel, name="egress-cancel", daemon=True)]
        for thread in self._threads:
            thread.start()
        return self

    def close(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._drop_connections()
        for thread in self._threads:
            thread.join(5)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
        self._key = None

    def __enter__(self) -> EgressProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _watch_cancel(self) -> None:
        while not self._stopped.wait(0.1):
            if self.cancel.is_set():
                self._drop_connections()  # a call in flight ends now, not when the model finishes
                return

    def _drop_connections(self) -> None:
        with self._lock:
            connections = [*self._active, *self._idle]
            self._idle.clear()
        for connection in connections:
            with contextlib.suppress(OSError, AttributeError):
                connection.sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                connection.close()

    def redact_values(self) -> list[str]:
        """What must never be recorded: the key this proxy injects."""
        return [self._key] if self._key else []

    # ------------------------------------------------------------------------ records

    @property
    def records(self) -> list[dict[str, Any]]:
        """One entry per request so far, in the order they arrived."""
        return self.records_since(0)

    def records_since(self, mark: int) -> list[dict[str, Any]]:
        """The entries after the first `mark` (a command's own, with `mark = len(proxy.records)`)."""
        with self._lock:  # a call still being served shows what is known of it so far
            return [{key: value for key, value in record.items() if not key.startswith("_")}
                    for record in self._records[mark:]]

    def usage(self, mark: int = 0) -> dict[str, Any]:
        """Totals over the requests (after `mark`): counts, tokens, cost, and the price tables used."""
        records = self.records_since(mark)
        total = {name: sum(record.get(name, 0) for record in records)
                 for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                              "cost_microusd", "bytes_in", "bytes_out")}
        versions = sorted({record["price_table_version"] for record in records
                           if record.get("price_table_version")})
        return {"requests": len(records), "refused": sum(1 for record in records if record.get("refused")),
                **total, "price_table_versions": versions,
                "budget": {"max_cost_microusd": self.max_cost_microusd, "max_tokens": self.max_tokens}}

    def describe(self, mark: int = 0) -> dict[str, Any]:
        """The receipt's view of this proxy: where it led, what it allowed, what passed (after `mark`)."""
        records = self.records_since(mark)
        return {"kind": self.kind, "upstream": self.upstream, "account": self.account,
                "key_variable": self.key_variable or "", "allowed": self.allowed(),
                "client_env": sorted(self.client_env),
                "records": records[:RECORDS_KEPT], "usage": self.usage(mark),
                **({"records_not_kept": len(records) - RECORDS_KEPT} if len(records) > RECORDS_KEPT else {})}

    def allowed(self) -> list[str]:
        return sorted(f"{method} /{path}" for method, path in self.rules)

    def _open(self, entry: dict[str, Any]) -> None:
        """A call's record takes its place when the call arrives, so records keep the calls' order
        (a refusal answered at once must not come before the call that spent the budget)."""
        with self._lock:
            self._records.append(entry)

    def _record(self, entry: dict[str, Any]) -> None:
        if not entry.pop("_charged", False):
            self._charge(entry)

    def _serving(self, change: int) -> None:
        with self._quiet:
            self._serving_count += change
            self._quiet.notify_all()

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until no request is being served, so the records are whole: a client that has
        read its last answer can exit before the proxy has written that call's record."""
        with self._quiet:
            return self._quiet.wait_for(lambda: self._serving_count == 0, timeout)

    def _charge(self, entry: dict[str, Any]) -> None:
        """Count a call against the budget; done before the client sees the end of its answer, so
        a client that waits for one answer before the next call can never slip past the budget."""
        with self._lock:
            self._spent_cost += entry.get("cost_microusd", 0)
            self._spent_tokens += sum(entry.get(name, 0) for name in (
                "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"))
        entry["_charged"] = True

    def _budget_spent(self) -> str:
        with self._lock:
            if self.max_cost_microusd is not None and self._spent_cost >= self.max_cost_microusd:
                return (f"the step's budget is spent ({self._spent_cost} of {self.max_cost_microusd}"
                        " micro-USD)")
            if self.max_tokens is not None and self._spent_tokens >= self.max_tokens:
                return f"the step's budget is spent ({self._spent_tokens} of {self.max_tokens} tokens)"
        return ""

    # ------------------------------------------------------------------------ upstream

    def route(self, method: str, target: str) -> str | None:
        """The upstream path (and query) for a request line, or None if it is not allowed."""
        path, _, query = target.partition("?")
        for allowed_method, relative in self.rules:
            # Exact paths only: no prefix, no "..", no encoded tricks reach the provider.
            if method == allowed_method and path in (f"/{relative}", f"/v1/{relative}"):
                return f"{self._base_path}/{relative}" + (f"?{query}" if query else "")
        return None

    def auth_headers(self) -> dict[str, str]:
        if not self._key:
            return {}
        if self.kind == "anthropic":
            return {"x-api-key": self._key}
        return {"authorization": f"Bearer {self._key}"}

    @contextlib.contextmanager
    def connection(self) -> Iterator[http.client.HTTPConnection]:
        """An upstream connection, reused when the last answer on it was read to its end."""
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        if connection is None:
            timeout = UPSTREAM_TIMEOUT_SECONDS
            if self._scheme == "https":
                connection = http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                                         context=ssl.create_default_context())
            else:
                connection = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        with self._lock:
            self._active.add(connection)
        keep = False
        try:
            yield connection
            keep = getattr(connection, "_crucible_reusable", False)
        finally:
            with self._lock:
                self._active.discard(connection)
                if keep and not self.cancel.is_set() and not self._stopped.is_set():
                    self._idle.append(connection)
                    connection = None
            if connection is not None:
                connection.close()

    def price(self, model: str, resolved: str, usage: Usage) -> tuple[int, str]:
        try:
            return llm._priced(self.price_model or model, self.price_model or resolved, usage)
        finally:
            connections.close_all()  # this handler thread's own connection: the thread ends soon


def _retry_after(value: str | None, attempt: int) -> float:
    """As the SDK writers wait (llm._retry_after): retry-after if given, else exponential."""
    try:
        if value is not None:
            return min(max(float(value), 0.0), llm.MAX_BACKOFF_SECONDS)
    except ValueError:
        pass
    return min(0.5 * 2 ** attempt, llm.MAX_BACKOFF_SECONDS)


def _error_body(kind: str, message: str) -> bytes:
    # One shape both SDKs read: Anthropic's {"type": "error", "error": {...}}, OpenAI's {"error": {...}}.
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = UPSTREAM_TIMEOUT_SECONDS  # a client connection idle this long is closed
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return  # never the request line: records are the proxy's log

    def address_string(self) -> str:
        return "sandbox"

    def do_POST(self) -> None:
        self._proxy()

    def do_GET(self) -> None:
        self._proxy()

    def do_PUT(self) -> None:
        self._proxy()

    def do_DELETE(self) -> None:
        self._proxy()

    def do_PATCH(self) -> None:
        self._proxy()

    def do_HEAD(self) -> None:
        self._proxy()

    def do_OPTIONS(self) -> None:
        self._proxy()

    def do_CONNECT(self) -> None:
        self._proxy()

    # ------------------------------------------------------------------------------

    def _proxy(self) -> None:
        proxy = self.server.proxy
        proxy._serving(+1)
        try:
            self._proxy_serve(proxy)
        finally:
            proxy._serving(-1)

    def _proxy_serve(self, proxy: EgressProxy) -> None:
        started = time.monotonic()
        entry: dict[str, Any] = {"method": self.command, "path": self.path.partition("?")[0][:300],
                                 "status": 0, "bytes_in": 0, "bytes_out": 0, "model": "",
                                 "input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0,
                                 "cache_write_tokens": 0, "cost_microusd": 0, "retries": 0}
        proxy._open(entry)
        try:
            self._handle(proxy, entry)
        except (BrokenPipeError, ConnectionResetError):
            entry.setdefault("error", "the client went away")
            self.close_connection = True
        finally:
            entry["latency_seconds"] = round(time.monotonic() - started, 6)
            proxy._record(entry)

    def _refuse(self, entry: dict[str, Any], status: int, kind: str, reason: str,
                headers: Sequence[tuple[str, str]] = ()) -> None:
        entry.update(status=status, refused=reason)
        body = _error_body(kind, reason)
        self._answer(status, body, headers)
        entry["bytes_out"] = len(body)

    def _answer(self, status: int, body: bytes, headers: Sequence[tuple[str, str]] = ()) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()

    def _read_body(self) -> bytes | None:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            body = bytearray()
            while True:
                size = int(self.rfile.readline(100).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1000).strip():  # trailers
                        pass
                    return bytes(body)
                if len(body) + size > MAX_REQUEST_BYTES:
                    return None
                body += self.rfile.read(size)
                self.rfile.readline(10)
        length = int(self.headers.get("content-length") or 0)
        if length > MAX_REQUEST_BYTES:
            return None
        return self.rfile.read(length) if length > 0 else b""

    def _handle(self, proxy: EgressProxy, entry: dict[str, Any]) -> None:
        upstream_path = proxy.route(self.command, self.path)
        try:
            body = self._read_body()
        except ValueError:
            self.close_connection = True
            self._refuse(entry, 400, "invalid_request_error", "the request body could not be read")
            return
        if body is None:
            self.close_connection = True  # what is left of the body is never read
            self._refuse(entry, 413, "request_too_large",
                         f"requests are limited to {MAX_REQUEST_BYTES} bytes")
            return
        entry["bytes_in"] = len(body)
        request: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            parsed = json.loads(body) if body else {}
            request = parsed if isinstance(parsed, dict) else {}
        entry["model"] = str(request.get("model") or "")[:200]
        if upstream_path is None:
            self._refuse(entry, 403, "permission_error", f"the egress proxy does not forward {self.command} "
                         f"{entry['path']} (allowed: {', '.join(proxy.allowed())})")
            return
        if proxy.cancel.is_set():
            self._refuse(entry, 503, "cancelled", "the step was cancelled")
            return
        if spent := proxy._budget_spent():
            # The Anthropic and OpenAI SDKs (so Claude Code) honour x-should-retry: a spent budget
            # does not come back, so a client need not back off and ask again.
            self._refuse(entry, 429, "budget_exceeded", spent, [("x-should-retry", "false")])
            return
        headers = {name: value for name, value in self.headers.items() if name.lower() not in _DROP_REQUEST}
        if any(name.lower() in ("authorization", "x-api-key", "api-key", "cookie") for name in self.headers):
            entry["client_credentials_dropped"] = True
        headers.update({"host": proxy._netloc,
                        "content-length": str(len(body)), "accept-encoding": "identity",
                        **proxy.auth_headers()})
        self._forward(proxy, entry, upstream_path, headers, body, request)

    def _forward(self, proxy: EgressProxy, entry: dict[str, Any], upstream_path: str, headers: dict[str, str],
                 body: bytes, request: dict[str, Any]) -> None:
        failure = ""
        for attempt in range(proxy.max_attempts):
            with llm.account_slot(proxy.account, proxy.account_limit, proxy.cancel) as held:
                if not held:
                    self._refuse(entry, 503, "cancelled", "the step was cancelled")
                    return
                with proxy.connection() as connection:
                    try:
                        response = self._send(connection, upstream_path, headers, body)
                    except (OSError, http.client.HTTPException) as error:
                        failure = f"{type(error).__name__}: {str(error)[:200]}"
                        response = None
                    if response is not None:
                        status = response.status
                        last = attempt + 1 == proxy.max_attempts
                        if (status in (429, 529) or status >= 500) and not last:
                            wait = _retry_after(response.getheader("retry-after"), attempt)
                            response.read()
                            connection._crucible_reusable = not response.will_close  # type: ignore[attr-defined]
                            entry["retries"] += 1
                            entry.setdefault("retried", []).append(f"{status}, waited {wait:g} s")
                        else:
                            self._relay(proxy, entry, connection, response, request)
                            return
                    else:
                        wait = _retry_after(None, attempt)
                        entry["retries"] += 1
                        entry.setdefault("retried", []).append(f"{failure}, waited {wait:g} s")
            if proxy.cancel.is_set() or attempt + 1 == proxy.max_attempts or llm._pause(wait, proxy.cancel):
                break
        if proxy.cancel.is_set():
            self._refuse(entry, 503, "cancelled", "the step was cancelled")
            return
        entry["error"] = failure
        self._refuse(entry, 502, "upstream_unreachable",
                     f"the provider could not be reached after {entry['retries']} tries ({failure})")

    @staticmethod
    def _send(connection: http.client.HTTPConnection, path: str, headers: dict[str, str],
              body: bytes) -> http.client.HTTPResponse:
        reused = connection.sock is not None
        connection._crucible_reusable = False  # type: ignore[attr-defined]
        try:
            connection.request("POST", path, body=body, headers=headers)
            return connection.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            if not reused:
                raise
            connection.close()  # an idle connection the provider had closed: once more, fresh
            connection.request("POST", path, body=body, headers=headers)
            return connection.getresponse()

    def _relay(self, proxy: EgressProxy, entry: dict[str, Any], connection: http.client.HTTPConnection,
               response: http.client.HTTPResponse, request: dict[str, Any]) -> None:
        """Pass the answer on: SSE chunk by chunk as it comes, JSON whole once checked."""
        entry["status"] = response.status
        meter = _Meter()
        content_type = response.getheader("content-type", "")
        headers = [(name, value) for name, value in response.getheaders()
                   if name.lower() not in _DROP_RESPONSE]
        if "text/event-stream" in content_type:
            entry["stream"] = True
            self.send_response(response.status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            try:
                while chunk := response.read1(_CHUNK):
                    if proxy.cancel.is_set():
                        entry["error"] = "cancelled while streaming"
                        self.close_connection = True
                        break
                    meter.feed_events(chunk)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                    entry["bytes_out"] += len(chunk)
                else:
                    self._usage_apply(proxy, entry, meter, response.status)
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                    connection._crucible_reusable = not response.will_close  # type: ignore[attr-defined]
            except (OSError, http.client.HTTPException) as error:
                if isinstance(error, (BrokenPipeError, ConnectionResetError)) and self.wfile.closed:
                    raise
                entry["error"] = f"the stream broke: {type(error).__name__}"
                self.close_connection = True
            if meter.malformed:
                entry["malformed"] = meter.malformed
        else:
            try:
                data = response.read(MAX_JSON_RESPONSE_BYTES + 1)
            except (OSError, http.client.HTTPException) as error:
                self._refuse(entry, 502, "bad_gateway",
                             f"the provider's answer broke off: {type(error).__name__}")
                return
            ok = 200 <= response.status < 300
            if ok:
                try:
                    parsed = json.loads(data) if len(data) <= MAX_JSON_RESPONSE_BYTES else None
                except ValueError:
                    parsed = None
                if not isinstance(parsed, dict):
                    entry["upstream_status"] = response.status
                    self._refuse(entry, 502, "bad_gateway", "the provider's answer is not a JSON object")
                    return
                meter.document(parsed)
            connection._crucible_reusable = not response.will_close  # type: ignore[attr-defined]
            self._usage_apply(proxy, entry, meter, response.status)
            self._answer(response.status, data, [(n, v) for n, v in headers if n.lower() != "content-type"])
            entry["bytes_out"] = len(data)
            if ok and "json" not in content_type:
                entry["content_type"] = content_type[:100]
        if not entry.get("_charged"):
            self._usage_apply(proxy, entry, meter, response.status)

    @staticmethod
    def _usage_apply(proxy: EgressProxy, entry: dict[str, Any], meter: _Meter, status: int) -> None:
        """The call's usage and cost from what the provider answered, charged to the budget."""
        if meter.seen:
            usage = meter.usage()
            entry.update(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                         cache_read_tokens=usage.cache_read_tokens,
                         cache_write_tokens=usage.cache_write_tokens)
            if meter.resolved_model:
                entry["resolved_model"] = meter.resolved_model[:200]
            model = entry["model"] or meter.resolved_model
            cost, version = proxy.price(model, meter.resolved_model, usage) if model else (0, "")
            entry["cost_microusd"] = cost
            if version:
                entry["price_table_version"] = version
        elif 200 <= status < 300 and not entry.get("refused"):
            entry["usage_missing"] = True
        proxy._charge(entry)
