"""Counting what one step costs: the git processes it starts and the database write
transactions it commits, per step kind (tests/search_app/test_step_costs.py, bench/step_costs.py)."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

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
    """Count every git process runtime_app.worktrees starts, under the step kind running in its thread."""
    from runtime_app import worktrees

    real = worktrees.git_run

    def counting(args: Sequence[str], **options: Any) -> bytes:
        with costs._lock:
            costs.git[costs.current()][git_kind(args)] += 1
        return real(args, **options)

    worktrees.git_run = counting
    try:
        yield costs
    finally:
        worktrees.git_run = real


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
