"""An A-Evolve script under Crucible (`import crucible.aevolve as ae`) against the same script under
A-Evolve 0.1.0 (`import agent_evolve as ae`): wall time and peak memory, side by side in one run.

    .venv/bin/python bench/aevolve_dropin.py [--runs 2] [--seed terminal] [--cycles 5] [--batch 5]

The script is A-Evolve's quick-start shape (tests/evolve_app/test_dropin_script.py): a user's
`BaseAgent` over a copy of one of A-Evolve's seed workspaces (`seed_workspaces/<seed>` of the
installed wheel), answering each task with one call of the real Anthropic SDK; a user's
`BenchmarkAdapter` of `--batch` "6 x 7" tasks judged on "42"; `EvolveConfig(batch_size=--batch,
max_cycles=--cycles, holdout_ratio=0, egl_window=cycles, evolver_model="claude-sonnet-4-5")`;
A-Evolve's SkillForge engine `AEvolveEngine(config, llm=SdkLLM())` (A-Evolve: as it is, the model
through the user's SDK provider, since 0.1.0's own AnthropicProvider sends a `temperature` this
SDK refuses; Crucible: as `aevolve-skillforge`, its config kept, the model through the `anthropic`
fleet preset with receipts, its bash in the sandbox); `run(cycles=--cycles)`. The two script
files differ in their import line only.

The model is tests/fakes/anthropic_server.FakeAnthropic, started once here (ANTHROPIC_BASE_URL, a
fake key): the agent's calls are answered "42", the evolver's with a short text (A-Evolve 0.1.0's
SkillForge offers its bash tool only to a Bedrock model, so neither side runs a command: both do
the same work). Scores are flat, and egl_window = cycles keeps both convergence rules from
stopping early, so both sides run every cycle.

Each side runs in its own subprocess, alternating, `--runs` times; medians. Wall time: measured
here around the subprocess (interpreter start, imports, Django set-up, the run); in-script time:
from the script's first line to its end. Peak memory: the script process's own VmHWM
(/proc/self/status) at its end. Not getrusage's ru_maxrss: a child's starts at its parent's RSS
at fork (bench/a_evolve_workspaces.py), and RUSAGE_CHILDREN of git or bwrap children only says
that again. Crucible's data dir is made and migrated before the timing (`manage.py migrate`, once
per run), as `make setup` leaves it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakes.anthropic_server import FakeAnthropic  # noqa: E402

SCRIPT = '''\
import json
import time

started = time.perf_counter()
import anthropic
import agent_evolve as ae
from agent_evolve.algorithms.skillforge.engine import AEvolveEngine
from agent_evolve.llm.base import LLMProvider, LLMResponse


class SdkLLM(LLMProvider):
    """The evolver's model through the SDK (A-Evolve 0.1.0's AnthropicProvider sends `temperature`,
    which this SDK's messages.create refuses)."""

    def complete(self, messages, max_tokens=4096, temperature=0.0, **kwargs):
        system = "\\n\\n".join(m.content for m in messages if m.role == "system")
        rest = [{{"role": m.role, "content": m.content}} for m in messages if m.role != "system"]
        reply = anthropic.Anthropic().messages.create(model="claude-sonnet-4-5", max_tokens=max_tokens,
                                                      system=system, messages=rest)
        return LLMResponse(content=reply.content[0].text)

    def complete_with_tools(self, messages, tools, max_tokens=4096, **kwargs):
        return self.complete(messages, max_tokens)


class MyAgent(ae.BaseAgent):
    def solve(self, task):
        reply = anthropic.Anthropic().messages.create(
            model="claude-sonnet-4-5", max_tokens=64, system=self.system_prompt,
            messages=[{{"role": "user", "content": task.input}}])
        return ae.Trajectory(task_id=task.id, output=reply.content[0].text)


class MyBench(ae.BenchmarkAdapter):
    def get_tasks(self, split="train", limit=10):
        return [ae.Task(id=f"{{split}}-{{n}}", input=f"What is 6 x 7? ({{n}})") for n in range(limit)]

    def evaluate(self, task, trajectory):
        right = trajectory.output.strip() == "42"
        return ae.Feedback(success=right, score=float(right), detail="the answer is 42")


config = ae.EvolveConfig(batch_size={batch}, max_cycles={cycles}, holdout_ratio=0, egl_window={cycles},
                         evolver_model="claude-sonnet-4-5")
evolver = ae.Evolver(
    agent=MyAgent("{workspace}"),
    benchmark=MyBench(),
    config=config,
    engine=AEvolveEngine(config, llm=SdkLLM()),
)
result = evolver.run(cycles={cycles})
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({{"seconds": time.perf_counter() - started, "peak_kib": hwm,
                  "cycles": result.cycles_completed, "scores": result.score_history,
                  "run": result.details.get("run_id")}}))
'''


def model(request: dict, _candidate: str) -> list[dict]:
    """The agent (no tools) answers 42; the evolver (A-Evolve's prompt) answers with a short text."""
    if request.get("tools") or "workspace" in json.dumps(request.get("system", "")).lower():
        return [{"type": "text", "text": "The agent solves every task: nothing to change."}]
    return [{"type": "text", "text": "42"}]


def one(side: str, tmp: Path, seed: Path, args: argparse.Namespace, base_url: str, number: int) -> dict:
    folder = tmp / f"{side}-{number}"
    workspace = folder / "workspace"
    shutil.copytree(seed, workspace, ignore=shutil.ignore_patterns("__pycache__"))
    data = folder / "data"
    env = {**os.environ, "ANTHROPIC_API_KEY": "sk-ant-bench-fake", "ANTHROPIC_BASE_URL": base_url,
           "PYTHONPATH": str(ROOT), "CRUCIBLE_DATA_DIR": str(data),
           "DJANGO_SETTINGS_MODULE": "crucible.settings"}
    env.pop("DATABASE_URL", None)
    if side == "crucible":
        subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v", "0"], env=env, check=True)
    text = SCRIPT.format(workspace=workspace, batch=args.batch, cycles=args.cycles)
    if side == "crucible":
        text = text.replace("import agent_evolve as ae\n", "import crucible.aevolve as ae\n")
    script = folder / "evolve.py"
    script.write_text(text)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(script)], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=1800)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{side} failed:\n{done.stderr[-4000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return {**figures, "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--seed", default="terminal")
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    import agent_evolve

    seed = Path(agent_evolve.__file__).resolve().parent.parent / "seed_workspaces" / args.seed
    if not seed.is_dir():
        raise SystemExit(f"no seed {args.seed!r} in the installed a-evolve package")
    tmp = Path(tempfile.mkdtemp(prefix="aevolve-dropin-"))
    results: dict[str, list[dict]] = {"a-evolve": [], "crucible": []}
    try:
        with FakeAnthropic(script=model) as fake:
            for number in range(args.runs):
                order = ("a-evolve", "crucible") if number % 2 == 0 else ("crucible", "a-evolve")
                for side in order:
                    figures = one(side, tmp, seed, args, fake.base_url, number)
                    results[side].append(figures)
                    print(f"run {number + 1} {side:9}: wall {figures['wall']:.2f} s, in-script "
                          f"{figures['seconds']:.2f} s, peak {figures['peak_kib'] / 1024:.0f} MiB, cycles "
                          f"{figures['cycles']}, scores {figures['scores']}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    def median(side: str, key: str) -> float:
        return statistics.median(r[key] for r in results[side])

    print(f"\nseed {args.seed}, {args.cycles} cycles of {args.batch} tasks, fake model, {args.runs} run(s) "
          f"a side (medians); python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print("| figure | A-Evolve 0.1.0 | Crucible (crucible.aevolve) | Crucible ÷ A-Evolve (of medians) "
          "| median of the runs' own ratios |")
    print("|---|---|---|---|---|")
    for key, label, unit, scale in (("wall", "wall time", "s", 1.0), ("seconds", "in-script time", "s", 1.0),
                                    ("peak_kib", "peak memory (VmHWM)", "MiB", 1 / 1024)):
        a, c = median("a-evolve", key), median("crucible", key)
        # Each run's pair ran back to back: its ratio is less exposed to a shared machine's load.
        paired = statistics.median(mine[key] / theirs[key] for mine, theirs
                                   in zip(results["crucible"], results["a-evolve"], strict=True))
        ratio = f"{c / a:.2f}" if a else "—"
        print(f"| {label} | {a * scale:.2f} {unit} | {c * scale:.2f} {unit} | {ratio} | {paired:.2f} |")
    print(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
