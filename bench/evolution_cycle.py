"""The evolution loop's own cost per cycle, excluding solving and the engine: a workspace with
200 skills and 10,000 memory lines against the demo seed, measured side by side in one run.

    .venv/bin/python bench/evolution_cycle.py [--cycles 12]

What it times: everything `Evolver.cycle` and the services do around the agent's and the
engine's work, per phase:

- **snapshot pre-evo-N**: the agent's buffered memories exported, then `workspace_snapshot`
  (stage every file with dulwich, commit, annotated tag);
- **enforce layers**: `Evolver._layers_enforce` (the working tree's changes against
  pre-evo-N, edits outside evolvable_layers put back);
- **changed paths**: `Evolver._changed_since` (does the cycle change anything: a mutation?);
- **snapshot evo-N**: `workspace_snapshot` again, after the engine;
- **layer_changes**: `EvolutionHistory.layer_changes(pre-evo-N, evo-N)` (skills added,
  modified, deleted, prompt size);
- **reload agent**: `BaseAgent.reload_from_fs` (prompt, skills' front matter, the last 20
  memories, tools);
- **record in DB**: `services.cycle_record` (the Cycle row, 12 observations, the event, the
  JSONL batch outside the history);
- **other**: the rest of the cycle (task sampling, the manifest read, bookkeeping).

Solving and the engine are timed too and left out of the overhead: the agent is a
`BaseAgent` whose `solve` returns a fixed Trajectory at once; the benchmark returns 12 tasks
and a fixed Feedback; the engine rewrites one skill's SKILL.md (a new line each cycle), as a
real engine's edit would.

How: a temp data dir with a fresh SQLite database; two workspaces imported with
`services.agent_import` (git init, evo-0) and given an evolution run each: **small** is a copy
of the demo seed (1 skill, empty memory), **big** is the same plus 200 skills of about 1 KB
(skills/skill-NNN/SKILL.md) and 10,000 lines in memory/episodic.jsonl (about 1.2 MB). Cycles
alternate small, big, small … so both see the same machine load; the first two cycles of each
are warm-up and not counted. Each phase is timed with time.perf_counter around the loop's own
functions (wrapped in this process; nothing in evolve_app is changed). It prints the median
of each phase per workspace and the ratio big/small of the median overhead.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from importlib.metadata import version
from pathlib import Path

from _search_setup import django_setup, operator_and_project

PHASES = ("snapshot pre-evo-N", "enforce layers", "changed paths", "snapshot evo-N", "layer_changes",
          "reload agent", "record in DB", "other")
SKILLS, MEMORY_LINES, BATCH, WARMUP = 200, 10_000, 12, 2


def big_workspace(seed: Path, target: Path) -> Path:
    shutil.copytree(seed, target, ignore=shutil.ignore_patterns("__pycache__"))
    step = "check the input, apply the rule, state the answer plainly"
    body = "\n".join(f"- step {n}: {step}." for n in range(12))
    for number in range(SKILLS):
        name = f"skill-{number:03d}"
        folder = target / "skills" / name
        folder.mkdir(parents=True)
        (folder / "SKILL.md").write_text(
            f"---\nname: {name}\ndescription: How to handle task family {number} without guessing.\n---\n"
            f"# Skill {number}\n\n{body}\n")
    with open(target / "memory" / "episodic.jsonl", "w") as handle:
        for number in range(MEMORY_LINES):
            entry = {"lesson": f"task {number}: read the question twice and answer with the number only",
                     "category": f"family-{number % 50}", "cycle": number // 100}
            handle.write(json.dumps(entry) + "\n")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=12, help="measured cycles per workspace (default 12)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    options = parser.parse_args()

    temp = Path(tempfile.mkdtemp(prefix="crucible-bench-evo-"))
    try:
        django_setup(temp / "data")
        run_bench(temp, options.cycles)
    finally:
        if options.keep:
            print(f"kept {temp}", file=sys.stderr)
        else:
            shutil.rmtree(temp, ignore_errors=True)


def run_bench(temp: Path, cycles: int) -> None:
    from evolve_app import loop, services
    from evolve_app.agents import BaseAgent
    from evolve_app.demo import SEED_WORKSPACE
    from evolve_app.engines import EvolutionEngine
    from evolve_app.history import EvolutionHistory
    from evolve_app.loop import EvolveConfig, Evolver
    from evolve_app.types import Feedback, StepResult, Task, Trajectory

    user, project = operator_and_project()
    times: dict[str, float] = defaultdict(float)  # the current cycle's phases

    def timed(phase, function):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                key = phase(*args, **kwargs) if callable(phase) else phase
                times[key] += time.perf_counter() - started
        return wrapper

    # The loop imports workspace_snapshot by name at its top: wrap the loop's own reference.
    loop.workspace_snapshot = timed(
        lambda path, tag, *a, **k: "snapshot pre-evo-N" if tag.startswith("pre-") else "snapshot evo-N",
        loop.workspace_snapshot)
    EvolutionHistory.layer_changes = timed("layer_changes", EvolutionHistory.layer_changes)
    loop.solve_batch = timed("solve", loop.solve_batch)

    class StubAgent(BaseAgent):
        def solve(self, task):
            return Trajectory(task.task_id, output="42", steps=[{"tool": "stub", "output": "42"}])

        def reload_from_fs(self):
            started = time.perf_counter()
            super().reload_from_fs()
            times["reload agent"] += time.perf_counter() - started

        def export_to_fs(self):  # it runs right before the pre-evo-N snapshot
            started = time.perf_counter()
            try:
                return super().export_to_fs()
            finally:
                times["snapshot pre-evo-N"] += time.perf_counter() - started

    class StubBenchmark:
        def get_tasks(self, split, limit):
            return [Task(f"{split}-{n:03d}", f"What is 6 × 7? (task {n})", category="stub")
                    for n in range(limit)]

        def evaluate(self, task, trajectory):
            success = int(task.task_id[-3:]) % 2 == 0  # half the batch fails, as in a real cycle
            return Feedback(success, 1.0 if success else 0.0, "fixed feedback")

    class OneSkillEngine(EvolutionEngine):
        def __init__(self):
            self.edits = 0

        def step(self, workspace, observations, history, trial):
            started = time.perf_counter()
            self.edits += 1
            name = "unit-conversions"
            workspace.write_skill(name, workspace.read_skill(name) + f"\nNote {self.edits}: check units.\n")
            times["engine"] += time.perf_counter() - started
            return StepResult(True, f"edited {name}")

    class TimedEvolver(Evolver):
        def _layers_enforce(self, number, allowed):
            started = time.perf_counter()
            try:
                return super()._layers_enforce(number, allowed)
            finally:
                times["enforce layers"] += time.perf_counter() - started

        def _changed_since(self, ref):
            started = time.perf_counter()
            try:
                return super()._changed_since(ref)
            finally:
                times["changed paths"] += time.perf_counter() - started

    small = temp / "small"
    shutil.copytree(SEED_WORKSPACE, small, ignore=shutil.ignore_patterns("__pycache__"))
    big = big_workspace(SEED_WORKSPACE, temp / "big")
    memory_bytes = (big / "memory" / "episodic.jsonl").stat().st_size
    files = {label: sum(1 for p in path.rglob("*") if p.is_file() and ".git" not in p.parts)
             for label, path in (("small", small), ("big", big))}
    setups = {}
    for label, path in (("small", small), ("big", big)):
        agent = services.agent_import(user, project, str(path), label, trusted=True)
        run = services.evolution_run_start(user, agent, cycles=WARMUP + cycles, enqueue=False)
        config = EvolveConfig(batch_size=BATCH, concurrency=4)
        evolver = TimedEvolver(StubAgent(path), StubBenchmark(), config, engine=OneSkillEngine())
        setups[label] = (run, evolver)
    print(f"workspaces: small {files['small']} files; big {files['big']} files "
          f"({SKILLS} more skills, memory/episodic.jsonl {MEMORY_LINES:,} lines, "
          f"{memory_bytes / 1e6:.1f} MB)")

    results: dict[str, list[dict[str, float]]] = {"small": [], "big": []}
    for number in range(1, WARMUP + cycles + 1):
        for label in ("small", "big"):
            run, evolver = setups[label]
            times.clear()
            started = time.perf_counter()
            result = evolver.cycle(number)
            recorded = time.perf_counter()
            services.cycle_record(run, result)
            ended = time.perf_counter()
            times["record in DB"] += ended - recorded
            assert result.status == "accepted" and result.mutated, (label, number, result.reason)
            assert result.skills_modified == ["unit-conversions"], result.skills_modified
            total = ended - started
            excluded = times["solve"] + times["engine"]
            measured = sum(times[phase] for phase in PHASES if phase != "other")
            sample = {phase: times[phase] for phase in PHASES}
            sample["other"] = total - excluded - measured
            sample["overhead"] = total - excluded
            sample["excluded"] = excluded
            if number > WARMUP:
                results[label].append(sample)

    def median(label: str, key: str) -> float:
        return statistics.median(sample[key] for sample in results[label]) * 1000

    print(f"\nper cycle, median of {cycles} cycles each (ms), after {WARMUP} warm-up cycles; "
          f"{BATCH} tasks a cycle")
    print(f"{'phase':<22}{'small':>10}{'big':>10}{'big/small':>11}")
    for key in (*PHASES, "overhead"):
        low, high = median("small", key), median("big", key)
        ratio = f"{high / low:.1f}x" if low > 0.05 else "—"
        label = "overhead (sum)" if key == "overhead" else key
        print(f"{label:<22}{low:>10.1f}{high:>10.1f}{ratio:>11}")
    excluded = median("small", "excluded"), median("big", "excluded")
    print(f"{'excluded: solve+engine':<22}{excluded[0]:>10.1f}{excluded[1]:>10.1f}")
    low, high = median("small", "overhead"), median("big", "overhead")
    spread = {label: f"min {min(s['overhead'] for s in results[label]) * 1000:.1f}, "
                     f"max {max(s['overhead'] for s in results[label]) * 1000:.1f}" for label in results}
    print(f"\ncycle overhead: small {low:.1f} ms ({spread['small']}), big {high:.1f} ms ({spread['big']}): "
          f"ratio big/small {high / low:.2f}x")
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, dulwich {version('dulwich')}, "
          f"SQLite, {sys.platform}")


if __name__ == "__main__":
    main()
