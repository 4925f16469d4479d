"""A search run by Crucible against the same search with no framework, side by side in one run.

    .venv/bin/python bench/search_orchestration.py                    # 0.2 s at 32; trivial 32/128/512
    .venv/bin/python bench/search_orchestration.py --only inline --populations 32,128 --sleep-population 0
    .venv/bin/python bench/search_orchestration.py --with-1000        # trivial 1,000 too (slow)

**Configurations.** Population 32 (rounds 32 → 8 → 3 → 1, 3 trials) whose writer, gate and score
commands each sleep 0.2 s; and trivial commands (`true`, 1 trial) at populations 32, 128 and 512
(rounds 32 → 8 → 3 → 1, else N → N/10 → 2 → 1), 1,000 with `--with-1000`. Concurrency 16. The
specs use `comparison = "absolute"` so every round runs exactly `trials` blocks on both sides
(paired comparison adds blocks where intervals are undecided: a measurement policy, not
orchestration).

**Lanes**, one after another on the same machine, each configuration in each lane:
- `bare`: bench/bare_loop.py, the same sandboxed commands and round barriers with a
  `ThreadPoolExecutor(16)`, git and plain bubblewrap (its docstring lists the differences).
- `bare-sandbox`: the same loop with every command in Crucible's own sandbox
  (`bare_loop.py --sandbox crucible`): no database, receipt or planner, so bare → bare-sandbox is
  what the sandbox costs and bare-sandbox → Crucible what the orchestration costs.
- `inline`: `search_run_inline` in this process (a thread per live step).
- `celery-fs`: a real Celery worker subprocess as `manage.py serve` starts one (prefork, embedded
  beat) on the embedded filesystem broker in the data dir, with `--concurrency 16` so 16 steps can
  be live; this process freezes and starts the search and sends the first `search_drive`.
- `celery-redis`: the same worker with `REDIS_URL=$CRUCIBLE_BENCH_REDIS_URL` (default
  redis://127.0.0.1:6379/9); skipped, with the reason, when that Redis does not answer.
A Celery lane's wall time runs from sending the first task to the search's run being terminal
(polled every 50 ms), the worker already started and idle.

**Figures per configuration:** each lane's wall time and its ratio to the bare loop; the
commands run (Crucible's: its `command` and `review` receipts) and git processes; the
**round-aware ideal** — for each barrier segment (round 0's writers and gates, each round's trial
blocks, the replay, the review) the larger of its command time / 16 and its longest serial chain
(a candidate's writer then gates; a measure step's trials, which run one at a time in the
exclusive lane), summed — computed from each lane's own command times, beside the old Σ/16
ideal. Goals printed against: ≤ 1.2× bare at population 32 with 0.2 s commands, ≤ 1.5× at 512
trivial.

**Inline only (in-process probes):** total planner time — the time inside
`search_app.services.search_advance`, wrapped — per population, to show it grows linearly; and
per step kind: step time (the step's started_at → finished_at), its commands' time, the fixed
cost (step − commands) per step and per command, the processes it started by program
(`subprocess.Popen` wrapped; `git` among them), and its SQL (`connection.execute_wrapper`):
write statements (INSERT/UPDATE/DELETE), write transactions (a BEGIN, or a write outside an
atomic block), and the time spent in BEGIN and write statements, which includes waiting for
SQLite's write lock.

`--web-scale N` adds the old scale check: a population-N search run inline while a Daphne server
on the same database answers `GET /api/searches/{id}/run` every 2 s (peak RSS of both, DB size).
Data goes to a temp dir in the system temp dir, removed unless `--keep`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _search_setup import REPO_ROOT, bench_temp, django_setup, operator_and_project
from bare_loop import (
    CONCURRENCY,
    Timed,
    bare_run,
    default_rounds,
    make_repo,
    round_aware_ideal,
    segment_spans,
)

__all__ = ["make_repo", "spec"]  # bench/ws_fanout.py builds its search with these

LANES = ("bare-sandbox", "inline", "celery-fs", "celery-redis")
GOALS = {("sleep", 32): 1.2, ("trivial", 512): 1.5}
WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


def spec(name: str, population: int, rounds: list[int], sleep: float, trials: int,
         comparison: str | None = None) -> str:
    pause = f"sleep {sleep}; " if sleep else ""
    # The figure goes to the report descriptor (`reported = "other"`); bash, as dash takes no fd above 9.
    score = pause + ("bash -c 'printf \"{\\\"v\\\": %s}\" \"$(cksum < code/id.txt | cut -d\" \" -f1)\" "
                     ">&\"$CRUCIBLE_REPORT_FD\"'")
    compare = f'comparison = "{comparison}"\n' if comparison else ""
    return f'''name = "{name}"
objective = "bench"
population = {population}
rounds = {rounds}
concurrency = 16

[worker]
provider = "command"
command = "{pause}echo $CRUCIBLE_CANDIDATE_ID > code/id.txt"
write_roots = ["code"]

[hard_gates]
commands = ["{pause or 'true'}"]

[score]
command = {json.dumps(score)}
metric = "v"
reported = "other"
direction = "maximize"
trials = {trials}
{compare}'''


@dataclass(frozen=True)
class Config:
    population: int
    sleep: float
    trials: int

    @property
    def rounds(self) -> list[int]:
        return default_rounds(self.population)

    @property
    def kind(self) -> str:
        return "sleep" if self.sleep else "trivial"

    def title(self) -> str:
        commands = f"every command sleeps {self.sleep:g} s" if self.sleep else "trivial commands"
        return f"population {self.population}, {commands}, rounds {self.rounds}, {self.trials} trial(s)"


@dataclass
class LaneResult:
    wall: float
    commands: list[Timed]
    outcome: str
    git_processes: int | None = None
    skipped: str = ""
    planner: tuple[float, int] | None = None  # seconds inside search_advance, calls
    steps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def command_seconds(self) -> float:
        return sum(c.seconds for c in self.commands)


# --------------------------------------------------------------------------- in-process probes


class Probe:
    """Wraps search_advance, step_execute and subprocess.Popen; counts per step (by thread)."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.lock = threading.Lock()
        self.planner_seconds, self.planner_calls = 0.0, 0
        self.per_step: dict[int, dict[str, Any]] = {}
        self.active = False

    def install(self) -> None:
        from search_app import services

        advance, execute, popen = services.search_advance, services.step_execute, subprocess.Popen
        probe = self

        def timed_advance(search_pk: int) -> list[int]:
            started = time.perf_counter()
            try:
                return advance(search_pk)
            finally:
                if probe.active:
                    with probe.lock:
                        probe.planner_seconds += time.perf_counter() - started
                        probe.planner_calls += 1

        def counted_execute(step_pk: int, owner: str) -> bool:
            from django.db import connection

            if not probe.active:
                return execute(step_pk, owner)
            counts = {"programs": Counter(), "writes": 0, "transactions": 0, "write_seconds": 0.0}
            probe.local.counts = counts
            try:
                with connection.execute_wrapper(probe.sql):
                    return execute(step_pk, owner)
            finally:
                probe.local.counts = None
                with probe.lock:
                    probe.per_step[step_pk] = counts

        class CountingPopen(popen):  # type: ignore[misc, valid-type]
            def __init__(self, args: Any, *rest: Any, **options: Any) -> None:
                counts = getattr(probe.local, "counts", None)
                if counts is not None:
                    program = args if isinstance(args, str | bytes | os.PathLike) else args[0]
                    counts["programs"][os.path.basename(os.fsdecode(program)).split()[0]] += 1
                super().__init__(args, *rest, **options)

        services.search_advance = timed_advance
        services.step_execute = counted_execute
        subprocess.Popen = CountingPopen  # type: ignore[misc]

    def sql(self, execute: Any, sql: str, params: Any, many: bool, context: dict) -> Any:
        counts = getattr(self.local, "counts", None)
        verb = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        if counts is None or (verb not in WRITES and verb != "BEGIN"):
            return execute(sql, params, many, context)
        outside = not context["connection"].in_atomic_block
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            counts["write_seconds"] += time.perf_counter() - started
            if verb == "BEGIN" or outside:
                counts["transactions"] += 1
            if verb != "BEGIN":
                counts["writes"] += 1

    def start(self) -> None:
        self.planner_seconds, self.planner_calls, self.per_step = 0.0, 0, {}
        self.active = True

    def stop(self) -> None:
        self.active = False


PROBE = Probe()


# ------------------------------------------------------------------------------ Crucible lanes


def crucible_commands(search: Any) -> tuple[list[Timed], list[dict[str, Any]]]:
    """The search's commands (its `command` and `review` receipts) placed in barrier segments and
    chains as round_aware_ideal wants them, and one row per step for the breakdown."""
    from runtime_app.models import Receipt

    steps = list(search.steps.select_related("candidate").order_by("id"))
    origin = min((step.started_at for step in steps if step.started_at), default=None)
    wanted = {pk for step in steps for pk in step.result.get("receipts", [])}
    receipts = {r.pk: r for r in Receipt.objects.filter(pk__in=wanted)}
    commands: list[Timed] = []
    rows = []
    for step in steps:
        part = f" part {step.part}" if step.part else ""
        if step.kind in ("generate", "evaluate"):
            phase, chain = f"round {step.round} write+gates", step.candidate.candidate_id
        elif step.kind == "measure":
            phase, chain = f"round {step.round} trials{part}", str(step.pk)
        else:
            phase, chain = f"{step.kind}{part}", str(step.pk)
        mine = [receipts[pk] for pk in step.result.get("receipts", []) if pk in receipts]
        ran = [r for r in mine if r.kind in ("command", "review")]
        commands += [Timed(phase, chain, r.duration_seconds,
                           (r.started_at - origin).total_seconds() if origin else 0.0) for r in ran]
        if step.started_at and step.finished_at:
            rows.append({"pk": step.pk, "kind": step.kind, "seconds": (step.finished_at - step.started_at)
                         .total_seconds(), "command_seconds": sum(r.duration_seconds for r in ran),
                         "commands": len(ran)})
    return commands, rows


def outcome_of(run: Any) -> str:
    """The winner's id, as the bare loop reports it, or the outcome (NONE …)."""
    return run.winner.candidate_id if run.outcome == "winner" and run.winner else run.outcome


def freeze(user: Any, project: Any, repo: Path, config: Config, lane: str) -> Any:
    from search_app import services

    text = spec(f"{lane}-{config.kind}-{config.population}", config.population, config.rounds, config.sleep,
                config.trials, comparison="absolute")
    search = services.search_freeze(user, project, text, "HEAD", repository_path=str(repo))
    services.search_start(user, search, enqueue=False)
    return search


def inline_run(user: Any, project: Any, repo: Path, config: Config) -> LaneResult:
    from search_app import services

    search = freeze(user, project, repo, config, "inline")
    PROBE.start()
    started = time.perf_counter()
    try:
        run = services.search_run_inline(search)
    finally:
        wall = time.perf_counter() - started
        PROBE.stop()
    commands, rows = crucible_commands(search)
    for row in rows:
        row.update(PROBE.per_step.get(row["pk"], {}))
    git = sum(counts["programs"]["git"] for counts in PROBE.per_step.values())
    return LaneResult(wall, commands, outcome_of(run), git,
                      planner=(PROBE.planner_seconds, PROBE.planner_calls), steps=rows)


def broker_connection(broker_url: str | None) -> Any:
    """A connection to the lane's broker: this process's own (the embedded filesystem broker of
    the data dir) or the Redis at `broker_url`. Celery's `connection_for_write(url)` would keep
    this process's transport setting, the filesystem one, and the task would never reach Redis."""
    from kombu import Connection

    from crucible.celery import app

    return Connection(broker_url) if broker_url else app.connection_for_write()


class Worker:
    """A Celery worker subprocess, as `manage.py serve` starts one, for one lane."""

    def __init__(self, temp: Path, lane: str, extra_env: dict[str, str]):
        self.log_path = temp / f"worker-{lane}.log"
        env = {**os.environ, **extra_env}
        argv = [sys.executable, "-m", "celery", "-A", "crucible", "worker", "--beat",
                "--schedule", str(temp / f"beat-{lane}"), "--loglevel", "INFO",
                "--concurrency", str(CONCURRENCY), "--without-mingle", "--without-gossip",
                "--hostname", f"bench-{lane}-{os.getpid()}@%h"]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while b" ready." not in self.log_path.read_bytes():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the {lane} worker did not become ready:\n{tail}")
            time.sleep(0.2)

    def warm(self, broker_url: str | None) -> float:
        """Send one task that does nothing (a drive for a search that does not exist) and wait
        until the worker has run it: a lane's search starts on a worker already consuming, as a
        deployment's long-running workers are. Returns the seconds that took."""
        from crucible.celery import app

        started, mark = time.perf_counter(), len(self.log_path.read_bytes())
        with broker_connection(broker_url) as connection:
            app.send_task("search_app.tasks.search_drive", args=[0], connection=connection)
        while b"search_drive" not in self.log_path.read_bytes()[mark:] or b"succeeded" not in \
                self.log_path.read_bytes()[mark:]:
            if self.process.poll() is not None or time.perf_counter() > started + 120:
                tail = self.log_path.read_text()[-2000:]
                raise RuntimeError(f"the worker did not run a first task:\n{tail}")
            time.sleep(0.02)
        return time.perf_counter() - started

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


def celery_run(user: Any, project: Any, repo: Path, config: Config, lane: str, broker_url: str | None
               ) -> LaneResult:
    from crucible.celery import app
    from search_app.models import SearchRun

    search = freeze(user, project, repo, config, lane)
    started = time.perf_counter()
    with broker_connection(broker_url) as connection:
        app.send_task("search_app.tasks.search_drive", args=[search.pk], connection=connection)
    deadline = started + 3600
    while not SearchRun.objects.get(search=search).terminal:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{lane}: the search did not end in an hour")
        time.sleep(0.05)
    wall = time.perf_counter() - started
    run = SearchRun.objects.get(search=search)
    commands, rows = crucible_commands(search)
    return LaneResult(wall, commands, outcome_of(run), steps=rows)


def redis_problem(url: str) -> str:
    """Why this Redis cannot be used ("" when it answers PING)."""
    try:
        import redis
    except ImportError:
        return "the redis package is not installed"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2).ping()
    except Exception as error:
        return f"{url} does not answer ({type(error).__name__}: {error})"
    return ""


# ------------------------------------------------------------------------------------ report


def lane_line(name: str, result: LaneResult, bare: LaneResult | None) -> str:
    if result.skipped:
        return f"  {name:<13} skipped: {result.skipped}"
    ideal, _ = round_aware_ideal(result.commands)
    ratio = f"{result.wall / bare.wall:5.2f}x" if bare and not bare.skipped else "   - "
    git = f"{result.git_processes:>6}" if result.git_processes is not None else "     -"
    return (f"  {name:<13} {result.wall:8.2f} s  {ratio}  {result.wall / ideal:6.2f}x  {ideal:7.2f} s  "
            f"{len(result.commands):>6}  {git}  {result.outcome}")


def report(config: Config, results: dict[str, LaneResult]) -> None:
    print(f"\n== {config.title()}")
    print(f"  {'lane':<13} {'wall':>10}  {'/bare':>6}  {'/ideal':>7}  {'ideal':>9}  {'cmds':>6}  "
          f"{'git':>6}  outcome")
    bare = results.get("bare")
    for name, result in results.items():
        print(lane_line(name, result, bare))
    if bare and not bare.skipped:
        ideal, phases = round_aware_ideal(bare.commands)
        flat = bare.command_seconds / CONCURRENCY
        print(f"  ideal from the bare loop's commands: round-aware {ideal:.2f} s = "
              + " + ".join(f"{phase} {seconds:.2f}" for phase, seconds in phases.items())
              + f"; old Σ/16 ideal {flat:.2f} s ({bare.command_seconds:.1f} s of commands / 16)")
    goal = GOALS.get((config.kind, config.population))
    if goal and bare and not bare.skipped:
        verdicts = [f"{name} {r.wall / bare.wall:.2f}x {'meets' if r.wall / bare.wall <= goal else 'MISSES'}"
                    for name, r in results.items() if name != "bare" and not r.skipped]
        print(f"  goal ≤ {goal}x the bare loop: " + "; ".join(verdicts))
    segments(results)
    sandboxed = results.get("bare-sandbox")
    if sandboxed and not sandboxed.skipped and bare and not bare.skipped:
        print(f"  the sandbox alone (bare-sandbox / bare): {sandboxed.wall / bare.wall:.2f}x; "
              "the orchestration (lane / bare-sandbox): " + "; ".join(
                  f"{name} {r.wall / sandboxed.wall:.2f}x" for name, r in results.items()
                  if name not in ("bare", "bare-sandbox") and not r.skipped))
    for name, result in results.items():
        if name not in ("bare", "inline") and result.steps:  # inline: the table below
            print(f"  {name} fixed cost per step (median ms, step time − its commands): " + ", ".join(
                f"{kind} {statistics.median(r['seconds'] - r['command_seconds'] for r in rows) * 1000:.0f}"
                for kind in ("generate", "evaluate", "measure", "replay", "review")
                if (rows := [r for r in result.steps if r["kind"] == kind])))
    inline = results.get("inline")
    if inline and inline.steps:
        breakdown(inline)


def segments(results: dict[str, LaneResult]) -> None:
    """Each barrier segment's wall time per lane, and what is left between segments (planning,
    a round's trees made and removed, a Celery hop), so a gap to the bare loop has a place."""
    lanes = {name: r for name, r in results.items() if not r.skipped and r.commands}
    spans = {name: segment_spans(r.commands) for name, r in lanes.items()}
    phases = list(dict.fromkeys(phase for lane in spans.values() for phase in lane))
    if not phases:
        return
    print("  segment wall (s, first command start → last end)  " + "  ".join(f"{n:>12}" for n in lanes))
    for phase in phases:
        print(f"    {phase:<48}" + "  ".join(f"{spans[n].get(phase, 0):12.2f}" for n in lanes))
    print(f"    {'outside the segments':<48}" + "  ".join(
        f"{r.wall - sum(spans[n].values()):12.2f}" for n, r in lanes.items()))


def breakdown(result: LaneResult) -> None:
    seconds, calls = result.planner or (0.0, 0)
    print(f"  inline planner: {seconds:.2f} s in search_advance over {calls} calls "
          f"({seconds / max(calls, 1) * 1000:.1f} ms a call)")
    print(f"  {'step kind':<9} {'steps':>5} {'step ms':>8} {'cmd ms':>8} {'fixed ms':>9} {'/cmd ms':>8} "
          f"{'git':>5} {'procs':>6} {'writes':>7} {'txns':>5} {'write ms':>9}   (medians per step)")
    for kind in ("generate", "evaluate", "measure", "replay", "review"):
        rows = [row for row in result.steps if row["kind"] == kind]
        if not rows:
            continue

        def med(key: str, rows: list[dict[str, Any]] = rows) -> float:
            return statistics.median(float(row.get(key, 0) or 0) for row in rows)

        fixed = [row["seconds"] - row["command_seconds"] for row in rows]
        per_command = [f / row["commands"] for f, row in zip(fixed, rows, strict=True) if row["commands"]]
        git = statistics.median(row.get("programs", Counter())["git"] for row in rows)
        procs = statistics.median(sum(row.get("programs", Counter()).values()) for row in rows)
        print(f"  {kind:<9} {len(rows):>5} {med('seconds') * 1000:8.0f} {med('command_seconds') * 1000:8.0f} "
              f"{statistics.median(fixed) * 1000:9.0f} "
              f"{(statistics.median(per_command) * 1000 if per_command else 0):8.0f} {git:5.0f} {procs:6.0f} "
              f"{med('writes'):7.0f} {med('transactions'):5.0f} {med('write_seconds') * 1000:9.1f}")


def planner_summary(planner: dict[int, tuple[float, int]]) -> None:
    if not planner:
        return
    print("\n== planner time (inline, trivial commands): total time inside search_advance")
    for population, (seconds, calls) in sorted(planner.items()):
        print(f"  population {population:>5}: {seconds:7.2f} s over {calls:>5} calls, "
              f"{seconds / population * 1000:6.1f} ms per candidate")


# ---------------------------------------------------------------------------- the old scale run


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def web_scale(user: Any, project: Any, repo: Path, population: int) -> None:
    """A population-N inline search while Daphne serves its run report every 2 s."""
    from django.conf import settings

    from runtime_app.services import api_token_create
    from search_app import services

    _, token = api_token_create(user, "bench")
    port = free_port()
    web = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                            "crucible.asgi:application"], cwd=REPO_ROOT, env={**os.environ},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    config = Config(population, 0, 1)
    search = freeze(user, project, repo, config, "web-scale")
    polls, failures = [0], [0]
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(2):
            request = urllib.request.Request(f"http://127.0.0.1:{port}/api/searches/{search.search_id}/run",
                                             headers={"Authorization": f"Bearer {token}"})
            try:
                with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310  (http://127.0.0.1)
                    json.load(response)
                polls[0] += 1
            except OSError:
                failures[0] += 1

    poller = threading.Thread(target=poll, daemon=True)
    started = time.perf_counter()
    poller.start()
    try:
        run = services.search_run_inline(search)
        wall = time.perf_counter() - started
        stop.set()
        poller.join()
        web_peak = peak_rss_mib(web.pid)
    finally:
        web.terminate()
        web.wait(20)
    database = Path(settings.DATABASES["default"]["NAME"])
    size = sum(p.stat().st_size for p in database.parent.glob(database.name + "*"))
    worker_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\n== web scale: {config.title()}, {search.steps.count()} steps, outcome {run.outcome}")
    print(f"  wall {wall:.1f} s ({wall / population * 1000:.0f} ms per candidate with 16 live steps)")
    print(f"  peak RSS: steps process {worker_peak:.0f} MiB, web server {web_peak:.0f} MiB "
          f"({polls[0]} run reports served, {failures[0]} failed); database {size / 1e6:.1f} MB")


# --------------------------------------------------------------------------------------- main


def interrupt(signum: int, frame: Any) -> None:
    """SIGTERM (e.g. `timeout`) ends the run as Ctrl-C does: what was measured is still reported."""
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(LANES),
                        help=f"comma-separated Crucible lanes of {', '.join(LANES)} "
                             "(the bare loop always runs)")
    parser.add_argument("--populations", default="32,128,512", help="trivial-command populations")
    parser.add_argument("--with-1000", action="store_true", help="add population 1,000 (slow)")
    parser.add_argument("--sleep-population", type=int, default=32,
                        help="population of the sleeping configuration (0: skip it)")
    parser.add_argument("--sleep", type=float, default=0.2, help="seconds each command sleeps there")
    parser.add_argument("--trials", type=int, default=3, help="trials of the sleeping configuration")
    parser.add_argument("--trivial-trials", type=int, default=1, help="trials of the trivial ones")
    parser.add_argument("--web-scale", type=int, default=0,
                        help="also run the old scale check at this population (Daphne polling)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (data dir, worker logs)")
    args = parser.parse_args()
    lanes = [lane.strip() for lane in args.only.split(",") if lane.strip()]
    unknown = sorted(set(lanes) - set(LANES))
    if unknown:
        parser.error(f"unknown lane(s) {unknown}; choose from {', '.join(LANES)}")
    configs = [Config(args.sleep_population, args.sleep, args.trials)] if args.sleep_population else []
    populations = [int(p) for p in args.populations.split(",") if p.strip()]
    populations += [1000] if args.with_1000 else []
    configs += [Config(p, 0, args.trivial_trials) for p in populations]
    if any(config.population < CONCURRENCY for config in configs):
        parser.error(f"populations start at {CONCURRENCY} (the specs' concurrency)")
    redis_url = os.environ.get("CRUCIBLE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")

    with bench_temp(args.keep) as temp:
        data_dir = temp / "data"
        django_setup(data_dir)
        PROBE.install()
        user, project = operator_and_project()
        repo = make_repo(temp / "repo")
        results: dict[Config, dict[str, LaneResult]] = {config: {} for config in configs}
        signal.signal(signal.SIGTERM, interrupt)
        try:
            for config in configs:
                bare = bare_run(repo, temp / "bare-trees", config.population, config.rounds, config.sleep,
                                config.trials)
                results[config]["bare"] = LaneResult(bare.wall, bare.commands, bare.winner,
                                                     bare.git_processes)
                print(f"bare {config.title()}: {bare.wall:.2f} s", flush=True)
            for lane in lanes:
                if lane == "bare-sandbox":
                    for config in configs:
                        bare = bare_run(repo, temp / "bare-trees", config.population, config.rounds,
                                        config.sleep, config.trials, sandbox="crucible")
                        results[config][lane] = LaneResult(bare.wall, bare.commands, bare.winner,
                                                           bare.git_processes)
                        print(f"{lane} {config.title()}: {bare.wall:.2f} s", flush=True)
                    continue
                if lane == "inline":
                    for config in configs:
                        results[config][lane] = inline_run(user, project, repo, config)
                        print(f"{lane} {config.title()}: {results[config][lane].wall:.2f} s", flush=True)
                    continue
                extra, broker = {}, None
                if lane == "celery-redis":
                    problem = redis_problem(redis_url)
                    if problem:
                        for config in configs:
                            results[config][lane] = LaneResult(0, [], "", skipped=problem)
                        print(f"{lane}: skipped: {problem}", flush=True)
                        continue
                    extra, broker = {"REDIS_URL": redis_url}, redis_url
                worker = Worker(temp, lane, extra)
                try:
                    warmed = worker.warm(broker)
                    print(f"{lane}: the worker ran its first task {warmed:.2f} s after it was sent")
                    for config in configs:
                        results[config][lane] = celery_run(user, project, repo, config, lane, broker)
                        print(f"{lane} {config.title()}: {results[config][lane].wall:.2f} s", flush=True)
                finally:
                    worker.stop()
        except KeyboardInterrupt:
            print("\ninterrupted: the figures measured so far follow", flush=True)
        for config in configs:
            report(config, results[config])
        planner_summary({config.population: results[config]["inline"].planner for config in configs
                         if not config.sleep and "inline" in results[config]
                         and results[config]["inline"].planner})
        if args.web_scale:
            web_scale(user, project, repo, args.web_scale)
        print(f"\n(temp dir {temp}; lanes {', '.join(['bare', *lanes])}; {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
