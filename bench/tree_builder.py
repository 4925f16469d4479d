"""Evaluation trees: `git worktree add` against the lock-free tree builder (tree_apply) with
0, 100 and 500 live trees, measured side by side in one run.

    .venv/bin/python bench/tree_builder.py [--runs 5] [--files 5000] [--keep]

What it times, on a generated repository of 5,000 small files (as bench/worktree_creation.py
makes it) and a candidate's patch changing 3 of them:

- **git worktree add** `git worktree add --detach path sha`, raw (hooks off, no user or
  system config): the checkout alone, no patch;
- **patch_apply** Crucible's old evaluation tree: `worktree_create` (under the repository
  lock) plus the patch staged, checked and checked out (`runtime_app.worktrees.patch_apply`);
- **tree_apply** the new evaluation tree: a plain directory of the commit's files with the
  patch applied and checked, in a private git dir (no registration, no lock, ≤ 3 git processes).

"Live trees" are the trees other steps hold at the same time. For the two worktree methods they
are registered worktrees (made with `--no-checkout`: the bookkeeping git scans is the same, the
disk is not filled); tree_apply is timed with the same repository and as many plain directories
under the data dir's worktrees. Each run times one of each method in an order that rotates;
`os.sync()` runs before each timing and trees are removed only after each level. The script
prints medians, min and max per method and level, and each median's ratio to tree_apply's.
Then, at 500, THREADS threads build THREADS trees at once, the two builders alternating
(patch_apply's `worktree add` runs under the repository lock; tree_apply takes none).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import worktree_creation
from _search_setup import bench_temp
from worktree_creation import django_setup, git, repo_generate

LEVELS = (0, 100, 500)
THREADS = 4
CHANGED = ("pkg01/module_0001.py", "pkg02/module_0002.py", "pkg03/module_0003.py")


def patch_make(repo: Path, sha: str) -> bytes:
    checkout = repo.parent / "patch-checkout"
    git(repo, "worktree", "add", "-q", "--detach", str(checkout), sha)
    for relative in CHANGED:
        with open(checkout / relative, "a") as handle:
            handle.write("faster = True\n")
    (checkout / "pkg04" / "new_module.py").write_text("NEW = 1\n")
    git(checkout, "add", "-A")
    text = subprocess.run(["git", "diff", "--cached", "--binary", "--full-index", sha],
                          cwd=checkout, capture_output=True, check=True).stdout
    git(repo, "worktree", "remove", "--force", str(checkout))
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--files", type=int, default=worktree_creation.FILES)
    parser.add_argument("--keep", action="store_true")
    options = parser.parse_args()
    worktree_creation.FILES = options.files  # repo_generate's size
    with bench_temp(options.keep) as temp:
        root = Path(temp)
        django_setup(root / "data")
        from runtime_app.worktrees import (
            patch_apply,
            tree_apply,
            tree_remove,
            worktree_remove,
            worktrees_root,
        )

        repo = root / "repo"
        sha = repo_generate(repo)
        patch = patch_make(repo, sha)
        out = root / "out"
        out.mkdir()
        trees = worktrees_root()
        trees.mkdir(parents=True, exist_ok=True)
        registered_live = 0
        counter = iter(range(10**6))

        def worktree_add() -> Path:
            target = out / f"wt{next(counter)}"
            git(repo, "worktree", "add", "-q", "--detach", str(target), sha)
            return target

        def old() -> Path:
            return patch_apply(repo, sha, patch, f"old{next(counter)}")

        def new() -> Path:
            return tree_apply(repo, sha, patch, f"new{next(counter)}")

        methods: dict[str, Callable[[], Path]] = {
            "git worktree add": worktree_add, "patch_apply": old, "tree_apply": new,
        }
        results: dict[int, dict[str, list[float]]] = {}
        for level in LEVELS:
            while registered_live < level:  # registered records for the worktree methods
                git(repo, "worktree", "add", "-q", "--no-checkout", "--detach",
                    str(out / f"live{registered_live}"), sha)
                (trees / f"live{registered_live}").mkdir()  # and plain trees for tree_apply
                registered_live += 1
            times: dict[str, list[float]] = {name: [] for name in methods}
            made: list[tuple[str, Path]] = []
            for run in range(options.runs + 1):  # run 0 is the warm-up
                order = list(methods)[run % 3:] + list(methods)[: run % 3]
                for name in order:
                    os.sync()
                    started = time.perf_counter()
                    path = methods[name]()
                    elapsed = time.perf_counter() - started
                    patched = (path / CHANGED[0]).read_text().endswith("faster = True\n")
                    assert patched or name == "git worktree add", name
                    made.append((name, path))
                    if run:
                        times[name].append(elapsed)
            for name, path in made:  # removed after the level, outside the timings
                if name == "tree_apply":
                    tree_remove(path)
                elif name == "patch_apply":
                    worktree_remove(repo, path)
                else:
                    git(repo, "worktree", "remove", "--force", str(path))
            results[level] = times

        # At the last level: THREADS steps build their trees at once, as a search's live steps do.
        concurrent: dict[str, list[float]] = {"patch_apply": [], "tree_apply": []}
        for run in range(options.runs):
            for name in (["patch_apply", "tree_apply"] if run % 2 == 0 else ["tree_apply", "patch_apply"]):
                os.sync()
                started = time.perf_counter()
                with ThreadPoolExecutor(THREADS) as pool:
                    paths = list(pool.map(lambda _, build=methods[name]: build(), range(THREADS)))
                concurrent[name].append(time.perf_counter() - started)
                for path in paths:
                    if name == "tree_apply":
                        tree_remove(path)
                    else:
                        worktree_remove(repo, path)

        print(f"\n{options.files} files, a patch of {len(CHANGED) + 1} files, median of {options.runs} runs; "
              f"Python {platform.python_version()}, {os.cpu_count()} cores, {git(repo, 'version')}")
        print(f"{'live trees':>10}  {'method':<18} {'median':>9} {'min':>9} {'max':>9}  ratio to tree_apply")
        for level, times in results.items():
            reference = statistics.median(times["tree_apply"])
            for name, values in times.items():
                median = statistics.median(values)
                print(f"{level:>10}  {name:<18} {median * 1000:>7.1f} ms {min(values) * 1000:>6.1f} ms "
                      f"{max(values) * 1000:>6.1f} ms  {median / reference:.2f}×")
        reference = statistics.median(concurrent["tree_apply"])
        print(f"\n{THREADS} trees built at once by {THREADS} threads, {LEVELS[-1]} live trees, wall time")
        for name, values in concurrent.items():
            median = statistics.median(values)
            print(f"{'':>10}  {name:<18} {median * 1000:>7.1f} ms {min(values) * 1000:>6.1f} ms "
                  f"{max(values) * 1000:>6.1f} ms  {median / reference:.2f}×")
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
