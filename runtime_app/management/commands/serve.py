"""Serve Crucible: Daphne (web + websockets) and a Celery worker with embedded beat.

Both run as child processes; Ctrl-C (or SIGTERM) stops both and waits for
them. If serve itself is killed, Linux sends both children SIGTERM (no orphaned server or worker).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

STOP_GRACE_SECONDS = 15
PR_SET_PDEATHSIG = 1


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
            "web": [sys.executable, "-m", "daphne", "-b", host, "-p", str(port),
                    "crucible.asgi:application"],
            "worker": [sys.executable, "-m", "celery", "-A", "crucible", "worker", "--beat",
                       "--schedule", beat_schedule, "--loglevel", settings.CONFIG.log_level,
                       "--concurrency", str(settings.CONFIG.worker_concurrency)],
        }
        children: dict[str, subprocess.Popen] = {}
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
        # Children get their own process groups, so the terminal's Ctrl-C reaches only us
        # and we stop them in order, instead of each one reacting on its own.
        for name, argv in commands.items():
            children[name] = subprocess.Popen(argv, start_new_session=True,
                                              preexec_fn=_end_with_parent(os.getpid()))
        mode = "distributed (Redis)" if settings.CONFIG.redis_url else "embedded"
        self.stdout.write(self.style.SUCCESS(
            f"Crucible is running at http://{host}:{port}/ ({mode} mode). Press Ctrl-C to stop."
        ))
        exit_code = 0
        while not stopping:
            for name, child in children.items():
                if child.poll() is not None:
                    self.stderr.write(f"{name} exited with code {child.returncode}; stopping.")
                    stopping, exit_code = True, 1
            time.sleep(0.2)
        self._stop(children)
        self.stdout.write("Stopped the web server and the worker.")
        if exit_code:
            sys.exit(exit_code)

    def _stop(self, children: dict[str, subprocess.Popen]) -> None:
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child in children.values():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
