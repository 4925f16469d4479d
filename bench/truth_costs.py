"""What truth by construction costs: the writer/evaluation barrier and the trial result checks,
the code before issue 30 and the current tree side by side in one run.

    .venv/bin/python bench/truth_costs.py                     # population 32, rounds 32 → 1, 3 times each
    .venv/bin/python bench/truth_costs.py --repeats 1 --population 16 --rounds 16,1
    .venv/bin/python bench/truth_costs.py --also results  # a third lane: the code of branch `results`

**The search.** Population 32, two rounds (32 → 1: the round-0 cut keeps one finalist, measured
again in round 1), concurrency 16, 2 trials, `comparison = "absolute"` (so every round runs
exactly `trials` blocks on both sides: no block depends on noise). The writer, the one hard gate
and the score command each sleep 0.2 s; the score prints a result line and a figure derived from
the candidate's id (`v`, maximised), so every run picks the same winner. The barrier's cost is
what the code before it overlapped: the first writers' evaluations (and the baseline's) beside
the last writers.

**The lanes**, alternated (before, after, …, then the other way round), each its own process, data dir and
repository, `search_run_inline`:
- `before`: the code at `f99a6cd` (the commit before issue 30), exported by this script with
  `git archive` into the temp dir and run with this interpreter (the same venv);
- `after`: this checkout, whose spec also declares `results = "stdout"` under `[score]` (each
  trial's stdout less its metric lines is compared with the baseline's from the same block) and
  `reported = "other"` (the figure comes through the report descriptor, as this tree requires
  for a figure the runtime does not measure), when this tree's spec accepts those keys; the
  script says which variant ran;
- `--also REF`: the code at REF (exported like `before`), with `results = "stdout"` if it accepts it.

**Figures:** each run's wall time (from `search_start` to the end of `search_run_inline`, the
database migrated and the search frozen before) and the part of it that the barrier changes,
round 0's writers and gates (from the run's start to its first trial), the median of each per
lane and the ratio to before.
Data and the exported tree go to a temp dir in the system temp dir, removed unless `--keep`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from _search_setup import REPO_ROOT, bench_temp
from bare_loop import make_repo

BEFORE = "f99a6cd"

# Run in a lane's own process, with its tree first on sys.path: freeze the first spec that tree
# accepts, run the search inline and print one JSON line with what it took.
CHILD = r'''
import json, os, sys, time
tree, data_dir, repo, specs_file = sys.argv[1:5]
os.environ["CRUCIBLE_DATA_DIR"] = data_dir
os.environ["DJANGO_SETTINGS_MODULE"] = "crucible.settings"
sys.path.insert(0, tree)
os.chdir(tree)
import django
django.setup()
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management import call_command
call_command("migrate", "--noinput", verbosity=0)
from runtime_app.models import Project, ProjectMembership, Receipt
from search_app import services
user = get_user_model().objects.create_superuser("bench", password="bench-password-1")
project = Project.objects.create(name="bench", created_by=user)
ProjectMembership.objects.create(project=project, user=user, role="admin")
refused = []
for variant, text in enumerate(json.loads(open(specs_file).read())):
    try:
        search = services.search_freeze(user, project, text, "HEAD", repository_path=repo)
        break
    except ValidationError as error:
        refused.append(" ".join(error.messages)[:300])
else:
    print(json.dumps({"error": refused}))
    sys.exit(1)
started = time.monotonic()
services.search_start(user, search, enqueue=False)
run = services.search_run_inline(search)
wall = time.monotonic() - started
from search_app.models import Step
first_trials = Step.objects.filter(search=search, kind="measure").order_by("started_at").first()
writers_and_gates = (first_trials.started_at - run.started_at).total_seconds() if first_trials else None
print(json.dumps({"wall": wall, "writers_and_gates": writers_and_gates, "variant": variant,
                  "refused": refused, "outcome": run.outcome,
                  "winner": run.winner.candidate_id if run.winner else None,
                  "commands": Receipt.objects.filter(kind="command").count()}))
'''


def spec(population: int, rounds: list[int], sleep: float, trials: int, results: bool) -> str:
    """The search's spec; with `results`, as this issue's code wants it: the trial's stdout compared
    with the baseline's (`results = "stdout"`), and the figure, of no kind the runtime measures,
    through the report descriptor (`reported = "other"`) instead of stdout's last line."""
    pause = f"sleep {sleep}; " if sleep else ""
    figure = "$(cksum < code/id.txt | cut -d' ' -f1)"
    if results:  # bash: dash cannot write to a descriptor above 9
        score = (pause + "echo computed; v=" + figure + "; exec bash -c "
                 + "'printf \"{\\\"v\\\": %s}\" \"$0\" >&\"$CRUCIBLE_REPORT_FD\"' \"$v\"")
    else:
        score = pause + "echo computed; printf '{\"v\": %s}\\n' " + figure
    checked = 'reported = "other"\nresults = "stdout"' if results else ""
    return f'''name = "truth-costs"
objective = "bench"
population = {population}
rounds = {rounds}
concurrency = {min(16, population)}

[worker]
provider = "command"
command = "{pause}echo $CRUCIBLE_CANDIDATE_ID > code/id.txt"
write_roots = ["code"]

[hard_gates]
commands = ["{pause or 'true'}"]

[score]
command = {json.dumps(score)}
metric = "v"
direction = "maximize"
trials = {trials}
comparison = "absolute"
{checked}
'''


def lane_run(tree: Path, work: Path, specs: list[str]) -> dict:
    work.mkdir(parents=True)
    repo = make_repo(work / "repo")
    specs_file = work / "specs.json"
    specs_file.write_text(json.dumps(specs))
    done = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(work / "data"), str(repo),
                           str(specs_file)], capture_output=True, text=True, cwd=tree)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(f"the lane in {tree} failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n"
                         f"{done.stderr[-4000:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--population", type=int, default=32)
    parser.add_argument("--rounds", default="32,1", help="comma-separated, ending in 1 (default: two rounds)")
    parser.add_argument("--sleep", type=float, default=0.2, help="seconds each command sleeps")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="runs per lane, alternated")
    parser.add_argument("--before", default=BEFORE, help="the commit to compare with")
    parser.add_argument("--also", action="append", default=[], metavar="REF",
                        help="another commit or branch as a lane of its own (e.g. the results checks')")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args()
    rounds = [int(r) for r in args.rounds.split(",")]
    plain = spec(args.population, rounds, args.sleep, args.trials, results=False)
    checked = spec(args.population, rounds, args.sleep, args.trials, results=True)
    concurrency = min(16, args.population)
    print(f"population {args.population}, rounds {rounds}, concurrency {concurrency}, {args.trials} trials, "
          f"every command sleeps {args.sleep:g} s; before: {args.before}, after: this checkout"
          + "".join(f", {ref}: that commit" for ref in args.also), flush=True)
    with bench_temp(args.keep) as temp:
        trees = {"before": export(args.before, temp / "before-tree"), "after": REPO_ROOT,
                 **{ref: export(ref, temp / f"{ref}-tree") for ref in args.also}}
        walls: dict[str, list[float]] = {lane: [] for lane in trees}
        round0: dict[str, list[float]] = {lane: [] for lane in trees}
        variants: dict[str, set[str]] = {lane: set() for lane in trees}
        for repeat in range(args.repeats):
            order = list(trees) if repeat % 2 == 0 else list(reversed(trees))
            for lane in order:
                specs = [plain] if lane == "before" else [checked, plain]
                got = lane_run(trees[lane], temp / f"{lane}-{repeat}", specs)
                walls[lane].append(got["wall"])
                round0[lane].append(got["writers_and_gates"])
                if lane != "before":
                    variants[lane].add("with results = \"stdout\"" if got["variant"] == 0 else
                                       f"without results (that tree refused the key: {got['refused'][0]})")
                print(f"  run {repeat + 1} {lane:8}: {got['wall']:6.2f} s (round 0's writers and gates "
                      f"{got['writers_and_gates']:5.2f} s), {got['commands']} commands, {got['outcome']} "
                      f"{got['winner']}", flush=True)
    before, before0 = statistics.median(walls["before"]), statistics.median(round0["before"])
    print(f"median of {args.repeats}: before {before:.2f} s (round 0's writers and gates {before0:.2f} s)")
    for lane in list(trees)[1:]:
        median, median0 = statistics.median(walls[lane]), statistics.median(round0[lane])
        print(f"  {lane}: {median:.2f} s, {median / before:.2f}× before (round 0's writers and gates "
              f"{median0:.2f} s, {median0 / before0:.2f}×); its spec ran {', '.join(sorted(variants[lane]))}")


def export(ref: str, tree: Path) -> Path:
    """The code at `ref`, exported with `git archive` (not a worktree: nothing is registered in
    the checkout's git dir, and the temp dir's removal takes it away)."""
    tree.mkdir()
    archive = subprocess.run(["git", "archive", "--format=tar", ref], cwd=REPO_ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree

if __name__ == "__main__":
    main()
