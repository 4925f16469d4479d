"""Live-event latency, embedded mode against Redis mode, measured side by side in one run.

    .venv/bin/python bench/event_latency.py        (or: make bench)

What it measures: the time from an event's commit (in this process, standing in for a
Celery worker) to the moment a websocket client receives the event's HTML fragment.

How: a fresh data dir and SQLite DB in a temp dir; two Daphne servers on that DB, one in
embedded mode (no REDIS_URL: in-memory channel layer, so the consumer finds events by
polling the DB every CRUCIBLE_EVENT_POLL_SECONDS, 0.5 s by default) and one in Redis mode
(REDIS_URL: the worker's nudge crosses processes through channels_redis; the poll falls
back to 5 s). Each server gets one logged-in websocket client that sent the resume
message. This process then emits EVENTS events one at a time; each event is timed on both
clients, so both modes see the same commits under the same machine load. Before each emit
it pauses a random fraction of the embedded poll interval, so emits land at random phases
of the poll timer, as a worker's would. Defaults are used for every setting measured.

If Redis is unreachable the script says so and measures embedded mode only.
"""

from __future__ import annotations

import contextlib
import os
import platform
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from _search_setup import bench_temp, keep_requested

REPO_ROOT = Path(__file__).resolve().parent.parent
EVENTS = 200
WARMUP = 5
RECEIVE_TIMEOUT = 15.0
# channels_redis keys in a database of their own, apart from the app's (0) and tests'.
BENCH_REDIS_URL = os.environ.get("CRUCIBLE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
EVENT_ID_RE = re.compile(r'data-event-id="(\d+)"')
# Settings this script chooses itself; anything inherited would skew or break the run.
CONTROLLED = (
    "DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL", "CRUCIBLE_DATA_DIR",
    "CRUCIBLE_EVENT_POLL_SECONDS", "CRUCIBLE_DEBUG", "CRUCIBLE_ALLOWED_HOSTS",
)


def base_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CONTROLLED}
    env.update(
        DJANGO_SETTINGS_MODULE="crucible.settings",
        CRUCIBLE_DATA_DIR=str(data_dir),
        CRUCIBLE_LOG_LEVEL="WARNING",
    )
    return env


def redis_reachable(url: str) -> str | None:
    """None if Redis answers at url, else why not."""
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.RedisError as error:
        return str(error)
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def daphne(name: str, env: dict[str, str], log_dir: Path) -> Iterator[tuple[int, int]]:
    """A Daphne subprocess serving the app; yields its port and pid."""
    port = free_port()
    log_path = log_dir / f"daphne-{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
             "crucible.asgi:application"],
            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"Daphne ({name}) exited; see {log_path}:\n{log_path.read_text()}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"Daphne ({name}) did not listen within 30 s")
            time.sleep(0.1)
        yield port, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class Listener:
    """One websocket client; a thread stamps each event id the moment its fragment lands."""

    mode: str
    port: int
    session_cookie: str
    arrivals: dict[int, float] = field(default_factory=dict)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def start(self, last_id: int) -> None:
        from websockets.sync.client import connect

        self.closing = contextlib.ExitStack()
        self.socket = self.closing.enter_context(connect(
            f"ws://127.0.0.1:{self.port}/ws/events/",
            origin=f"http://127.0.0.1:{self.port}",
            additional_headers={"Cookie": f"sessionid={self.session_cookie}"},
            proxy=None,
            compression=None,
        ))
        self.socket.send(f'{{"type": "resume", "last_id": {last_id}}}')
        self.thread = threading.Thread(target=self._receive, name=f"ws-{self.mode}", daemon=True)
        self.thread.start()

    def _receive(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            for message in self.socket:
                now = time.perf_counter()
                with self.arrived:
                    for event_id in EVENT_ID_RE.findall(message):
                        self.arrivals.setdefault(int(event_id), now)
                    self.arrived.notify_all()
        except ConnectionClosed:
            pass

    def wait_for(self, event_id: int) -> float:
        with self.arrived:
            if not self.arrived.wait_for(lambda: event_id in self.arrivals, RECEIVE_TIMEOUT):
                raise TimeoutError(f"{self.mode}: event {event_id} not received in {RECEIVE_TIMEOUT} s")
            return self.arrivals[event_id]

    def stop(self) -> None:
        self.closing.close()
        self.thread.join(timeout=5)


def emit_one(project, number: int) -> tuple[int, float]:
    """Emit an event as a worker would; return its id and the moment it committed."""
    from django.db import transaction

    from runtime_app.services import event_emit

    committed: list[float] = []
    with transaction.atomic():
        # Registered before event_emit's nudge, so it runs first, right at commit.
        transaction.on_commit(lambda: committed.append(time.perf_counter()))
        event = event_emit(project, "project", project.pk, "bench.tick", {"message": f"tick {number}"})
    return event.pk, committed[0]


def bench_django(data_dir: Path) -> tuple[dict[str, str], str | None]:
    """A migrated database in data_dir and Django set up in this process, which plays the
    worker; returns the servers' environment and why Redis is unreachable (None if it is not)."""
    env = base_env(data_dir)
    print(f"data dir {data_dir}; migrating …", flush=True)
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
                   cwd=REPO_ROOT, env=env, check=True)
    redis_error = redis_reachable(BENCH_REDIS_URL)
    if redis_error:
        print(f"Redis at {BENCH_REDIS_URL} is unreachable ({redis_error}): "
              "measuring embedded mode only.", flush=True)
    # With Redis this process nudges through Redis, as a worker in a Redis deployment does; the
    # embedded server cannot hear that nudge and finds each event by polling.
    env_emitter = env if redis_error else {**env, "REDIS_URL": BENCH_REDIS_URL}
    os.environ.update(env_emitter)
    for name in CONTROLLED:
        if name not in env_emitter:
            os.environ.pop(name, None)
    sys.path.insert(0, str(REPO_ROOT))
    import django

    django.setup()
    return env, redis_error


def percentile(values: list[float], pct: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


def main() -> int:
    started = time.monotonic()
    with bench_temp(keep_requested()) as tmp:
        data_dir = Path(tmp) / "data"
        env, redis_error = bench_django(data_dir)
        from django.conf import settings
        from django.contrib.auth import get_user_model
        from django.test import Client

        from runtime_app.models import Event, Project, ProjectMembership

        user = get_user_model().objects.create_user(username="bench", password="bench-password-1")
        project = Project.objects.create(name="bench", created_by=user)
        ProjectMembership.objects.create(project=project, user=user)
        client = Client()
        client.force_login(user)
        session_cookie = client.cookies[settings.SESSION_COOKIE_NAME].value

        modes = {"embedded": env}
        if not redis_error:
            modes["redis"] = {**env, "REDIS_URL": BENCH_REDIS_URL}
        from crucible.config import load

        poll = load(env).event_poll_seconds  # the embedded default: env has no REDIS_URL
        last_id = Event.objects.order_by("-id").values_list("id", flat=True).first() or 0
        with contextlib.ExitStack() as stack:
            listeners = []
            for mode, mode_env in modes.items():
                port, _ = stack.enter_context(daphne(mode, mode_env, Path(tmp)))
                listener = Listener(mode, port, session_cookie)
                listener.start(last_id)
                stack.callback(listener.stop)
                listeners.append(listener)
            print(f"servers up; embedded poll interval {poll} s; "
                  f"{WARMUP} warm-up events, then {EVENTS} measured …", flush=True)

            rng = random.Random(20261202)
            latencies: dict[str, list[float]] = {listener.mode: [] for listener in listeners}
            for number in range(WARMUP + EVENTS):
                time.sleep(rng.uniform(0, poll))
                event_id, committed_at = emit_one(project, number)
                for listener in listeners:
                    received_at = listener.wait_for(event_id)
                    if number >= WARMUP:
                        latencies[listener.mode].append((received_at - committed_at) * 1000)

    elapsed = time.monotonic() - started
    print()
    print(f"Live-event latency, commit → websocket fragment received, {EVENTS} events "
          f"({os.cpu_count()} cores, Python {platform.python_version()}, SQLite; {elapsed:.0f} s run)")
    print(f"{'mode':<10} {'median ms':>10} {'p95 ms':>10} {'max ms':>10}")
    summary = {}
    for mode, values in latencies.items():
        summary[mode] = (statistics.median(values), percentile(values, 95), max(values))
        median, p95, worst = summary[mode]
        print(f"{mode:<10} {median:>10.1f} {p95:>10.1f} {worst:>10.1f}")
    if "redis" in summary:
        (e_median, e_p95, _), (r_median, r_p95, _) = summary["embedded"], summary["redis"]
        print(f"ratio embedded/redis: median {e_median / r_median:.0f}×, p95 {e_p95 / r_p95:.0f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
