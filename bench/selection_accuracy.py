"""Selection accuracy under noise: how often the truly fastest correct candidate of the demo
wins, over RUNS complete searches.

    .venv/bin/python bench/selection_accuracy.py [RUNS]

The demo (search_app/spec_templates/demo-scripted.toml on the demo repository that
`make run` creates) has a known ground truth: its scripted writers apply ten strategies,
and only the sieve of Eratosthenes (written by cand_001 and, identically, by cand_011) is
both correct and fastest; three other correct candidates are 3–10× slower but close
enough that timing noise on a busy 2-core machine can reorder trials. Each run freezes the
demo spec under a new name (so each is a new search), runs it in this process with the
runtime's sandbox and four live steps, and records the winner. It prints the count of runs
the sieve won, and every other outcome.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from _search_setup import REPO_ROOT, django_setup, freeze_and_run, operator_and_project

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
SIEVE = {"cand_001", "cand_011"}


def main() -> None:
    (REPO_ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="crucible-bench-accuracy-", dir=REPO_ROOT / "var") as temp:
        django_setup(Path(temp) / "data")
        from runtime_app.management.commands.crucible_setup import Command

        user, project = operator_and_project()
        repo = Command()._demo_repository()
        template = (REPO_ROOT / "search_app" / "spec_templates" / "demo-scripted.toml").read_text()
        winners: Counter[str] = Counter()
        started = time.perf_counter()
        for number in range(1, RUNS + 1):
            spec = template.replace('name = "demo-speed-up-scripted"', f'name = "accuracy-{number}"')
            _, run = freeze_and_run(user, project, spec, repo)
            winner = run.winner.candidate_id if run.winner else "NONE"
            winners[winner] += 1
            elapsed = time.perf_counter() - started
            print(f"run {number:2d}: {run.outcome} {winner} ({elapsed:.0f} s)", flush=True)
        won = sum(count for name, count in winners.items() if name in SIEVE)
        print(f"the fastest correct candidate (the sieve) won {won} of {RUNS} runs; "
              f"outcomes: {dict(winners)}; {time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
