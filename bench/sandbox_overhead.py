"""Sandbox overhead: `true` run through runtime_app.sandbox.run against a bare subprocess.run,
measured side by side in one run.

    .venv/bin/python bench/sandbox_overhead.py

What it times, RUNS times each, interleaved so every method sees the same machine load:

- **bare**: `subprocess.run(["true"])`;
- **rlimits-only**: `sandbox.run(["true"], isolation="off")`: a new session, prlimit, a pids
  cgroup where the host allows one, the allow-listed environment, output capture and a
  receipt (not saved);
- **bubblewrap**: `sandbox.run(["true"], isolation="required")`: all of that inside
  bubblewrap (skipped with a note when bubblewrap cannot start).

It prints the median, p90 and min of each, and each median's ratio to bare.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RUNS = 100


def django_setup(data_dir: Path) -> None:
    os.environ["CRUCIBLE_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crucible.settings")
    sys.path.insert(0, str(REPO_ROOT))
    import django

    django.setup()


def main() -> None:
    (REPO_ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="crucible-bench-", dir=REPO_ROOT / "var") as temp:
        root = Path(temp)
        django_setup(root / "data")
        from runtime_app import sandbox

        tree = root / "data" / "worktrees" / "bench"
        tree.mkdir(parents=True)
        methods = {
            "bare": lambda: subprocess.run(["true"], cwd=tree, check=True),
            "rlimits-only": lambda: sandbox.run(["true"], cwd=tree, timeout=30, isolation="off"),
        }
        available, reason = sandbox.bubblewrap_probe()
        if available:
            methods["bubblewrap"] = lambda: sandbox.run(["true"], cwd=tree, timeout=30, isolation="required")
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
        cgroup = "a pids cgroup per run" if sandbox.pids_cgroup_parent() else "no pids cgroup"
        print(f"{RUNS} runs of `true` each, {platform.python_version()}, {os.cpu_count()} cores, {cgroup}")
        bare = statistics.median(times["bare"])
        for name, values in times.items():
            values.sort()
            median = statistics.median(values)
            p90 = values[int(len(values) * 0.9) - 1]
            print(f"{name:>13}: median {median * 1000:7.2f} ms  p90 {p90 * 1000:7.2f} ms  "
                  f"min {values[0] * 1000:7.2f} ms  ratio to bare {median / bare:5.1f}x")


if __name__ == "__main__":
    main()
