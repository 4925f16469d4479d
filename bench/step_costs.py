"""The runtime's fixed cost per step: what an evaluate step and a generate step spend on git,
without the commands they run, timed through the real functions.

    .venv/bin/python bench/step_costs.py [--runs 20] [--files 1000] [--parallel 1] [--code DIR]

- **evaluate**: `services.patch_admit` of a real candidate patch (limits, patched tree, change
  policy, checkout) and `worktree_remove` of its worktree: what evaluate does before its gates.
- **generate**: `worktree_create` at the baseline, a two-file edit (the writer's part, untimed
  work of a few µs), `patch_extract`, `worktree_remove`.

It prints the median, min and max ms of each, the CPU it used (with its git children), and
the git processes each starts, by kind.
`--code DIR` imports runtime_app from another checkout (e.g. `git worktree add /tmp/old
<commit>`, then run from inside it) to measure code before a change with this same script;
`--parallel N` runs N operations at once (N live steps). Receipts are built but not written (no database); the
repository and data dir are temporary directories, removed at the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from worktree_creation import git

REPO_ROOT = Path(__file__).resolve().parent.parent


def repo_make(path: Path, files: int) -> str:
    """A repository of `files` small Python files under code/ and a test, in one packed commit."""
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    for number in range(files):
        file = path / "code" / f"pkg{number % 20:02d}" / f"module_{number:04d}.py"
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(f"VALUE_{number} = {number}\n" * (1 + number % 7))
    (path / "tests").mkdir()
    (path / "tests" / "test_answer.py").write_text("def test_answer():\n    assert True\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "baseline")
    git(path, "gc", "-q")
    return git(path, "rev-parse", "HEAD")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--code", type=Path, default=REPO_ROOT, help="the checkout whose code is timed")
    options = parser.parse_args()
    temp = Path(tempfile.mkdtemp(prefix="crucible-bench-steps-"))
    os.environ["CRUCIBLE_DATA_DIR"] = str(temp / "data")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crucible.settings")
    sys.path.insert(0, str(options.code.resolve()))
    import django

    django.setup()
    import shutil

    from runtime_app import services, worktrees
    from runtime_app.policy import PolicyRules

    rules = PolicyRules(write_roots=("code",), protected_paths=("tests",))
    try:
        run(options, temp, services, worktrees, rules)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def run(options: argparse.Namespace, temp: Path, services, worktrees, rules) -> None:
    repo = temp / "repo"
    print(f"code from {Path(worktrees.__file__).parent.parent}; a repository of {options.files:,} files …",
          flush=True)
    commit = repo_make(repo, options.files)
    # No database: a receipt is built as in a step, then not written.
    services.receipt_record = lambda receipt, **_: receipt
    calls: Counter = Counter()
    lock = threading.Lock()
    real = worktrees.git_run

    def counting(args, **kwargs):
        kind = [args[0], *(arg for arg in args[1:2] if arg.startswith("-") or args[0] == "worktree")]
        with lock:
            calls[" ".join(kind)] += 1
        return real(args, **kwargs)

    # Every module-level binding of git_run (a `from runtime_app.worktrees import git_run` copy too).
    for module in list(sys.modules.values()):
        for name, value in list(getattr(module, "__dict__", {}).items()):
            if value is real:
                setattr(module, name, counting)

    def edit(worktree: Path) -> None:
        for number in (3, 1234 % options.files):
            file = worktree / "code" / f"pkg{number % 20:02d}" / f"module_{number:04d}.py"
            file.write_text(file.read_text() + f"FAST_{number} = True\n")

    source = worktrees.worktree_create(repo, commit, "source")
    edit(source)
    patch = worktrees.patch_extract(source).text
    worktrees.worktree_remove(repo, source)

    def evaluate(number: int) -> None:
        worktree, receipt = services.patch_admit(repo, commit, patch, f"eval-{number}", rules)
        assert worktree is not None, receipt.detail
        worktrees.worktree_remove(repo, worktree)

    def generate(number: int) -> None:
        worktree = worktrees.worktree_create(repo, commit, f"gen-{number}")
        edit(worktree)
        assert not worktrees.patch_extract(worktree).empty
        worktrees.worktree_remove(repo, worktree)

    for name, operation in (("evaluate", evaluate), ("generate", generate)):
        operation(-1)  # warm-up, untimed and uncounted
        calls.clear()
        before = cpu_seconds()
        timings = timed(operation, options.runs, options.parallel)
        cpu = (cpu_seconds() - before) * 1000 / options.runs
        per_step = {kind: count / options.runs for kind, count in sorted(calls.items())}
        print(f"{name}: median {statistics.median(timings):7.1f} ms  min {min(timings):7.1f}  "
              f"max {max(timings):7.1f}  ({options.runs} runs, {options.parallel} at once); "
              f"CPU {cpu:.1f} ms a step (this process and its git children)\n"
              f"  git processes per step: {sum(calls.values()) / options.runs:g}  {per_step}")


def cpu_seconds() -> float:
    """User and system CPU of this process and its finished children: less noisy than wall
    time on a busy machine."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(operation: Callable[[int], None], runs: int, parallel: int) -> list[float]:
    def one(number: int) -> float:
        started = time.perf_counter()
        operation(number)
        return (time.perf_counter() - started) * 1000

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        return list(pool.map(one, range(runs)))


if __name__ == "__main__":
    main()
