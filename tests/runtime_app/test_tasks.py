"""A real Celery worker (a subprocess, like production) answers pings and records heartbeats.

Each test starts `python -m celery -A crucible worker` against the database this test uses
(tests.helpers.subprocess_env) and judges only what the worker wrote to that database.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from celery import Celery
from django.conf import settings

from runtime_app import services
from runtime_app.models import Event, WorkerHeartbeat
from tests.helpers import REPO_ROOT, stop_process, subprocess_env

PING_TASK = "runtime_app.tasks.project_ping_reply"
WAIT_SECONDS = 60
HEARTBEAT_WAIT_SECONDS = 40


@dataclass
class Worker:
    process: subprocess.Popen
    log: Path

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n--- worker output (tail) ---\n" + "\n".join(text.splitlines()[-lines:])

    def wait_until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll condition until it holds; fail with the worker's output if it never does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            if self.process.poll() is not None:
                pytest.fail(f"the worker exited with {self.process.returncode} before {what}"
                            + self.tail())
            time.sleep(0.25)
        pytest.fail(f"no {what} within {timeout:.0f} s" + self.tail())


@pytest.fixture
def start_worker(transactional_db, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start real Celery workers on this test's database; always stop them afterwards.

    Depending on transactional_db makes the worker stop before the database is flushed.
    Mingle and gossip are off so a test worker never talks to other workers that may share
    the same Redis.
    """
    workers: list[Worker] = []
    handles = []

    def start(*extra_args: str, **extra_env: str) -> Worker:
        log = tmp_path / f"worker-{len(workers)}.log"
        handle = log.open("wb")
        handles.append(handle)
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "crucible", "worker", "--loglevel", "INFO",
             "--pool", "solo", "--concurrency", "1", "--without-mingle", "--without-gossip",
             "--hostname", f"test-{uuid.uuid4().hex[:8]}@%h", *extra_args],
            cwd=REPO_ROOT,
            env=subprocess_env(**extra_env),
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
        worker = Worker(process, log)
        workers.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in workers:
            stop_process(worker.process, timeout=20)
        for handle in handles:
            handle.close()


def pongs_for(ping: Event):
    return Event.objects.filter(project_id=ping.project_id, kind="worker.pong", payload__ping=ping.pk)


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_worker_on_redis_answers_a_ping_with_an_event(personas, redis_url, start_worker):
    """The ping event is made with services.event_emit and its task sent by name through a
    separate Celery app bound to Redis, because the suite's own settings use the filesystem
    broker unless REDIS_URL is set: this way the same test proves the Redis path on both CI
    passes. The worker and the sender use a queue of their own, so another worker sharing
    this Redis (a developer's `make run`) can never take the message. Sending the task twice
    proves that answering a ping is idempotent.
    """
    queue = f"crucible-test-{uuid.uuid4().hex[:12]}"
    worker = start_worker("--queues", queue, REDIS_URL=redis_url)
    ping = services.event_emit(
        personas.alpha, "project", personas.alpha.pk, "worker.ping", {"message": "owner pinged"}
    )
    # Not the current app: shared tasks (project_ping_reply.delay) must keep using crucible's.
    sender = Celery("crucible-test-sender", broker=redis_url, set_as_current=False)
    try:
        first = sender.send_task(PING_TASK, args=[ping.pk], queue=queue)
        worker.wait_until(lambda: pongs_for(ping).exists(), WAIT_SECONDS, "worker.pong event")
        second = sender.send_task(PING_TASK, args=[ping.pk], queue=queue)
    finally:
        sender.close()

    def both_tasks_done() -> bool:
        log = worker.log.read_text(errors="replace")
        return all(f"{PING_TASK}[{task.id}] succeeded" in log for task in (first, second))

    worker.wait_until(both_tasks_done, WAIT_SECONDS, "success of both ping tasks in the log")
    pongs = list(pongs_for(ping))
    assert len(pongs) == 1, f"expected one pong, got {pongs}" + worker.tail()
    pong = pongs[0]
    assert pong.pk > ping.pk
    assert pong.subject_type == "project" and pong.subject_id == personas.alpha.pk
    assert pong.payload["hostname"]


@pytest.mark.integration
@pytest.mark.skipif(
    bool(settings.CONFIG.redis_url),
    reason="REDIS_URL is set, so Celery uses Redis instead of the embedded filesystem broker",
)
@pytest.mark.django_db(transaction=True)
def test_embedded_worker_on_the_filesystem_broker_answers_a_ping(personas, start_worker):
    """`make run` without Redis: the web process queues on kombu's filesystem transport under
    CRUCIBLE_DATA_DIR and a worker sharing that data dir answers."""
    worker = start_worker()
    services.project_ping(personas.member, personas.alpha)
    ping = Event.objects.get(project=personas.alpha, kind="worker.ping")
    assert ping.payload["message"] == "member pinged the workers"
    worker.wait_until(lambda: pongs_for(ping).exists(), WAIT_SECONDS, "worker.pong event")
    assert pongs_for(ping).count() == 1


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_beat_records_a_worker_heartbeat(start_worker, tmp_path):
    """The worker with embedded beat (as `manage.py serve` starts it) sends the 10-second
    heartbeat task to itself and the heartbeat lands in the database."""
    assert not WorkerHeartbeat.objects.exists()
    worker = start_worker("--beat", "--schedule", str(tmp_path / "schedule"))
    worker.wait_until(
        WorkerHeartbeat.objects.exists, HEARTBEAT_WAIT_SECONDS, "WorkerHeartbeat row"
    )
    heartbeat = WorkerHeartbeat.objects.get()
    assert heartbeat.hostname
    assert heartbeat.last_seen_at is not None
