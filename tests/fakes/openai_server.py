"""A loopback HTTP server that speaks OpenAI's chat-completions API (what local model servers
also speak), for tests: the real `openai` SDK is pointed at it with `base_url`.

It mirrors tests/fakes/anthropic_server.py: on a conversation's first turn it calls the
`editor` function to create the file `plan[candidate]` names, then answers in text once it
sees a tool message. Usage reports `prompt_tokens_details.cached_tokens` for a system prompt
(and tools) it has seen before. Faults: ("429", retry_after), ("500",), ("malformed",).

For agent CLIs: `"stream": true` chat requests get chunks (`data: {...}` then `data: [DONE]`),
and `text_script(request)`, when given, supplies the assistant's text (aider's edit formats:
`aider_script`). POST /v1/responses (the Responses API, always streamed, as Codex CLI calls
it) answers with the items `responses_script(request)` returns (`codex_script` edits a file
with Codex's apply_patch tool). Every request's method and path are kept in `calls`. A
Responses call without `"stream": true` gets the answer as one JSON document instead. Both report
`input_tokens_details.cached_tokens` for an `instructions` text seen before, and a streamed chat
completion's last chunk carries the usage.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.fakes.anthropic_server import tokens_of

TextScript = Callable[[dict[str, Any]], str]
ResponsesScript = Callable[[dict[str, Any]], list[dict[str, Any]]]


class FakeOpenAI:
    def __init__(self, plan: dict[str, dict[str, str]] | None = None, text_script: TextScript | None = None,
                 responses_script: ResponsesScript | None = None) -> None:
        self.plan = plan or {}
        self.text_script = text_script
        self.responses_script = responses_script or (lambda request: [message_item("done.")])
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        self.calls: list[tuple[str, str]] = []
        self.faults: list[tuple] = []
        self.seen: set[str] = set()
        self.lock = threading.Lock()
        self.counter = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def fail_next(self, *faults: tuple) -> None:
        with self.lock:
            self.faults.extend(faults)

    def keys_seen(self) -> set[str]:
        return {headers["authorization"][7:] for headers in self.request_headers
                if headers.get("authorization", "").startswith("Bearer ")}

    def _respond(self, request: dict[str, Any]) -> dict[str, Any]:
        messages = request["messages"]
        found = re.search(r"You are (cand_\d+)", json.dumps(messages[:2]))
        candidate = found.group(1) if found else "unknown"
        message: dict[str, Any] = {"role": "assistant", "content": f"{candidate}: done."}
        finish = "stop"
        if self.text_script:
            message["content"] = self.text_script(request)
        elif messages[-1]["role"] != "tool" and candidate in self.plan:
            edit = self.plan[candidate]
            arguments = {"command": "create", "path": edit["path"], "file_text": edit["content"]}
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{self.counter:04d}", "type": "function",
                "function": {"name": "editor", "arguments": json.dumps(arguments)}}]}
            finish = "tool_calls"
        prefix = [request.get("tools", []), messages[0]]
        digest = hashlib.sha256(json.dumps(prefix, sort_keys=True).encode()).hexdigest()
        with self.lock:
            cached = tokens_of(prefix) if digest in self.seen else 0
            self.seen.add(digest)
        prompt = tokens_of(prefix) + tokens_of(messages[1:])
        completion = tokens_of(message)
        return {
            "id": f"chatcmpl-{self.counter:05d}", "object": "chat.completion", "created": 1764633600,
            "model": request["model"] + "-2026-12-01",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }

    def _cached(self, request: dict[str, Any]) -> int:
        """The tokens of a Responses call's `instructions` this fake has seen before (its cache)."""
        instructions = request.get("instructions") or ""
        digest = hashlib.sha256(instructions.encode()).hexdigest()
        with self.lock:
            cached = tokens_of(instructions) if instructions and digest in self.seen else 0
            self.seen.add(digest)
        return cached

    def _respond_responses(self, request: dict[str, Any]) -> dict[str, Any]:
        instructions = request.get("instructions") or ""
        cached = self._cached(request)
        number = self.counter
        text = "done."
        prompt = (tokens_of(instructions) if instructions else 0) + tokens_of(request.get("input", ""))
        return {
            "id": f"resp_{number:05d}", "object": "response", "created_at": 1764633600, "status": "completed",
            "model": request["model"] + "-2026-12-01", "output_text": text,
            "output": [{"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": text}]}],
            "usage": {"input_tokens": prompt, "output_tokens": tokens_of(text), "total_tokens": prompt + 2,
                      "input_tokens_details": {"cached_tokens": cached},
                      "output_tokens_details": {"reasoning_tokens": 0}},
        }

    def _chunks(self, completion: dict[str, Any]) -> list[dict[str, Any]]:
        """A text completion as streamed chunks: role, the text in pieces, then the finish with usage."""
        base = {key: completion[key] for key in ("id", "created", "model")}
        base["object"] = "chat.completion.chunk"
        choice = completion["choices"][0]
        text = choice["message"].get("content") or ""
        pieces = [text[i:i + 64] for i in range(0, len(text), 64)] or [""]
        chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                        "finish_reason": None}]}]
        chunks += [{**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                   for piece in pieces]
        finish = {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}
        chunks.append({**base, "choices": [finish], "usage": completion["usage"]})
        return chunks

    def _response_events(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        """A Responses API turn as its stream: created, each output item added then done, completed."""
        items = self.responses_script(request)
        response_id = f"resp_fake_{self.counter:05d}"
        shell = {"id": response_id, "object": "response", "created_at": 1764633600,
                 "model": request["model"], "status": "in_progress", "output": []}
        events: list[dict[str, Any]] = [{"type": "response.created", "response": shell}]
        for index, item in enumerate(items):
            events.append({"type": "response.output_item.added", "output_index": index,
                           "item": {**item, "status": "in_progress"}})
            if item["type"] == "message":
                events.append({"type": "response.output_text.delta", "item_id": item["id"],
                               "output_index": index, "content_index": 0,
                               "delta": item["content"][0]["text"]})
            events.append({"type": "response.output_item.done", "output_index": index, "item": item})
        prompt = tokens_of(request.get("input", [])) + tokens_of(request.get("instructions") or "")
        completion, cached = tokens_of(items), self._cached(request)
        events.append({"type": "response.completed", "response": {
            **shell, "status": "completed", "output": items,
            "usage": {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
                      "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": prompt + completion}}})
        return events

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return

            def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def _send_events(self, events: list[tuple[str | None, dict[str, Any] | str]],
                             headers: dict[str, str]) -> None:
                # HTTP/1.0 without content-length: the stream ends when the connection closes.
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                for name, data in events:
                    line = data if isinstance(data, str) else json.dumps(data)
                    event = f"event: {name}\n" if name else ""
                    self.wfile.write(f"{event}data: {line}\n\n".encode())
                self.wfile.flush()

            def do_GET(self) -> None:
                with fake.lock:
                    fake.calls.append(("GET", self.path.split("?", 1)[0]))
                self._send(404, b'{"error": {"message": "no such route"}}', {})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with fake.lock:
                    fake.counter += 1
                    fault = fake.faults.pop(0) if fake.faults else None
                    fake.request_headers.append({k.lower(): v for k, v in self.headers.items()})
                    headers = {"x-request-id": f"req_oai_{fake.counter:05d}"}
                    path = self.path.split("?", 1)[0].rstrip("/")
                    fake.calls.append(("POST", path))
                if path not in ("/v1/chat/completions", "/v1/responses"):
                    self._send(404, b'{"error": {"message": "no such route"}}', headers)
                    return
                request = json.loads(body)
                with fake.lock:
                    fake.requests.append(request)
                if fault and fault[0] == "429":
                    self._send(429, b'{"error": {"message": "rate limited", "type": "rate_limit"}}',
                               {**headers, "retry-after": str(fault[1])})
                    return
                if fault and fault[0] == "500":
                    self._send(500, b'{"error": {"message": "boom"}}', {**headers, "retry-after": "0"})
                    return
                if fault and fault[0] == "malformed":
                    self._send(200, b'{"id": "chatcmpl-broken", "choices": [', headers)
                    return
                if path == "/v1/responses" and not request.get("stream"):
                    self._send(200, json.dumps(fake._respond_responses(request)).encode(), headers)
                    return
                if path == "/v1/responses":
                    events = fake._response_events(request)
                    self._send_events([(event["type"], event) for event in events], headers)
                    return
                if request.get("stream"):
                    chunks = fake._chunks(fake._respond(request))
                    self._send_events([(None, chunk) for chunk in chunks] + [(None, "[DONE]")], headers)
                    return
                self._send(200, json.dumps(fake._respond(request)).encode(), headers)

        return Handler


def message_item(text: str) -> dict[str, Any]:
    """An assistant message as a Responses API output item."""
    return {"type": "message", "id": "msg_fake", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def tool_outputs(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool results a Responses API conversation carries so far."""
    return [item for item in request.get("input", [])
            if item.get("type") in ("function_call_output", "custom_tool_call_output")]


def codex_script(path: str, old: str, new: str) -> ResponsesScript:
    """Codex CLI edits `path` (relative to its working directory) with its own apply_patch tool,
    then ends the turn. Codex offers apply_patch as a freeform (custom) tool only for models in
    its bundled catalog; for other models it goes through exec_command, which runs apply_patch."""
    patch = f"*** Begin Patch\n*** Update File: {path}\n@@\n-{old}\n+{new}\n*** End Patch\n"

    def script(request: dict[str, Any]) -> list[dict[str, Any]]:
        if tool_outputs(request):
            return [message_item(f"Edited {path}.")]
        tools = {tool.get("name"): tool.get("type") for tool in request.get("tools", [])}
        if tools.get("apply_patch") == "custom":
            return [{"type": "custom_tool_call", "id": "ctc_fake", "call_id": "call_fake_patch",
                     "name": "apply_patch", "input": patch, "status": "completed"}]
        command = f"apply_patch <<'EOF'\n{patch}EOF\n"
        return [{"type": "function_call", "id": "fc_fake", "call_id": "call_fake_exec",
                 "name": "exec_command", "arguments": json.dumps({"cmd": command}), "status": "completed"}]

    return script


def aider_script(path: str, old: str, new: str) -> TextScript:
    """aider's diff edit format: one SEARCH/REPLACE block for `path`, and a plain reply when the
    last message is aider's report of a block that failed to apply. (The conversation holds
    other blocks anyway: aider's rules and, for some models, few-shot turns.)"""
    block = f"{path}\n```\n<<<<<<< SEARCH\n{old}\n=======\n{new}\n>>>>>>> REPLACE\n```\n"

    def script(request: dict[str, Any]) -> str:
        failed = "SearchReplaceNoExactMatch" in str(request["messages"][-1].get("content"))
        return "Done." if failed else f"I will change {path}.\n\n{block}"

    return script


def codex_plan_script(plan: dict[str, tuple[str, str, str]], final: str = "") -> ResponsesScript:
    """Codex CLI as a search's writer: each candidate (read from the prompt) patches `path` from
    `old` to `new` as `plan[candidate]` says, then ends its turn with `final` (or "done"). A
    candidate without a plan only talks."""

    def script(request: dict[str, Any]) -> list[dict[str, Any]]:
        found = re.search(r"You are (cand_\d+)", json.dumps(request.get("input", "")))
        candidate = found.group(1) if found else "unknown"
        if candidate not in plan or tool_outputs(request):
            return [message_item(final or f"{candidate}: done.")]
        return codex_script(*plan[candidate])(request)

    return script


def aider_plan_script(plan: dict[str, tuple[str, str, str]], final: str = "") -> TextScript:
    """aider as a search's writer: each candidate (the last "You are cand_N" in the conversation)
    gets one SEARCH/REPLACE block for `path` from `old` to `new`, as `plan[candidate]` says, and
    `final` after it. A candidate without a plan only talks."""

    def script(request: dict[str, Any]) -> str:
        found = re.findall(r"You are (cand_\d+)", json.dumps(request.get("messages", [])))
        candidate = found[-1] if found else "unknown"
        if candidate not in plan:
            return final or f"{candidate}: nothing to do."
        reply = aider_script(*plan[candidate])(request)
        return f"{reply}\n{final}" if final else reply

    return script
