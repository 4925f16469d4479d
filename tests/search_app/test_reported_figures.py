"""A figure the score command reports about itself cannot win a search by being forged.

The candidate's code runs inside the score command, so it can reach everything the command
reports: the clock the score script times it with, the command's stdout (an `atexit` line
after the script's own), the file `$CRUCIBLE_METRICS_FILE` names. A time figure
(`reported = "time_ms"`) is therefore checked against what the runtime measured of the same
trials from outside (wall time, the cgroup's CPU time): a saving the report claims and the
runtime did not see eliminates the candidate. A figure of another kind (`reported = "other"`)
is read only from the report descriptor, which a hidden evaluator holds and the child process
running the candidate's code does not.

Each search is one the forgers won before: three of them fill the round's one place ahead of
the honest candidate.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from runtime_app.models import Receipt
from search_app import services
from tests.gitrepo import repo_create

SLOW = "def compute(n):\n    return sum(i * i for i in range(n))\n"
FAST = "def compute(n):\n    return (n - 1) * n * (2 * n - 1) // 6\n"
# Each forger keeps the slow code (its gates pass) and forges the figure the score reports.
FROZEN_CLOCK = SLOW + "\nimport time\n\ntime.perf_counter = lambda: 1.0\n"
ATEXIT_LINE = SLOW + ("\nimport atexit\n\n"
                      "atexit.register(lambda: print('{\"median_runtime_ms\": 0.00001}', flush=True))\n")
METRICS_FILE = SLOW + ("\nimport json, os\n\n"
                       "if os.environ.get('CRUCIBLE_METRICS_FILE'):\n"
                       "    with open(os.environ['CRUCIBLE_METRICS_FILE'], 'w') as out:\n"
                       "        out.write(json.dumps({'median_runtime_ms': 0.00001}))\n")

WRITER = f'''import os, pathlib, sys
sys.stdin.read()
code = {{"cand_001": {FROZEN_CLOCK!r}, "cand_002": {ATEXIT_LINE!r}, "cand_003": {METRICS_FILE!r},
         "cand_004": {FAST!r}}}[os.environ["CRUCIBLE_CANDIDATE_ID"]]
pathlib.Path("code/work.py").write_text(code)
'''

# The score script a person wrote: it imports the candidate's code and times it itself.
SCORE = """import json, sys, time
sys.path.insert(0, "code")
from work import compute
start = time.perf_counter()
assert compute(1_200_000) == 575999280000200000
elapsed = time.perf_counter() - start
print(json.dumps({"median_runtime_ms": elapsed * 1000}))
"""

FILES = {
    "code/work.py": SLOW,
    "tests/test_work.py": ("import sys\nsys.path.insert(0, 'code')\nfrom work import compute\n\n"
                           "def test_small():\n    assert compute(10) == 285\n\n"
                           "def test_large():\n    assert compute(1000) == 332833500\n"),
    "scripts/writer.py": WRITER,
    "scripts/score.py": SCORE,
    "pytest.ini": "[pytest]\ntestpaths = tests\n",
}

TIME_SPEC = """name = "reported-time"
objective = "Make compute() faster without changing its result"
population = 4
rounds = [4, 1]
concurrency = 4

[worker]
provider = "command"
command = "python scripts/writer.py"
write_roots = ["code"]

[hard_gates]
commands = ["python -m pytest -q -p no:cacheprovider tests"]
protected_paths = ["tests", "scripts"]

[score]
command = "python scripts/score.py"
metric = "median_runtime_ms"
reported = "time_ms"
direction = "minimize"
trials = 2

[selection]
policy = "ordered"
ordering = ["score", "diff_lines"]
"""


def _run(personas, tmp_path, spec: str, files: dict[str, str]):
    repo = repo_create(tmp_path / "repo", files)
    search = services.search_freeze(personas.owner, personas.alpha, spec, "HEAD", repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    outcome = services.search_run_inline(search)
    return outcome, {c.candidate_id: c for c in search.candidates.all()}


@pytest.mark.django_db(transaction=True)
def test_forged_time_reports_are_eliminated_and_the_honest_faster_candidate_wins(
        personas, tmp_path, data_dir, bubblewrap):
    outcome, candidates = _run(personas, tmp_path, TIME_SPEC, FILES)
    reasons = {cid: c.reason for cid, c in candidates.items()}
    for forger in ("cand_001", "cand_002", "cand_003"):
        candidate = candidates[forger]
        assert candidate.state == "eliminated" and candidate.round_reached == 0, reasons
        # Both figures, side by side: what it reported, and what the runtime measured.
        assert "reports " in candidate.reason and "the baseline (" in candidate.reason, reasons
        assert "the runtime measured " in candidate.reason and " in wall time and " in candidate.reason
        assert candidate.reason.endswith("in the runtime's own measurement"), reasons
        assert "it claims to save" in candidate.reason, reasons
    assert outcome.outcome == "winner" and outcome.winner.candidate_id == "cand_004", reasons
    # The honest candidate's report was checked, and the pages say so.
    assert outcome.search.candidates.get(candidate_id="cand_004").blocks["0"]["0"]["cpu"] is not None


@pytest.mark.django_db(transaction=True)
def test_a_baseline_reporting_more_time_than_its_command_took_stops_the_search_naming_the_unit(
        personas, tmp_path, data_dir, bubblewrap):
    # The score reports milliseconds; the spec says seconds: the baseline "took" minutes.
    spec = TIME_SPEC.replace('reported = "time_ms"', 'reported = "time_s"').replace(
        "population = 4\nrounds = [4, 1]\nconcurrency = 4",
        "population = 2\nrounds = [2, 1]\nconcurrency = 2")
    outcome, _ = _run(personas, tmp_path, spec.replace("trials = 2", "trials = 1"), FILES)
    assert outcome.outcome == "NONE", outcome.reason
    assert outcome.reason.startswith("stopped: the baseline's score command reports "), outcome.reason
    assert "but the runtime measured the whole command at " in outcome.reason
    assert '`median_runtime_ms` is not in the unit `reported = "time_s"` says' in outcome.reason


WORK = "def label(n):\n    return 'odd'\n"  # right for odd numbers only: 2 of 4
HONEST = "def label(n):\n    return 'even' if n in (2,) else 'odd'\n"  # 3 of 4
# Forgers keep the baseline's answers and try every channel the command reports through.
PRINTS = WORK + ("\nimport atexit\n\n"  # the last line of the command's stdout, after the evaluator's log
                 "atexit.register(lambda: print('{\"accuracy\": 1.0}', flush=True))\n")
WRITES = WORK + ("\nimport os\n\n"
                 "path = os.environ.get('CRUCIBLE_METRICS_FILE') or '/tmp/metrics.json'\n"
                 "with open(path, 'w') as out:\n"
                 "    out.write('{\"accuracy\": 1.0}')\n"
                 "fd = int(os.environ.get('CRUCIBLE_REPORT_FD', '-1'))\n"
                 "for target in (fd, f'/proc/{os.getppid()}/fd/{fd}'):\n"
                 "    try:\n"
                 "        os.write(target if isinstance(target, int) else os.open(target, os.O_WRONLY),\n"
                 "                 b'{\"accuracy\": 1.0}')\n"
                 "    except OSError as error:\n"
                 "        print('refused:', error)\n")

OTHER_WRITER = f'''import os, pathlib, sys
sys.stdin.read()
plan = {{"cand_001": {PRINTS!r}, "cand_002": {WRITES!r}, "cand_003": {HONEST!r}}}
code = plan[os.environ["CRUCIBLE_CANDIDATE_ID"]]
pathlib.Path("code/work.py").write_text(code)
'''

# The hidden evaluator (docs/sandbox.md, the evaluator process): it holds the report descriptor,
# runs the candidate's code only in a child (which does not get it), and computes the figure.
EVALUATOR = """import json, os, subprocess, sys
fd = int(os.environ["CRUCIBLE_REPORT_FD"])
os.set_inheritable(fd, False)
CASES = {1: "odd", 2: "even", 3: "odd", 4: "even"}
run = ("import json, sys; sys.path.insert(0, 'code'); from work import label; "
       "print(json.dumps([label(n) for n in %r]))" % sorted(CASES))
child = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, timeout=60,
                       close_fds=True)
print(child.stdout, end="")  # the child's output, for the receipt
answers = next(json.loads(line) for line in child.stdout.splitlines() if line.startswith("["))
accuracy = sum(answer == CASES[n] for n, answer in zip(sorted(CASES), answers)) / len(CASES)
os.write(fd, json.dumps({"accuracy": accuracy}).encode())
"""

OTHER_SPEC = f"""name = "reported-other"
objective = "Label numbers right"
population = 3
rounds = [3, 1]
concurrency = 3

[worker]
provider = "command"
command = "python scripts/writer.py"
write_roots = ["code"]

[evaluator.files]
"scripts/evaluate.py" = {json.dumps(EVALUATOR)}

[hard_gates]
commands = ["python -c \\"import sys; sys.path.insert(0, 'code'); import work\\""]
protected_paths = ["scripts"]

[score]
command = "python scripts/evaluate.py"
metric = "accuracy"
reported = "other"
direction = "maximize"
comparison = "absolute"
trials = 1

[selection]
policy = "ordered"
ordering = ["score", "diff_lines"]
"""


@pytest.mark.django_db(transaction=True)
def test_an_other_figure_counts_only_through_the_report_descriptor_the_candidate_s_code_does_not_hold(
        personas, tmp_path, data_dir, bubblewrap):
    files = {"code/work.py": WORK, "scripts/writer.py": OTHER_WRITER}
    outcome, candidates = _run(personas, tmp_path, OTHER_SPEC, files)
    reasons = {cid: c.reason for cid, c in candidates.items()}
    # What the forgers printed and wrote was not read: the evaluator's figure (2 of 4) was.
    for forger in ("cand_001", "cand_002"):
        assert candidates[forger].trials == {"0": [0.5]}, reasons
    assert candidates["baseline"].trials["0"] == [0.5]
    assert outcome.outcome == "winner" and outcome.winner.candidate_id == "cand_003", reasons
    assert outcome.winner.score_absolute == 0.75
    trial = Receipt.objects.filter(subject_id=candidates["cand_001"].pk, label__contains="trial").first()
    assert trial.stdout_excerpt.strip().endswith('{"accuracy": 1.0}')  # it was printed, and not read
    assert "CRUCIBLE_METRICS_FILE" not in trial.env_names and "CRUCIBLE_REPORT_FD" in trial.env_names
    assert trial.detail["report_descriptor"] == "written"
    written = Receipt.objects.filter(subject_id=candidates["cand_002"].pk, label__contains="trial").first()
    assert "refused: [Errno 9] Bad file descriptor" in written.stdout_excerpt  # not handed to the child
    assert written.stdout_excerpt.count("refused:") == 2  # nor reachable through /proc/<evaluator>/fd


def test_the_evaluator_process_docs_show_is_the_one_this_search_runs():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "sandbox.md").read_text()
    example = docs.split("```toml\n[evaluator.files]\n", 1)[1].split("```", 1)[0]
    data = tomllib.loads("[evaluator.files]\n" + example)
    assert data["evaluator"]["files"]["scripts/evaluate.py"] == EVALUATOR
    assert data["score"]["reported"] == "other"
