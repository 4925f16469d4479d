"""Specs for the host-path tests (hidden evaluator files from the host, read paths, preflight):
the plan repository of runs.py with the sections a test needs written out."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tests.search_app.runs import GATE, SCORE


def spec(*, writer: str = "python scripts/writer.py", worker: str = "", gates: tuple[str, ...] = (GATE,),
         hard_gates: str = "", score: str = SCORE, score_extra: str = "", evaluator: str = "",
         population: int = 2, rounds: tuple[int, ...] = (2, 1), concurrency: int = 2,
         name: str = "host-paths") -> str:
    """A spec for runs.plan_repo: `worker`, `hard_gates`, `score_extra` are extra lines of those
    sections, `evaluator` the body of `[evaluator.files]`."""
    hidden = f"\n[evaluator.files]\n{evaluator}\n" if evaluator else ""
    return f'''name = "{name}"
objective = "Make answer() return the largest number you can"
population = {population}
rounds = {list(rounds)}
concurrency = {concurrency}

[worker]
provider = "command"
command = {json.dumps(writer)}
write_roots = ["code"]
{worker}

[hard_gates]
commands = {json.dumps(list(gates))}
protected_paths = ["tests", "scripts", "plan.json"]
timeout_seconds = 60
{hard_gates}

[score]
command = {json.dumps(score)}
metric = "value"
reported = "other"
direction = "maximize"
trials = 1
{score_extra}

[selection]
policy = "ordered"
ordering = ["score", "diff_lines"]
{hidden}'''


def roots(settings, **paths: list[Path]) -> None:
    """Set CRUCIBLE_READ_ROOTS (`read_roots=`) and CRUCIBLE_EVALUATOR_ROOTS (`evaluator_roots=`) for
    one test, through pytest-django's `settings` fixture (which puts the old config back)."""
    settings.CONFIG = dataclasses.replace(settings.CONFIG, **paths)
