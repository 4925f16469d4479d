"""Live tails: a running command's output, redacted, for the page that watches its subject, and
gone once its receipt is written. Commands are real and sandboxed; each waits for a `go` file
the test writes into its tree, so nothing depends on timing."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from runtime_app import sandbox, services, tails
from runtime_app.models import Receipt
from runtime_app.tails import Tail, tails_running, tails_watch
from tests.helpers import service_missing

SUBJECT = ("candidate", 4242)
WAIT_SECONDS = 60  # generous for a loaded machine; passing tests never wait this long
# Prints a line, waits for the test to write `go` into its tree, prints another.
SLOW = "echo 'line one'; echo 'to stderr' >&2; while [ ! -e go ]; do sleep 0.05; done; echo 'line two'"


@pytest.fixture(autouse=True)
def file_store(settings) -> None:
    """These tests read the embedded mode's files, whatever REDIS_URL says (test_tails_redis.py
    covers the Redis store)."""
    settings.CONFIG = dataclasses.replace(settings.CONFIG, redis_url=None)


@pytest.fixture
def tree(data_dir) -> Path:
    path = data_dir / "worktrees" / "tailed"
    path.mkdir(parents=True)
    return path


def wait_for(predicate, what: str):
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"gave up waiting for {what}")


def in_thread(function, *args, **kwargs) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["value"] = function(*args, **kwargs)
        except BaseException as error:  # re-raised by the test
            outcome["error"] = error
        finally:
            from django.db import connection

            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def finish(thread: threading.Thread, outcome: dict, tree: Path):
    (tree / "go").write_text("")
    thread.join(WAIT_SECONDS)
    assert not thread.is_alive(), "the command did not end after go"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def tail_files(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "tails").glob("*.json"))


def test_a_watched_command_s_output_shows_while_it_runs_and_goes_once_its_receipt_is_written(
    transactional_db, tree, data_dir, mode
):
    tails_watch(SUBJECT)
    thread, outcome = in_thread(services.command_run, SLOW, cwd=tree, timeout=WAIT_SECONDS, isolation=mode,
                                subject=SUBJECT, label="cand_042 gate 1")
    running = wait_for(lambda: [r for r in tails_running(SUBJECT) if "line one" in r.text], "line one")
    assert len(running) == 1
    now = running[0]
    assert "to stderr" in now.text and "line two" not in now.text  # both streams, nothing early
    assert now.label == "cand_042 gate 1" and now.command == SLOW and now.output
    assert Receipt.objects.count() == 0
    receipt = finish(thread, outcome, tree)
    assert receipt.pk and receipt.succeeded and "line two" in receipt.stdout_excerpt
    assert tails_running(SUBJECT) == [] and tail_files(data_dir) == []


def test_a_tail_file_is_private_to_the_server_and_out_of_every_sandbox(
    transactional_db, tree, data_dir
):
    available, reason = sandbox.bubblewrap_probe()
    if not available:
        service_missing(reason)
    other = ("candidate", 7)
    tails_watch(other)
    spy = Tail(other, "cand_007 gate 1")
    spy.begin(["echo"], [])
    spy.feed(b"another candidate's output\n")
    spy._write(time.monotonic(), with_output=True)
    folder = data_dir / "tails"
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(spy.path).st_mode) == 0o600
    tails_watch(SUBJECT)
    probe = (f"cat {folder}/*.json; ls {folder}; echo forged > {folder}/candidate-7.x.json; "
             f"echo forged > {spy.path}; " + SLOW)
    thread, outcome = in_thread(services.command_run, probe, cwd=tree, timeout=WAIT_SECONDS,
                                isolation="required", subject=SUBJECT)
    wait_for(lambda: [r for r in tails_running(SUBJECT) if "line one" in r.text], "line one")
    receipt = finish(thread, outcome, tree)
    assert "another candidate" not in receipt.stdout_excerpt + receipt.stderr_excerpt
    assert "No such file" in receipt.stderr_excerpt  # the data dir is not in its view at all
    assert [r.text for r in tails_running(other)] == ["another candidate's output\n"]
    spy.close()


def test_nobody_watching_means_no_output_on_disk(transactional_db, tree, data_dir):
    thread, outcome = in_thread(services.command_run, SLOW, cwd=tree, timeout=WAIT_SECONDS, isolation="off",
                                subject=SUBJECT, label="cand_042 gate 1")
    running = wait_for(lambda: tails_running(SUBJECT), "the command to say it runs")
    assert running[0].command == SLOW and not running[0].output and running[0].text == ""
    assert json.loads(tail_files(data_dir)[0].read_text())["text"] == ""
    tails_watch(SUBJECT)  # a page opens: the output follows
    wait_for(lambda: [r for r in tails_running(SUBJECT) if "line one" in r.text], "line one once watched")
    finish(thread, outcome, tree)
    assert tail_files(data_dir) == []


def test_the_tail_is_redacted_as_the_receipt_is(transactional_db, tree, data_dir, mode):
    tails_watch(SUBJECT)
    command = "echo 'the key is hunter2-very-secret'; " + SLOW
    thread, outcome = in_thread(services.command_run, command, cwd=tree, timeout=WAIT_SECONDS, isolation=mode,
                                subject=SUBJECT, redact_values=["hunter2-very-secret"])
    running = wait_for(lambda: [r for r in tails_running(SUBJECT) if "line one" in r.text], "line one")
    assert "the key is [redacted]" in running[0].text and "hunter2" not in running[0].text
    assert "hunter2" not in tail_files(data_dir)[0].read_text()
    receipt = finish(thread, outcome, tree)
    assert "the key is [redacted]" in receipt.stdout_excerpt


def test_the_start_of_a_secret_waits_for_its_end_and_a_cut_window_starts_at_a_whole_line(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    tail = Tail(SUBJECT, cap=64)
    tail.begin(["true"], ["hunter2-very-secret"])
    tail.feed(b"the key is hunt")
    assert tail.text() == "the key is "
    tail.feed(b"er2-very-secret\n")
    assert tail.text() == "the key is [redacted]\n"
    tail.feed(b"".join(b"line %d\n" % number for number in range(100)))
    text = tail.text()
    assert text.endswith("line 99\n") and text.startswith("line ") and len(text.encode()) <= 64
    assert all(line.startswith("line ") for line in text.splitlines())


def test_a_tail_that_fails_never_stops_the_command(transactional_db, tree, data_dir, monkeypatch):
    def broken(self) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(Tail, "tick", broken)
    receipt = services.command_run("seq 1 20000", cwd=tree, timeout=WAIT_SECONDS, isolation="off",
                                   subject=SUBJECT)
    assert receipt.succeeded and receipt.stdout_bytes == len(b"".join(b"%d\n" % n for n in range(1, 20001)))


def test_a_tail_left_by_a_dead_worker_is_removed(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    left = tmp_path / "tails" / "candidate-4242.dead.json"
    left.parent.mkdir()
    left.write_text(json.dumps({"label": "x", "command": "sleep 99", "started_at": "", "text": ""}))
    old = time.time() - tails.STALE_SECONDS - 5
    os.utime(left, (old, old))
    assert tails_running(SUBJECT) == [] and not left.exists()


def test_commands_without_a_subject_have_no_tail(transactional_db, tree, data_dir):
    receipt = services.command_run(SLOW.replace("[ ! -e go ]", "false"), cwd=tree, timeout=30,
                                   isolation="off")
    assert receipt.succeeded and not (data_dir / "tails").exists()


def test_a_subject_a_tail_cannot_name_runs_its_command_without_one(transactional_db, tree, data_dir):
    receipt = services.command_run("echo fine", cwd=tree, timeout=30, isolation="off",
                                   subject=("../../etc", 1))
    assert receipt.succeeded and receipt.stdout_excerpt == "fine\n" and not (data_dir / "tails").exists()
