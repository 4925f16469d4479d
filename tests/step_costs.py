"""Counting what one step costs: the git processes it starts and the database write
transactions it commits, per step kind (tests/search_app/test_step_costs.py, bench/step_costs.py);
and StepProbe, which counts a whole search's steps and planner calls for
bench/search_orchestration.py (tests/search_app/test_orchestration_probe.py)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, connections
from django.db.backends.signals import connection_created

WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


def git_kind(args: Sequence[str]) -> str:
    """A git call's subcommand and the flags that tell its kind apart (`apply --numstat`)."""
    flags = [arg for arg in args[1:] if arg.startswith("--") and arg not in ("--quiet", "--binary")]
    if args[0] == "apply":
        flags = [flag for flag in flags if flag in ("--numstat", "--check", "--index", "--cached")]
    elif args[0] not in ("worktree",):
        flags = flags[:1] if args[0] in ("read-tree",) else []
    head = [args[0], args[1]] if args[0] == "worktree" and len(args) > 1 else [args[0]]
    return " ".join([*head, *flags])


@dataclass
class StepCosts:
    """Per step kind: a Counter of git call kinds, and the write transactions of each step."""

    git: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    transactions: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    steps: Counter = field(default_factory=Counter)
    _local: threading.local = field(default_factory=threading.local)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def per_step(self, kind: str) -> dict[str, float]:
        count = self.steps[kind] or 1
        return {name: calls / count for name, calls in sorted(self.git[kind].items())}

    def git_per_step(self, kind: str) -> float:
        return sum(self.git[kind].values()) / (self.steps[kind] or 1)

    def current(self) -> str:
        return getattr(self._local, "kind", "outside a step")


@contextlib.contextmanager
def git_counted(costs: StepCosts) -> Iterator[StepCosts]:
    """Count every git_run call (at every module that bound it), under the step kind running in its thread."""
    from runtime_app import worktrees

    real = worktrees.git_run

    def counting(args: Sequence[str], **options: Any) -> bytes:
        with costs._lock:
            costs.git[costs.current()][git_kind(args)] += 1
        return real(args, **options)

    bound = rebind(real, counting)
    try:
        yield costs
    finally:
        for module, name in bound:
            setattr(module, name, real)


@contextlib.contextmanager
def writes_counted(costs: StepCosts, kind: str) -> Iterator[None]:
    """Count the write transactions this thread commits until the block ends: each write
    statement in autocommit is one, every outermost atomic block with writes is one."""
    outermost: list[Any] = []
    count = 0

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal count
        if sql.lstrip().upper().startswith(WRITES):
            if not connection.in_atomic_block:
                count += 1
            elif not outermost or outermost[-1] is not connection.atomic_blocks[0]:
                outermost.append(connection.atomic_blocks[0])  # kept: its id is never reused meanwhile
                count += 1
        return execute(sql, params, many, context)

    costs._local.kind = kind
    try:
        with connection.execute_wrapper(wrapper):
            yield
    finally:
        costs._local.kind = "outside a step"
        with costs._lock:
            costs.steps[kind] += 1
            costs.transactions[kind].append(count)


# ------------------------------------------------------------------ the probe of a whole search


class ProbeMissed(RuntimeError):
    """A counter of the probe saw nothing where the search must have done something: a binding
    was missed (a module holds the real function under a name the probe did not replace)."""


def rebind(original: Any, replacement: Any) -> list[tuple[Any, str]]:
    """Replace every module-level binding of `original` (the object itself, under any name, in
    every imported module) with `replacement`; returns the (module, name) pairs replaced. A module
    that did `from x import f` holds its own binding of f: patching only x.f misses its calls."""
    replaced = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            if value is original:
                setattr(module, name, replacement)
                replaced.append((module, name))
    return replaced


@dataclass
class StepTally:
    """What one step (or the planner, or everything outside steps) did while the probe ran."""

    kind: str
    programs: Counter = field(default_factory=Counter)  # processes started, by program name
    git: Counter = field(default_factory=Counter)  # git processes, by git_kind
    git_run_calls: int = 0
    writes: int = 0  # write statements
    transactions: int = 0  # committed transactions with a write, plus writes in autocommit
    write_seconds: float = 0.0  # in BEGIN and write statements (SQLite's lock waits included)
    executions: int = 0  # step_execute calls (a step retried runs more than once)
    seconds: float = 0.0

    @property
    def git_processes(self) -> int:
        return self.programs["git"]


_STEP_EXECUTE = ("search_app.services.steps", "step_execute")
_SEARCH_ADVANCE = ("search_app.services.runs", "search_advance")
_GIT_RUN = ("runtime_app.worktrees", "git_run")


class StepProbe:
    """Counts, per step, what a search run in this process really does, at the layers every call
    goes through rather than at one module's name for a function:

    - processes at `subprocess.Popen` (every binding of the class; `subprocess.run` and git_run
      start theirs through it), git ones by argv[0]; `worktrees.git_run` is counted too, at every
      module that bound it, as a cross-check that no git process bypassed Popen;
    - write transactions at the database backend: a write statement through every connection's
      execute_wrappers (new connections get the wrapper from `connection_created`), and a
      transaction when the connection commits (`commit` of the backend class) after a write;
    - the planner by wrapping `search_advance`, and steps by wrapping `step_execute`, each at every
      module-level binding of the function object (found by scanning sys.modules);
    - a thread started inside a step (its heartbeat, the sandbox's pumps) counts for that step.

    `check()` raises ProbeMissed when a counter stayed at zero where the search must have done
    something, so a missed binding is an error, never a row of zeros."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.lock = threading.Lock()
        self.active = False
        self.installed: list[tuple[Any, str, Any]] = []  # (owner, name, original) to restore
        self.reset()

    def reset(self) -> None:
        self.per_step: dict[int, StepTally] = {}
        self.planner = StepTally("planner")
        self.outside = StepTally("outside steps")
        self.planner_calls: list[float] = []

    # ---------------------------------------------------------------- where counts go

    def tally(self) -> StepTally:
        current = getattr(self.local, "tally", None)
        if current is None:
            current = getattr(threading.current_thread(), "_crucible_probe_tally", None)
        if current is None:
            current = self.planner if getattr(self.local, "planning", 0) else self.outside
        return current

    # ---------------------------------------------------------------- install / remove

    def install(self) -> StepProbe:
        if self.installed:
            return self
        probe = self
        execute = getattr(importlib.import_module(_STEP_EXECUTE[0]), _STEP_EXECUTE[1])
        advance = getattr(importlib.import_module(_SEARCH_ADVANCE[0]), _SEARCH_ADVANCE[1])
        git_run = getattr(importlib.import_module(_GIT_RUN[0]), _GIT_RUN[1])
        popen = subprocess.Popen

        @functools.wraps(execute)
        def counted_execute(*args: Any, **kwargs: Any) -> Any:
            if not probe.active or getattr(probe.local, "tally", None) is not None:
                return execute(*args, **kwargs)
            step_pk = args[0] if args else kwargs["step_pk"]
            with probe.lock:
                tally = probe.per_step.setdefault(step_pk, StepTally("?"))
                tally.executions += 1
            probe.local.tally = tally
            started = time.perf_counter()
            try:
                return execute(*args, **kwargs)
            finally:
                tally.seconds += time.perf_counter() - started
                probe.local.tally = None

        @functools.wraps(advance)
        def timed_advance(*args: Any, **kwargs: Any) -> Any:
            if not probe.active or getattr(probe.local, "planning", 0):
                return advance(*args, **kwargs)
            probe.local.planning = 1
            started = time.perf_counter()
            try:
                return advance(*args, **kwargs)
            finally:
                probe.local.planning = 0
                with probe.lock:
                    probe.planner_calls.append(time.perf_counter() - started)

        @functools.wraps(git_run)
        def counted_git_run(*args: Any, **options: Any) -> Any:
            if probe.active:
                tally = probe.tally()
                with probe.lock:
                    tally.git_run_calls += 1
            return git_run(*args, **options)

        class CountingPopen(popen):  # type: ignore[misc, valid-type]
            def __init__(self, args: Any, *rest: Any, **options: Any) -> None:
                if probe.active:
                    probe.process(args)
                super().__init__(args, *rest, **options)

        for original, replacement in ((execute, counted_execute), (advance, timed_advance),
                                      (git_run, counted_git_run), (popen, CountingPopen)):
            self.installed += [(module, name, original) for module, name in rebind(original, replacement)]
        backend = type(connections["default"])
        commit = backend.commit

        def counted_commit(connection: Any) -> None:
            dirty = getattr(connection, "_crucible_probe_dirty", False)
            connection._crucible_probe_dirty = False
            commit(connection)
            if dirty and probe.active:
                tally = probe.tally()
                with probe.lock:
                    tally.transactions += 1

        rollback = backend.rollback

        def cleared_rollback(connection: Any) -> None:
            connection._crucible_probe_dirty = False  # its writes were never committed
            rollback(connection)

        for name, replacement in (("commit", counted_commit), ("rollback", cleared_rollback)):
            self.installed.append((backend, name, backend.__dict__.get(name, _INHERITED)))
            setattr(backend, name, replacement)
        real_start = threading.Thread.start

        def start(thread: threading.Thread) -> None:
            thread._crucible_probe_tally = getattr(probe.local, "tally", None)  # type: ignore[attr-defined]
            real_start(thread)

        self.installed.append((threading.Thread, "start", real_start))
        threading.Thread.start = start  # type: ignore[method-assign]
        connection_created.connect(self._wrap_connection, weak=False, dispatch_uid="crucible-step-probe")
        for each in connections.all(initialized_only=True):
            self._wrap_connection(connection=each)
        return self

    def uninstall(self) -> None:
        for owner, name, original in reversed(self.installed):
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self.installed = []
        connection_created.disconnect(dispatch_uid="crucible-step-probe")
        for each in connections.all(initialized_only=True):
            if self.sql in each.execute_wrappers:
                each.execute_wrappers.remove(self.sql)

    def _wrap_connection(self, sender: Any = None, connection: Any = None, **_: Any) -> None:
        if self.sql not in connection.execute_wrappers:
            connection.execute_wrappers.append(self.sql)

    @contextlib.contextmanager
    def counting(self) -> Iterator[StepProbe]:
        """Counts from a clean slate until the block ends."""
        self.reset()
        self.active = True
        try:
            yield self
        finally:
            self.active = False

    # ---------------------------------------------------------------- the counters

    def process(self, args: Any) -> None:
        if isinstance(args, str | bytes | os.PathLike):
            argv = os.fsdecode(args).split()
        else:
            argv = [os.fsdecode(arg) for arg in args]
        program = os.path.basename(argv[0]) if argv else "?"
        tally = self.tally()
        with self.lock:
            tally.programs[program] += 1
            if program == "git" and len(argv) > 1:
                tally.git[git_kind(_git_subcommand(argv[1:]))] += 1

    def sql(self, execute: Any, sql: str, params: Any, many: bool, context: dict) -> Any:
        if not self.active:
            return execute(sql, params, many, context)
        verb = sql.lstrip()[:8].upper()
        write, begin = verb.startswith(WRITES), verb.startswith("BEGIN")
        if not (write or begin):
            return execute(sql, params, many, context)
        connection = context["connection"]
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            tally = self.tally()
            with self.lock:
                tally.write_seconds += time.perf_counter() - started
                if write:
                    tally.writes += 1
                    if connection.in_atomic_block:
                        connection._crucible_probe_dirty = True
                    else:
                        tally.transactions += 1

    # ---------------------------------------------------------------- reading them

    def steps_label(self, kinds: dict[int, str]) -> None:
        """Name each counted step's kind (step pk → kind, read from the database after the run)."""
        for pk, tally in self.per_step.items():
            tally.kind = kinds.get(pk, tally.kind)

    def by_kind(self) -> dict[str, list[StepTally]]:
        kinds: dict[str, list[StepTally]] = defaultdict(list)
        for tally in self.per_step.values():
            kinds[tally.kind].append(tally)
        return kinds

    def check(self, ran: dict[int, str]) -> None:
        """Raise ProbeMissed unless the counts fit the steps that ran (step pk → kind, from the
        database): every step seen, each with a write transaction (it records its result in
        one), the planner called, git processes seen, and no git_run call without its process."""
        problems = []
        unseen = sorted(set(ran) - set(self.per_step))
        if unseen:
            problems.append(f"{len(unseen)} of {len(ran)} steps that ran were never seen by the probe's "
                            f"step_execute (first: {unseen[:5]}): a binding of step_execute was missed")
        if ran and not self.planner_calls:
            problems.append("no search_advance call was seen: a binding of search_advance was missed")
        seen = [tally for pk, tally in self.per_step.items() if pk in ran]
        silent = sorted({tally.kind for tally in seen if tally.transactions == 0})
        if seen and silent:
            problems.append(f"steps of kind {', '.join(silent)} committed no write transaction, yet every "
                            "step records its result in one: the database hook missed them")
        tallies = [*self.per_step.values(), self.planner, self.outside]
        git_runs = sum(t.git_run_calls for t in tallies)
        git_processes = sum(t.git_processes for t in tallies)
        if ran and git_processes == 0:
            problems.append(f"no git process was seen in {len(ran)} steps (git_run called {git_runs} times): "
                            "the subprocess hook missed them")
        if git_runs > git_processes:
            problems.append(f"git_run was called {git_runs} times but only {git_processes} git processes "
                            "were seen at subprocess.Popen: some git process bypassed the hook")
        if problems:
            raise ProbeMissed("the probe missed calls: " + "; ".join(problems))


_INHERITED = object()  # the class had no attribute of its own: restore by deleting ours


def _git_subcommand(args: Sequence[str]) -> list[str]:
    """git's arguments from its subcommand on: global options (`-c key=value`, `-C dir`) dropped."""
    rest = list(args)
    while rest and rest[0].startswith("-"):
        if rest.pop(0) in ("-c", "-C") and rest:
            rest.pop(0)
    return rest or ["?"]
