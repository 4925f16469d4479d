"""Live tails across machines: with REDIS_URL set, a worker's tail reaches the web node through
Redis although they share no disk. The worker is a real subprocess with its own data dir running
a real command (`services.command_run`); this test process is the web node, with another data
dir. Each command waits for a `go` file the test writes into its tree, so nothing depends on
timing. Needs Redis (a skip without it, a failure with CRUCIBLE_REQUIRE_SERVICES=1), except the
last test, which points the store at a port where nothing listens."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis

from runtime_app import services, tails
from runtime_app.models import Receipt
from runtime_app.tails import RedisStore, tails_running, tails_watch
from tests.helpers import REPO_ROOT, free_port, subprocess_env

WAIT_SECONDS = 60  # generous for a loaded machine; passing tests never wait this long
SECRET = "hunter2-very-secret"
# Prints a secret and a line, waits for the test to write `go` into its tree, prints another.
SLOW = (f"echo 'the key is {SECRET}'; echo 'line one'; while [ ! -e go ]; do sleep 0.05; done; "
        "echo 'line two'")
# The worker: runs one command for a subject as a Celery step would, then prints its receipt's id.
WORKER = """
import json, sys
import django
django.setup()
from runtime_app import services, tails
job = json.loads(sys.argv[1])
for name, value in job["timings"].items():
    setattr(tails, name, value)
receipt = services.command_run(job["command"], cwd=job["tree"], timeout=60, isolation="off",
                               subject=tuple(job["subject"]), label=job["label"],
                               redact_values=[job["secret"]])
print(json.dumps({"receipt": receipt.pk}), flush=True)
"""


@pytest.fixture
def client(redis_url, settings) -> redis.Redis:
    """This process (the web node) keeps its tails in Redis; the client looks at them raw."""
    url = redis_url.rsplit("/", 1)[0] + "/14"  # its own database, as the other Redis tests
    settings.CONFIG = dataclasses.replace(settings.CONFIG, redis_url=url)
    return redis.Redis.from_url(url)


@pytest.fixture
def subject() -> tuple[str, int]:
    return ("candidate", uuid.uuid4().int % 10**9)  # no test sees another's tails or watch


class Worker:
    """A worker on another machine: its own data dir, the command's tree in it, REDIS_URL set."""

    def __init__(self, root: Path, url: str, subject: tuple[str, int], command: str = SLOW,
                 label: str = "cand_042 gate 1", **timings: float) -> None:
        self.data_dir = root / "worker"
        self.tree = self.data_dir / "worktrees" / "tailed"
        self.tree.mkdir(parents=True)
        job = {"command": command, "tree": str(self.tree), "subject": list(subject),
               "label": label, "secret": SECRET, "timings": timings}
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, json.dumps(job)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
            env=subprocess_env(REDIS_URL=url, CRUCIBLE_DATA_DIR=str(self.data_dir)),
            start_new_session=True)

    def finish(self) -> int:
        """Lets the command end; the id of the receipt the worker wrote."""
        (self.tree / "go").write_text("")
        out, _ = self.process.communicate(timeout=WAIT_SECONDS)
        assert self.process.returncode == 0, "the worker failed"
        return json.loads(out)["receipt"]

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(WAIT_SECONDS)

    def stop(self) -> None:
        (self.tree / "go").write_text("")  # a command the kill left behind ends too
        if self.process.poll() is None:
            self.kill()


def wait_for(predicate, what: str):
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"gave up waiting for {what}")


def tail_keys(client: redis.Redis, subject: tuple[str, int]) -> list[bytes]:
    """The subject's records and index in Redis (not its watch)."""
    key = tails._key(subject)
    return sorted([*client.scan_iter(match=RedisStore.tail_key(key, "*")),
                   *client.scan_iter(match=RedisStore.index_key(key))])


def test_a_worker_s_tail_reaches_the_web_node_and_the_page_s_watch_reaches_the_worker(
    transactional_db, client, subject, tmp_path, settings
):
    settings.DATA_DIR = tmp_path / "web"
    assert isinstance(tails.store(), RedisStore)
    worker = Worker(tmp_path, settings.CONFIG.redis_url, subject)
    try:
        running = wait_for(lambda: tails_running(subject), "the worker's command to say it runs")
        assert running[0].label == "cand_042 gate 1" and SECRET not in running[0].command
        assert "[redacted]" in running[0].command and "while [ ! -e go ]" in running[0].command
        assert not running[0].output and running[0].text == ""  # nobody watches yet
        tails_watch(subject)  # the page opens, on the web node
        running = wait_for(lambda: [r for r in tails_running(subject) if "line one" in r.text],
                           "the output once the worker saw the watch")
        assert running[0].output and "the key is [redacted]\n" in running[0].text
        assert SECRET not in running[0].text and "line two" not in running[0].text
        (record,) = client.scan_iter(match=RedisStore.tail_key(tails._key(subject), "*"))
        assert SECRET.encode() not in client.get(record)
        assert 0 < client.pttl(record) <= tails.STALE_SECONDS * 1000  # a dead worker's expires
        assert not (tmp_path / "web" / "tails").exists() and not (worker.data_dir / "tails").exists()
        receipt = Receipt.objects.get(pk=worker.finish())
    finally:
        worker.stop()
    assert "line two" in receipt.stdout_excerpt and SECRET not in receipt.stdout_excerpt
    assert tails_running(subject) == [] and tail_keys(client, subject) == []  # gone with the receipt


def test_a_tail_whose_worker_died_expires_by_itself(transactional_db, client, subject, tmp_path, settings):
    # Short timings in the worker only, so its record expires in seconds rather than 30.
    worker = Worker(tmp_path, settings.CONFIG.redis_url, subject, STALE_SECONDS=5.0, REFRESH_SECONDS=0.2)
    try:
        wait_for(lambda: tails_running(subject), "the worker's command to say it runs")
        (record,) = client.scan_iter(match=RedisStore.tail_key(tails._key(subject), "*"))
        assert 0 < client.pttl(record) <= 5000
        time.sleep(6)  # longer than the TTL: only the worker's refreshes keep it
        assert len(tails_running(subject)) == 1
        worker.kill()
        wait_for(lambda: tail_keys(client, subject) == [], "Redis to expire the dead worker's tail")
        assert tails_running(subject) == []
    finally:
        worker.stop()


def test_a_redis_that_fails_never_fails_a_step_or_a_page(
    transactional_db, subject, tmp_path, settings, caplog
):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    settings.CONFIG = dataclasses.replace(settings.CONFIG, redis_url=url)
    settings.DATA_DIR = tmp_path / "data"
    tree = settings.DATA_DIR / "worktrees" / "tailed"
    tree.mkdir(parents=True)
    caplog.set_level(logging.WARNING, logger="runtime_app.tails")
    tails_watch(subject)
    receipt = services.command_run("sleep 1; echo fine", cwd=tree, timeout=WAIT_SECONDS,
                                   isolation="off", subject=subject, label="cand_042 gate 1")
    assert receipt.succeeded and receipt.stdout_excerpt == "fine\n"
    assert tails_running(subject) == []  # the page shows no tail
    warnings = [r for r in caplog.records if r.name == "runtime_app.tails" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Redis failed" in warnings[0].getMessage()  # once, not per call
    assert not (tmp_path / "data" / "tails").exists()  # no fallback to a disk no web node reads

