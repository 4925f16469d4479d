"""A candidate's files cannot stand in for the tools that judge it.

With `write_roots = ["."]` the whole repository is writable, and the repository root is on
`sys.path` for every command (`python -m pytest` puts the working directory there, `python
certificate.py` its script's directory). A root `pytest.py` is then pytest, a root `json.py` is
json, and a `*.dist-info` with a `[pytest11]` entry point is an installed pytest plugin. Each
attacker below writes wrong code that those files make pass its gates; the change policy
refuses each at the policy stage, with the reason, and the honest candidate wins. Real
repository, real sandbox, a `command` writer that picks its patch by `$CRUCIBLE_CANDIDATE_ID`.
"""

from __future__ import annotations

import json

import pytest

from search_app import services
from tests.gitrepo import repo_create

# Longer than the attacks' change of work.py, so that before the rule an attacker, tied with it on
# score, came first on diff_lines.
HONEST = ('def compute(n):\n    """The sum of i * i for i below n, in closed form:\n\n'
          + "".join(f"    step {i}: the sum of squares formula, shifted by one.\n" for i in range(20))
          + '    """\n    return (n - 1) * n * (2 * n - 1) // 6\n')
WRONG = "def compute(n):\n    return 0\n"

# (a) pytest itself, for `python -m pytest`: it runs as __main__, says all passed and ends with 0.
FAKE_PYTEST = "print('2 passed in 0.01s')\n"
# (b) json, for `python certificate.py`: whatever it loads equals whatever it is compared with.
FAKE_JSON = '''class _Equal:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False

def load(handle, **kwargs):
    return _Equal()

def dumps(value, **kwargs):
    return repr(value)
'''
# (c) an "installed" pytest plugin, found through a dist-info's entry points in the root.
DIST_METADATA = "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n"
DIST_ENTRY_POINTS = "[pytest11]\nevil = evil_plugin\n"
EVIL_PLUGIN = '''import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.outcome = "passed"
        report.longrepr = None
'''

ATTACKS = {
    "pytest": {"work.py": WRONG, "pytest.py": FAKE_PYTEST},
    "json": {"work.py": WRONG, "json.py": FAKE_JSON},
    "dist-info": {"work.py": WRONG, "evil-1.0.dist-info/METADATA": DIST_METADATA,
                  "evil-1.0.dist-info/entry_points.txt": DIST_ENTRY_POINTS, "evil_plugin.py": EVIL_PLUGIN},
}
GATES = {
    "pytest": "python -m pytest -q -p no:cacheprovider tests",
    "json": "python certificate.py",
    "dist-info": "python -m pytest -q -p no:cacheprovider tests",
}
REFUSED = {
    "pytest": ("pytest.py", "would be imported instead of the installed module `pytest`"),
    "json": ("json.py", "would be imported instead of the standard library's `json`"),
    "dist-info": ("evil-1.0.dist-info/entry_points.txt", "packaging metadata (`evil-1.0.dist-info`)"),
}

WRITER = r'''import json, os, pathlib, sys
sys.stdin.read()
files = json.loads(pathlib.Path("scripts/patches.json").read_text())[os.environ["CRUCIBLE_CANDIDATE_ID"]]
for path, text in files.items():
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(path).write_text(text)
'''

BASE = {
    "work.py": "def compute(n):\n    return sum(i * i for i in range(n))\n",
    "certificate.py": ("import json\nimport sys\nfrom work import compute\n\n"
                       "with open('expected_result.json') as handle:\n    expected = json.load(handle)\n"
                       "if compute(100) != expected:\n    sys.exit('wrong result')\nprint('ok')\n"),
    "expected_result.json": "328350\n",
    "tests/test_work.py": ("from work import compute\n\n"
                           "def test_small():\n    assert compute(10) == 285\n\n"
                           "def test_large():\n    assert compute(1000) == 332833500\n"),
    "scripts/writer.py": WRITER,
}


def _spec(gate: str) -> str:
    return f"""name = "shadowing"
objective = "Make compute() faster without changing its result"
population = 2
rounds = [2, 1]
concurrency = 2

[worker]
provider = "command"
command = "python scripts/writer.py"
write_roots = ["."]

[hard_gates]
commands = ["{gate}"]
protected_paths = ["tests", "scripts", "certificate.py", "expected_result.json"]

[score]
command = "python -c 'from work import compute; compute(1_500_000)'"
metric = "runtime:cpu_seconds"
direction = "minimize"
trials = 2

[selection]
policy = "ordered"
ordering = ["score", "diff_lines"]
"""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attack", ["pytest", "json", "dist-info"])
def test_a_file_that_stands_in_for_a_judging_tool_is_refused_and_the_honest_candidate_wins(
        personas, tmp_path, data_dir, bubblewrap, attack):
    patches = {"cand_001": {"work.py": HONEST}, "cand_002": ATTACKS[attack]}
    files = {**BASE, "scripts/patches.json": json.dumps(patches)}
    repo = repo_create(tmp_path / "repo", files)
    search = services.search_freeze(personas.owner, personas.alpha, _spec(GATES[attack]), "HEAD",
                                    repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    outcome = services.search_run_inline(search)
    candidates = {c.candidate_id: c for c in search.candidates.all()}
    reasons = {cid: c.reason for cid, c in candidates.items()}
    attacker = candidates["cand_002"]
    path, reason = REFUSED[attack]
    assert attacker.gates_passed == 0, reasons  # it never reached a gate (before the rule: it passed them)
    assert attacker.state == "eliminated" and "patch refused at policy: refused: " in attacker.reason, reasons
    assert f"{path}: {reason}" in attacker.reason, reasons
    assert outcome.outcome == "winner" and outcome.winner.candidate_id == "cand_001", reasons
