"""A small real repository whose scripted writer follows a test's plan, and specs for it.
The baseline's answer() returns 2.

The plan maps candidate ids to behaviours, committed in the baseline as plan.json:
  N (int)                       code/answer.py returns N (the score, maximised)
  {"value": N, "cost": C}       the same, and the writer reports a cost of C µUSD
  {"value": N, "delay": S}      the same, after S seconds of writing
  {"value": N, "note": T}       the same, with a comment line T (another patch, the same score)
  {"file": PATH}                answer() returns the int read from PATH at run time
  "broken"                      a syntax error (the gate fails)
  "hang"                        importing answer sleeps for a minute (the gate times out)
  "sleep"                       the writer itself sleeps for a minute
  "tests"                       the writer changes the tests (the change policy refuses it)
  "nothing" (or no entry)       the writer changes nothing
  {"value": N, "refined": R}    N in round 0; when refining (CRUCIBLE_REFINE=1), R: an int, "broken"
                                or "revert" (puts the baseline back)
Every writer first prints its round, effort and previous score (its receipt keeps the line).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from tests.gitrepo import repo_create

WRITER = '''import json, os, pathlib, sys, time
prompt = sys.stdin.read()
plan = json.loads(pathlib.Path("plan.json").read_text())
what = plan.get(os.environ["CRUCIBLE_CANDIDATE_ID"], "nothing")
print("round", os.environ["CRUCIBLE_ROUND"], "effort", os.environ["CRUCIBLE_EFFORT"],
      "previous", os.environ.get("CRUCIBLE_PREVIOUS_SCORE", "-"))
code = pathlib.Path("code/answer.py")
if isinstance(what, dict) and "revised" in what:  # sent back by a person: says what it was told
    if os.environ.get("CRUCIBLE_REVISION"):
        print("told:", prompt[prompt.find("Reviewers requested"):].replace("\\n", " | "))
        what = what["revised"]
    else:
        what = what["value"]
if isinstance(what, dict) and "refined" in what:
    if os.environ.get("CRUCIBLE_REFINE") == "1":
        what = what["refined"]
        if what == "revert":
            code.write_text("def answer():\\n    return 2\\n")
    else:
        what = what["value"]
if isinstance(what, int):
    code.write_text(f"def answer():\\n    return {what}\\n")
elif isinstance(what, dict) and "file" in what:
    code.write_text(f"def answer():\\n    return int(open({what['file']!r}).read())\\n")
elif isinstance(what, dict) and "delay" in what:
    time.sleep(what["delay"])
    code.write_text(f"def answer():\\n    return {what['value']}\\n")
elif isinstance(what, dict) and "note" in what:
    code.write_text(f"def answer():\\n    # {what['note']}\\n    return {what['value']}\\n")
elif isinstance(what, dict):
    code.write_text(f"def answer():\\n    return {what['value']}\\n")
    print(json.dumps({"cost_microusd": what["cost"], "input_tokens": 10, "output_tokens": 5}))
elif what == "broken":
    code.write_text("def answer(:\\n")
elif what == "hang":
    code.write_text("import time\\ntime.sleep(60)\\n\\ndef answer():\\n    return 99\\n")
elif what == "sleep":
    time.sleep(60)
elif what == "tests":
    code.write_text("def answer():\\n    return 50\\n")
    pathlib.Path("tests/test_answer.py").write_text("def test_nothing():\\n    pass\\n")
'''

GATE = "python -c \"import sys; sys.path.insert(0, 'code'); import answer; assert answer.answer() > 0\""
# The value goes to the report descriptor (`reported = "other"`: read from there only); the
# printed line is what earlier specs read, and what a `runtime:` metric's search ignores.
SCORE = ("python -c \"import json, os, sys; sys.path.insert(0, 'code'); import answer; "
         "line = json.dumps({'value': answer.answer()}); print(line); "
         "fd = os.environ.get('CRUCIBLE_REPORT_FD'); fd and os.write(int(fd), line.encode())\"")


def plan_repo(path: Path, plan: dict) -> Path:
    return repo_create(path, {
        "code/answer.py": "def answer():\n    return 2\n",
        "tests/test_answer.py": "def test_answer():\n    assert True\n",
        "scripts/writer.py": WRITER,
        "plan.json": json.dumps(plan),
    })


def spec_text(*, population: int, rounds: list[int], concurrency: int | None = None, trials: int = 2,
              budget: str = "", gate_timeout: int = 60, name: str = "plan-search",
              policy: str = "ordered", refine: bool = False, effort: str = "",
              replay_tolerance: float = 0.25, comparison: str = "paired",
              max_trials: int | None = None, confidence: float = 0.5, review: str = "blocking",
              read_paths: tuple[str, ...] = ()) -> str:
    """A plan search's spec. Its scores are exact, so by default it decides at confidence 0.5
    (two blocks are enough); tests of the statistics ask for more. `read_paths`: host paths the
    gates and the score command may read (under CRUCIBLE_READ_ROOTS: tests set it with
    hostspecs.roots)."""
    reads = f"read_paths = {json.dumps(list(read_paths))}" if read_paths else ""
    concurrency = concurrency or min(4, population)
    effort = f"reasoning_effort = {effort}" if effort else ""
    return f'''name = "{name}"
objective = "Make answer() return the largest number you can"
population = {population}
rounds = {rounds}
concurrency = {concurrency}

[worker]
provider = "command"
command = "python scripts/writer.py"
write_roots = ["code"]
refine = {str(refine).lower()}
{effort}
{budget}
[hard_gates]
commands = [{json.dumps(GATE)}]
protected_paths = ["tests", "scripts", "plan.json"]
timeout_seconds = {gate_timeout}
{reads}

[score]
command = {json.dumps(SCORE)}
metric = "value"
reported = "other"
direction = "maximize"
trials = {trials}
replay_tolerance = {replay_tolerance}
comparison = "{comparison}"
confidence = {confidence}
{reads}
{f"max_trials = {max_trials}" if max_trials else ""}

[selection]
policy = "{policy}"
ordering = ["score", "diff_lines"]
review = "{review}"
'''


def frozen(personas, tmp_path: Path, plan: dict, repo_name: str = "", **spec):
    """A search of project alpha frozen against a new plan repository."""
    from search_app import services

    repo = plan_repo(tmp_path / (repo_name or f"repo-{uuid.uuid4().hex[:6]}"), plan)
    return services.search_freeze(personas.owner, personas.alpha, spec_text(**spec), "HEAD",
                                  repository_path=str(repo))


def run_inline(personas, search):
    """Start the search and drive it to its end in this process, as the CLI does."""
    from search_app import services

    services.search_start(personas.owner, search, enqueue=False)
    return services.search_run_inline(search)


def fates(search) -> dict[str, tuple[str, str]]:
    return {c.candidate_id: (c.state, c.reason) for c in search.candidates.all()}


def wait_for_end(search, timeout: float = 240):
    """Poll the database until the search's run is terminal (driven by other processes); fail after
    `timeout` seconds with the run's state."""
    from search_app.models import SearchRun

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = SearchRun.objects.get(search=search)
        if run.terminal:
            return run
        time.sleep(0.5)
    pytest.fail(f"the search did not end in {timeout:.0f} s: {SearchRun.objects.get(search=search)}")
