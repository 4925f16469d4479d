"""A candidate whose code rewrites the test runner's verdict from inside never wins.

Code the tests import runs inside pytest's own process. At import it can find pytest's plugin
manager among the interpreter's live objects (`gc.get_objects()`) and register a plugin whose
hooks turn every failure into a pass, or set the session's exit status to 0: wrong code passes
its gates ("2 passed"), and being wrong it is also the fastest. Nothing inside that process
can be trusted to say otherwise; the reviewer reads the patch from outside every command, and
with `selection.review = "blocking"` (the default) its reject eliminates the provisional winner
and the next candidate is replayed.
"""

from __future__ import annotations

import pytest

from search_app import services
from tests.gitrepo import repo_create

# Counts the primes below n by trial division: the baseline, slow and right.
BASELINE = '''def compute(n):
    count = 0
    for k in range(2, n):
        d = 2
        while d * d <= k:
            if k % d == 0:
                break
            d += 1
        else:
            count += 1
    return count
'''

# Honest and about three times faster: odd candidates and odd divisors up to the square root.
HONEST = '''from math import isqrt


def compute(n):
    if n <= 2:
        return 0
    count = 1
    for k in range(3, n, 2):
        for d in range(3, isqrt(k) + 1, 2):
            if k % d == 0:
                break
        else:
            count += 1
    return count
'''

# Wrong and instant; at import it finds pytest's Config through gc and registers a plugin whose
# report hook turns failures into passes. Written as the attacker found it (line 1: `import gc`).
THROUGH_GC = '''import gc


class _Green:
    def pytest_runtest_makereport(self, item, call):
        report = yield
        if report.failed:
            report.outcome = "passed"
            report.longrepr = None
        return report


for _obj in gc.get_objects():
    if type(_obj).__name__ == "Config" and type(_obj).__module__ == "_pytest.config":
        import pytest  # only where pytest already runs: the timed trials stay fast
        pytest.hookimpl(wrapper=True)(_Green.pytest_runtest_makereport)
        _obj.pluginmanager.register(_Green(), "green")
        break


def compute(n):
    return n // 10
'''

# The same, with nothing a text search would find: no `gc`, no `pytest`, no hook name in full.
OBFUSCATED = '''_m = __import__(bytes([103, 99]).decode())
_walk = getattr(_m, "get_" + "objects")


def _finish(self, session):
    session.exitstatus = 0


_quiet = type("Quiet", (), {"pytest" + "_sessionfinish": _finish})

for _obj in _walk():
    if type(_obj).__name__ == "Config" and hasattr(type(_obj), "getini"):
        getattr(_obj, "plugin" + "manager").register(_quiet(), "quiet")
        break


def compute(n):
    return n // 11
'''

CODE = {"cand_001": HONEST, "cand_002": THROUGH_GC, "cand_003": OBFUSCATED}
WRITER = f"""import os, pathlib, sys
sys.stdin.read()
pathlib.Path("code/work.py").write_text({CODE!r}[os.environ["CRUCIBLE_CANDIDATE_ID"]])
"""

FILES = {
    "code/work.py": BASELINE,
    "tests/test_work.py": ("import sys\nsys.path.insert(0, 'code')\nfrom work import compute\n\n"
                           "def test_small():\n    assert compute(100) == 25\n\n"
                           "def test_large():\n    assert compute(150000) == 13848\n"),
    "scripts/writer.py": WRITER,
    "pytest.ini": "[pytest]\ntestpaths = tests\n",
    "scripts/score.py": "import sys\nsys.path.insert(0, 'code')\nfrom work import compute\n\n"
                        "compute(150000)\n",
}

SPEC = """name = "verdict-rewrite"
objective = "Make compute() faster without changing its result"
population = 3
rounds = [3, 1]
concurrency = 3

[worker]
provider = "command"
command = "python scripts/writer.py"
write_roots = ["code"]

[hard_gates]
commands = ["python -m pytest -q -p no:cacheprovider tests"]
protected_paths = ["tests", "scripts"]

[score]
command = "python scripts/score.py"
metric = "runtime:cpu_seconds"
direction = "minimize"
trials = 2

[selection]
policy = "ordered"
ordering = ["score", "diff_lines"]
"""


@pytest.mark.django_db(transaction=True)
def test_code_that_rewrites_the_test_runners_verdict_through_gc_passes_its_gates_but_never_wins(
        personas, tmp_path, data_dir, bubblewrap):
    repo = repo_create(tmp_path / "repo", FILES)
    search = services.search_freeze(personas.owner, personas.alpha, SPEC, "HEAD", repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    outcome = services.search_run_inline(search)
    candidates = {c.candidate_id: c for c in search.candidates.all()}
    reasons = {cid: c.reason for cid, c in candidates.items()}
    for cid in ("cand_002", "cand_003"):
        forger = candidates[cid]
        # Wrong code, yet pytest said its tests passed: the verdict was rewritten from inside.
        assert forger.gates_passed == 1, reasons
        assert search.steps.filter(kind="replay", candidate=forger, result__passed=True).exists(), reasons
        assert forger.state == "eliminated" and "the reviewer rejects it" in forger.reason, reasons
        assert "blocking" in forger.reason, reasons
    # The finding names the line that reaches into the judge.
    assert "(gc) at code/work.py:1 " in candidates["cand_002"].reason, reasons
    obfuscated = candidates["cand_003"].reason
    assert "__import__" in obfuscated and "at code/work.py:1 " in obfuscated, reasons
    assert outcome.outcome == "winner" and outcome.winner.candidate_id == "cand_001", reasons
    assert "reviewer says approve" in outcome.winner.reason
