"""Selection accuracy under noise: how often the truly fastest correct candidate of the demo
wins, over RUNS complete searches with paired scoring and RUNS with absolute scoring, run
alternately in one run while a bounded background load (two busy processes) runs beside them.

    .venv/bin/python bench/selection_accuracy.py [RUNS]

The demo (search_app/spec_templates/demo-scripted.toml on the demo repository that
`make run` creates) has a known ground truth: its scripted writers apply ten strategies, and
only the sieve of Eratosthenes (written by cand_001 and, byte for byte, by cand_011, so it is
credited to cand_001) is both correct and fastest; the wheel and trial division are correct
but slower. Each search is frozen under a new name (so each is a new search), runs in this
process with the runtime's sandbox and four live steps, and records its winner and cand_001's
figure. It prints, per scoring, how often cand_001 won and the spread (max ÷ min) of
cand_001's figure across the runs: its paired ratio to the baseline, or its absolute median.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from _search_setup import (
    REPO_ROOT,
    bench_temp,
    django_setup,
    freeze_and_run,
    keep_requested,
    operator_and_project,
)

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
FASTEST = "cand_001"
BUSY = "while True: pass"


def main() -> None:
    load = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    try:
        with bench_temp(keep_requested()) as temp:
            django_setup(Path(temp) / "data")
            from runtime_app.management.commands.crucible_setup import Command
            from search_app.models import Candidate

            user, project = operator_and_project()
            repo = Command()._demo_repository()
            template = (REPO_ROOT / "search_app" / "spec_templates" / "demo-scripted.toml").read_text()
            winners = {"paired": Counter(), "absolute": Counter()}
            figures: dict[str, list[float]] = {"paired": [], "absolute": []}
            started = time.perf_counter()
            for number in range(1, RUNS + 1):
                for scoring in ("paired", "absolute"):
                    spec = template.replace('name = "demo-speed-up-scripted"',
                                            f'name = "accuracy-{scoring}-{number}"')
                    spec = spec.replace('direction = "minimize"',
                                        f'direction = "minimize"\ncomparison = "{scoring}"')
                    search, run = freeze_and_run(user, project, spec, repo)
                    winner = run.winner.candidate_id if run.winner else "NONE"
                    winners[scoring][winner] += 1
                    fastest = Candidate.objects.get(search=search, candidate_id=FASTEST)
                    if fastest.score is not None:
                        figures[scoring].append(fastest.score)
                    print(f"run {number:2d} {scoring:8s}: {run.outcome} {winner}, {FASTEST} "
                          f"{fastest.score} ({time.perf_counter() - started:.0f} s)", flush=True)
            for scoring in ("paired", "absolute"):
                values = figures[scoring]
                spread = max(values) / min(values) if values and min(values) > 0 else float("nan")
                print(f"{scoring}: the fastest correct candidate won {winners[scoring][FASTEST]} of "
                      f"{RUNS} runs; outcomes {dict(winners[scoring])}; {FASTEST}'s figure spread "
                      f"{spread:.2f}x (max/min over {len(values)} runs)")
            print(f"{time.perf_counter() - started:.0f} s in all, beside 2 busy processes")
    finally:
        for process in load:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
