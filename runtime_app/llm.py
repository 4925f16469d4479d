"""Model calls: the Anthropic and OpenAI SDKs with Crucible's own retries, limits and receipts.

Every call leaves an `llm_call` receipt: requested and resolved model, request id, input,
output, cache-write and cache-read tokens, latency, retries, and its cost in micro-USD from
the versioned price table. 429, 529 and 5xx answers and lost connections are retried with
backoff that honours `retry-after`, outside any deterministic schedule; other errors fail
the call at once. Calls in flight per provider account are limited separately from the
runtime's live steps. API keys come from the server's environment (`ANTHROPIC_API_KEY`,
`OPENAI_API_KEY`, or the variable a preset names; `ANTHROPIC_BASE_URL` / `OPENAI_BASE_URL` or
the preset's URL for the server) and never enter a receipt, an event, a sandbox or a log line.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from runtime_app.keys import provider_key
from runtime_app.models import Receipt
from runtime_app.prices import Usage, cost_microusd, price_for

MAX_ATTEMPTS = 6
MAX_BACKOFF_SECONDS = 60.0
_limits: dict[str, threading.BoundedSemaphore] = {}
_limits_lock = threading.Lock()


class LLMError(Exception):
    """A call that failed for good (after its retries, or at once for a request error)."""

    def __init__(self, message: str, receipt: Receipt | None = None) -> None:
        super().__init__(message)
        self.receipt = receipt


@dataclass
class Reply:
    message: Any  # the SDK's Message
    usage: Usage
    cost_microusd: int
    receipt: Receipt


@contextmanager
def account_slot(account: str, limit: int = 0, cancel: threading.Event | None = None) -> Iterator[bool]:
    """Holds one of an account's `limit` call slots; yields False if cancelled while waiting.

    Threads share a semaphore and processes on this machine share `limit` lock files, so every
    worker process together keeps to the limit; the kernel frees a killed process's lock."""
    size = limit or settings.CONFIG.provider_concurrency
    with _limits_lock:
        threads = _limits.setdefault(f"{account}/{size}", threading.BoundedSemaphore(size))
    while not threads.acquire(timeout=0.1):
        if cancel is not None and cancel.is_set():
            yield False
            return
    try:
        folder = Path(settings.DATA_DIR) / "provider-slots" / re.sub(r"[^A-Za-z0-9_.-]", "_", account)
        folder.mkdir(parents=True, exist_ok=True)
        while True:
            for index in range(size):
                handle = open(folder / f"{index}.lock", "a")  # noqa: SIM115 — held across the yield
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.close()
                    continue
                try:
                    yield True
                finally:
                    handle.close()  # closing releases the lock
                return
            if cancel is not None and cancel.is_set():
                yield False
                return
            time.sleep(0.05)
    finally:
        threads.release()


def anthropic_client(base_url: str | None = None, key_variable: str | None = None) -> Any:
    import anthropic  # noqa: PLC0415 - about 1 s to import: loaded by the first call, not at start-up

    return anthropic.Anthropic(
        api_key=provider_key(key_variable or "ANTHROPIC_API_KEY") or "missing-key",
        base_url=base_url or os.environ.get("ANTHROPIC_BASE_URL") or None,
        max_retries=0,  # Crucible retries itself, honouring retry-after, and counts the retries
        timeout=600.0,
    )


def _retry_after(error: Any, attempt: int) -> float:
    headers = getattr(getattr(error, "response", None), "headers", None) or {}
    value = headers.get("retry-after") if hasattr(headers, "get") else None
    try:
        if value is not None:
            return min(max(float(value), 0.0), MAX_BACKOFF_SECONDS)
    except ValueError:
        pass
    return min(0.5 * 2 ** attempt, MAX_BACKOFF_SECONDS)


def _with_retries(send: Callable[[], Any], sdk: Any, cancel: threading.Event | None, account: str,
                  request_id_header: str, limit: int = 0) -> tuple[Any, str | None, list[str], str]:
    """(parsed response or None, request id, retries, failure): the retry policy for both SDKs."""
    started = time.monotonic()
    retries: list[str] = []
    failure = ""
    request_id = None
    for attempt in range(MAX_ATTEMPTS):
        if cancel is not None and cancel.is_set():
            return None, request_id, retries, "cancelled"
        try:
            with account_slot(account, limit, cancel) as held:
                if not held:
                    return None, request_id, retries, "cancelled"
                raw = send()
            request_id = raw.headers.get(request_id_header)
            parsed = raw.parse()
            if parsed is None:
                raise ValueError("the response is empty")
            return parsed, request_id, retries, ""
        except sdk.APIStatusError as error:
            status = error.status_code
            if error.response is not None:
                request_id = error.response.headers.get(request_id_header)
            if not (status in (429, 529) or status >= 500):
                return None, request_id, retries, f"HTTP {status}: {_error_text(error)}"
            wait = _retry_after(error, attempt)
            retries.append(f"{status} after {time.monotonic() - started:.1f} s, waited {wait:g} s")
            failure = f"HTTP {status} {attempt + 1} times"
        except (sdk.APIConnectionError, sdk.APITimeoutError) as error:
            wait = _retry_after(error, attempt)
            retries.append(f"{type(error).__name__}, waited {wait:g} s")
            failure = f"{type(error).__name__} {attempt + 1} times"
        except (ValueError, TypeError, KeyError, sdk.APIResponseValidationError) as error:  # malformed
            wait = min(0.5 * 2 ** attempt, MAX_BACKOFF_SECONDS)
            retries.append(f"malformed response: {str(error)[:120]}")
            failure = f"malformed responses {attempt + 1} times"
        if _pause(wait, cancel):
            return None, request_id, retries, "cancelled"
    return None, request_id, retries, failure


def _priced(model: str, resolved: str, usage: Usage) -> tuple[int, str]:
    price, version = price_for(resolved or model)
    if price is None:
        price, version = price_for(model)
    return (cost_microusd(price, usage) if price else 0), version


def _call_receipt(record: Callable[[Receipt], Receipt], *, endpoint: str, model: str, resolved: str,
                  started_at: Any, started: float, request_id: str | None, usage: Usage, cost: int,
                  price_version: str, failure: str, detail: dict) -> Receipt:
    return record(Receipt(
        kind=Receipt.Kind.LLM_CALL, argv=[endpoint, model], started_at=started_at, finished_at=timezone.now(),
        duration_seconds=round(time.monotonic() - started, 6), exit_code=None if failure else 0,
        error=failure, requested_model=model, resolved_model=resolved, request_id=request_id or "",
        input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
        cache_write_tokens=usage.cache_write_tokens, cache_read_tokens=usage.cache_read_tokens,
        cost_microusd=cost, price_table_version=price_version, detail=detail,
    ))


def anthropic_call(
    client: Any, *, model: str, system: list[dict], messages: list[dict], tools: list[dict],
    max_tokens: int, record: Callable[[Receipt], Receipt], cancel: threading.Event | None = None,
    thinking: dict | None = None, account: str = "anthropic", account_limit: int = 0, price_model: str = "",
) -> Reply:
    """One Messages call with retries; its receipt is written through `record` either way."""
    import anthropic  # noqa: PLC0415 - about 1 s to import: loaded by the first call, not at start-up

    started_at, started = timezone.now(), time.monotonic()
    options: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "system": system,
                               "messages": messages, "tools": tools}
    if thinking:
        options["thinking"] = thinking
    message, request_id, retries, failure = _with_retries(
        lambda: client.messages.with_raw_response.create(**options), anthropic, cancel, account, "request-id",
        account_limit)
    if message is not None and not getattr(message, "content", None) and message.stop_reason is None:
        message, failure = None, "the response has no content and no stop reason"
    usage, cost, version, resolved = Usage(), 0, "", ""
    if message is not None:
        raw_usage = message.usage
        usage = Usage(
            input_tokens=raw_usage.input_tokens or 0, output_tokens=raw_usage.output_tokens or 0,
            cache_write_tokens=getattr(raw_usage, "cache_creation_input_tokens", 0) or 0,
            cache_read_tokens=getattr(raw_usage, "cache_read_input_tokens", 0) or 0,
        )
        resolved = message.model or ""
        cost, version = _priced(price_model or model, price_model or resolved, usage)
    receipt = _call_receipt(
        record, endpoint="anthropic.messages.create", model=model, resolved=resolved, started_at=started_at,
        started=started, request_id=request_id, usage=usage, cost=cost, price_version=version,
        failure=failure, detail={"retries": retries, "stop_reason": getattr(message, "stop_reason", None),
                                 "max_tokens": max_tokens, "messages": len(messages)},
    )
    if message is None:
        raise LLMError(f"the model call failed: {failure}", receipt)
    return Reply(message, usage, cost, receipt)


def bedrock_client(base_url: str | None = None) -> Any:
    """Bedrock through the anthropic SDK: a Bedrock API key (AWS_BEARER_TOKEN_BEDROCK) if set,
    else SigV4 with the standard AWS credentials (environment, profile, instance role)."""
    import anthropic  # noqa: PLC0415 - about 1 s to import: loaded by the first call, not at start-up

    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return anthropic.AnthropicBedrock(
        api_key=provider_key("AWS_BEARER_TOKEN_BEDROCK"), aws_region=region,
        base_url=base_url or os.environ.get("BEDROCK_BASE_URL") or None, max_retries=0, timeout=600.0,
    )


def openai_client(base_url: str | None = None, api_key_variable: str = "OPENAI_API_KEY") -> Any:
    import openai  # noqa: PLC0415 - loaded by the first call, not at every start-up

    return openai.OpenAI(
        api_key=provider_key(api_key_variable) or "missing-key",
        base_url=base_url or os.environ.get("OPENAI_BASE_URL") or None, max_retries=0, timeout=600.0,
    )


def openai_call(
    client: Any, *, model: str, messages: list[dict], tools: list[dict], max_tokens: int,
    record: Callable[[Receipt], Receipt], cancel: threading.Event | None = None,
    reasoning_effort: str | None = None, account: str = "openai", account_limit: int = 0,
    price_model: str = "",
) -> Reply:
    """One chat-completions call (any OpenAI-compatible server) with the same retries and receipt."""
    import openai  # noqa: PLC0415 - loaded by the first call, not at every start-up

    started_at, started = timezone.now(), time.monotonic()
    options: dict[str, Any] = {"model": model, "messages": messages, "max_completion_tokens": max_tokens}
    if tools:
        options["tools"] = tools
    if reasoning_effort:
        options["reasoning_effort"] = reasoning_effort
    completion, request_id, retries, failure = _with_retries(
        lambda: client.chat.completions.with_raw_response.create(**options), openai, cancel, account,
        "x-request-id", account_limit)
    if completion is not None and not completion.choices:
        completion, failure = None, "the response has no choices"
    usage, cost, version, resolved = Usage(), 0, "", ""
    if completion is not None:
        raw = completion.usage
        cached = getattr(getattr(raw, "prompt_tokens_details", None), "cached_tokens", 0) or 0 if raw else 0
        usage = Usage(input_tokens=(raw.prompt_tokens if raw else 0) - cached,
                      output_tokens=raw.completion_tokens if raw else 0, cache_read_tokens=cached)
        resolved = completion.model or ""
        cost, version = _priced(price_model or model, price_model or resolved, usage)
    finish = completion.choices[0].finish_reason if completion is not None else None
    receipt = _call_receipt(
        record, endpoint="openai.chat.completions.create", model=model, resolved=resolved,
        started_at=started_at, started=started, request_id=request_id, usage=usage, cost=cost,
        price_version=version, failure=failure,
        detail={"retries": retries, "stop_reason": finish, "max_tokens": max_tokens,
                "messages": len(messages)},
    )
    if completion is None:
        raise LLMError(f"the model call failed: {failure}", receipt)
    return Reply(completion, usage, cost, receipt)


def _pause(seconds: float, cancel: threading.Event | None) -> bool:
    """Wait before a retry; True if the step was cancelled meanwhile."""
    if cancel is None:
        time.sleep(seconds)
        return False
    return cancel.wait(seconds)


def _error_text(error: Any) -> str:
    body = getattr(error, "body", None)
    if isinstance(body, dict):
        detail = body.get("error", {})
        if isinstance(detail, dict) and detail.get("message"):
            return str(detail["message"])[:300]
    return str(error)[:300]


# ---------------------------------------------------------------------------- tool conversations

THINKING_BUDGET = {"low": 2048, "medium": 8192, "high": 16384, "max": 32000}
OPENAI_EFFORT = {"low": "low", "medium": "medium", "high": "high", "max": "high"}


@dataclass(frozen=True)
class ToolUse:
    id: str
    name: str
    input: Any


class ToolChat:
    """One writer's or reviewer's conversation, whatever the provider: the shared prefix as the
    (cached) system prompt, the candidate's suffix as the first user message, tool calls out,
    tool results in."""

    def __init__(self, kind: str, model: str, prefix: str, suffix: str, tools: list[dict], effort: str, *,
                 base_url: str | None = None, key_variable: str | None = None, account: str = "",
                 account_limit: int = 0, price_model: str = "") -> None:
        self.kind, self.model, self.effort = kind, model, effort
        self.account = account or kind
        self.limits = {"account": self.account, "account_limit": account_limit, "price_model": price_model}
        self.anthropic = kind in ("anthropic", "bedrock")
        if self.anthropic:
            self.client = (bedrock_client(base_url) if kind == "bedrock"
                           else anthropic_client(base_url, key_variable))
            self.system = [{"type": "text", "text": prefix, "cache_control": {"type": "ephemeral"}}]
            self.messages: list[dict] = [{"role": "user", "content": suffix}]
            self.tools = tools
        else:
            self.client = openai_client(base_url, key_variable or "OPENAI_API_KEY")
            self.system = []
            self.messages = [{"role": "system", "content": prefix}, {"role": "user", "content": suffix}]
            self.tools = [{"type": "function", "function": {
                "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}}
                for t in tools]

    @property
    def max_tokens(self) -> int:
        extra = THINKING_BUDGET.get(self.effort, 0) if self.anthropic else 0
        return 8192 + extra

    def prompt_bytes(self) -> int:
        """An upper bound of the next call's input tokens (a token is at least one byte)."""
        return len(json.dumps([self.system, self.messages, self.tools]).encode())

    def turn(self, record: Callable[[Receipt], Receipt],
             cancel: threading.Event | None) -> tuple[Reply, list[ToolUse]]:
        if self.anthropic:
            thinking = ({"type": "enabled", "budget_tokens": THINKING_BUDGET[self.effort]}
                        if self.effort in THINKING_BUDGET else None)
            reply = anthropic_call(self.client, model=self.model, system=self.system, messages=self.messages,
                                   tools=self.tools, max_tokens=self.max_tokens, record=record, cancel=cancel,
                                   thinking=thinking, **self.limits)
            content = [block.model_dump(exclude_none=True) for block in reply.message.content]
            self.messages.append({"role": "assistant", "content": content})
            uses = [ToolUse(b.id, b.name, b.input) for b in reply.message.content if b.type == "tool_use"]
            return reply, uses
        reply = openai_call(self.client, model=self.model, messages=self.messages, tools=self.tools,
                            max_tokens=self.max_tokens, record=record, cancel=cancel,
                            reasoning_effort=OPENAI_EFFORT.get(self.effort), **self.limits)
        message = reply.message.choices[0].message
        calls = message.tool_calls or []
        entry: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
        if calls:
            entry["tool_calls"] = [{"id": c.id, "type": "function",
                                    "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                   for c in calls]
        self.messages.append(entry)
        uses = []
        for call in calls:
            try:
                arguments = json.loads(call.function.arguments or "{}")
            except ValueError:
                arguments = "(arguments that are not JSON)"
            uses.append(ToolUse(call.id, call.function.name, arguments))
        return reply, uses

    def transcript(self, limit: int = 4000) -> list[dict[str, str]]:
        """The conversation after the prompt, provider-neutral, each entry's text capped at `limit`:
        [{"role": "assistant" | "tool_call" | "tool_result" | "thinking", "text": ...}, ...]."""
        def entry(role: str, text: Any) -> dict[str, str]:
            text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
            return {"role": role, "text": text if len(text) <= limit else text[:limit] + " …"}

        entries = []
        for message in self.messages[(2 if not self.anthropic else 1):]:
            content = message.get("content")
            if isinstance(content, list):
                for block in content:
                    kind = block.get("type")
                    if kind == "text":
                        entries.append(entry("assistant", block.get("text", "")))
                    elif kind == "thinking":
                        entries.append(entry("thinking", block.get("thinking", "")))
                    elif kind == "tool_use":
                        call = {"tool": block.get("name"), "input": block.get("input")}
                        entries.append(entry("tool_call", call))
                    elif kind == "tool_result":
                        entries.append(entry("tool_result", ("ERROR: " if block.get("is_error") else "")
                                             + str(block.get("content", ""))))
                continue
            if message["role"] == "tool":
                entries.append(entry("tool_result", content or ""))
                continue
            if content:
                entries.append(entry("assistant", content))
            for call in message.get("tool_calls", []):
                entries.append(entry("tool_call", {"tool": call["function"]["name"],
                                                   "input": call["function"]["arguments"]}))
        return entries

    def results(self, results: list[tuple[str, str, bool]]) -> None:
        """Hand the tool results (id, text, is_error) back to the model."""
        if self.anthropic:
            # A second cache breakpoint rides on the newest tool result, so each turn reads the
            # whole conversation so far from the cache (the API allows four; we use two).
            for message in self.messages:
                if isinstance(message["content"], list):
                    for block in message["content"]:
                        block.pop("cache_control", None)
            blocks = [{"type": "tool_result", "tool_use_id": tool_id, "content": text, "is_error": is_error}
                      for tool_id, text, is_error in results]
            if blocks:
                blocks[-1]["cache_control"] = {"type": "ephemeral"}
            self.messages.append({"role": "user", "content": blocks})
        else:
            for tool_id, text, is_error in results:
                self.messages.append({"role": "tool", "tool_call_id": tool_id,
                                      "content": ("ERROR: " if is_error else "") + text})
