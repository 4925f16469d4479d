"""SQLite with Crucible's writers queued in process: a thread that writes waits on a lock of this
process instead of in SQLite's busy handler, whose back-off sleeps (up to 100 ms each) go on long
after the other writer let go. Other processes still meet SQLite's lock and busy timeout.

A transaction (BEGIN IMMEDIATE) takes the lock when it begins and lets it go when it commits,
rolls back or its connection closes; a write outside a transaction holds it for that statement.
It is re-entrant per thread, and never waited on longer than the busy timeout: a thread that
holds it while waiting on another thread's write delays that write, never deadlocks it.
"""

from __future__ import annotations

import threading
from typing import Any

from django.db.backends.sqlite3 import base

_WRITE_VERBS = ("INSERT", "UPDATE", "DELETE", "REPLACE")
_locks: dict[str, threading.RLock] = {}
_locks_guard = threading.Lock()


def write_lock(name: str) -> threading.RLock:
    """The lock of this process for the database file `name`."""
    with _locks_guard:
        return _locks.setdefault(name, threading.RLock())


class QueuedCursorWrapper(base.SQLiteCursorWrapper):
    """A write statement outside a transaction waits on the process's lock, as a transaction does."""

    write_lock: threading.RLock
    wait_seconds: float

    def execute(self, query: str, params: Any = None) -> Any:
        if self.connection.in_transaction or not _writes(query):
            return super().execute(query, params)
        with _held(self.write_lock, self.wait_seconds):
            return super().execute(query, params)

    def executemany(self, query: str, param_list: Any) -> Any:
        if self.connection.in_transaction or not _writes(query):
            return super().executemany(query, param_list)
        with _held(self.write_lock, self.wait_seconds):
            return super().executemany(query, param_list)


def _writes(query: str) -> bool:
    return query.lstrip()[:7].upper().startswith(_WRITE_VERBS)


class _held:
    """Hold `lock` for a block, or go on without it once `seconds` have passed."""

    def __init__(self, lock: threading.RLock, seconds: float) -> None:
        self.lock, self.seconds, self.acquired = lock, seconds, False

    def __enter__(self) -> None:
        self.acquired = self.lock.acquire(timeout=self.seconds)

    def __exit__(self, *exc: object) -> None:
        if self.acquired:
            self.lock.release()


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._write_lock: threading.RLock | None = None
        self._write_lock_held = False
        # SQLite's busy timeout: past it, a writer goes on to SQLite's own lock, as before.
        self._write_wait_seconds = float(self.settings_dict.get("OPTIONS", {}).get("timeout", 5))

    def get_new_connection(self, conn_params: dict) -> Any:
        # The file's lock, looked up when connecting: a test run renames the database after __init__.
        self._write_lock = write_lock(str(self.settings_dict["NAME"]))
        self._cursor_class = type("QueuedCursor", (QueuedCursorWrapper,),
                                  {"write_lock": self._write_lock, "wait_seconds": self._write_wait_seconds})
        return super().get_new_connection(conn_params)

    def create_cursor(self, name: str | None = None) -> Any:
        return self.connection.cursor(factory=self._cursor_class)

    def _start_transaction_under_autocommit(self) -> None:
        if not self._write_lock_held and self._write_lock is not None:
            self._write_lock_held = self._write_lock.acquire(timeout=self._write_wait_seconds)
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._write_lock_release()
            raise

    def _commit(self) -> Any:
        try:
            return super()._commit()
        finally:
            self._write_lock_release()

    def _rollback(self) -> Any:
        try:
            return super()._rollback()
        finally:
            self._write_lock_release()

    def _close(self) -> Any:
        try:
            return super()._close()
        finally:
            self._write_lock_release()

    def _write_lock_release(self) -> None:
        if self._write_lock_held:
            self._write_lock_held = False
            self._write_lock.release()
