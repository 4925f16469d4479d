"""How right the time left is: the forecast before issue 31 (steps done so far at the mean pace,
over the steps the plan implies) and the new one (search_app/forecast.py, `time_left`: this
search's measured step durations over the work left per kind) sampled side by side at every step
completion of real searches, against the time each search really had left. And the forecast
before launch (`forecast`): the old one (past searches' command receipts: writer, gate and trial
medians) and the new one (past searches' step wall times, through `time_left`'s work model at
"nothing done yet") against the search's true wall time.

    .venv/bin/python bench/forecast_accuracy.py            # the demo and two other specs
    .venv/bin/python bench/forecast_accuracy.py --only demo --keep

**The searches**, each frozen and run inline (`search_run_inline`, as `manage.py search run` does)
in one temp data dir, each twice: the first run leaves the repository's history, the second is
forecast before launch and then sampled while it runs:
- `demo`: search_app/spec_templates/demo-scripted.toml on the demo repository (`crucible_setup`'s),
  population 12, rounds 12 → 4 → 2 → 1, the scripted `command` writers;
- `uneven`: population 6, rounds 6 → 2 → 1, concurrency 3, 3 trials; writers that take 0.3–1.1 s
  by candidate, a 0.3 s gate, a 0.2 s score;
- `long-trials`: population 4, rounds 4 → 1, concurrency 2, 6 trials of 0.5 s, 1 s writers.

**Figures**, per search and over all: for each forecast, the share of samples where it gives a
figure at all, and over those the median absolute error as a ratio of the true remaining time
and in seconds; for the new one also the share of samples whose range holds the true remaining
time. The old forecast gives nothing until a fifth of its planned steps are done; the new one's
figure while a kind is still untimed is its lower bound (counted as given), so it is also shown
over the samples where every kind still to run was timed ("every kind timed"). Before launch:
each forecast's range and middle against the true wall time, and true ÷ middle.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from _search_setup import REPO_ROOT, bench_temp, django_setup, operator_and_project
from bare_loop import make_repo
from truth_costs import spec as truth_spec

# Writers of 0.3, 0.7 or 1.1 s by the candidate's last digit.
UNEVEN_WRITER = ("python3 -c 'import os, time; "
                 "time.sleep(0.3 + int(os.environ[\"CRUCIBLE_CANDIDATE_ID\"][-1]) % 3 * 0.4)'; "
                 "echo $CRUCIBLE_CANDIDATE_ID > code/id.txt")


def bench_spec(name: str, population: int, rounds: list[int], concurrency: int, trials: int, *,
               writer: str, gate: str, score_sleep: float) -> str:
    """truth_costs' spec (the figure through the report descriptor, results compared), renamed,
    with its own writer, gate and concurrency."""
    text = truth_spec(population, rounds, score_sleep, trials, results=True)
    lines = []
    for row in text.splitlines():
        if row.startswith("name = "):
            row = f'name = "{name}"'
        elif row.startswith("concurrency = "):
            row = f"concurrency = {concurrency}"
        elif row.startswith("command = ") and "CRUCIBLE_CANDIDATE_ID" in row:
            row = f"command = {json.dumps(writer)}"
        elif row.startswith("commands = "):
            row = f"commands = [{json.dumps(gate)}]"
        lines.append(row)
    return "\n".join(lines) + "\n"


UNEVEN = bench_spec("uneven", 6, [6, 2, 1], 3, 3, writer=UNEVEN_WRITER, gate="sleep 0.3", score_sleep=0.2)
LONG_TRIALS = bench_spec("long-trials", 4, [4, 1], 2, 6, gate="true", score_sleep=0.5,
                         writer="sleep 1; echo $CRUCIBLE_CANDIDATE_ID > code/id.txt")


def old_eta(search, run, now) -> float | None:
    """The estimate before issue 31 (search_app/selectors.py, run_timing, as it was)."""
    from search_app.models import Step

    ended = (Step.State.DONE, Step.State.FAILED, Step.State.CANCELLED)
    elapsed = (now - run.started_at).total_seconds()
    done = search.steps.filter(state__in=ended).count()
    spec = search.spec_normalized or {}
    rounds = list(spec.get("rounds") or [])
    population = spec.get("population") or (rounds[0] if rounds else 0)
    refine = bool((spec.get("worker") or {}).get("refine"))
    later = sum(rounds[1:]) * 2 if refine else 0
    planned = max(1 + 2 * population + later + len(rounds) + 2,
                  done + search.steps.filter(state__in=(Step.State.PENDING, Step.State.RUNNING)).count())
    if done >= 3 and done * 5 >= planned and planned > done:
        return elapsed / done * (planned - done)
    return None


def old_prelaunch(spec, history):
    """The wall time before launch as it was before this change: the medians of past searches'
    writer steps and gate and trial receipts, in `_wall`'s waves (None without all three)."""
    from search_app.forecast import _plan_counts, _wall

    def median_of(durations: dict, command: str) -> float | None:
        values = durations.get(command) or [v for vs in durations.values() for v in vs]
        return statistics.median(values) if values else None

    gates = [median_of(history.gate_seconds, command) for command in spec.hard_gates.commands]
    trial = median_of(history.trial_seconds, spec.score.command)
    if not history.writer_seconds or None in gates or trial is None:
        return None
    rounds, replay = _plan_counts(spec)
    return _wall(spec, rounds, replay, statistics.median(history.writer_seconds),
                 sum(g for g in gates if g is not None), trial)["total"]


def prelaunch(search) -> dict:
    """Both forecasts before launch of a frozen search, from the repository's past searches."""
    from search_app.selectors import forecast_history, search_forecast, search_spec

    new = search_forecast(search)
    history = forecast_history(search.project_id, search.repository_path, search.spec_normalized["worker"][
        "provider"], search.requested_model_id, exclude_pk=search.pk)
    old = old_prelaunch(search_spec(search), history)
    return {"old": (old.low, (old.low + old.high) / 2, old.high) if old else None,
            "new": (new.wall_seconds.low, new.wall_typical_seconds, new.wall_seconds.high)
            if new.wall_seconds and new.wall_typical_seconds is not None else None,
            "source": new.wall_source}


def run_sampled(user, project, name: str, text: str, repo: Path) -> dict:
    from django.utils import timezone

    from search_app import services
    from search_app.selectors import search_time_left

    # The first run leaves the history the second one's forecast before launch reads.
    first = services.search_freeze(user, project, text, "HEAD", repository_path=str(repo))
    services.search_start(user, first, enqueue=False)
    first_run = services.search_run_inline(first)
    again = text.replace('name = "', 'name = "again-', 1)
    search = services.search_freeze(user, project, again, "HEAD", repository_path=str(repo))
    before = prelaunch(search)
    services.search_start(user, search, enqueue=False)
    samples: list[tuple[float, float | None, object]] = []
    seen = [0]

    def progress(run) -> None:
        ended = search.steps.filter(state__in=("done", "failed", "cancelled")).count()
        if ended > seen[0] and not run.terminal:
            seen[0] = ended
            now = timezone.now()
            samples.append((time.monotonic(), old_eta(search, run, now), search_time_left(search, run, now)))

    run = services.search_run_inline(search, progress=progress)
    end = time.monotonic()
    rows = [(end - at, old, new) for at, old, new in samples if end - at > 0]
    return {"name": name, "outcome": run.outcome, "wall": (run.finished_at - run.started_at).total_seconds(),
            "samples": rows, "prelaunch": before,
            "first_wall": (first_run.finished_at - first_run.started_at).total_seconds()}


def prelaunch_line(result: dict) -> str:
    true = result["wall"]

    def shown(figure) -> str:
        if figure is None:
            return f"{'unknown':>32}"
        low, mid, high = figure
        inside = "in" if low <= true <= high else "out"
        return f"{mid:7.1f} s ({low:6.1f}–{high:7.1f}, {inside:>3}) ×{true / mid:5.2f}"

    before = result["prelaunch"]
    return (f"{result['name']:<12} true {true:7.1f} s (first run {result['first_wall']:6.1f} s)  "
            f"old {shown(before['old'])}  new {shown(before['new'])}")


def figures(rows: list) -> dict:
    old = [(true, est) for true, est, _ in rows if est is not None]
    new = [(true, left.mid) for true, _, left in rows]
    full = [(true, left.mid) for true, _, left in rows if not left.untimed]
    inside = [left.low <= true <= left.high for true, _, left in rows if not left.untimed]

    def errors(pairs):
        if not pairs:
            return None, None
        return (statistics.median(abs(est - true) / true for true, est in pairs),
                statistics.median(abs(est - true) for true, est in pairs))

    return {"n": len(rows), "old_given": len(old), "old": errors(old), "new_given": len(new),
            "new": errors(new), "full_given": len(full), "full": errors(full),
            "inside": (sum(inside), len(inside))}


def line(name: str, wall: float | None, f: dict) -> str:
    def err(pair):
        ratio, seconds = pair
        return "—" if ratio is None else f"{ratio:6.2f}× / {seconds:6.1f} s"

    inside, timed = f["inside"]
    took = f"{wall:6.1f} s" if wall is not None else "       "
    return (f"{name:<12} {took} {f['n']:>4}  old {f['old_given']:>2} {err(f['old']):>18}  "
            f"new {f['new_given']:>2} {err(f['new']):>18}  new, every kind timed {f['full_given']:>2} "
            f"{err(f['full']):>18}  in range {inside}/{timed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("demo", "uneven", "long-trials"), default=None)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    parser.add_argument("--samples", action="store_true", help="print every sample")
    args = parser.parse_args()
    with bench_temp(args.keep) as temp:
        django_setup(temp / "data")
        from django.conf import settings

        from runtime_app.management.commands.crucible_setup import Command

        settings.DATA_DIR = temp / "data"
        user, project = operator_and_project()
        demo_repo = Command()._demo_repository()
        demo_text = (REPO_ROOT / "search_app" / "spec_templates" / "demo-scripted.toml").read_text()
        plan = [("demo", demo_text, demo_repo), ("uneven", UNEVEN, make_repo(temp / "uneven")),
                ("long-trials", LONG_TRIALS, make_repo(temp / "long"))]
        results = [run_sampled(user, project, name, text, repo) for name, text, repo in plan
                   if args.only in (None, name)]
    print("time left at each step completion, against the time really left "
          "(median |forecast − true|: ratio of true / seconds)")
    print(f"{'search':<12} {'took':>8} {'n':>4}  per forecast: samples with a figure, median error "
          "(ratio / seconds)")
    every = []
    for result in results:
        every += result["samples"]
        if args.samples:
            for true, old, left in result["samples"]:
                shown = "—" if old is None else f"{old:.1f}"
                print(f"  {result['name']}: true {true:.1f} old {shown} new {left.low:.1f}/{left.mid:.1f}/"
                      f"{left.high:.1f} untimed {','.join(left.untimed)}")
        print(line(result["name"], result["wall"], figures(result["samples"])) + f"  ({result['outcome']})")
    print(line("all", None, figures(every)))
    print()
    print("wall time forecast before launch, from the first run of the same spec, against the second's "
          "true wall time: middle (low–high, truth in or out of the range) and true ÷ middle")
    for result in results:
        print(prelaunch_line(result))
        if args.samples:
            print(f"  {result['prelaunch']['source']}")
    if any(math.isnan(true) for true, _, _ in every):
        sys.exit(1)


if __name__ == "__main__":
    main()
