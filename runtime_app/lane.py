"""The measurement lane: score and replay trials never overlap with any other command Crucible
runs on the same host.

Every sandboxed command and every git call holds the lane *shared* while it runs; a timing trial
holds it *exclusive*, so it runs alone. Writers and gates still run side by side. The lock is a
pair of `flock` files in `CRUCIBLE_LANE_DIR` (default: the data dir's `locks/`), so it binds
threads and processes alike on one host; workers on other hosts have their own.

A thread that holds the lane may take it again inside (an apply step holds it across its git
calls): the inner hold passes straight through, since a second flock would wait for the first.

A turnstile gives a waiting trial priority: a shared taker passes through the turnstile first,
and a trial holds it while it waits for the lane, so a stream of writers and gates cannot starve
it.

A person's page is not the runtime's work: the git reads of a GET or HEAD request to the web
server (a diff, a file at a tag) pass without the lane (`PageReadsMiddleware`, `page_reads`),
so a page never waits seconds for a queue of timing trials. They are short and arrive at times
that have nothing to do with which candidate a block is timing, like the web server's own page
rendering, which never held the lane; docs/sandbox.md says why the measurement stays fair.
Sandboxed commands always take the lane, whoever starts them.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from django.conf import settings
from django.http import HttpRequest, HttpResponse

SHARED = "shared"
EXCLUSIVE = "exclusive"
MODES = (SHARED, EXCLUSIVE)
_held = threading.local()  # the mode this thread holds the lane in, if any
# A context variable, not a thread-local: asgiref carries it into the thread a sync view runs in.
_page_read: contextvars.ContextVar[bool] = contextvars.ContextVar("crucible_page_read", default=False)


def lane_dir() -> Path:
    configured = settings.CONFIG.lane_dir
    return configured if configured is not None else Path(settings.DATA_DIR).resolve() / "locks"


def _open(name: str) -> int:
    folder = lane_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return os.open(folder / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


@contextlib.contextmanager
def page_reads() -> Iterator[None]:
    """Inside: git reads for a person's page, which do not take the lane (`git_held`)."""
    token = _page_read.set(True)
    try:
        yield
    finally:
        _page_read.reset(token)


def git_held() -> contextlib.AbstractContextManager[float]:
    """The lane for one git call: held shared, except for a page's reads (`page_reads`)."""
    return contextlib.nullcontext(0.0) if _page_read.get() else lane_hold(SHARED)


class PageReadsMiddleware:
    """GET and HEAD requests read for a person's page: their git calls skip the lane."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            return self.get_response(request)
        with page_reads():
            return self.get_response(request)


@contextlib.contextmanager
def lane_hold(mode: str = SHARED) -> Iterator[float]:
    """Hold the lane for one command; yields the seconds spent waiting for it."""
    if mode not in MODES:
        raise ValueError(f"lane mode {mode!r}; use {SHARED} or {EXCLUSIVE}")
    holding = getattr(_held, "mode", None)
    if holding in (EXCLUSIVE, mode):
        yield 0.0
        return
    if holding is not None:
        raise RuntimeError("a thread holding the lane shared cannot take it exclusive: "
                           "it would wait for itself")
    started = time.monotonic()
    turnstile, lane = _open("measurement-lane.turnstile"), _open("measurement-lane.lock")
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if mode == EXCLUSIVE:
            try:  # wait for the lane while holding the turnstile: no new shared holder gets in
                fcntl.flock(lane, fcntl.LOCK_EX)
            finally:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        else:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
            fcntl.flock(lane, fcntl.LOCK_SH)
        _held.mode = mode
        yield time.monotonic() - started
    finally:
        _held.mode = None
        os.close(lane)  # closing releases the flock
        os.close(turnstile)
