"""A-Evolve workspaces as they are ([6/8]): a big skill on the agent page, an oversized workspace
at import and in a cycle, and the ten shapes A-Evolve ships, measured side by side in one run.

    .venv/bin/python bench/a_evolve_workspaces.py [--requests 5] [--imports 5] [--cycle-runs 3]

What it measures, against what the issue saw before the size limits (a 100 MB SKILL.md imported
silently and returned in full by the agent page in 7.8 s; a cycle that took 34.5 s and 1.34 GB):

1. **The agent page with a big skill**: a GET of `/agents/<id>/?skill=<name>` through Django's
   test Client logged in as a superuser (routing, middleware, the view, git reads, the
   template), in this process, with no network; its server time and response size. Three pages:
   **small**, the demo seed's own skill (about 1 KB); **truncated**, a workspace whose
   `skills/big-skill/SKILL.md` is just under MAX_FILE_BYTES (the most an import now accepts),
   shown as shipped: its first PAGE_FILE_CHARS characters and a download link; **whole**, the
   same page with `workspace.PAGE_FILE_CHARS` raised in this process above the file's size,
   which is what the page did before (the whole file). Each page is requested once to warm up,
   then REQUESTS times in a rotating order; medians, response bytes and ratios.
2. **An oversized workspace.** Import: `services.agent_import` of a copy of the demo seed with
   a 300 MB sparse `data/weights.bin` (os.truncate: its size counts, no data is written), which
   is refused naming the limit, against importing the same folder without it (git init, commit,
   `evo-0`); IMPORTS of each, alternating, each on a fresh copy; medians. Cycle: the demo seed
   imported and given an evolution run, then one cycle (`Evolver.run(1)` with
   `services.cycle_record`) whose engine makes `skills/unit-conversions/blob.bin` with
   os.truncate: **300 MB** (sparse; the loop reverts it, over MAX_FILE_BYTES) or **1 KB** (kept
   and committed in `evo-1`). The agent is a `BaseAgent` answering at once and the benchmark 4
   fixed tasks, so the cycle is the loop's own work. Each cycle runs in a fresh subprocess of
   this script (`--scenario cycle-big|cycle-small`: its own temp data dir, SQLite database and
   workspace) that prints its wall time, its RSS at the cycle's start, the cycle's own peak
   (VmHWM, the high-water mark reset just before the cycle through `/proc/self/clear_refs`) and
   the process's peak (VmHWM before the reset or after the cycle, whichever is larger: Django's
   set-up and migrations included); CYCLE_RUNS of each, alternating; medians and ratios
   big/small. Not `getrusage(RUSAGE_SELF).ru_maxrss`: in a child it starts at the parent's RSS
   when it was forked (the kernel keeps the larger of the two across exec), and this process
   is about 150 MiB by then, which hides a child's 120 MiB; it is kept in the child's JSON
   (`ru_maxrss_mib`), and a run from a small parent showed it equal to VmHWM within 0.2 MiB.
3. **The ten A-Evolve shapes** (its eight seeds and two evolved artifacts), built as
   tests/evolve_app/test_a_evolve_shapes.py builds them (`shape_build`, `ALL`) under a repo
   root: each is imported (a folder without a manifest through `workspace_preview` and its
   inferred manifest confirmed as it is; the time includes the preview) and runs one cycle of
   the textbook engine on a 2-task JSONL benchmark (`evolution_run_start` then
   `evolution_run_execute` in this process), the agent's model being the loopback
   tests/fakes/anthropic_server.FakeAnthropic answering "42" in text (ANTHROPIC_BASE_URL, a fake
   ANTHROPIC_API_KEY, the server's agent model `anthropic:fake-sonnet`). One more copy of the
   arc seed is run first, untimed (the model client's first import and connection). Per shape:
   imported (with its own manifest or through the preview), the cycle's status, import ms, cycle
   ms; a shape counts when its cycle is not failed, both tasks' outputs are "42" and the model
   was called.

How: a temp data dir in the system temp dir with a fresh SQLite database (and one per
subprocess); the workspaces are made in it and removed at the end (unless `--keep`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _search_setup import REPO_ROOT, bench_temp, django_setup, operator_and_project

CONTROLLED = ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL", "CRUCIBLE_DATA_DIR",
              "CRUCIBLE_DEBUG", "CRUCIBLE_ALLOWED_HOSTS", "CRUCIBLE_REPO_ROOTS", "CRUCIBLE_AGENT_MODEL")
BIG_BYTES = 300 * 1000 * 1000  # the 300 MB binary
SMALL_BYTES = 1000
BLOB = "skills/unit-conversions/blob.bin"
FAKE_KEY = "sk-ant-bench-fake-a-evolve-0123"


def seed_copy(target: Path) -> Path:
    from evolve_app.demo import SEED_WORKSPACE

    shutil.copytree(SEED_WORKSPACE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def sparse(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    os.truncate(path, size)  # a hole: the size counts, nothing is written


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def status_mib(field: str) -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(f"{field}:")) / 1024


def peak_reset() -> bool:
    """Reset the process's high-water mark (VmHWM) to its current RSS, so the peak read after the
    cycle is the cycle's, not Django's set-up and migrations' (Linux >= 4.0). ru_maxrss keeps the
    larger of it and what exited threads saw, so the cycle's peak is read as VmHWM."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def median(values: list[float]) -> float:
    return statistics.median(values)


# ------------------------------------------------------------------------------ 1. the agent page


def big_skill(path: Path, size: int) -> None:
    head = ("---\nname: big-skill\ndescription: A skill grown very large by an engine.\n---\n\n"
            "# Big skill\n\n")
    line = "- step: check the input, apply the rule, state the answer plainly, no guessing.\n"
    body = line * ((size - len(head)) // len(line))
    text = head + body
    text += "x" * (size - len(text) - 1) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def agent_page(temp: Path, user, project, requests: int) -> None:
    from django.test import Client

    from evolve_app import services
    from evolve_app import workspace as workspace_module

    shipped = workspace_module.PAGE_FILE_CHARS
    size = workspace_module.MAX_FILE_BYTES - 4096
    small = seed_copy(temp / "page-small")
    big = seed_copy(temp / "page-big")
    big_skill(big / "skills" / "big-skill" / "SKILL.md", size)
    agents = {"small": services.agent_import(user, project, str(small), "page small", trusted=True),
              "big": services.agent_import(user, project, str(big), "page big", trusted=True)}
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    pages = {"small": ("small", "unit-conversions", shipped), "truncated": ("big", "big-skill", shipped),
             "whole": ("big", "big-skill", size + 1)}

    def get(mode: str) -> tuple[float, int]:
        which, skill, chars = pages[mode]
        workspace_module.PAGE_FILE_CHARS = chars
        url = f"/agents/{agents[which].pk}/?skill={skill}"
        try:
            begin = time.perf_counter()
            response = client.get(url)
            elapsed = (time.perf_counter() - begin) * 1000
        finally:
            workspace_module.PAGE_FILE_CHARS = shipped
        if response.status_code != 200:
            raise RuntimeError(f"GET {url} ({mode}): {response.status_code}")
        body = response.content
        if mode == "truncated":
            assert b"/file/?" in body or b"file/?ref" in body, "no download link on the truncated page"
        return elapsed, len(body)

    sizes = {mode: get(mode)[1] for mode in pages}  # warm-up
    times: dict[str, list[float]] = {mode: [] for mode in pages}
    order = list(pages)
    for turn in range(requests):
        for mode in order[turn % 3:] + order[:turn % 3]:
            times[mode].append(get(mode)[0])
    med = {mode: median(values) for mode, values in times.items()}
    print(f"\n1. Agent page /agents/<id>/?skill=<name>, server time per GET through the test Client, median "
          f"of {requests}; the big SKILL.md is {size:,} bytes "
          f"(MAX_FILE_BYTES {workspace_module.MAX_FILE_BYTES:,} - 4096), PAGE_FILE_CHARS {shipped:,}")
    print(f"{'page':<40} {'median ms':>10} {'min ms':>8} {'bytes':>12}")
    labels = {"small": "small skill (demo seed, baseline)", "truncated": "big skill, truncated (as shipped)",
              "whole": "big skill, whole (limit lifted: before)"}
    for mode in pages:
        print(f"{labels[mode]:<40} {med[mode]:>10.1f} {min(times[mode]):>8.1f} {sizes[mode]:>12,}")
    print(f"ratio whole/truncated: time {med['whole'] / med['truncated']:.1f}x, "
          f"bytes {sizes['whole'] / sizes['truncated']:.1f}x; truncated/small: time "
          f"{med['truncated'] / med['small']:.2f}x, bytes {sizes['truncated'] / sizes['small']:.1f}x")


# --------------------------------------------------------------------- 2. an oversized workspace


def import_refusal(temp: Path, user, project, imports: int) -> None:
    from django.core.exceptions import ValidationError

    from evolve_app import services

    folders = {"big": [], "small": []}
    for n in range(imports + 1):
        folders["small"].append(seed_copy(temp / f"import-small-{n}"))
        big = seed_copy(temp / f"import-big-{n}")
        sparse(big / "data" / "weights.bin", BIG_BYTES)
        folders["big"].append(big)
    times: dict[str, list[float]] = {"big": [], "small": []}
    message = ""
    for n in range(imports + 1):  # the first of each is warm-up
        for mode in (("big", "small") if n % 2 == 0 else ("small", "big")):
            folder = folders[mode][n]
            begin = time.perf_counter()
            try:
                services.agent_import(user, project, str(folder), f"import {mode} {n}", trusted=True)
                outcome = "imported"
            except ValidationError as error:
                outcome = "refused"
                message = "; ".join(error.message_dict["path"])
            elapsed = (time.perf_counter() - begin) * 1000
            assert outcome == ("refused" if mode == "big" else "imported"), (mode, outcome)
            if mode == "big":
                assert not (folder / ".git").exists(), "a refused import left a repository behind"
            if n:
                times[mode].append(elapsed)
    med = {mode: median(values) for mode, values in times.items()}
    print(f"\n2a. Import of the demo seed with a {BIG_BYTES / 1e6:.0f} MB sparse data/weights.bin (refused) "
          f"against the same folder without it (imported), median of {imports}, alternating")
    print(f"{'import':<40} {'median ms':>10} {'min ms':>8}  outcome")
    print(f"{'with the 300 MB file':<40} {med['big']:>10.1f} {min(times['big']):>8.1f}  refused")
    print(f"{'without it':<40} {med['small']:>10.1f} {min(times['small']):>8.1f}  imported, evo-0")
    print(f"ratio refused/imported: {med['big'] / med['small']:.2f}x")
    print(f"refusal: {message[:300]}")


def cycle_scenario(temp: Path, size: int) -> dict:
    """One cycle whose engine makes BLOB `size` bytes (sparse); run in a fresh subprocess."""
    from evolve_app import services
    from evolve_app.agents import BaseAgent
    from evolve_app.engines import EvolutionEngine
    from evolve_app.loop import EvolveConfig, Evolver
    from evolve_app.types import Feedback, StepResult, Task, Trajectory

    user, project = operator_and_project()

    class StubAgent(BaseAgent):
        def solve(self, task):
            return Trajectory(task.task_id, output="42", steps=[{"tool": "stub", "output": "42"}])

    class StubBenchmark:
        def get_tasks(self, split, limit):
            return [Task(f"{split}-{n:03d}", f"What is 6 x 7? (task {n})", category="stub")
                    for n in range(limit)]

        def evaluate(self, task, trajectory):
            return Feedback(True, 1.0, "fixed feedback")

    class BlobEngine(EvolutionEngine):
        def step(self, workspace, observations, history, trial):
            sparse(workspace.root / BLOB, size)
            return StepResult(True, f"wrote {BLOB} ({size:,} bytes)")

    folder = seed_copy(temp / "workspace")
    agent = services.agent_import(user, project, str(folder), "cycle", trusted=True)
    run = services.evolution_run_start(user, agent, cycles=1, enqueue=False)
    evolver = Evolver(StubAgent(folder), StubBenchmark(), EvolveConfig(batch_size=4, concurrency=2),
                      engine=BlobEngine(), on_cycle=lambda result: services.cycle_record(run, result))
    setup_peak = status_mib("VmHWM")
    reset = peak_reset()
    before = status_mib("VmRSS")
    begin = time.perf_counter()
    outcome = evolver.run(1)
    wall = time.perf_counter() - begin
    peak = status_mib("VmHWM")
    process_peak = maxrss_mib()
    result = outcome.cycles[0]
    kept = (folder / BLOB).exists()
    committed = b"blob.bin" in subprocess.run(["git", "-C", str(folder), "ls-tree", "-r", "--name-only",
                                               "evo-1"], capture_output=True, check=True).stdout
    return {"wall_ms": wall * 1000, "rss_before_mib": before, "rss_peak_mib": peak, "peak_reset": reset,
            "process_peak_mib": max(setup_peak, peak), "ru_maxrss_mib": process_peak, "status": result.status,
            "mutated": result.mutated, "reverted": result.reverted_paths, "reason": result.reason,
            "kept": kept, "committed": committed}


def cycle_runs(runs: int) -> None:
    script = Path(__file__).resolve()
    results: dict[str, list[dict]] = {"cycle-big": [], "cycle-small": []}
    for n in range(runs):
        for scenario in (("cycle-big", "cycle-small") if n % 2 == 0 else ("cycle-small", "cycle-big")):
            done = subprocess.run([sys.executable, str(script), "--scenario", scenario], capture_output=True,
                                  text=True, cwd=REPO_ROOT, timeout=300)
            if done.returncode != 0:
                raise RuntimeError(f"{scenario} failed:\n{done.stdout}\n{done.stderr}")
            results[scenario].append(json.loads(done.stdout.strip().splitlines()[-1]))
    big, small = results["cycle-big"], results["cycle-small"]
    for sample in big:
        assert sample["reverted"] == [BLOB] and not sample["kept"] and not sample["committed"], sample
    for sample in small:
        assert sample["status"] == "accepted" and sample["mutated"] and sample["committed"], sample

    def med(samples: list[dict], key: str) -> float:
        return median([sample[key] for sample in samples])

    print(f"\n2b. One cycle whose engine writes {BLOB} (sparse) against the same engine writing "
          f"{SMALL_BYTES:,} bytes; each cycle in a fresh process, median of {runs}, alternating")
    reset = all(sample["peak_reset"] for sample in big + small)
    peak = "cycle peak" if reset else "peak RSS"
    print(f"RSS in MiB: at the cycle's start; the peak during the cycle (VmHWM, the high-water mark "
          f"{'reset' if reset else 'NOT reset: includes set-up'} just before); the process's peak "
          "(VmHWM: Django's set-up and migrations included)")
    print(f"{'engine writes':<14} {'cycle ms':>9} {'min ms':>8} {'RSS start':>10} {peak:>11} "
          f"{'process':>8}  outcome")
    outcomes = (f"{big[0]['status']}, blob reverted, no mutation", f"{small[0]['status']}, blob in evo-1")
    for label, samples, outcome in ((f"{BIG_BYTES / 1e6:.0f} MB", big, outcomes[0]),
                                    (f"{SMALL_BYTES:,} bytes", small, outcomes[1])):
        print(f"{label:<14} {med(samples, 'wall_ms'):>9.1f} {min(s['wall_ms'] for s in samples):>8.1f} "
              f"{med(samples, 'rss_before_mib'):>10.1f} {med(samples, 'rss_peak_mib'):>11.1f} "
              f"{med(samples, 'process_peak_mib'):>8.1f}  {outcome}")
    growth = {label: med(samples, "rss_peak_mib") - med(samples, "rss_before_mib")
              for label, samples in (("big", big), ("small", small))}
    print(f"ratio 300 MB/small: cycle time {med(big, 'wall_ms') / med(small, 'wall_ms'):.2f}x, peak RSS "
          f"{med(big, 'rss_peak_mib') / med(small, 'rss_peak_mib'):.2f}x, process peak "
          f"{med(big, 'process_peak_mib') / med(small, 'process_peak_mib'):.2f}x (RSS growth during the "
          f"cycle: {growth['big']:.1f} vs {growth['small']:.1f} MiB); the issue saw 34.5 s and 1.34 GB")
    print(f"(ru_maxrss in the children, which starts at this process's RSS when forked: "
          f"{med(big, 'ru_maxrss_mib'):.1f} vs {med(small, 'ru_maxrss_mib'):.1f} MiB)")
    print(f"reason recorded: {big[0]['reason'][:200]}")


# ---------------------------------------------------------------------------- 3. the ten shapes


def shapes(temp: Path, user, project) -> None:
    from django.conf import settings

    from evolve_app import services
    from evolve_app.workspace import workspace_preview
    from tests.evolve_app.test_a_evolve_run import ANSWER, tasks_file
    from tests.evolve_app.test_a_evolve_shapes import ALL, shape_build
    from tests.fakes.anthropic_server import FakeAnthropic

    roots = temp / "roots"
    roots.mkdir()
    settings.CONFIG = dataclasses.replace(settings.CONFIG, repo_roots=[roots],
                                          agent_model="anthropic:fake-sonnet")
    os.environ["ANTHROPIC_API_KEY"] = FAKE_KEY
    tasks = tasks_file(roots)
    rows = []

    def one(parent: Path, name: str, fake: FakeAnthropic) -> tuple:
        folder = shape_build(parent, name)
        begin = time.perf_counter()
        try:
            preview = workspace_preview(folder)
            confirmed = None if preview.has_manifest else preview.manifest
            agent = services.agent_import(user, project, str(folder), manifest=confirmed)
        except Exception as error:  # reported in the table, not raised
            return (name, "no", f"{type(error).__name__}: {error}"[:60], 0.0, 0.0, False)
        import_ms = (time.perf_counter() - begin) * 1000
        requests = len(fake.requests)
        begin = time.perf_counter()
        try:
            run = services.evolution_run_start(user, agent, benchmark=f"jsonl:{tasks}", cycles=1,
                                               config={"batch_size": 2}, enqueue=False)
            run = services.evolution_run_execute(run.pk)
            cycle = run.cycles.get() if run.status == "finished" else None
            status = cycle.status if cycle else f"run {run.status}: {run.reason}"[:60]
            outputs = [o.agent_output for o in cycle.observations.all()] if cycle else []
            ran = cycle is not None and cycle.status != "failed" and outputs == [ANSWER, ANSWER]
        except Exception as error:
            status, ran = f"{type(error).__name__}: {error}"[:60], False
        cycle_ms = (time.perf_counter() - begin) * 1000
        ran = ran and len(fake.requests) > requests  # the agent reached the model
        kind = "manifest" if preview.has_manifest else "preview"
        return (name, f"yes ({kind})", status, import_ms, cycle_ms, ran)

    with FakeAnthropic(script=lambda request, candidate: [{"type": "text", "text": ANSWER}]) as fake:
        os.environ["ANTHROPIC_BASE_URL"] = fake.base_url
        (roots / "warm-up").mkdir()
        warm = one(roots / "warm-up", "arc", fake)  # the model client's first import and connection
        assert warm[5], warm
        for name in ALL:
            rows.append(one(roots, name, fake))
    print("\n3. The ten A-Evolve shapes (eight seeds, two artifacts): import, then one cycle (textbook "
          "engine, 2 tasks, the model a loopback fake answering in text), after one untimed warm-up shape")
    print(f"{'shape':<22} {'imported':<16} {'cycle':<12} {'import ms':>10} {'cycle ms':>10}")
    for name, imported, status, import_ms, cycle_ms, _ in rows:
        print(f"{name:<22} {imported:<16} {status:<12} {import_ms:>10.1f} {cycle_ms:>10.1f}")
    done = sum(1 for row in rows if row[1].startswith("yes") and row[5])
    print(f"{done} of {len(ALL)} imported and ran a cycle; median import "
          f"{median([r[3] for r in rows]):.1f} ms, median cycle {median([r[4] for r in rows]):.1f} ms")


# ------------------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5, help="GETs of each agent page (default 5)")
    parser.add_argument("--imports", type=int, default=5, help="imports of each folder (default 5)")
    parser.add_argument("--cycle-runs", type=int, default=3,
                        help="subprocesses per cycle scenario (default 3)")
    parser.add_argument("--scenario", choices=("cycle-big", "cycle-small"), help=argparse.SUPPRESS)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args()
    for name in CONTROLLED:
        os.environ.pop(name, None)
    with bench_temp(args.keep) as temp:
        django_setup(temp / "data")
        if args.scenario:
            size = BIG_BYTES if args.scenario == "cycle-big" else SMALL_BYTES
            print(json.dumps(cycle_scenario(temp, size)))
            return 0
        started = time.perf_counter()
        load = os.getloadavg()
        print(f"A-Evolve workspaces: {os.cpu_count()} cores, Python {platform.python_version()}, SQLite, "
              f"{sys.platform}; load average {load[0]:.1f} at the start")
        user, project = operator_and_project()
        agent_page(temp, user, project, args.requests)
        import_refusal(temp, user, project, args.imports)
        cycle_runs(args.cycle_runs)
        shapes(temp, user, project)
        print(f"\n{time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
