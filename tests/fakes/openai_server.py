"""A loopback HTTP server that speaks OpenAI's chat-completions API (what local model servers
also speak), for tests: the real `openai` SDK is pointed at it with `base_url`.

It mirrors tests/fakes/anthropic_server.py: on a conversation's first turn it calls the
`editor` function to create the file `plan[candidate]` names, then answers in text once it
sees a tool message. Usage reports `prompt_tokens_details.cached_tokens` for a system prompt
(and tools) it has seen before. Faults: ("429", retry_after), ("500",), ("malformed",).
`"stream": true` answers as server-sent chunks (with a last chunk carrying the usage when
`stream_options.include_usage` asks for it, then `[DONE]`). POST /v1/responses answers a
Responses API call (`input` text), streamed (ending in `response.completed`) or not, with
`input_tokens_details.cached_tokens` for an `instructions` text it has seen before.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.fakes.anthropic_server import tokens_of


class FakeOpenAI:
    def __init__(self, plan: dict[str, dict[str, str]] | None = None) -> None:
        self.plan = plan or {}
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
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
        if messages[-1]["role"] != "tool" and candidate in self.plan:
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

    def _respond_responses(self, request: dict[str, Any]) -> dict[str, Any]:
        instructions = request.get("instructions") or ""
        digest = hashlib.sha256(instructions.encode()).hexdigest()
        with self.lock:
            cached = tokens_of(instructions) if instructions and digest in self.seen else 0
            self.seen.add(digest)
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

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with fake.lock:
                    fake.counter += 1
                    fault = fake.faults.pop(0) if fake.faults else None
                    fake.request_headers.append({k.lower(): v for k, v in self.headers.items()})
                    headers = {"x-request-id": f"req_oai_{fake.counter:05d}"}
                if self.path.rstrip("/") not in ("/v1/chat/completions", "/v1/responses"):
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
                if self.path.rstrip("/") == "/v1/responses":
                    response = fake._respond_responses(request)
                    if request.get("stream"):
                        self._events(headers, [
                            {"type": "response.created", "response": {**response, "status": "in_progress",
                                                                      "output": [], "usage": None}},
                            {"type": "response.output_text.delta", "delta": response["output_text"]},
                            {"type": "response.completed", "response": response}])
                        return
                    self._send(200, json.dumps(response).encode(), headers)
                    return
                completion = fake._respond(request)
                if request.get("stream"):
                    chunk = {"id": completion["id"], "object": "chat.completion.chunk",
                             "created": completion["created"], "model": completion["model"]}
                    choice = completion["choices"][0]
                    chunks = [{**chunk, "choices": [{"index": 0, "delta": choice["message"],
                                                      "finish_reason": None}]},
                              {**chunk, "choices": [{"index": 0, "delta": {},
                                                      "finish_reason": choice["finish_reason"]}]}]
                    if (request.get("stream_options") or {}).get("include_usage"):
                        chunks.append({**chunk, "choices": [], "usage": completion["usage"]})
                    self._events(headers, [*chunks, "[DONE]"])
                    return
                self._send(200, json.dumps(completion).encode(), headers)

            def _events(self, headers: dict[str, str], events: list[Any]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
                for event in events:
                    data = event if isinstance(event, str) else json.dumps(event)
                    self.wfile.write(f"data: {data}\n\n".encode())
                    self.wfile.flush()

        return Handler
