"""A loopback HTTP server that speaks the Anthropic Messages API, for tests and benches.

The real `anthropic` SDK (and its Bedrock client) is pointed at it with `base_url`. It
answers POST /v1/messages and Bedrock's POST /model/{model}/invoke (non-streaming) with
scripted tool-use conversations, usage computed from the request (the cacheable prefix —
tools and system blocks up to the last `cache_control` — is written to its cache on first
sight and read from it afterwards), and a `request-id` header. Queue
faults with `fail_next`: ("429", retry_after), ("529",) or ("529", retry_after), ("malformed",),
("slow", seconds). Requests' headers are kept in `request_headers` (the key arrives as
`x-api-key` or `authorization: Bearer`, depending on the SDK version), and every request's
method and path (query string dropped) in `calls`.

A request with `"stream": true` gets the same message as server-sent events (message_start,
content_block_start/delta/stop with text_delta and input_json_delta, message_delta with the
stop reason and usage, message_stop), which is how Claude Code calls the API;
`claude_code_script` makes Claude Code edit a file with its own Read and Edit tools.
Events go out `stream_pause` seconds apart after the first.

The default script edits files: on the first turn of a conversation it asks the `editor`
tool to create or replace the file named in `plan[candidate]` (the candidate id is read from
the prompt's last line, "You are cand_007."), then ends the turn once it sees a tool result.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Script = Callable[[dict[str, Any], str], list[dict[str, Any]]]


def tokens_of(value: Any) -> int:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return max(1, math.ceil(len(text.encode()) / 4))


class FakeAnthropic:
    def __init__(self, plan: dict[str, dict[str, str]] | None = None, script: Script | None = None,
                 resolved_suffix: str = "-20261201") -> None:
        self.plan = plan or {}
        self.script = script or self._edit_script
        self.review_verdict = "approve"
        self.draft_toml = ""
        self.resolved_suffix = resolved_suffix
        self.stream_pause = 0.0
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        self.calls: list[tuple[str, str]] = []
        self.faults: list[tuple] = []
        self.cached_prefixes: set[str] = set()
        self.lock = threading.Lock()
        self.counter = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeAnthropic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def keys_seen(self) -> set[str]:
        """Every API key a request carried."""
        keys = set()
        for headers in self.request_headers:
            if "x-api-key" in headers:
                keys.add(headers["x-api-key"])
            if headers.get("authorization", "").startswith("Bearer "):
                keys.add(headers["authorization"][7:])
        return keys

    def fail_next(self, *faults: tuple) -> None:
        with self.lock:
            self.faults.extend(faults)

    # --- what the model "says" ------------------------------------------------------------

    def _edit_script(self, request: dict[str, Any], candidate: str) -> list[dict[str, Any]]:
        if "You draft Crucible search specs" in json.dumps(request.get("system", "")):
            return [{"type": "text", "text": f"Here is a draft.\n\n```toml\n{self.draft_toml}```\n"}]
        if "independent reviewer" in json.dumps(request.get("system", "")):
            verdict = {"verdict": self.review_verdict, "findings": []}
            return [{"type": "text", "text": f"Read the patch.\n{json.dumps(verdict)}"}]
        last = request["messages"][-1]
        has_result = isinstance(last["content"], list) and any(
            block.get("type") == "tool_result" for block in last["content"])
        if has_result or candidate not in self.plan:
            return [{"type": "text", "text": f"{candidate}: done."}]
        edit = self.plan[candidate]
        return [
            {"type": "text", "text": f"I will edit {edit['path']}."},
            {"type": "tool_use", "id": f"toolu_{self.counter:04d}", "name": "editor",
             "input": {"command": "create", "path": edit["path"], "file_text": edit["content"]}},
        ]

    def _usage(self, request: dict[str, Any], content: list[dict[str, Any]]) -> dict[str, int]:
        """Cache accounting as the API does it: the prompt is tools, system blocks, then message
        blocks; each block marked `cache_control` is a breakpoint. The longest breakpoint prefix
        seen before is read from the cache, the rest up to the last breakpoint is written, and
        what follows the last breakpoint is plain input. Markers themselves are not content."""
        system = request.get("system", [])
        units: list[Any] = [request.get("tools", [])]
        units += system if isinstance(system, list) else [{"type": "text", "text": system}]
        for message in request["messages"]:
            blocks = message["content"]
            if isinstance(blocks, str):
                blocks = [{"type": "text", "text": blocks}]
            units += [{"role": message["role"], **block} for block in blocks]
        breakpoints = [i for i, unit in enumerate(units)
                       if isinstance(unit, dict) and unit.get("cache_control")]
        plain = [{k: v for k, v in unit.items() if k != "cache_control"} if isinstance(unit, dict) else unit
                 for unit in units]
        tokens = [tokens_of(unit) for unit in plain]
        digests = {i: hashlib.sha256(json.dumps(plain[: i + 1], sort_keys=True).encode()).hexdigest()
                   for i in breakpoints}
        with self.lock:
            read_upto = max((i for i in breakpoints if digests[i] in self.cached_prefixes), default=-1)
            self.cached_prefixes.update(digests.values())
        last = max(breakpoints, default=-1)
        return {
            "input_tokens": sum(tokens[last + 1:]),
            "output_tokens": tokens_of(content),
            "cache_creation_input_tokens": sum(tokens[read_upto + 1: last + 1]),
            "cache_read_input_tokens": sum(tokens[: read_upto + 1]),
        }

    def _respond(self, request: dict[str, Any]) -> dict[str, Any]:
        prompt = json.dumps(request["messages"][0]["content"])
        found = re.search(r"You are (cand_\d+)", prompt)
        candidate = found.group(1) if found else "unknown"
        content = self.script(request, candidate)
        usage = self._usage(request, content)
        usage["output_tokens"] = min(usage["output_tokens"], request.get("max_tokens", 4096))
        return {
            "id": f"msg_fake_{self.counter:05d}", "type": "message", "role": "assistant",
            "model": request["model"] + self.resolved_suffix, "content": content,
            "stop_reason": "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn",
            "stop_sequence": None, "usage": usage,
        }

    def _events(self, message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The message as the streaming API sends it: empty blocks first, then their deltas."""
        usage = message["usage"]
        start = {**message, "content": [], "stop_reason": None,
                 "usage": {**usage, "output_tokens": 1}}
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": start})]
        for index, block in enumerate(message["content"]):
            if block["type"] == "tool_use":
                empty = {**block, "input": {}}
                text = json.dumps(block["input"])
                # Split the JSON so the client has to join partial_json fragments, as with the API.
                pieces = [text[i:i + 40] for i in range(0, len(text), 40)]
                deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in pieces]
            else:
                empty = {"type": "text", "text": ""}
                deltas = [{"type": "text_delta", "text": block["text"]}]
            events.append(("content_block_start",
                           {"type": "content_block_start", "index": index, "content_block": empty}))
            events += [("content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": delta}) for delta in deltas]
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        events.append(("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]}}))
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    # --- HTTP -----------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                return

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def _send_events(self, events: list[tuple[str, dict[str, Any]]], headers: dict[str, str]) -> None:
                # HTTP/1.0 without content-length: the stream ends when the connection closes.
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                for number, (name, data) in enumerate(events):
                    if number and fake.stream_pause:
                        time.sleep(fake.stream_pause)
                    self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                    self.wfile.flush()

            def do_GET(self) -> None:
                with fake.lock:
                    fake.calls.append(("GET", self.path.split("?", 1)[0]))
                self._send(404, b'{"type":"error","error":{"type":"not_found_error","message":"no"}}')

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with fake.lock:
                    fake.counter += 1
                    number = fake.counter
                    fault = fake.faults.pop(0) if fake.faults else None
                    fake.request_headers.append({k.lower(): v for k, v in self.headers.items()})
                    path = self.path.split("?", 1)[0]  # Claude Code adds ?beta=true
                    fake.calls.append(("POST", path))
                request_id = {"request-id": f"req_fake_{number:05d}"}
                bedrock = re.fullmatch(r"/model/([^/]+)/invoke", path)
                if path.rstrip("/") != "/v1/messages" and not bedrock:
                    self._send(404, b'{"type":"error","error":{"type":"not_found_error","message":"no"}}')
                    return
                request = json.loads(body)
                if bedrock:  # Bedrock carries the model in the path, not the body
                    request["model"] = bedrock.group(1)
                with fake.lock:
                    fake.requests.append(request)
                if fault and fault[0] == "429":
                    error = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
                    self._send(429, json.dumps(error).encode(), {**request_id, "retry-after": str(fault[1])})
                    return
                if fault and fault[0] == "529":
                    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
                    wait = {"retry-after": str(fault[1])} if len(fault) > 1 else {}
                    self._send(529, json.dumps(error).encode(), {**request_id, **wait})
                    return
                if fault and fault[0] == "malformed":
                    self._send(200, b'{"id": "msg_broken", "content": [', request_id)
                    return
                if fault and fault[0] == "slow":
                    time.sleep(fault[1])
                if request.get("stream"):
                    self._send_events(fake._events(fake._respond(request)), request_id)
                    return
                self._send(200, json.dumps(fake._respond(request)).encode(), request_id)

        return Handler


def tool_results(request: dict[str, Any]) -> list[dict[str, Any]]:
    """Every tool_result block the conversation so far carries."""
    return [block for message in request["messages"] if message["role"] == "user"
            and isinstance(message["content"], list)
            for block in message["content"] if block.get("type") == "tool_result"]


def claude_code_script(path: str, old: str, new: str) -> Script:
    """Claude Code edits `path` (absolute) with its own tools: Read first, because its Edit refuses
    a file it has not read, then Edit `old` into `new`, then end the turn. Requests without the
    Edit tool (side calls such as titles) get plain text."""

    def script(request: dict[str, Any], candidate: str) -> list[dict[str, Any]]:
        if "Edit" not in {tool.get("name") for tool in request.get("tools", [])}:
            return [{"type": "text", "text": "ok"}]
        done = tool_results(request)
        if not done:
            return [{"type": "text", "text": f"Reading {path}."},
                    {"type": "tool_use", "id": "toolu_fake_read", "name": "Read",
                     "input": {"file_path": path}}]
        if len(done) == 1:
            return [{"type": "tool_use", "id": "toolu_fake_edit", "name": "Edit",
                     "input": {"file_path": path, "old_string": old, "new_string": new}}]
        return [{"type": "text", "text": f"Edited {path}."}]

    return script


def claude_code_plan_script(plan: dict[str, tuple[str, str, str]], final: str = "",
                            refined: dict[str, tuple[str, str, str]] | None = None) -> Script:
    """Claude Code as a search's writer: each candidate (read from the prompt) Reads then Edits
    `path` (relative to the working directory its prompt's environment section names) from `old`
    to `new`, as `plan[candidate]` says (`refined[candidate]` when the prompt says its patch is
    already applied), then ends its turn with `final` (or "done"). A candidate without a plan
    only talks."""

    def script(request: dict[str, Any], candidate: str) -> list[dict[str, Any]]:
        if "Edit" not in {tool.get("name") for tool in request.get("tools", [])}:
            return [{"type": "text", "text": "ok"}]
        found = re.search(r"[Ww]orking directory: ([^\s\\\\\"]+)", json.dumps(request))
        refining = "is already applied in your working directory" in json.dumps(request["messages"][0])
        plan_now = (refined or {}) if refining else plan
        if candidate not in plan_now or not found:
            return [{"type": "text", "text": final or f"{candidate}: nothing to do."}]
        path, old, new = plan_now[candidate]
        return claude_code_script(f"{found.group(1)}/{path}", old, new)(request, candidate) \
            if len(tool_results(request)) < 2 else [{"type": "text", "text": final or "done"}]

    return script
