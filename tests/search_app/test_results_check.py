"""Correctness is checked where it is timed: a candidate that behaves only while it is watched never wins.

The gates check correctness and the score trials time; code that can tell a trial from a gate
(its argv, its environment, its working directory, the commands above it in the process tree,
the interpreter's flags) can compute the right answer in the gates and a fast wrong one in the
trials. It won on `runtime:cpu_seconds` before trial results were compared. Now the runtime
reads every trial's results (`score.results`) outside the sandbox and compares them with the
baseline's trial in the same block: each such cheater is eliminated with the first differing
line, and the honest faster candidate still wins.
"""

from __future__ import annotations

import pytest

from runtime_app.models import Receipt
from search_app import services
from tests.gitrepo import repo_create

# How each cheater tells a score trial from a gate. Each is True only inside the score command.
DETECTORS = {
    "argv": "any('score' in part for part in [*sys.argv, *sys.orig_argv])",
    "environment": "os.environ.get('BENCH_MODE') == '1'",
    "cwd": "os.path.basename(os.getcwd()) == 'scripts'",
    "process_tree": "_ancestor_runs(b'score.sh')",
    "interpreter_flags": "bool(sys.flags.no_site)",
}
CHEATER = '''import os, sys


def _ancestor_runs(word):
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{{pid}}/cmdline", "rb") as handle:
                if word in handle.read():
                    return True
            with open(f"/proc/{{pid}}/stat", "rb") as handle:
                pid = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


WATCHED = {detector}


def compute(n):
    if WATCHED:
        return n * 7  # fast and wrong: only while it is timed
    return sum(i * i for i in range(n))
'''
# Honest and about twice as fast: half the sum by the formula (slower than the cheaters' nothing).
HONEST = ("def compute(n):\n    half = n // 2\n    low = sum(i * i for i in range(half))\n"
          "    return low + (n - 1) * n * (2 * n - 1) // 6 - (half - 1) * half * (2 * half - 1) // 6\n")
CANDIDATES = {"cand_001": HONEST, **{f"cand_{n:03d}": CHEATER.format(detector=code)
                                     for n, code in enumerate(DETECTORS.values(), start=2)}}
WRITER = f'''import os, pathlib, sys
sys.stdin.read()
CODE = {CANDIDATES!r}
pathlib.Path("code/work.py").write_text(CODE[os.environ["CRUCIBLE_CANDIDATE_ID"]])
'''
FILES = {
    "code/work.py": "def compute(n):\n    return sum(i * i for i in range(n))\n",
    "tests/test_work.py": ("import sys\nsys.path.insert(0, 'code')\nfrom work import compute\n\n"
                           "def test_small():\n    assert compute(10) == 285\n\n"
                           "def test_large():\n    assert compute(1000) == 332833500\n"),
    "scripts/writer.py": WRITER,
    "pytest.ini": "[pytest]\ntestpaths = tests\n",
    # The score runs in another folder, with another variable, another argv and interpreter flag,
    # under a shell script: every difference from the gate a cheater could look for.
    "scripts/score.sh": "export BENCH_MODE=1\ncd scripts\npython -S score.py \"$@\"\necho done\n",
    "scripts/score.py": ("import sys\nsys.path.insert(0, '../code')\nfrom work import compute\n\n"
                         "print('sum of squares', compute(2_000_000))\n"
                         "print('{\"note\": \"a JSON line without the metric is a result too\"}')\n"),
    "scripts/results.py": ("import os, sys\nsys.path.insert(0, 'code')\nfrom work import compute\n\n"
                           "os.makedirs('out', exist_ok=True)\n"
                           "with open('out/result.txt', 'w') as handle:\n"
                           "    handle.write(f'{compute(2_000_000)}\\n')\n"),
}


def _spec(results: str, population: int, *, score: str = "sh scripts/score.sh") -> str:
    return f"""name = "watched"
objective = "Make compute() faster without changing its result"
population = {population}
rounds = [{population}, 1]
concurrency = {min(population, 3)}

[worker]
provider = "command"
command = "python scripts/writer.py"
write_roots = ["code"]

[hard_gates]
commands = ["python -m pytest -q -p no:cacheprovider tests"]
protected_paths = ["tests", "scripts"]

[score]
command = "{score}"
metric = "runtime:cpu_seconds"
direction = "minimize"
trials = 2
{results}

[selection]
policy = "ordered"
ordering = ["score", "diff_lines"]
"""


def _run(personas, tmp_path, spec: str, files: dict[str, str] = FILES):
    repo = repo_create(tmp_path / "repo", files)
    search = services.search_freeze(personas.owner, personas.alpha, spec, "HEAD", repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    outcome = services.search_run_inline(search)
    return search, outcome, {c.candidate_id: c for c in search.candidates.all()}


@pytest.mark.django_db(transaction=True)
def test_a_candidate_that_computes_wrong_only_while_timed_is_eliminated_whatever_tells_it_so(
        personas, tmp_path, data_dir, bubblewrap):
    _, outcome, candidates = _run(personas, tmp_path, _spec('results = "stdout"', len(CANDIDATES)))
    reasons = {cid: c.reason for cid, c in candidates.items()}
    for number, detector in enumerate(DETECTORS, start=2):
        cheater = candidates[f"cand_{number:03d}"]
        assert cheater.gates_passed == 1, (detector, reasons)  # right in the gates
        assert cheater.state == "eliminated", (detector, reasons)
        assert "its results differ from the baseline's in the same block" in cheater.reason, detector
        assert "stdout line 1: baseline `sum of squares 2666664666667000000` · candidate `sum of squares " \
               "14000000`" in cheater.reason, (detector, reasons)
    assert outcome.outcome == "winner" and outcome.winner.candidate_id == "cand_001", reasons
    trials = Receipt.objects.filter(detail__measures="cand_002", detail__has_key="results_check")
    assert trials and all(trial.detail["results_check"] == "differs" for trial in trials)
    assert all(len(trial.detail["results_sha256"]) == 64 for trial in trials)
    base = Receipt.objects.filter(detail__measures="baseline", detail__has_key="results_check").first()
    assert base.detail["results_check"] == "the baseline's"


@pytest.mark.django_db(transaction=True)
def test_a_results_file_written_wrong_only_while_timed_eliminates_its_candidate(
        personas, tmp_path, data_dir, bubblewrap):
    files = {**FILES, "scripts/writer.py": WRITER.replace("CODE[", "{'cand_001': CODE['cand_001'], "
                                                          "'cand_002': CODE['cand_003']}[")}
    spec = _spec('results = { files = ["out/result.txt"] }', 2,
                 score="BENCH_MODE=1 python -S scripts/results.py")
    _, outcome, candidates = _run(personas, tmp_path, spec, files)
    cheater = candidates["cand_002"]
    assert cheater.state == "eliminated" and "out/result.txt line 1: baseline `2666664666667000000` · " \
        "candidate `14000000`" in cheater.reason, cheater.reason
    assert outcome.winner.candidate_id == "cand_001"


@pytest.mark.django_db(transaction=True)
def test_a_baseline_whose_trial_writes_no_results_stops_the_search_with_a_reason(
        personas, tmp_path, data_dir, bubblewrap):
    spec = _spec('results = { files = ["out/never.txt"] }', 2, score="cd scripts && python -S score.py")
    search, outcome, _ = _run(personas, tmp_path, spec)
    stopped = search.steps.filter(result__has_key="spec_failure").first()
    assert stopped is not None, outcome
    assert "score.results: the baseline's trial in block" in stopped.result["spec_failure"]
    assert "it wrote nothing to `out/never.txt`" in stopped.result["spec_failure"]
    assert outcome.winner is None
