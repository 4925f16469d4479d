"""A candidate whose code forces its own gates' exit code never wins while the review blocks.

Code that a gate imports runs inside the gate's process, so it can end it with exit 0 before
any check runs (`os._exit(0)` at import): every gate passes, and a runtime-measured score is
tiny because nothing ran. The reviewer reads the patch from outside every command; with
`selection.review = "blocking"` (the default) its reject eliminates the provisional winner and
the next candidate is replayed.
"""

from __future__ import annotations

import pytest

from search_app import services
from tests.gitrepo import repo_create

WRITER = r'''import os, pathlib, sys
sys.stdin.read()
FAST = "def compute(n):\n    return (n - 1) * n * (2 * n - 1) // 6\n"
# Wrong, and it ends whatever process imports it with exit 0 before a single check runs.
EARLY_EXIT = "import os\nos._exit(0)\n\ndef compute(n):\n    return 285\n"
SLOWER = "def compute(n):\n    total = 0\n    for i in range(n):\n        total += i * i\n    return total\n"
code = {"cand_001": FAST, "cand_002": EARLY_EXIT, "cand_003": SLOWER}[os.environ["CRUCIBLE_CANDIDATE_ID"]]
pathlib.Path("code/work.py").write_text(code)
'''

FILES = {
    "code/work.py": "def compute(n):\n    return sum(i * i for i in range(n))\n",
    "tests/test_work.py": ("import sys\nsys.path.insert(0, 'code')\nfrom work import compute\n\n"
                           "def test_small():\n    assert compute(10) == 285\n\n"
                           "def test_large():\n    assert compute(1000) == 332833500\n"),
    "scripts/writer.py": WRITER,
    "pytest.ini": "[pytest]\ntestpaths = tests\n",
    # Work every honest run pays after the import, whatever compute() does: an early exit skips it.
    "scripts/score.py": ("import sys\nsys.path.insert(0, 'code')\nfrom work import compute\n\n"
                         "sum(i % 7 for i in range(2_000_000))\ncompute(1_500_000)\n"),
}


def _spec(review: str | None) -> str:
    review_line = f'review = "{review}"' if review else ""
    return f"""name = "early-exit"
objective = "Make compute() faster without changing its result"
population = 3
rounds = [3, 1]
concurrency = 3

[worker]
provider = "command"
command = "python scripts/writer.py"
write_roots = ["code"]

[hard_gates]
commands = ["python -c \\"import sys; sys.path.insert(0, 'code'); import work\\"",
            "python -m pytest -q -p no:cacheprovider tests"]
protected_paths = ["tests", "scripts"]

[score]
command = "python scripts/score.py"
metric = "runtime:cpu_seconds"
direction = "minimize"
trials = 2

[selection]
policy = "ordered"
ordering = ["score", "diff_lines"]
{review_line}
"""


def _run(personas, tmp_path, review: str | None):
    repo = repo_create(tmp_path / "repo", FILES)
    search = services.search_freeze(personas.owner, personas.alpha, _spec(review), "HEAD",
                                    repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    outcome = services.search_run_inline(search)
    return search, outcome, {c.candidate_id: c for c in search.candidates.all()}


@pytest.mark.django_db(transaction=True)
def test_a_candidate_that_exits_early_at_import_passes_its_gates_but_the_blocking_review_eliminates_it(
        personas, tmp_path, data_dir, bubblewrap):
    search, outcome, candidates = _run(personas, tmp_path, None)
    reasons = {cid: c.reason for cid, c in candidates.items()}
    forger = candidates["cand_002"]
    # Its gates passed and nothing it ran cost any CPU: it was the provisional winner.
    assert forger.gates_passed == 2, reasons
    assert search.steps.filter(kind="replay", candidate=forger, result__passed=True).exists(), reasons
    assert forger.state == "eliminated" and "the reviewer rejects it" in forger.reason, reasons
    assert "forces success at code/work.py:" in forger.reason and "blocking" in forger.reason
    assert outcome.outcome == "winner" and outcome.winner.candidate_id == "cand_001", reasons
    assert "reviewer says approve" in outcome.winner.reason


@pytest.mark.django_db(transaction=True)
def test_an_advisory_review_leaves_the_decision_to_a_person(personas, tmp_path, data_dir, bubblewrap):
    _, outcome, _ = _run(personas, tmp_path, "advisory")
    assert outcome.outcome == "winner" and outcome.winner.candidate_id == "cand_002"
    reason = outcome.winner.reason
    assert "reviewer says reject" in reason and "awaiting human approval" in reason


@pytest.mark.django_db(transaction=True)
def test_a_search_frozen_before_reviews_could_block_runs_as_it_was_frozen(personas, tmp_path, data_dir,
                                                                         bubblewrap):
    repo = repo_create(tmp_path / "repo", FILES)
    search = services.search_freeze(personas.owner, personas.alpha, _spec(None), "HEAD",
                                    repository_path=str(repo))
    type(search).objects.filter(pk=search.pk).update(contract=2)  # what the migration leaves older searches
    search.refresh_from_db()
    services.search_start(personas.owner, search, enqueue=False)
    outcome = services.search_run_inline(search)
    assert outcome.winner.candidate_id == "cand_002" and "reviewer says reject" in outcome.winner.reason


def test_review_blocking_is_left_out_of_the_search_id_at_its_default():
    from search_app.spec import spec_normalized, spec_validate

    blocking = spec_normalized(spec_validate(_spec(None)).spec)
    assert "review" not in blocking["selection"]
    assert spec_normalized(spec_validate(_spec("blocking")).spec) == blocking
    assert spec_normalized(spec_validate(_spec("advisory")).spec)["selection"]["review"] == "advisory"
