"""`manage.py serve` supervises its children: a killed worker comes back while the web server
keeps answering; a child that cannot start stops serve with one line; an idle log stays quiet
and a root worker warns only when candidate code would run as root."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from celery.app.trace import LOG_SUCCESS

from runtime_app import sandbox
from runtime_app.hooks import root_worker_check
from tests.helpers import REPO_ROOT, free_port, stop_process, wait_for_port

WAIT_SECONDS = 90


def serve_start(tmp_path: Path, port: int) -> tuple[subprocess.Popen, Path]:
    """`manage.py serve` on a fresh embedded data dir, as `make run` starts it."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}}
    env["CRUCIBLE_DATA_DIR"] = str(tmp_path / "data")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO_ROOT, env=env,
                   check=True, timeout=180)
    log = tmp_path / "serve.log"
    with log.open("wb") as handle:
        serve = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(port)],
                                 cwd=REPO_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)
    return serve, log


def children(pid: int) -> dict[str, int]:
    """serve's children by role: the Celery worker and the Daphne web server."""
    found = {}
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        found["worker" if b"celery" in argv else "web"] = int(child)
    return found


def wait_until(condition, serve: subprocess.Popen, log: Path, what: str):
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if serve.poll() is not None:
            pytest.fail(f"serve exited with {serve.returncode} before {what}\n" + log.read_text()[-4000:])
        time.sleep(0.25)
    pytest.fail(f"no {what} within {WAIT_SECONDS} s\n" + log.read_text()[-4000:])


def login_page_status(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=20) as response:
        return response.status


def test_a_killed_worker_is_restarted_and_the_web_server_keeps_answering(tmp_path):
    port = free_port()
    serve, log = serve_start(tmp_path, port)
    try:
        wait_for_port(port, serve, timeout=60)
        wait_until(lambda: log.read_text().count("ready.") == 1, serve, log, "ready worker")
        first = children(serve.pid)
        os.kill(first["worker"], signal.SIGKILL)
        again = wait_until(lambda: (now := children(serve.pid)).get("worker") not in (None, first["worker"])
                           and now, serve, log, "new worker")
        assert again["web"] == first["web"]
        assert login_page_status(port) == 200
        wait_until(lambda: log.read_text().count("ready.") == 2, serve, log, "restarted worker ready")
        output = log.read_text()
        assert "The worker was killed by SIGKILL; restarting it in 1 s." in output
        assert "Restarted the worker" in output
        # Idle for a while: no routine-task chatter, no root or host-name warnings.
        for quiet in ("worker_heartbeat[", "steps_reconcile[", "Sending due task", "superuser",
                      "No hostname"):
            assert quiet not in output, output[-4000:]
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=40) == 0
    finally:
        stop_process(serve)


def test_a_child_that_dies_at_once_every_time_stops_serve_with_one_line(tmp_path):
    """Someone else holds the port, so the web server exits as it starts, again and again."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        serve, log = serve_start(tmp_path, port)
        try:
            assert serve.wait(timeout=WAIT_SECONDS * 2) == 1
        finally:
            stop_process(serve)
    output = log.read_text()
    assert output.count("restarting it in") == 4, output[-4000:]
    verdict = [line for line in output.splitlines() if "stopping Crucible" in line]
    assert len(verdict) == 1 and "The web server stopped 5 times within 60 s" in verdict[0], output[-4000:]
    assert "Stopped the web server and the worker." in output


def test_routine_periodic_tasks_log_at_debug_and_other_tasks_at_info(caplog):
    caplog.set_level(logging.INFO)
    trace = logging.getLogger("celery.app.trace")
    for task in ("runtime_app.tasks.worker_heartbeat", "search_app.tasks.steps_reconcile",
                 "search_app.tasks.step_run"):
        trace.info(LOG_SUCCESS, {"id": "1", "name": task, "runtime": 0.01, "return_value": None})
    logging.getLogger("celery.beat").info("Scheduler: Sending due task %s (%s)", "steps-reconcile",
                                          "search_app.tasks.steps_reconcile")
    trace.error("Task %(name)s[%(id)s] raised", {"id": "2", "name": "runtime_app.tasks.worker_heartbeat"})
    assert [(record.levelname, record.getMessage()) for record in caplog.records] == [
        ("INFO", "Task search_app.tasks.step_run[1] succeeded in 0.01s: None"),
        ("ERROR", "Task runtime_app.tasks.worker_heartbeat[2] raised"),
    ]


@pytest.mark.parametrize(("isolation", "warned"), [(sandbox.BUBBLEWRAP, False), (sandbox.RLIMITS_ONLY, True)])
def test_a_root_worker_warns_only_when_commands_would_run_as_root(isolation, warned, caplog, monkeypatch):
    monkeypatch.setattr("runtime_app.hooks.os.geteuid", lambda: 0)
    monkeypatch.setattr(sandbox, "isolation_choose", lambda: isolation)
    monkeypatch.setattr(sandbox, "bubblewrap_probe", lambda: (False, "bubblewrap (bwrap) is not installed"))
    caplog.set_level(logging.INFO)
    root_worker_check()
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert bool(warnings) == warned
    if warned:
        assert "candidate code would run as root" in warnings[0] and "not installed" in warnings[0]
