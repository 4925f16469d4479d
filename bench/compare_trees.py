"""The compare page's patched trees on a generated repository of 5,000 files: a worktree per
candidate (what the page did) against a temporary index (what it does), side by side.

    .venv/bin/python bench/compare_trees.py

What it times: getting the tree id of the baseline with one candidate's patch applied, the
input of the compare page's "diff between two patched trees".

- **worktree**: `patch_apply` (the patched tree in a temporary index, the name-status
  verification, a `git worktree add` checkout of 5,000 files and `read-tree -m -u`), `worktree_tree`, then
  `worktree_remove`;
- **index**: `runtime_app.worktrees.patched_tree` (`git read-tree` into a temporary index,
  `git apply --cached`, `git write-tree`): no checkout.

How: the repository of bench/worktree_creation.py (5,000 small files in one packed commit),
and a real patch (three files changed, one added) extracted from a candidate's worktree.
Both methods must give the same tree, which the script checks. RUNS runs after one untimed
warm-up; in each run the two methods go in turn, the order rotating, so both see the same
machine load. It prints the median, min and max per method and the ratio of the medians.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _search_setup import bench_temp, keep_requested
from worktree_creation import FILES, django_setup, git, repo_generate

RUNS = 15


def main() -> None:
    with bench_temp(keep_requested()) as temp:
        root = Path(temp)
        django_setup(root / "data")
        from runtime_app.worktrees import (
            patch_apply,
            patch_extract,
            patched_tree,
            worktree_create,
            worktree_remove,
            worktree_tree,
        )

        repo = root / "repo"
        print(f"generating a repository of {FILES:,} files …", flush=True)
        commit = repo_generate(repo)
        source = worktree_create(repo, commit, "candidate")
        for number in (7, 1234, 4321):
            path = source / f"pkg{number % 50:02d}" / f"module_{number:04d}.py"
            path.write_text(path.read_text() + f"faster_{number} = True\n")
        (source / "pkg00" / "fast_path.py").write_text("def fast():\n    return 42\n")
        patch = patch_extract(source).text
        worktree_remove(repo, source)

        def by_worktree(run: int) -> str:
            worktree = patch_apply(repo, commit, patch, f"compare-{run}")
            try:
                return worktree_tree(worktree, base=commit)
            finally:
                worktree_remove(repo, worktree)

        def by_index(run: int) -> str:
            return patched_tree(repo, commit, patch)

        methods = {"worktree": by_worktree, "index": by_index}
        assert by_worktree(-1) == by_index(-1), "the two methods disagree on the tree"
        timings: dict[str, list[float]] = {name: [] for name in methods}
        names = list(methods)
        for run in range(RUNS):
            for name in names[run % 2:] + names[: run % 2]:
                started = time.perf_counter()
                methods[name](run)
                timings[name].append((time.perf_counter() - started) * 1000)

        print(f"\npatched tree of one candidate, {FILES:,}-file repository, {RUNS} runs "
              f"(Python {platform.python_version()}, git {git(repo, 'version').split()[-1]})")
        medians = {}
        for name, values in timings.items():
            medians[name] = statistics.median(values)
            print(f"  {name:9s} median {medians[name]:8.1f} ms   min {min(values):8.1f}   "
                  f"max {max(values):8.1f}")
        print(f"  ratio worktree/index: {medians['worktree'] / medians['index']:.1f}×"
              f"  (a compare of two candidates builds two trees)")


if __name__ == "__main__":
    main()
