"""Real git repositories for tests, committed with fixed names and dates, so their commit
shas never change and no user or system git config leaks in."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Crucible Tests",
    "GIT_AUTHOR_EMAIL": "tests@crucible.invalid",
    "GIT_AUTHOR_DATE": "2026-01-02T03:04:05+00:00",
    "GIT_COMMITTER_NAME": "Crucible Tests",
    "GIT_COMMITTER_EMAIL": "tests@crucible.invalid",
    "GIT_COMMITTER_DATE": "2026-01-02T03:04:05+00:00",
    "GIT_CONFIG_GLOBAL": os.devnull,  # no user or system config can change what gets committed
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
}

BASELINE_FILES = {
    "code/certificate.py": "def certificate(n):\n    return sum(i * i for i in range(n))\n",
    "expected_result.json": '{"result": 328350}\n',
    "README.md": "# certificate\n\nCompute the certificate quickly.\n",
    "docs/notes.md": "The certificate must match expected_result.json exactly.\n",
    "tests/test_certificate.py": "from code.certificate import certificate\n\n"
    "def test_certificate():\n    assert certificate(100) == 328350\n",
    "scripts/benchmark_candidate.sh": "#!/bin/sh\npython -m timeit -n 5 'import certificate'\n",
}


def git(repo: Path, *args: str, date: str | None = None) -> str:
    env = {**os.environ, **GIT_ENV}
    if date:
        env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    return subprocess.run(
        ["git", "-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null", *args],
        cwd=repo, env=env, check=True, capture_output=True, text=True,
    ).stdout.strip()


def write_files(repo: Path, files: dict[str, str], executable: tuple[str, ...] = ()) -> None:
    for relative, content in files.items():
        path = repo / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        path.chmod(0o755 if relative in executable else 0o644)


def repo_create(
    path: Path, files: dict[str, str], *, branches: tuple[str, ...] = (), tags: tuple[str, ...] = (),
    executable: tuple[str, ...] = (),
) -> Path:
    """A repository at path with one commit of `files` on `main` (those in `executable` with
    mode 755), plus branches and tags."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    write_files(path, files, executable)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "baseline")
    for branch in branches:
        git(path, "branch", branch)
    for tag in tags:
        git(path, "tag", tag)
    return path


def baseline_repo(path: Path) -> Path:
    """Two commits on `main`: the baseline (tagged `v1`), then a change to code/certificate.py."""
    repo_create(path, BASELINE_FILES, tags=("v1",))
    closed_form = "def certificate(n):\n    return (n - 1) * n * (2 * n - 1) // 6\n"
    write_files(path, {"code/certificate.py": closed_form})
    git(path, "commit", "-q", "-am", "closed form", date="2026-01-03T03:04:05+00:00")
    return path


def seed_runnable(spec: str) -> str:
    """The seed spec with commands that can start in `baseline_repo`'s tree (its certificate.py
    is under code/, its benchmark script is not executable): freezing refuses the seed as it is."""
    return spec.replace("python certificate.py", "python code/certificate.py").replace(
        '"./scripts/benchmark_candidate.sh"', '"sh scripts/benchmark_candidate.sh"')
