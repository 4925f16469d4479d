"""Crucible's SQLite backend (crucible/db/sqlite3): the writers of one process queue on a lock of
the process, held from a transaction's BEGIN to its COMMIT or ROLLBACK, and by a single write
outside a transaction; reads never wait on it."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from crucible.db.sqlite3.base import write_lock
from runtime_app.models import Project

pytestmark = [
    pytest.mark.skipif(connection.vendor != "sqlite", reason="the queue is SQLite's"),
    pytest.mark.django_db(transaction=True),
]


def lock_taken() -> bool:
    """Whether another thread holds the process's write lock (this thread does not)."""
    result: list[bool] = []

    def probe() -> None:
        lock = write_lock(str(connection.settings_dict["NAME"]))
        got = lock.acquire(blocking=False)
        if got:
            lock.release()
        result.append(not got)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return result[0]


def test_a_transaction_holds_the_lock_from_begin_to_commit_or_rollback():
    assert not lock_taken()
    with transaction.atomic():
        assert lock_taken()
        with transaction.atomic():  # a savepoint: the same lock, still held
            Project.objects.create(name="queued-1")
        assert lock_taken()
    assert not lock_taken()
    with pytest.raises(RuntimeError), transaction.atomic():
        Project.objects.create(name="queued-2")
        raise RuntimeError("rolled back")
    assert not lock_taken()
    names = Project.objects.filter(name__startswith="queued").values_list("name", flat=True)
    assert list(names) == ["queued-1"]


def test_another_threads_write_waits_in_the_queue_and_reads_do_not():
    held, release = threading.Event(), threading.Event()
    committed_at: list[float] = []

    def writer() -> None:
        try:
            with transaction.atomic():
                Project.objects.create(name="first")
                held.set()
                release.wait(10)
            committed_at.append(time.monotonic())
        finally:
            connection.close()

    thread = threading.Thread(target=writer)
    thread.start()
    assert held.wait(10)
    assert Project.objects.filter(name="first").count() == 0  # a read does not wait (WAL)
    timer = threading.Timer(0.3, release.set)
    timer.start()
    Project.objects.create(name="second")  # a write outside a transaction queues behind it
    wrote_at = time.monotonic()
    thread.join(10)
    assert committed_at and wrote_at >= committed_at[0]
    assert set(Project.objects.filter(name__in=("first", "second")).values_list("name", flat=True)) == \
        {"first", "second"}
