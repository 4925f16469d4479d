"""Serve Crucible: Daphne (web + websockets) and a Celery worker with embedded beat.

Both run as child processes, supervised: a child that exits is logged and started again after
a backoff (1 s, doubling up to 30 s), its leftover processes (a dead worker's pool and beat)
ended first; only FAST_DEATHS exits within FAST_WINDOW_SECONDS stop serve, with one line saying
why. Ctrl-C (or SIGTERM) stops both and waits for them. If serve itself is killed, Linux sends
both children SIGTERM (no orphaned server or worker).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

STOP_GRACE_SECONDS = 15
PR_SET_PDEATHSIG = 1
FAST_DEATHS = 5  # exits of one child within the window that mean it cannot run here
FAST_WINDOW_SECONDS = 60
BACKOFF_SECONDS, BACKOFF_MAX_SECONDS = 1.0, 30.0

logger = logging.getLogger("crucible.serve")


def _end_with_parent(parent: int) -> Any:
    """In the child, before exec: ask Linux for SIGTERM when `serve` dies, even by SIGKILL,
    so the web server and worker are never left running on their own."""
    def prepare() -> None:
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent:  # serve died before the request took effect
                os._exit(1)
    return prepare


class Command(BaseCommand):
    help = "Start the web server (Daphne) and a worker (Celery with beat); Ctrl-C stops both."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=settings.CONFIG.host)
        parser.add_argument("--port", type=int, default=settings.CONFIG.port)

    def handle(self, *args: Any, host: str, port: int, **options: Any) -> None:
        beat_schedule = str(settings.DATA_DIR / "celerybeat-schedule")
        commands = {
            "web server": [sys.executable, "-m", "daphne", "-b", host, "-p", str(port),
                           "crucible.asgi:application"],
            "worker": [sys.executable, "-m", "celery", "-A", "crucible", "worker", "--beat",
                       "--schedule", beat_schedule, "--loglevel", settings.CONFIG.log_level,
                       "--concurrency", str(settings.CONFIG.worker_concurrency)],
        }
        stopping = False

        def stop(signum: int, frame: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        # No process-wide umask 077: the 0700 data dir already keeps what the children create
        # there (queue messages, worktrees) from other users, SQLite's -wal and -shm take the
        # database's 0600, and worktrees and merged objects must stay readable by the sandbox's
        # unprivileged user and the repository's other users.
        children = [Child(name, argv) for name, argv in commands.items()]
        for child in children:
            child.start()
        mode = "distributed (Redis)" if settings.CONFIG.redis_url else "embedded"
        self.stdout.write(self.style.SUCCESS(
            f"Crucible is running at http://{host}:{port}/ ({mode} mode). Press Ctrl-C to stop."
        ))
        self.stdout.flush()
        exit_code = 0
        while not stopping:
            for child in children:
                if child.supervise() == GIVE_UP:
                    stopping, exit_code = True, 1
            time.sleep(0.2)
        self._stop([child.process for child in children if child.process is not None])
        self.stdout.write("Stopped the web server and the worker.")
        if exit_code:
            sys.exit(exit_code)

    def _stop(self, processes: list[subprocess.Popen]) -> None:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for process in processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


GIVE_UP = "give up"


def _how(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


@dataclass
class Child:
    """One supervised child: started in its own process group, restarted with backoff."""

    name: str
    argv: list[str]
    process: subprocess.Popen | None = None
    restart_at: float | None = None
    deaths: deque = field(default_factory=deque)

    def start(self) -> None:
        # Its own process group, so the terminal's Ctrl-C reaches only serve, which stops the
        # children in order, and a dead child's leftovers can be ended as one group.
        self.process = subprocess.Popen(self.argv, start_new_session=True,
                                        preexec_fn=_end_with_parent(os.getpid()))
        self.restart_at = None

    def supervise(self) -> str | None:
        """Restart the child when it is due; GIVE_UP after too many deaths in a short time."""
        now = time.monotonic()
        if self.process is None:
            if self.restart_at is not None and now >= self.restart_at:
                self.start()
                logger.warning("Restarted the %s (pid %d).", self.name, self.process.pid)
            return None
        returncode = self.process.poll()
        if returncode is None:
            return None
        # What the child left running (a worker's pool processes and beat) goes with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process = None
        self.deaths.append(now)
        while self.deaths and now - self.deaths[0] > FAST_WINDOW_SECONDS:
            self.deaths.popleft()
        if len(self.deaths) >= FAST_DEATHS:
            logger.error("The %s stopped %d times within %d s (last: it %s); stopping Crucible: "
                         "its output above says why.", self.name, len(self.deaths), FAST_WINDOW_SECONDS,
                         _how(returncode))
            return GIVE_UP
        delay = min(BACKOFF_MAX_SECONDS, BACKOFF_SECONDS * 2 ** (len(self.deaths) - 1))
        logger.warning("The %s %s; restarting it in %.0f s.", self.name, _how(returncode), delay)
        self.restart_at = now + delay
        return None

