"""Shared set-up for the benchmarks: a temp dir outside the checkout, a migrated SQLite database,
an operator in a project, and helpers to freeze and run a spec in this process."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def bench_temp(keep: bool = False) -> Iterator[Path]:
    """A fresh dir in the system's temp dir (`crucible-bench-…`, never under the checkout) for a
    bench's data dir, repositories and logs; removed at the end unless `keep` (`--keep`)."""
    path = Path(tempfile.mkdtemp(prefix="crucible-bench-"))
    try:
        yield path
    finally:
        if keep:
            print(f"kept {path}", file=sys.stderr)
        else:
            shutil.rmtree(path, ignore_errors=True)


def keep_requested() -> bool:
    """`--keep` on the command line of a bench that has no other options."""
    return "--keep" in sys.argv[1:]


def django_setup(data_dir: Path) -> None:
    os.environ["CRUCIBLE_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crucible.settings")
    sys.path.insert(0, str(REPO_ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)


def operator_and_project():
    from django.contrib.auth import get_user_model

    from runtime_app.models import Project, ProjectMembership

    user = get_user_model().objects.create_superuser("bench", password="bench-password-1")
    project = Project.objects.create(name="bench", created_by=user)
    ProjectMembership.objects.create(project=project, user=user, role="admin")
    return user, project


def freeze_and_run(user, project, spec_text: str, repo: Path):
    from search_app import services

    search = services.search_freeze(user, project, spec_text, "HEAD", repository_path=str(repo))
    services.search_start(user, search, enqueue=False)
    return search, services.search_run_inline(search)


def free_port() -> int:
    """A loopback port nothing listens on now (for a real server a bench starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 120) -> None:
    """Until `process` listens on `port`; exit with why when it dies or never listens."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"serve exited with {process.returncode} before listening")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise SystemExit(f"nothing listened on port {port} within {timeout} s")


def served_data_prepare(temp: Path, password: str) -> tuple[Path, dict[str, str], list[str]]:
    """A data dir under `temp` set up as `make run` does (migrated, demo project, admin with
    `password`), Django pointed at it: (data dir, the server's environment, `manage.py` argv)."""
    data = temp / "data"
    env = {k: v for k, v in os.environ.items()
           if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}}
    env.update(CRUCIBLE_DATA_DIR=str(data), CRUCIBLE_ADMIN_PASSWORD=password)
    manage = [sys.executable, "manage.py"]
    for step in (["migrate", "-v0"], ["crucible_setup"]):
        subprocess.run([*manage, *step], cwd=REPO_ROOT, env=env, check=True, timeout=300,
                       stdout=subprocess.DEVNULL)
    django_setup(data)
    return data, env, manage
