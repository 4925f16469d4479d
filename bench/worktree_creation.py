"""Worktree creation for a generated repository of 5,000 files: dulwich against the git CLI
against a full copy, measured side by side in one run.

    .venv/bin/python bench/worktree_creation.py

What it times: making a checkout of the baseline commit that a candidate can work in.

- **dulwich** `porcelain.worktree_add(repo, path, commit=sha, detach=True)`;
- **git CLI** `git worktree add --detach path sha` with hooks off and no user or system
  config, as `runtime_app.worktrees` runs it;
- **copy** `shutil.copytree` of the whole checkout, `.git` included (a copy of the object
  store is what a worktree avoids);
- **worktree_create**: `runtime_app.worktrees.worktree_create`, the function Crucible
  calls (the git CLI path plus name checks, ref resolution and the data dir).

How: a temp dir holds a repository of FILES small files (50 directories, 1–10 lines of
20–250 bytes each, fixed seed) in one commit, packed with `git gc` as a clone would be.
Each run creates one worktree with each method in turn (the order rotates per run), so
every method sees the same page cache and machine load. `os.sync()` runs before each
timing so no method pays for the writeback of files an earlier one wrote, and worktrees
are only removed at the end (deleting 5,000 files between timings made the next timings
stall on this machine). One untimed warm-up round comes first. The script prints the
median, min and max of RUNS runs per method and each median's ratio to the git CLI's.
"""

from __future__ import annotations

import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

from _search_setup import bench_temp, keep_requested

REPO_ROOT = Path(__file__).resolve().parent.parent
FILES = 5_000
RUNS = 5

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Crucible Bench",
    "GIT_AUTHOR_EMAIL": "bench@crucible.invalid",
    "GIT_AUTHOR_DATE": "2026-01-02T03:04:05+00:00",
    "GIT_COMMITTER_NAME": "Crucible Bench",
    "GIT_COMMITTER_EMAIL": "bench@crucible.invalid",
    "GIT_COMMITTER_DATE": "2026-01-02T03:04:05+00:00",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}


def git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | GIT_ENV
    return subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false", *args],
        cwd=cwd, env=env, check=True, capture_output=True, text=True,
    ).stdout.strip()


def repo_generate(path: Path) -> str:
    """A repository of FILES small text files in one packed commit; returns the commit sha."""
    rng = random.Random(5000)
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    for number in range(FILES):
        file = path / f"pkg{number % 50:02d}" / f"module_{number:04d}.py"
        file.parent.mkdir(exist_ok=True)
        lines = rng.randint(1, 10)
        file.write_text("".join(f"value_{number}_{i} = {rng.randint(0, 10**9)}\n" for i in range(lines)))
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "generated")
    git(path, "gc", "-q")
    return git(path, "rev-parse", "HEAD")


def django_setup(data_dir: Path) -> None:
    os.environ["CRUCIBLE_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crucible.settings")
    sys.path.insert(0, str(REPO_ROOT))
    import django

    django.setup()


def main() -> None:
    with bench_temp(keep_requested()) as temp:
        root = Path(temp)
        django_setup(root / "data")
        from dulwich import porcelain

        from runtime_app.worktrees import worktree_create, worktree_prune, worktree_remove

        repo = root / "repo"
        started = time.perf_counter()
        sha = repo_generate(repo)
        print(f"generated {FILES} files in one commit in {time.perf_counter() - started:.1f} s")
        out = root / "out"
        out.mkdir()

        def dulwich_add(target: Path) -> None:
            porcelain.worktree_add(str(repo), str(target), commit=sha, detach=True)

        def git_add(target: Path) -> None:
            git(repo, "worktree", "add", "-q", "--detach", str(target), sha)

        def copy(target: Path) -> None:
            shutil.copytree(repo, target, symlinks=True)

        def crucible(target: Path) -> None:
            worktree_create(repo, sha, target.name)

        methods: dict[str, Callable[[Path], None]] = {
            "dulwich worktree_add": dulwich_add,
            "git worktree add --detach": git_add,
            "shutil.copytree": copy,
            "worktree_create (Crucible)": crucible,
        }
        times: dict[str, list[float]] = {name: [] for name in methods}
        data_worktrees = root / "data" / "worktrees"
        for run in range(RUNS + 1):  # run 0 is the warm-up
            order = list(methods)[run % len(methods):] + list(methods)[: run % len(methods)]
            for name in order:
                target = out / f"run{run}-{list(methods).index(name)}"
                os.sync()  # start each timing with no writeback of earlier runs pending
                started = time.perf_counter()
                methods[name](target)
                elapsed = time.perf_counter() - started
                checkout = data_worktrees / target.name if name.startswith("worktree_create") else target
                assert len(list((checkout / "pkg07").iterdir())) == FILES // 50, name
                if run:
                    times[name].append(elapsed)
        print("removing the worktrees")
        for checkout in data_worktrees.iterdir():
            worktree_remove(repo, checkout)
        for target in out.iterdir():
            shutil.rmtree(target)
        worktree_prune(repo)

        medians = {name: statistics.median(values) for name, values in times.items()}
        reference = medians["git worktree add --detach"]
        print(f"\n{FILES} files, median of {RUNS} runs each; Python {platform.python_version()}, "
              f"{os.cpu_count()} cores, {git(repo, 'version')}, dulwich {version('dulwich')}")
        print(f"{'method':<30} {'median':>9} {'min':>9} {'max':>9}  ratio to git CLI")
        for name, values in times.items():
            print(f"{name:<30} {medians[name] * 1000:>7.0f} ms {min(values) * 1000:>6.0f} ms "
                  f"{max(values) * 1000:>6.0f} ms  {medians[name] / reference:.2f}×")


if __name__ == "__main__":
    main()
