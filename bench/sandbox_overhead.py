"""Sandbox overhead: `true` run through runtime_app.sandbox.run against a bare subprocess.run,
and the allow-list sandbox against the previous one (`--ro-bind / /`), measured side by side in
one run.

    .venv/bin/python bench/sandbox_overhead.py

What it times, RUNS times each, interleaved so every method sees the same machine load:

- **bare**: `subprocess.run(["true"])`;
- **rlimits-only**: `sandbox.run(["true"], isolation="off")`: a new session, prlimit, cgroups
  where the host allows them, the allow-listed environment, output capture and a receipt;
- **old bubblewrap**: the previous sandbox (`runtime_app/sandbox.py` at OLD_COMMIT, loaded
  from git history): bubblewrap over `--ro-bind / /` with the hidden places covered, as root;
- **allow-list**: today's `sandbox.run(["true"], isolation="required")`: an unprivileged uid,
  only the tree, the toolchain, a sized private /tmp and /dev/shm (sources the uid cannot reach
  are staged, by one `mount -a`), accounting and memory-capped cgroups;
- **allow-list + fresh tree**: the same with `fresh=True` and a read-only path, as every gate
  and trial runs: a throwaway overlay of the pristine tree per command, its writes on a sized
  tmpfs.

It prints the median, p90 and min of each, each median's ratio to bare, and the new modes'
ratios to the old bubblewrap (the goal: under 2x).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _search_setup import bench_temp, keep_requested

REPO_ROOT = Path(__file__).resolve().parent.parent
RUNS = 100
OLD_COMMIT = "e40d206"  # the last commit with the `--ro-bind / /` sandbox


def old_sandbox():
    """The previous sandbox module, from git history, or None where the history is missing."""
    done = subprocess.run(["git", "show", f"{OLD_COMMIT}:runtime_app/sandbox.py"], cwd=REPO_ROOT,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return None
    spec = importlib.util.spec_from_loader("old_sandbox", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_sandbox"] = module  # its dataclasses look their module up
    exec(compile(done.stdout, "old_sandbox.py", "exec"), module.__dict__)  # noqa: S102
    return module


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
        from runtime_app import sandbox

        tree = root / "data" / "worktrees" / "bench"
        (tree / "tests").mkdir(parents=True)
        (tree / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")
        methods = {
            "bare": lambda: subprocess.run(["true"], cwd=tree, check=True),
            "rlimits-only": lambda: sandbox.run(["true"], cwd=tree, timeout=30, isolation="off"),
        }
        available, reason = sandbox.bubblewrap_probe()
        old = old_sandbox()
        if available:
            if old is not None:
                methods["old bubblewrap"] = lambda: old.run(["true"], cwd=tree, timeout=30,
                                                            isolation="required")
            methods["allow-list"] = lambda: sandbox.run(["true"], cwd=tree, timeout=30, isolation="required")
            methods["allow-list + fresh tree"] = lambda: sandbox.run(
                ["true"], cwd=tree, timeout=30, isolation="required", fresh=True, read_only=["tests"])
        else:
            print(f"bubblewrap skipped: {reason}")
        for method in methods.values():  # warm-up: imports, probes, page cache
            method()
        times: dict[str, list[float]] = {name: [] for name in methods}
        for _ in range(RUNS):
            for name, method in methods.items():
                started = time.perf_counter()
                method()
                times[name].append(time.perf_counter() - started)
        cgroup = "cgroups per run" if sandbox.pids_cgroup_parent() else "no cgroups"
        print(f"{RUNS} runs of `true` each, {platform.python_version()}, {os.cpu_count()} cores, {cgroup}")
        bare = statistics.median(times["bare"])
        for name, values in times.items():
            values.sort()
            median = statistics.median(values)
            p90 = values[int(len(values) * 0.9) - 1]
            versus = ""
            if "old bubblewrap" in times and name.startswith("allow-list"):
                old_median = statistics.median(times["old bubblewrap"])
                versus = f"  ratio to old bubblewrap {median / old_median:4.2f}x"
            print(f"{name:>23}: median {median * 1000:7.2f} ms  p90 {p90 * 1000:7.2f} ms  "
                  f"min {values[0] * 1000:7.2f} ms  ratio to bare {median / bare:5.1f}x{versus}")


if __name__ == "__main__":
    main()
