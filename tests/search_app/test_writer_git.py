"""What a writer can do with git in its worktree, under the real sandbox (docs/running-searches.md,
"What a writer can do with git"): it reads every ref of the repository, it can write nothing
through git (the repository's .git is bound read-only), its patch is its files on disk against the
baseline whatever it tried to commit, and a writer that replaces its worktree's `.git` file
leaves no patch anyone will read."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest

from runtime_app import sandbox
from runtime_app.models import Receipt
from search_app import services
from tests.gitrepo import repo_create
from tests.helpers import service_missing
from tests.search_app.runs import fates

pytestmark = pytest.mark.django_db(transaction=True)

WRITER = r'''import json, os, pathlib, subprocess, sys
sys.stdin.read()

def git(*args):
    done = subprocess.run(["git", "-c", "user.name=w", "-c", "user.email=w@w", *args],
                          capture_output=True, text=True)
    return {"rc": done.returncode, "out": done.stdout[:200], "err": done.stderr[-200:]}

answer = pathlib.Path("code/answer.py")
if os.environ["CRUCIBLE_CANDIDATE_ID"] == "cand_002":
    answer.write_text("def answer():\n    return 5\n")
    pathlib.Path(".git").write_text("gitdir: /tmp/elsewhere\n")  # its own worktree's .git file
    sys.exit(0)
answer.write_text("def answer():\n    return 9\n")
seen = {"log": git("log", "--all", "--format=%s"),
        "show": git("show", "crucible/old-search:secret/hidden_test.py")}
pathlib.Path("code/leaked.py").write_text(seen["show"]["out"])
git_dir = git("rev-parse", "--git-dir")["out"].strip()
for name, args in {"add": ["add", "-A"], "commit": ["commit", "-qam", "writer"],
                   "stash": ["stash"], "branch": ["checkout", "-b", "writer"],
                   "update_ref": ["update-ref", "refs/heads/evil", "HEAD"],
                   "reset": ["reset", "--hard"]}.items():
    seen[name] = git(*args)
try:
    pathlib.Path(git_dir, "HEAD").write_text("0" * 40 + "\n")
    seen["admin_head"] = "written"
except OSError as error:
    seen["admin_head"] = error.strerror
print(json.dumps(seen))
'''

FILES = {
    "code/answer.py": "def answer():\n    return 2\n",
    "tests/test_answer.py": "def test_answer():\n    assert True\n",
    "scripts/writer.py": WRITER,
}

GATE = "python -c \"import sys; sys.path.insert(0, 'code'); import answer; assert answer.answer() > 0\""
SCORE = ("python -c \"import json, os, sys; sys.path.insert(0, 'code'); import answer; "
         "os.write(int(os.environ['CRUCIBLE_REPORT_FD']), json.dumps({'value': answer.answer()}).encode())\"")

SPEC = f"""name = "writer-git"
objective = "Make answer() return the largest number you can"
population = 2
rounds = [2, 1]
concurrency = 2

[worker]
provider = "command"
command = "python scripts/writer.py"
write_roots = ["code"]

[hard_gates]
commands = [{json.dumps(GATE)}]
protected_paths = ["tests", "scripts"]

[score]
command = {json.dumps(SCORE)}
metric = "value"
reported = "other"
direction = "maximize"
trials = 1
confidence = 0.5

[selection]
policy = "ordered"
ordering = ["score", "diff_lines"]
"""


def git(repo, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def sandboxed(settings):
    available, reason = sandbox.bubblewrap_probe()
    if not available:
        service_missing(reason)
    settings.CONFIG = dataclasses.replace(settings.CONFIG, sandbox="required")


def test_a_writer_reads_every_ref_writes_nothing_through_git_and_its_patch_is_its_files(
        personas, tmp_path, data_dir, sandboxed):
    repo = repo_create(tmp_path / "repo", FILES)
    # A previous search's merged winner, or tests someone kept on a side branch.
    git(repo, "checkout", "-q", "-b", "crucible/old-search")
    (repo / "secret").mkdir()
    (repo / "secret" / "hidden_test.py").write_text("SECRET-TOKEN = 42\n")
    git(repo, "add", "secret")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "old search's winner")
    git(repo, "checkout", "-q", "-")
    refs_before = git(repo, "for-each-ref", "--format=%(refname) %(objectname)")
    search = services.search_freeze(personas.owner, personas.alpha, SPEC, "HEAD", repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    services.search_run_inline(search)

    writer = Receipt.objects.get(label="cand_001 writer")
    assert writer.detail["sandbox"]["uid"] == 65534, writer.detail  # bubblewrap ran it
    seen = json.loads(writer.stdout_excerpt.strip().splitlines()[-1])
    # Every ref is readable: a side branch's file reaches the writer.
    assert "old search's winner" in seen["log"]["out"] and seen["show"]["out"] == "SECRET-TOKEN = 42\n"
    # Nothing is written through git: the repository's .git is read-only.
    for name in ("add", "commit", "stash", "branch", "update_ref", "reset"):
        assert seen[name]["rc"] != 0, (name, seen[name])
    assert "Read-only file system" in seen["commit"]["err"] and seen["admin_head"] == "Read-only file system"
    assert git(repo, "for-each-ref", "--format=%(refname) %(objectname)") == refs_before
    # The patch is the files on disk against the baseline, the commit attempt notwithstanding.
    cand_001 = search.candidates.get(candidate_id="cand_001")
    assert cand_001.files == ["code/answer.py", "code/leaked.py"], fates(search)
    assert b"SECRET-TOKEN = 42" in bytes(cand_001.patch) and b"return 9" in bytes(cand_001.patch)
    # A writer that rewrites its worktree's .git file is eliminated: no patch is read through it.
    cand_002 = search.candidates.get(candidate_id="cand_002")
    assert cand_002.state == "eliminated" and "its patch could not be extracted" in cand_002.reason
    assert "its .git does not point at a worktree record" in cand_002.reason and not cand_002.patch
