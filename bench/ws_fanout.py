"""Websocket fan-out: 50 viewers of one search against 1, measured side by side in one run.

    .venv/bin/python bench/ws_fanout.py [--events 100] [--viewers 50]

What it measures: for each event of a search, the time from its commit (in this process,
standing in for a Celery worker) until each logged-in viewer of that search's live page
(`/ws/events/search/<pk>/`) has received the HTML fragment carrying its `data-event-id`;
once with VIEWERS viewers connected and once with a single viewer, on the same server.

How: a fresh data dir and SQLite DB in a temp dir (migrated in a subprocess), an operator,
a project, VIEWERS member users each with a session cookie from `force_login`, and one
search frozen through `search_freeze` against a tiny git repository. One Daphne subprocess
per mode, with default settings: **embedded** (no `REDIS_URL`: the in-memory layer cannot
carry this process's nudge, so each consumer finds the event by polling the database every
0.5 s) and, if Redis answers, **Redis** (`REDIS_URL`, default `redis://127.0.0.1:6379/9`,
overridable with `CRUCIBLE_BENCH_REDIS_URL`: this process's nudge reaches every consumer in
the project's group through `channels_redis`). The modes run one after the other, so each
server has the machine to itself.

The viewers are `websockets` asyncio clients on one event loop in a thread of this process;
they connect at random moments within 0.5 s (so, as with people opening a page, their
consumers' poll timers are out of phase), send the resume message as static/js/crucible.js
does, and stamp each event id the moment its message is read. Against each server the run
has three phases: 1 viewer (half of EVENTS), VIEWERS viewers (EVENTS), 1 viewer again (the
other half), so drift over the run falls on both sides. Each phase starts with WARMUP
unmeasured events (they also cover the new sockets' resume). Before each emit it pauses a
random 0–0.5 s (fixed seed), so emits land at random phases of the poll timers, as a
worker's would. Latencies are pooled over all (event, viewer) pairs; it prints median, p95
and max, the median over events of the slowest viewer, the Daphne process's CPU use during
each phase, and the ratio p95(VIEWERS)/p95(1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
from pathlib import Path

from _search_setup import bench_temp, operator_and_project
from event_latency import BENCH_REDIS_URL, EVENT_ID_RE, bench_django, daphne, percentile
from search_orchestration import make_repo, spec

VIEWERS = 50
EVENTS = 100
WARMUP = 5
RECEIVE_TIMEOUT = 30.0
PAUSE = 0.5  # the embedded poll interval; emits land at random points of it


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Viewers:
    """Websocket clients of one subject on one asyncio loop (a thread); each stamps the event
    ids of every message the moment it reads it."""

    def __init__(self, url: str, origin: str, cookies: list[str]) -> None:
        self.url, self.origin, self.cookies = url, origin, cookies
        self.arrivals: list[dict[int, float]] = [{} for _ in cookies]
        self.arrived = threading.Condition()
        self.open_sockets: dict[int, tuple[object, asyncio.Task]] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="viewers", daemon=True)
        self.thread.start()

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=120)

    async def _open(self, index: int, last_id: int, delay: float) -> None:
        from websockets.asyncio.client import connect

        await asyncio.sleep(delay)
        websocket = await connect(
            self.url, origin=self.origin, additional_headers={"Cookie": f"sessionid={self.cookies[index]}"},
            proxy=None, compression=None, open_timeout=60,
        )
        await websocket.send(json.dumps({"type": "resume", "last_id": last_id}))
        self.open_sockets[index] = (websocket, asyncio.create_task(self._receive(index, websocket)))

    async def _receive(self, index: int, websocket) -> None:
        from websockets.exceptions import ConnectionClosed

        arrivals = self.arrivals[index]
        try:
            async for message in websocket:
                now = time.perf_counter()
                event_ids = EVENT_ID_RE.findall(message)
                with self.arrived:
                    for event_id in event_ids:
                        arrivals.setdefault(int(event_id), now)
                    self.arrived.notify_all()
        except ConnectionClosed:
            pass

    async def _close(self, index: int) -> None:
        websocket, task = self.open_sockets.pop(index)
        await websocket.close()
        await task

    def open(self, indexes: list[int], last_id: int, delays: list[float]) -> None:
        async def all_of():
            pairs = zip(indexes, delays, strict=True)
            await asyncio.gather(*(self._open(index, last_id, delay) for index, delay in pairs))

        self._run(all_of())

    def close(self, indexes: list[int]) -> None:
        async def all_of():
            await asyncio.gather(*(self._close(index) for index in indexes))

        self._run(all_of())

    def wait_for(self, event_id: int, indexes: list[int]) -> list[float]:
        with self.arrived:
            if not self.arrived.wait_for(
                lambda: all(event_id in self.arrivals[i] for i in indexes), RECEIVE_TIMEOUT
            ):
                missing = [i for i in indexes if event_id not in self.arrivals[i]]
                raise TimeoutError(f"event {event_id} not received by viewers {missing} "
                                   f"in {RECEIVE_TIMEOUT} s")
            return [self.arrivals[i][event_id] for i in indexes]

    def stop(self) -> None:
        self.close(list(self.open_sockets))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def emit_one(search, number: int) -> tuple[int, float]:
    """Emit a search event as a worker would; return its id and the moment it committed."""
    from django.db import transaction

    from runtime_app.services import event_emit

    committed: list[float] = []
    with transaction.atomic():
        # Registered before event_emit's nudge, so it runs first, right at commit.
        transaction.on_commit(lambda: committed.append(time.perf_counter()))
        event = event_emit(search.project_id, "search", search.pk, "bench.tick",
                           {"message": f"tick {number}"})
    return event.pk, committed[0]


def measure(mode: str, port: int, pid: int, search, cookies: list[str], events: int,
            rng: random.Random) -> dict[int, dict]:
    """The three phases against one server; {viewer count: figures}."""
    from runtime_app.models import Event

    viewers = Viewers(f"ws://127.0.0.1:{port}/ws/events/search/{search.pk}/",
                      f"http://127.0.0.1:{port}", cookies)
    many = list(range(len(cookies)))
    phases = [([0], events // 2), (many, events), ([0], events - events // 2)]
    results: dict[int, dict] = {}
    number = 0
    try:
        for indexes, count in phases:
            last_id = Event.objects.order_by("-id").values_list("id", flat=True).first() or 0
            fresh = [i for i in indexes if i not in viewers.open_sockets]
            stale = [i for i in viewers.open_sockets if i not in indexes]
            if stale:
                viewers.close(stale)
            if fresh:  # people open a page at random moments: their poll timers are out of phase
                viewers.open(fresh, last_id, [rng.uniform(0, PAUSE) for _ in fresh])
            print(f"  {mode}: {len(indexes)} viewer{'s' if len(indexes) > 1 else ''} connected; "
                  f"{WARMUP} warm-up + {count} events …", flush=True)
            entry = results.setdefault(len(indexes), {"pairs": [], "slowest": [], "cpu": 0.0, "wall": 0.0})
            for step in range(WARMUP + count):
                if step == WARMUP:
                    cpu_start, wall_start = cpu_seconds(pid), time.perf_counter()
                time.sleep(rng.uniform(0, PAUSE))
                event_id, committed_at = emit_one(search, number)
                number += 1
                received = viewers.wait_for(event_id, indexes)
                if step >= WARMUP:
                    latencies = [(at - committed_at) * 1000 for at in received]
                    entry["pairs"].extend(latencies)
                    entry["slowest"].append(max(latencies))
            entry["cpu"] += cpu_seconds(pid) - cpu_start
            entry["wall"] += time.perf_counter() - wall_start
    finally:
        viewers.stop()
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=EVENTS, help="measured events per viewer count")
    parser.add_argument("--viewers", type=int, default=VIEWERS)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args()
    started = time.monotonic()
    with bench_temp(args.keep) as tmp:
        data_dir = Path(tmp) / "data"
        env, redis_error = bench_django(data_dir)
        from django.conf import settings
        from django.contrib.auth import get_user_model
        from django.test import Client

        from runtime_app.models import ProjectMembership
        from search_app import services

        operator, project = operator_and_project()
        repo = make_repo(Path(tmp) / "repo")
        search = services.search_freeze(operator, project, spec("fanout", 16, [16, 1], 0, 1), "HEAD",
                                        repository_path=str(repo))
        cookies = []
        for n in range(args.viewers):
            user = get_user_model().objects.create_user(f"viewer{n:02d}", password="bench-password-1")
            ProjectMembership.objects.create(project=project, user=user)
            client = Client()
            client.force_login(user)
            cookies.append(client.cookies[settings.SESSION_COOKIE_NAME].value)

        modes = {"embedded": env}
        if not redis_error:
            modes["redis"] = {**env, "REDIS_URL": BENCH_REDIS_URL}
        rng = random.Random(20261204)
        figures: dict[str, dict[int, dict]] = {}
        for mode, mode_env in modes.items():
            with daphne(mode, mode_env, Path(tmp)) as (port, pid):
                figures[mode] = measure(mode, port, pid, search, cookies, args.events, rng)

    elapsed = time.monotonic() - started
    print()
    print(f"Websocket fan-out, commit → fragment received by each viewer of one search, "
          f"{args.events} events per viewer count ({os.cpu_count()} cores, "
          f"Python {platform.python_version()}, SQLite; {elapsed:.0f} s run)")
    print(f"{'mode':<10} {'viewers':>7} {'pairs':>6} {'median ms':>10} {'p95 ms':>8} {'max ms':>8} "
          f"{'slowest/event median ms':>24} {'Daphne CPU':>11}")
    for mode, by_count in figures.items():
        for count, entry in sorted(by_count.items()):
            pairs, cpu = entry["pairs"], entry["cpu"] / entry["wall"] * 100
            print(f"{mode:<10} {count:>7} {len(pairs):>6} {statistics.median(pairs):>10.1f} "
                  f"{percentile(pairs, 95):>8.1f} {max(pairs):>8.1f} "
                  f"{statistics.median(entry['slowest']):>24.1f} {cpu:>10.0f}%")
    for mode, by_count in figures.items():
        one, many = by_count[1]["pairs"], by_count[args.viewers]["pairs"]
        print(f"ratio {mode} {args.viewers}/1: p95 {percentile(many, 95) / percentile(one, 95):.2f}×, "
              f"median {statistics.median(many) / statistics.median(one):.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
