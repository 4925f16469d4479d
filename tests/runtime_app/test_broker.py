"""The embedded broker never loses the worker to a torn, empty or garbage message file.

A real Celery worker (a subprocess, as `manage.py serve` starts it) on the filesystem broker of
this test's data dir finds bad files in its queue folder, sets them aside and still answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from kombu import Connection

from runtime_app import broker, services
from runtime_app.models import Event
from tests.helpers import REPO_ROOT, stop_process, subprocess_env

WAIT_SECONDS = 60

pytestmark = pytest.mark.skipif(
    bool(settings.CONFIG.redis_url),
    reason="REDIS_URL is set, so Celery uses Redis instead of the embedded filesystem broker",
)

BAD_FILES = {
    "empty": b"",  # created by its writer, not yet written (kombu issue #1551)
    "torn": b'{"body": "eyJ0YXNrIjogInJ1bnRpbWVfYXBwLnRhc2tz',
    "garbage": b"\xff\xfe\x00not json at all",
    "wrong-shape": json.dumps({"body": "", "properties": {}}).encode(),
}


def queue_folder() -> Path:
    return Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])


def quarantine_folder() -> Path:
    return Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["quarantine_folder"])


def drop_bad_files(tag: str) -> list[str]:
    """Bad message files for the worker's queue, named to sort before any real message."""
    names = []
    for kind, content in BAD_FILES.items():
        name = f"{0:015d}_{tag}-{kind}.celery.msg"
        (queue_folder() / name).write_bytes(content)
        names.append(name)
    return names


def wait_until(condition, process: subprocess.Popen, log: Path, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if condition():
            return
        if process.poll() is not None:
            pytest.fail(f"the worker exited with {process.returncode} before {what}\n"
                        + log.read_text(errors="replace")[-4000:])
        time.sleep(0.25)
    pytest.fail(f"no {what} within {WAIT_SECONDS} s\n" + log.read_text(errors="replace")[-4000:])


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_worker_survives_torn_empty_and_garbage_message_files_and_still_runs_a_task(personas, tmp_path):
    tag = uuid.uuid4().hex[:8]
    bad = drop_bad_files(tag)
    log = tmp_path / "worker.log"
    with log.open("wb") as handle:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "crucible", "worker", "--loglevel", "INFO",
             "--pool", "solo", "--without-mingle", "--without-gossip", "--hostname", f"test-{tag}@%h"],
            cwd=REPO_ROOT, env=subprocess_env(), stdin=subprocess.DEVNULL, stdout=handle,
            stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: b"ready." in log.read_bytes(), worker, log, "ready worker")
            # Bad files arriving while it runs are set aside too.
            bad += drop_bad_files(tag + "-later")
            services.project_ping(personas.member, personas.alpha)
            ping = Event.objects.get(project=personas.alpha, kind="worker.ping")
            wait_until(lambda: Event.objects.filter(kind="worker.pong", payload__ping=ping.pk).exists(),
                       worker, log, "worker.pong event")
            assert worker.poll() is None
            assert not [name for name in bad if (queue_folder() / name).exists()]
            assert {name for name in bad} <= {path.name for path in quarantine_folder().iterdir()}
            assert "Set aside unreadable broker message" in log.read_text(errors="replace")
        finally:
            stop_process(worker, timeout=20)
            for name in bad:
                (quarantine_folder() / name).unlink(missing_ok=True)


def test_a_message_is_written_whole_under_a_hidden_name_then_renamed_into_the_queue(tmp_path, monkeypatch):
    """No reader can see a message file before its last byte is written."""
    folders = {name: tmp_path / name for name in ("queue", "processed", "control")}
    for folder in folders.values():
        folder.mkdir()
    seen_while_writing: list[list[str]] = []
    real_fdopen = os.fdopen

    def fdopen_watching(descriptor, mode):
        file = real_fdopen(descriptor, mode)
        real_write = file.write

        def write(data):
            seen_while_writing.append(sorted(os.listdir(folders["queue"])))
            return real_write(data)

        file.write = write
        return file

    monkeypatch.setattr(broker.os, "fdopen", fdopen_watching)
    options = {"data_folder_in": str(folders["queue"]), "data_folder_out": str(folders["queue"]),
               "processed_folder": str(folders["processed"]), "control_folder": str(folders["control"])}
    with Connection("filesystem://", transport=broker.Transport, transport_options=options) as connection:
        queue = connection.SimpleQueue("sentences")
        queue.put({"hello": "world"})
        assert all(name.startswith(".") for names in seen_while_writing for name in names)
        assert [name.endswith(".sentences.msg") for name in os.listdir(folders["queue"])] == [True]
        message = queue.get(timeout=5)
        assert message.payload == {"hello": "world"}
        message.ack()
        queue.close()
    assert os.listdir(folders["queue"]) == [] and os.listdir(folders["processed"]) == []
