"""Orchestration overhead and scale of a search, measured in one run.

    .venv/bin/python bench/search_orchestration.py [--population-scale 1000]

1. **Overhead:** a population-32 search (rounds 32 → 8 → 3 → 1, 16 live steps) whose writer,
   gate and score commands each sleep 0.2 s. Ideal wall time = the sum of every command's
   duration (from its receipt) / 16. It prints wall / ideal and the fixed cost per step:
   the step's time minus its commands' time (worktree, patch extract or apply, the change
   policy, hidden files, receipts and the database).
2. **Scale:** a population-1000 search (1000 → 100 → 10 → 1) with trivial commands, while a
   Daphne server on the same database answers `GET /api/searches/{id}/run` every 2 s. It
   prints the wall time, the peak RSS of the process running the steps and of the web
   server, and the database's size.

Both run the steps in this process with `search_run_inline` (a thread per live step), under
the sandbox the setting chooses (bubblewrap here when it can start).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _search_setup import REPO_ROOT, django_setup, freeze_and_run, operator_and_project

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "Bench", "GIT_AUTHOR_EMAIL": "bench@crucible.invalid",
           "GIT_COMMITTER_NAME": "Bench", "GIT_COMMITTER_EMAIL": "bench@crucible.invalid",
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def make_repo(path: Path) -> Path:
    (path / "code").mkdir(parents=True)
    (path / "code" / "id.txt").write_text("baseline\n")
    (path / "README").write_text("bench\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "baseline"]):
        subprocess.run(["git", *args], cwd=path, env=GIT_ENV, check=True)
    return path


def spec(name: str, population: int, rounds: list[int], sleep: float, trials: int) -> str:
    pause = f"sleep {sleep}; " if sleep else ""
    score = pause + "printf '{\\\"v\\\": %s}\\n' $(cksum < code/id.txt | cut -d' ' -f1)"
    return f'''name = "{name}"
objective = "bench"
population = {population}
rounds = {rounds}
concurrency = 16

[worker]
provider = "command"
command = "{pause}echo $CRUCIBLE_CANDIDATE_ID > code/id.txt"
write_roots = ["code"]

[hard_gates]
commands = ["{pause or 'true'}"]

[score]
command = "{score}"
metric = "v"
direction = "maximize"
trials = {trials}
'''


def overhead(user, project, repo: Path) -> None:
    from runtime_app.models import Receipt

    started = time.perf_counter()
    search, run = freeze_and_run(user, project, spec("overhead", 32, [32, 8, 3, 1], 0.2, 3), repo)
    wall = time.perf_counter() - started
    command_seconds = 0.0
    fixed: dict[str, list[float]] = {"generate": [], "evaluate": [], "replay": [], "review": []}
    for step in search.steps.all():
        receipts = Receipt.objects.filter(pk__in=step.result.get("receipts", []))
        commands = sum(r.duration_seconds for r in receipts if r.kind in ("command", "review"))
        command_seconds += commands
        fixed[step.kind].append((step.finished_at - step.started_at).total_seconds() - commands)
    ideal = command_seconds / 16
    print(f"overhead: population 32, {search.steps.count()} steps, outcome {run.outcome}")
    print(f"  wall {wall:.1f} s, ideal {ideal:.1f} s (commands {command_seconds:.1f} s / 16): "
          f"ratio {wall / ideal:.2f}x")
    for kind, values in fixed.items():
        if values:
            print(f"  fixed cost per {kind} step: median {statistics.median(values) * 1000:.0f} ms "
                  f"(max {max(values) * 1000:.0f} ms, {len(values)} steps)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def scale(user, project, repo: Path, population: int, data_dir: Path) -> None:
    import threading

    from django.conf import settings

    from runtime_app.services import api_token_create
    from search_app import services
    from search_app.models import SearchRun

    _, token = api_token_create(user, "bench")
    port = free_port()
    web = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                            "crucible.asgi:application"], cwd=REPO_ROOT, env={**os.environ},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rounds = [population, max(population // 10, 2), 2, 1] if population >= 40 else [population, 1]
    text = spec(f"scale-{population}", population, rounds, 0, 1)
    search = services.search_freeze(user, project, text, "HEAD", repository_path=str(repo))
    services.search_start(user, search, enqueue=False)
    polls, failures = [0], [0]
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(2):
            request = urllib.request.Request(f"http://127.0.0.1:{port}/api/searches/{search.search_id}/run",
                                             headers={"Authorization": f"Bearer {token}"})
            try:
                with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310  (http://127.0.0.1)
                    json.load(response)
                polls[0] += 1
            except OSError:
                failures[0] += 1

    poller = threading.Thread(target=poll, daemon=True)
    started = time.perf_counter()
    poller.start()
    try:
        run = services.search_run_inline(search)
        wall = time.perf_counter() - started
        stop.set()
        poller.join()
        web_peak = peak_rss_mib(web.pid)
    finally:
        web.terminate()
        web.wait(20)
    database = Path(settings.DATABASES["default"]["NAME"])
    size = sum(p.stat().st_size for p in database.parent.glob(database.name + "*"))
    worker_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert SearchRun.objects.get(search=search).terminal
    print(f"scale: population {population}, rounds {rounds}, {search.steps.count()} steps, "
          f"outcome {run.outcome}")
    print(f"  wall {wall:.1f} s ({wall / population * 1000:.0f} ms per candidate with 16 live steps)")
    print(f"  peak RSS: steps process {worker_peak:.0f} MiB, web server {web_peak:.0f} MiB "
          f"({polls[0]} run reports served, {failures[0]} failed)")
    print(f"  database {size / 1e6:.1f} MB (SQLite with its WAL), data dir {data_dir}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--population-scale", type=int, default=1000)
    parser.add_argument("--skip-overhead", action="store_true")
    args = parser.parse_args()
    (REPO_ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="crucible-bench-search-", dir=REPO_ROOT / "var") as temp:
        data_dir = Path(temp) / "data"
        django_setup(data_dir)
        os.environ["CRUCIBLE_DATA_DIR"] = str(data_dir)  # for the web server
        user, project = operator_and_project()
        repo = make_repo(Path(temp) / "repo")
        if not args.skip_overhead:
            overhead(user, project, repo)
        scale(user, project, repo, args.population_scale, data_dir)


if __name__ == "__main__":
    main()
