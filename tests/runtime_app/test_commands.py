"""`make run`'s steps: crucible_setup (idempotent) and serve (two children, clean stop)."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from runtime_app.models import Event, Project
from tests.helpers import REPO_ROOT, free_port, stop_process, wait_for_port


@pytest.mark.django_db
def test_setup_creates_the_admin_and_demo_project_once(capsys, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    call_command("crucible_setup")
    first = capsys.readouterr().out
    assert "It is shown only this once" in first
    password = first.split("password: ")[1].split()[0]
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.check_password(password)
    call_command("crucible_setup")
    assert "password" not in capsys.readouterr().out
    assert Project.objects.filter(name="demo").count() == 1
    assert Event.objects.filter(kind="project.created").count() == 1


@pytest.mark.django_db
def test_the_demo_spec_freezes_against_the_demo_repository(settings, tmp_path, monkeypatch):
    from dataclasses import replace

    from search_app.models import Spec
    from search_app.services import search_freeze

    settings.DATA_DIR = tmp_path
    settings.CONFIG = replace(settings.CONFIG, data_dir=tmp_path)
    monkeypatch.setenv("DEEPSEEK_API_KEY", "placeholder-key")  # its writers' provider; freezing asks for it
    call_command("crucible_setup")
    call_command("crucible_setup")
    project = Project.objects.get(name="demo")
    repository = project.repositories.get()
    assert repository.path == str(tmp_path / "demo-repos" / "certificate")
    spec = Spec.objects.get(project=project, title="speed up the certificate")
    admin = get_user_model().objects.get(username="admin")
    search = search_freeze(admin, project, spec.latest.text, "HEAD", repository=repository)
    assert search.name == "speed-up-certificate"
    # Fixed author and dates: the demo baseline is the same commit on every machine.
    from dulwich.repo import Repo

    from runtime_app.management.commands.crucible_setup import Command

    settings.DATA_DIR = tmp_path / "elsewhere"
    with Repo(str(Command()._demo_repository())) as other:
        assert other.head().decode() == search.baseline_commit
    script = tmp_path / "demo-repos" / "certificate" / "scripts" / "benchmark_candidate.sh"
    assert script.stat().st_mode & 0o111


@pytest.mark.django_db
def test_setup_uses_the_password_from_the_environment(settings, capsys, tmp_path):
    from dataclasses import replace

    settings.DATA_DIR = tmp_path
    settings.CONFIG = replace(settings.CONFIG, admin_password="s3cret-Admin")
    call_command("crucible_setup")
    assert "s3cret-Admin" not in capsys.readouterr().out
    assert get_user_model().objects.get(username="admin").check_password("s3cret-Admin")


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "\nState:\tZ" not in status.read_text()


def _serve(tmp_path: Path, log) -> tuple[subprocess.Popen, int]:
    """`manage.py serve` on a fresh embedded data dir, started as `make run` does."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}}
    env["CRUCIBLE_DATA_DIR"] = str(tmp_path)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO_ROOT, env=env,
                   check=True, timeout=180)
    port = free_port()
    serve = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(port)],
                             cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return serve, port


def test_serve_starts_web_and_worker_and_ctrl_c_stops_both(tmp_path):
    log = (tmp_path / "serve.log").open("w")
    serve, port = _serve(tmp_path, log)
    try:
        wait_for_port(port, serve, timeout=60)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=10) as response:
            assert response.status == 200
        children = _children(serve.pid)
        assert len(children) == 2
        # The worker's beat writes a heartbeat into the same database: the worker is up.
        deadline = time.monotonic() + 60
        beats = 0
        while time.monotonic() < deadline and not beats:
            with sqlite3.connect(tmp_path / "crucible.sqlite3", timeout=30) as db:
                beats = db.execute("SELECT COUNT(*) FROM runtime_app_workerheartbeat").fetchone()[0]
            time.sleep(0.5)
        assert beats, (tmp_path / "serve.log").read_text()[-3000:]
        # What the web server and the worker create lies in a data dir only their user can enter,
        # and the database's journal files take its 0600.
        assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700
        journal = [tmp_path / "crucible.sqlite3", *tmp_path.glob("crucible.sqlite3-*")]
        assert {stat.S_IMODE(path.stat().st_mode) for path in journal if path.exists()} == {0o600}
        assert list(tmp_path.glob("celerybeat-schedule*"))

        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=40) == 0
        assert not [pid for pid in children if _alive(pid)]
        output = (tmp_path / "serve.log").read_text()
        assert f"http://127.0.0.1:{port}/" in output
        assert "Stopped the web server and the worker." in output
    finally:
        stop_process(serve)
        log.close()


def test_a_killed_serve_takes_the_web_server_and_worker_with_it(tmp_path):
    log = (tmp_path / "serve.log").open("w")
    serve, port = _serve(tmp_path, log)
    children: list[int] = []
    try:
        wait_for_port(port, serve, timeout=60)
        children = _children(serve.pid)
        assert len(children) == 2
        serve.kill()  # SIGKILL: serve cannot stop them itself
        serve.wait(timeout=10)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and [pid for pid in children if _alive(pid)]:
            time.sleep(0.2)
        assert not [pid for pid in children if _alive(pid)], (tmp_path / "serve.log").read_text()[-3000:]
    finally:
        stop_process(serve)
        for pid in children:
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
        log.close()


def test_a_demo_repository_from_an_older_crucible_gets_the_current_files(settings, tmp_path):
    from runtime_app.management.commands.crucible_setup import DEMO_REPO_SOURCE, Command
    from tests.gitrepo import git

    settings.DATA_DIR = tmp_path
    repo = Command()._demo_repository()
    git(repo, "rm", "-q", "scripts/demo_writer.py")
    git(repo, "commit", "-q", "-m", "older demo")
    again = Command()._demo_repository()
    assert (again / "scripts" / "demo_writer.py").read_bytes() == (
        DEMO_REPO_SOURCE / "scripts" / "demo_writer.py").read_bytes()
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "log", "-1", "--format=%s") == "Demo: the current demo files"


@pytest.mark.django_db
def test_setup_creates_the_demo_agent_once_with_its_first_evolution_queued(settings, tmp_path):
    from evolve_app.models import Agent, EvolutionRun

    settings.DATA_DIR = tmp_path
    call_command("crucible_setup")
    call_command("crucible_setup")
    agent = Agent.objects.get()
    assert agent.project.name == "demo" and agent.path == str(tmp_path / "agents" / "demo-1")
    run = EvolutionRun.objects.get()
    assert (run.agent, run.status, run.cycles_planned, run.benchmark) == (agent, "queued", 4, "demo")
    tags = subprocess.run(["git", "-C", agent.path, "tag"], capture_output=True, text=True).stdout.split()
    assert tags == ["evo-0"]


def test_a_checkout_without_executable_bits_still_makes_the_same_demo_baseline(
    settings, tmp_path, monkeypatch
):
    import shutil

    from runtime_app.management.commands import crucible_setup
    from tests.gitrepo import git

    settings.DATA_DIR = tmp_path / "intact"
    intact = crucible_setup.Command()._demo_repository()
    # An archive or a copy can drop the bit; the score command `./scripts/...` must still run.
    stripped = tmp_path / "stripped-checkout"
    shutil.copytree(crucible_setup.DEMO_REPO_SOURCE, stripped)
    for path in stripped.rglob("*"):
        if path.is_file():
            path.chmod(0o644)
    monkeypatch.setattr(crucible_setup, "DEMO_REPO_SOURCE", stripped)
    settings.DATA_DIR = tmp_path / "from-stripped"
    repo = crucible_setup.Command()._demo_repository()
    assert "100755" in git(repo, "ls-files", "-s", "scripts/benchmark_candidate.sh")
    assert git(repo, "rev-parse", "HEAD") == git(intact, "rev-parse", "HEAD")


def test_a_demo_repository_committed_without_the_executable_bit_gets_it_back(settings, tmp_path):
    from runtime_app.management.commands.crucible_setup import Command
    from tests.gitrepo import git

    settings.DATA_DIR = tmp_path
    repo = Command()._demo_repository()
    git(repo, "update-index", "--chmod=-x", "scripts/benchmark_candidate.sh")
    git(repo, "commit", "-q", "-m", "an older demo lost the bit")
    (repo / "scripts" / "benchmark_candidate.sh").chmod(0o644)
    Command()._demo_repository()
    assert "100755" in git(repo, "ls-files", "-s", "scripts/benchmark_candidate.sh")
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "log", "-1", "--format=%s") == "Demo: the current demo files"
