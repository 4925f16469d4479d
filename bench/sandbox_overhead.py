"""Sandbox overhead per command: `true` through runtime_app.sandbox.run against a minimal bubblewrap,
the bare loop's bubblewrap line, and the sandbox as it was before issue 33, measured side by side in
one run, with where each one's time goes.

    .venv/bin/python bench/sandbox_overhead.py [--runs 60] [--keep]

What it times, `--runs` times each, interleaved so every method sees the same machine load:

- **bwrap minimal**: `bwrap --ro-bind / / true` (no namespaces but the mount one, no mounts);
- **bare loop's bwrap**: the line bench/bare_loop.py runs each command with (`--ro-bind / /`, a
  writable tree, `--unshare-all`, a new session, no uid change, no rlimits, no cgroups);
- **before** / **before, fresh**: `sandbox.run` as it was at BEFORE_COMMIT (loaded from git
  history), for a writer's tree and for a gate's fresh overlay with a read-only path;
- **after** / **after, fresh**: today's `sandbox.run`, the same two ways;
- **after, command_run**: `services.command_run`, as the steps call it: the same run and its
  receipt written to the database (SQLite here);
- **rlimits-only**: today's `sandbox.run(isolation="off")`, for scale.

For before and after it splits each run's time into pieces, by wrapping the sandbox's own functions
with `time.perf_counter`: Python planning (mount plan, allow-list, path checks, environment),
cgroup creation, the processes from their start until the command is reaped (for after, with the
admission at bubblewrap's block fd counted apart), cgroup removal, and the rest of `run` (the
receipt, secrets, output capture, the lane). With `strace` installed it also counts, once per
method outside the timing, the programs each run executes and the processes it forks.

It prints median, p90 and min per method, the ratios of the medians to both bubblewrap baselines,
and each piece's median before and after.
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib.util
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _search_setup import bench_temp
from _search_setup import django_setup as django_migrated

REPO_ROOT = Path(__file__).resolve().parent.parent
BEFORE_COMMIT = "810f58b"  # runtime_app/sandbox.py before issue 33's per-command work


def before_sandbox():
    """The sandbox module as it was at BEFORE_COMMIT, or None where the history is missing."""
    done = subprocess.run(["git", "show", f"{BEFORE_COMMIT}:runtime_app/sandbox.py"], cwd=REPO_ROOT,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return None
    spec = importlib.util.spec_from_loader("before_sandbox", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules["before_sandbox"] = module  # its dataclasses look their module up
    exec(compile(done.stdout, "before_sandbox.py", "exec"), module.__dict__)  # noqa: S102
    return module


def django_setup(data_dir: Path) -> None:
    os.environ["CRUCIBLE_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crucible.settings")
    sys.path.insert(0, str(REPO_ROOT))
    import django

    django.setup()


def bare_loop_line(tree: Path) -> list[str]:
    """bench/bare_loop.py's bubblewrap line for a writer's command (BareLoop._sandboxed)."""
    return ["bwrap", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--bind", str(tree), str(tree), "--chdir", str(tree), "--unshare-all", "--cap-drop", "ALL",
            "--new-session", "--die-with-parent", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "true"]


class Pieces:
    """Per-run time of a sandbox module's pieces, by wrapping its functions."""

    NAMES = {"_plan": "planning (Python)", "_cgroups_open": "cgroups made",
             "_admit": "admission at block fd", "_wait": "processes, start to reaped",
             "remove": "cgroups removed"}

    def __init__(self, module) -> None:
        self.current: dict[str, float] = collections.defaultdict(float)
        self.runs: list[dict[str, float]] = []
        for name in ("_plan", "_cgroups_open", "_admit", "_wait"):
            if hasattr(module, name):
                setattr(module, name, self._wrapped(getattr(module, name), self.NAMES[name]))
        module._RunCgroups.remove = self._wrapped(module._RunCgroups.remove, self.NAMES["remove"])
        popen = module.subprocess.Popen

        def timed_popen(*args, **kwargs):  # the start of the run's processes belongs with them
            started = time.perf_counter()
            try:
                return popen(*args, **kwargs)
            finally:
                self.current[self.NAMES["_wait"]] += time.perf_counter() - started

        self.module = module
        self.popen = popen
        self.timed_popen = timed_popen

    def _wrapped(self, function, label: str):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.current[label] += time.perf_counter() - started
        return timed

    def call(self, method) -> None:
        self.current = collections.defaultdict(float)
        self.module.subprocess.Popen = self.timed_popen
        started = time.perf_counter()
        try:
            method()
        finally:
            self.module.subprocess.Popen = self.popen
        total = time.perf_counter() - started
        self.current["rest of run (receipt, capture, lane)"] = total - sum(self.current.values())
        self.runs.append(dict(self.current))


def processes_started(tree: Path, data_dir: Path, which: str, fresh: bool) -> tuple[int, int] | None:
    """(programs executed, processes forked) by one run, counted with strace in a child process:
    one file per process (-ff), so no call is split, and only calls between the two marks."""
    if not shutil.which("strace"):
        return None
    folder = data_dir / f"strace-{which}-{fresh}"
    folder.mkdir(exist_ok=True)
    code = (f"import sys; sys.argv = ['x', '--one', {which!r}, {str(tree)!r}, {str(fresh)!r}]; "
            f"sys.path.insert(0, {str(Path(__file__).parent)!r}); import sandbox_overhead as b; b.one()")
    subprocess.run(["strace", "-ff", "-ttt", "-qq", "-o", str(folder / "t"), "-e",
                    "trace=execve,clone,clone3,fork,vfork,write", sys.executable, "-c", code], cwd=REPO_ROOT,
                   capture_output=True, check=False, env={**os.environ, "CRUCIBLE_DATA_DIR": str(data_dir)})
    lines = [line for path in folder.iterdir() for line in path.read_text(errors="replace").splitlines()]
    marks = sorted(float(line.split()[0]) for line in lines if 'write(2, "MARK' in line)
    if len(marks) < 2:
        return None
    window = [line for line in lines if marks[0] < float(line.split()[0]) < marks[1]]
    execs = sum(1 for line in window if " execve(" in line and line.endswith("= 0"))
    forks = sum(1 for line in window if re.search(r" (?:clone3?|v?fork)\(", line)
                and "CLONE_THREAD" not in line and re.search(r"= [1-9]\d*$", line))
    return execs, forks


def one() -> None:
    """Child of processes_started: one warm run, then the counted one between two marks."""
    which, tree, fresh = sys.argv[2], Path(sys.argv[3]), sys.argv[4] == "True"
    django_setup(Path(os.environ["CRUCIBLE_DATA_DIR"]))
    module = before_sandbox() if which == "before" else __import__("runtime_app.sandbox").sandbox
    kwargs = {"fresh": True, "read_only": ["tests"]} if fresh else {}
    module.run(["true"], cwd=tree, timeout=30, isolation="required", **kwargs)
    os.write(2, b"MARK\n")
    module.run(["true"], cwd=tree, timeout=30, isolation="required", **kwargs)
    os.write(2, b"MARK\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    with bench_temp(args.keep) as temp:
        root = Path(temp)
        django_migrated(root / "data")  # command_run writes its receipt
        from runtime_app import sandbox, services

        tree = root / "data" / "worktrees" / "bench"
        (tree / "tests").mkdir(parents=True)
        (tree / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")
        available, reason = sandbox.bubblewrap_probe()
        if not available:
            print(f"bubblewrap cannot start here: {reason}")
            return
        before = before_sandbox()
        after_pieces = Pieces(sandbox)
        before_pieces = Pieces(before) if before is not None else None
        fresh = {"fresh": True, "read_only": ["tests"]}
        methods = {
            "bwrap minimal": lambda: subprocess.run(["bwrap", "--ro-bind", "/", "/", "true"], check=True),
            "bare loop's bwrap": lambda: subprocess.run(bare_loop_line(tree), check=True),
            "after": lambda: after_pieces.call(
                lambda: sandbox.run(["true"], cwd=tree, timeout=30, isolation="required")),
            "after, fresh": lambda: sandbox.run(["true"], cwd=tree, timeout=30, isolation="required",
                                                **fresh),
            "after, command_run": lambda: services.command_run(["true"], cwd=tree, timeout=30,
                                                               isolation="required"),
            "rlimits-only": lambda: sandbox.run(["true"], cwd=tree, timeout=30, isolation="off"),
        }
        if before is not None:
            methods["before"] = lambda: before_pieces.call(
                lambda: before.run(["true"], cwd=tree, timeout=30, isolation="required"))
            methods["before, fresh"] = lambda: before.run(["true"], cwd=tree, timeout=30,
                                                          isolation="required", **fresh)
        for method in methods.values():  # warm-up: imports, probes, the stager, page cache
            method()
            method()
        for pieces in (after_pieces, before_pieces):
            if pieces is not None:
                pieces.runs.clear()
        times: dict[str, list[float]] = {name: [] for name in methods}
        for _ in range(args.runs):
            for name, method in methods.items():
                started = time.perf_counter()
                method()
                times[name].append(time.perf_counter() - started)
        cgroup = ", ".join(sorted(sandbox.cgroup_parents())) or "no cgroups"
        stager = "a stager" if isinstance(sandbox._stagers.get(os.getpid()), sandbox._Stager) else "no stager"
        print(f"{args.runs} runs of `true` each, interleaved; Python {platform.python_version()}, "
              f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, uid {os.geteuid()}, "
              f"cgroups: {cgroup}, {stager}")
        medians = {name: statistics.median(values) for name, values in times.items()}
        floor, line = medians["bwrap minimal"], medians["bare loop's bwrap"]
        for name, values in times.items():
            values.sort()
            p90 = values[int(len(values) * 0.9) - 1]
            print(f"{name:>18}: median {medians[name] * 1000:6.2f} ms  p90 {p90 * 1000:6.2f} ms  "
                  f"min {values[0] * 1000:6.2f} ms  = {medians[name] / floor:4.2f}x bwrap minimal, "
                  f"{medians[name] / line:4.2f}x the bare loop's bwrap")
        if before is not None:
            print(f"after / before: {medians['after'] / medians['before']:.2f}x (writer's tree), "
                  f"{medians['after, fresh'] / medians['before, fresh']:.2f}x (fresh overlay)")
        print("pieces of one run of `true` (medians, ms; a writer's tree):")
        labels = list(dict.fromkeys([*Pieces.NAMES.values(), "rest of run (receipt, capture, lane)"]))
        print(f"  {'piece':<40} {'before':>8} {'after':>8}")
        for label in labels:
            cells = []
            for pieces in (before_pieces, after_pieces):
                values = [run.get(label, 0.0) for run in (pieces.runs if pieces else [])]
                shown = f"{statistics.median(values) * 1000:8.2f}" if values and any(values) else f"{'-':>8}"
                cells.append(shown)
            print(f"  {label:<40} {cells[0]} {cells[1]}")
        for fresh_run in (False, True):
            counts = {which: processes_started(tree, root / "data", which, fresh_run)
                      for which in (("before", "after") if before is not None else ("after",))}
            shown = "; ".join(f"{which}: {count[0]} programs executed, {count[1]} processes forked"
                              for which, count in counts.items() if count)
            kind = "fresh overlay" if fresh_run else "writer tree"
            if shown:
                print(f"processes per run ({kind}, strace): {shown}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        one()
    else:
        main()
