"""A search run by Crucible against the same search with no framework, side by side in one run.

    .venv/bin/python bench/search_orchestration.py                    # 0.2 s at 32; trivial 32/128/512
    .venv/bin/python bench/search_orchestration.py --populations 32,128   # the same without 512
    .venv/bin/python bench/search_orchestration.py --only inline --populations 32,128 --sleep-population 0
    .venv/bin/python bench/search_orchestration.py --with-1000        # trivial 1,000 too (slow)

**Configurations.** Population 32 (rounds 32 → 8 → 3 → 1, 3 trials) whose writer, gate and score
commands each sleep 0.2 s; and trivial commands (`true`, 1 trial) at populations 32, 128 and 512
(rounds 32 → 8 → 3 → 1, else N → N/10 → 2 → 1), 1,000 with `--with-1000`. Concurrency 16. The
specs use `comparison = "absolute"` so every round runs exactly `trials` blocks on both sides
(paired comparison adds blocks where intervals are undecided: a measurement policy, not
orchestration).

**Lanes**, one after another on the same machine, each configuration in each lane (the Celery
lanes only at the two configurations with a goal, 32 × 0.2 s and 512 trivial, unless
`--celery-all`):
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
ideal. Issue 33's goals, each printed with PASS or MISS: every lane ≤ 1.15× the bare loop at
population 32 with 0.2 s commands; at 512 trivial each Crucible lane ≤ 1.25× the sandboxed loop
(`bare-sandbox`) and the sandboxed loop ≤ 1.2× the bare loop; git processes per step (inline,
mean) ≤ 3 for generate and evaluate, ≤ 6 for replay. The last block of the output, "issue 33",
gathers the per-step figures and every goal.

**Inline only (in-process probe, tests/step_costs.py's StepProbe):** the planner's calls (each
outermost `search_advance` call timed: count, median and mean per call, total) and, per step
kind, step time (the step's started_at → finished_at), its commands' time, the fixed cost (step −
commands) per step and per command, the processes it started by program (git among them), write
statements (INSERT/UPDATE/DELETE/REPLACE), write transactions (a commit after a write, or a write
in autocommit) and the time in BEGIN and write statements (SQLite's lock waits included). The
probe counts at the layers every call goes through, not at one module's name for a function:
`step_execute`, `search_advance` and `git_run` are replaced at every module-level binding of the
function object (sys.modules scanned, so `from … import` copies are caught), processes at
`subprocess.Popen` (every binding), SQL through every connection's execute wrappers and the
backend's `commit`; a thread started inside a step counts for it. After each inline run it
checks the counts against the steps the database says ran (each seen, each with a write
transaction, the planner called, git processes seen, no `git_run` without its process) and prints
"PROBE MISSED" with what was missed instead of zeros (tests/search_app/test_orchestration_probe.py).

`--web-scale N` adds the old scale check: a population-N search run inline while a Daphne server
on the same database answers `GET /api/searches/{id}/run` every 2 s (peak RSS of both, DB size).
Data goes to a temp dir in the system temp dir, removed unless `--keep`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
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

sys.path.insert(0, str(REPO_ROOT))  # tests.step_costs: the probe the tests check
from tests.step_costs import ProbeMissed, StepProbe, StepTally

__all__ = ["make_repo", "spec"]  # bench/ws_fanout.py builds its search with these

LANES = ("bare-sandbox", "inline", "celery-fs", "celery-redis")
KINDS = ("generate", "evaluate", "measure", "replay", "review")
# Issue 33's goals, side by side in one run.
GOAL_SLEEP_32 = 1.15  # every lane / the bare loop, population 32, 0.2 s commands
GOAL_ORCHESTRATION_512 = 1.25  # each Crucible lane / the sandboxed loop, population 512, trivial
GOAL_SANDBOX_512 = 1.2  # the sandboxed loop / the bare loop, population 512, trivial
GIT_GOALS = {"generate": 3, "evaluate": 3, "replay": 6}  # git processes per step


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

    @property
    def has_goal(self) -> bool:
        return (self.kind, self.population) in (("sleep", 32), ("trivial", 512))

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
    planner: list[float] | None = None  # seconds of each search_advance call (inline)
    steps: list[dict[str, Any]] = field(default_factory=list)
    tallies: dict[str, StepTally] = field(default_factory=dict)  # inline: planner, outside steps
    probe_error: str = ""  # inline: what the probe's check found missing
    walls: list[float] = field(default_factory=list)  # with --repeat: every run's wall time

    @property
    def command_seconds(self) -> float:
        return sum(c.seconds for c in self.commands)


# --------------------------------------------------------------------------- in-process probes

# tests/step_costs.py's StepProbe: it patches every binding of step_execute, search_advance and
# git_run, subprocess.Popen and the database backend's commit, and fails loudly on a miss.
PROBE = StepProbe()
FROZEN = itertools.count(1)


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

    # A name of its own each time: freezing the same spec again returns the search already run.
    text = spec(f"{lane}-{config.kind}-{config.population}-{next(FROZEN)}", config.population, config.rounds,
                config.sleep, config.trials, comparison="absolute")
    search = services.search_freeze(user, project, text, "HEAD", repository_path=str(repo))
    services.search_start(user, search, enqueue=False)
    return search


def inline_run(user: Any, project: Any, repo: Path, config: Config) -> LaneResult:
    from search_app import services

    search = freeze(user, project, repo, config, "inline")
    with PROBE.counting():
        started = time.perf_counter()
        try:
            run = services.search_run_inline(search)
        finally:
            wall = time.perf_counter() - started
    commands, rows = crucible_commands(search)
    ran = dict(search.steps.filter(started_at__isnull=False).values_list("pk", "kind"))
    PROBE.steps_label(ran)
    problem = ""
    try:
        PROBE.check(ran)
    except ProbeMissed as error:
        problem = str(error)
    for row in rows:
        tally = PROBE.per_step.get(row["pk"])
        if tally is not None:
            row.update(programs=tally.programs, git=tally.git_processes, writes=tally.writes,
                       transactions=tally.transactions, write_seconds=tally.write_seconds)
    tallies = [*PROBE.per_step.values(), PROBE.planner, PROBE.outside]
    return LaneResult(wall, commands, outcome_of(run), sum(t.git_processes for t in tallies),
                      planner=list(PROBE.planner_calls), steps=rows, probe_error=problem,
                      tallies={"planner": PROBE.planner, "outside steps": PROBE.outside})


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


def lane_line(name: str, result: LaneResult, bare: LaneResult | None, sandboxed: LaneResult | None) -> str:
    if result.skipped:
        return f"  {name:<13} skipped: {result.skipped}"
    ideal, _ = round_aware_ideal(result.commands)
    ratio = f"{result.wall / bare.wall:5.2f}x" if bare and not bare.skipped else "   - "
    over = (f"{result.wall / sandboxed.wall:5.2f}x" if sandboxed and not sandboxed.skipped
            and name not in ("bare", "bare-sandbox") else "     -")
    git = f"{result.git_processes:>6}" if result.git_processes is not None else "     -"
    walls = f"  (runs: {', '.join(f'{w:.2f}' for w in result.walls)} s)" if len(result.walls) > 1 else ""
    return (f"  {name:<13} {result.wall:8.2f} s  {ratio}  {over:>9}  {result.wall / ideal:6.2f}x  "
            f"{ideal:7.2f} s  {len(result.commands):>6}  {git}  {result.outcome}{walls}")


def verdict(ratio: float, goal: float) -> str:
    return "PASS" if ratio <= goal else "MISS"


def goal_lines(config: Config, results: dict[str, LaneResult]) -> list[str]:
    """The issue's goals for this configuration, each with its ratio and PASS or MISS."""
    bare, sandboxed = results.get("bare"), results.get("bare-sandbox")
    ran = {name: r for name, r in results.items() if not r.skipped and name != "bare"}
    lines = []
    if bare and not bare.skipped and (config.kind, config.population) == ("sleep", 32):
        for name, r in ran.items():
            ratio = r.wall / bare.wall
            lines.append(f"[{verdict(ratio, GOAL_SLEEP_32)}] population 32, {config.sleep:g} s commands: "
                         f"{name} {ratio:.2f}x the bare loop (goal ≤ {GOAL_SLEEP_32}x)")
    if (config.kind, config.population) == ("trivial", 512):
        if bare and not bare.skipped and sandboxed and not sandboxed.skipped:
            ratio = sandboxed.wall / bare.wall
            lines.append(f"[{verdict(ratio, GOAL_SANDBOX_512)}] population 512, trivial: the sandboxed loop "
                         f"{ratio:.2f}x the bare loop (goal ≤ {GOAL_SANDBOX_512}x)")
        if sandboxed and not sandboxed.skipped:
            for name, r in ran.items():
                if name != "bare-sandbox":
                    ratio = r.wall / sandboxed.wall
                    lines.append(f"[{verdict(ratio, GOAL_ORCHESTRATION_512)}] population 512, trivial: "
                                 f"{name} {ratio:.2f}x the sandboxed loop (goal ≤ {GOAL_ORCHESTRATION_512}x)")
        elif ran:
            lines.append("[ -- ] population 512, trivial: no bare-sandbox lane ran, so the goals against "
                         "the sandboxed loop are not measured (add it to --only)")
    return lines


def report(config: Config, results: dict[str, LaneResult]) -> None:
    print(f"\n== {config.title()}")
    print(f"  {'lane':<13} {'wall':>10}  {'/bare':>6}  {'/sandboxed':>9}  {'/ideal':>7}  {'ideal':>9}  "
          f"{'cmds':>6}  {'git':>6}  outcome")
    bare, sandboxed = results.get("bare"), results.get("bare-sandbox")
    for name, result in results.items():
        print(lane_line(name, result, bare, sandboxed))
    if bare and not bare.skipped:
        ideal, phases = round_aware_ideal(bare.commands)
        flat = bare.command_seconds / CONCURRENCY
        print(f"  ideal from the bare loop's commands: round-aware {ideal:.2f} s = "
              + " + ".join(f"{phase} {seconds:.2f}" for phase, seconds in phases.items())
              + f"; old Σ/16 ideal {flat:.2f} s ({bare.command_seconds:.1f} s of commands / 16)")
    for line in goal_lines(config, results):
        print(f"  {line}")
    segments(results)
    for name, result in results.items():
        if name not in ("bare", "inline") and result.steps:  # inline: the table below
            print(f"  {name} fixed cost per step (median ms, step time − its commands): " + ", ".join(
                f"{kind} {statistics.median(r['seconds'] - r['command_seconds'] for r in rows) * 1000:.0f}"
                for kind in KINDS if (rows := [r for r in result.steps if r["kind"] == kind])))
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
    """The inline lane's cost per step kind, as the probe counted it (tests/step_costs.py)."""
    calls = result.planner or []
    if result.probe_error:
        print(f"  PROBE MISSED — the counts below are not to be trusted: {result.probe_error}")
    if calls:
        median, mean = statistics.median(calls) * 1000, statistics.fmean(calls) * 1000
        print(f"  inline planner: {sum(calls):.2f} s in search_advance over {len(calls)} calls "
              f"(median {median:.1f} ms, mean {mean:.1f} ms a call)")
    print(f"  {'step kind':<9} {'steps':>5} {'step ms':>8} {'cmd ms':>8} {'fixed ms':>9} {'/cmd ms':>8} "
          f"{'git':>5} {'git max':>7} {'procs':>6} {'writes':>7} {'txns':>5} {'txn max':>7} {'write ms':>9}")
    for kind in KINDS:
        rows = [row for row in result.steps if row["kind"] == kind]
        if not rows:
            continue

        def med(key: str, rows: list[dict[str, Any]] = rows) -> float:
            return statistics.median(float(row.get(key, 0) or 0) for row in rows)

        def mean(key: str, rows: list[dict[str, Any]] = rows) -> float:
            return statistics.fmean(float(row.get(key, 0) or 0) for row in rows)

        fixed = [row["seconds"] - row["command_seconds"] for row in rows]
        per_command = [f / row["commands"] for f, row in zip(fixed, rows, strict=True) if row["commands"]]
        procs = statistics.median(sum(row.get("programs", Counter()).values()) for row in rows)
        print(f"  {kind:<9} {len(rows):>5} {med('seconds') * 1000:8.0f} {med('command_seconds') * 1000:8.0f} "
              f"{statistics.median(fixed) * 1000:9.0f} "
              f"{(statistics.median(per_command) * 1000 if per_command else 0):8.0f} {mean('git'):5.1f} "
              f"{max(row.get('git', 0) for row in rows):7d} {procs:6.0f} {mean('writes'):7.1f} "
              f"{mean('transactions'):5.1f} {max(row.get('transactions', 0) for row in rows):7d} "
              f"{med('write_seconds') * 1000:9.1f}")
    print("  (step, cmd, fixed, /cmd and write ms: medians; git, writes, txns: means per step, with the max)")
    for name, tally in result.tallies.items():
        print(f"  {name}: {tally.git_processes} git processes, {tally.writes} writes in "
              f"{tally.transactions} write transactions")


def issue_summary(configs: list[Config], results: dict[Config, dict[str, LaneResult]]) -> None:
    """The figures issue 33 asks for, in one place: per step kind at each trivial population, the
    planner per call, and every goal with PASS or MISS."""
    inline = [(c, results[c]["inline"]) for c in configs
              if not c.sleep and "inline" in results[c] and results[c]["inline"].steps]
    print("\n== issue 33: per-step cost (inline lane, trivial commands; means per step, max in brackets)")
    if inline:
        print(f"  {'population':>10}  {'kind':<9} {'steps':>5}  {'git processes':>14}  {'write txns':>11}  "
              f"{'fixed ms (median)':>17}")
        for config, result in inline:
            if result.probe_error:
                print(f"  {config.population:>10}  PROBE MISSED: {result.probe_error}")
            for kind in KINDS:
                rows = [row for row in result.steps if row["kind"] == kind]
                if rows:
                    git = [row.get("git", 0) for row in rows]
                    txns = [row.get("transactions", 0) for row in rows]
                    fixed = statistics.median(row["seconds"] - row["command_seconds"] for row in rows)
                    print(f"  {config.population:>10}  {kind:<9} {len(rows):>5}  "
                          f"{statistics.fmean(git):7.1f} ({max(git):>3})  "
                          f"{statistics.fmean(txns):5.1f} ({max(txns):>3})  {fixed * 1000:17.0f}")
        print("  planner (search_advance, outermost calls):")
        for config, result in inline:
            calls = result.planner or []
            if calls:
                print(f"  {config.population:>10}  {len(calls):>5} calls  "
                      f"{statistics.median(calls) * 1000:7.1f} ms median, "
                      f"{statistics.fmean(calls) * 1000:7.1f} ms mean a call  total {sum(calls):7.2f} s")
    else:
        print("  (no inline lane at a trivial population ran)")
    print("\n== issue 33: goals (side by side in this run)")
    lines = [line for config in configs for line in goal_lines(config, results[config])]
    for kind, goal in GIT_GOALS.items():
        figures = [(c.population, statistics.fmean(row.get("git", 0) for row in rows), r.probe_error)
                   for c, r in inline if (rows := [row for row in r.steps if row["kind"] == kind])]
        if figures:
            missed = any(error for _, _, error in figures)
            mark = "PROBE MISSED" if missed else verdict(max(f for _, f, _ in figures), goal)
            lines.append(f"[{mark}] git processes per {kind} step ≤ {goal} (inline, mean per step): "
                         + ", ".join(f"{p}: {f:.1f}" for p, f, _ in figures))
    for line in lines or ["(no configuration with a goal ran)"]:
        print(f"  {line}")


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


def median_run(results: list[LaneResult]) -> LaneResult:
    """The run of the median wall time (the lower middle of an even count), with every run's wall."""
    ran = sorted((r for r in results if not r.skipped), key=lambda r: r.wall)
    if not ran:
        return results[0]
    chosen = ran[(len(ran) - 1) // 2]
    chosen.walls = [r.wall for r in results if not r.skipped]
    return chosen


def lanes_run(args: argparse.Namespace, lanes: list[str], configs: list[Config], user: Any, project: Any,
              repo: Path, temp: Path, redis_url: str, record: Any) -> None:
    """Every configuration in the bare loop, then in each lane, once."""
    for config in configs:
        bare = bare_run(repo, temp / "bare-trees", config.population, config.rounds, config.sleep,
                        config.trials)
        record(config, "bare", LaneResult(bare.wall, bare.commands, bare.winner, bare.git_processes))
    for lane in lanes:
        if lane == "bare-sandbox":
            for config in configs:
                bare = bare_run(repo, temp / "bare-trees", config.population, config.rounds,
                                config.sleep, config.trials, sandbox="crucible")
                record(config, lane, LaneResult(bare.wall, bare.commands, bare.winner, bare.git_processes))
            continue
        if lane == "inline":
            for config in configs:
                record(config, lane, inline_run(user, project, repo, config))
            continue
        extra, broker = {}, None
        if lane == "celery-redis":
            problem = redis_problem(redis_url)
            if problem:
                for config in configs:
                    record(config, lane, LaneResult(0, [], "", skipped=problem))
                continue
            extra, broker = {"REDIS_URL": redis_url}, redis_url
        worker = Worker(temp, lane, extra)
        try:
            warmed = worker.warm(broker)
            print(f"{lane}: the worker ran its first task {warmed:.2f} s after it was sent")
            for config in configs:
                if args.celery_all or config.has_goal:
                    record(config, lane, celery_run(user, project, repo, config, lane, broker))
        finally:
            worker.stop()


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
    parser.add_argument("--celery-all", action="store_true",
                        help="run the Celery lanes at every configuration (default: only where a goal is "
                             "set, population 32 with sleeping commands and 512 trivial)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every lane this many times, alternating, and report the median run")
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
    if args.repeat < 1:
        parser.error("--repeat is at least 1")
    if any(config.population < CONCURRENCY for config in configs):
        parser.error(f"populations start at {CONCURRENCY} (the specs' concurrency)")
    redis_url = os.environ.get("CRUCIBLE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")

    with bench_temp(args.keep) as temp:
        data_dir = temp / "data"
        django_setup(data_dir)
        PROBE.install()
        user, project = operator_and_project()
        repo = make_repo(temp / "repo")
        runs: dict[Config, dict[str, list[LaneResult]]] = {config: {} for config in configs}

        def record(config: Config, lane: str, result: LaneResult, repetition: int) -> None:
            runs[config].setdefault(lane, []).append(result)
            shown = f"skipped: {result.skipped}" if result.skipped else f"{result.wall:.2f} s"
            print(f"{lane} {config.title()}{f' (run {repetition + 1})' if args.repeat > 1 else ''}: {shown}",
                  flush=True)

        signal.signal(signal.SIGTERM, interrupt)
        try:
            for repetition in range(args.repeat):  # the lanes alternate: bare, sandboxed, inline, … again
                lanes_run(args, lanes, configs, user, project, repo, temp, redis_url,
                          lambda config, lane, result, r=repetition: record(config, lane, result, r))
        except KeyboardInterrupt:
            print("\ninterrupted: the figures measured so far follow", flush=True)
        results = {config: {lane: median_run(tries) for lane, tries in lanes_of.items()}
                   for config, lanes_of in runs.items()}
        for config in configs:
            report(config, results[config])
        issue_summary(configs, results)
        if args.web_scale:
            web_scale(user, project, repo, args.web_scale)
        print(f"\n(temp dir {temp}; lanes {', '.join(['bare', *lanes])}; {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
