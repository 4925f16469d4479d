"""Bounded growth, tried as an attacker would: a real scripted command writer in a real repository
writes a huge file or thousands of files, and the search must refuse the candidate with a reason
while the registered repository's object store stays as it was.

The writer (committed in the baseline as scripts/writer.py) follows plan.json:
  "blob"     writes code/blob.bin: 64 MiB of seeded random bytes (incompressible)
  "many"     writes 5,000 small files under code/gen/
  N (int)    code/answer.py returns N
  "nothing"  changes nothing
"""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from pathlib import Path

import pytest

from search_app import services
from tests.gitrepo import git, repo_create
from tests.search_app.runs import fates, run_inline, spec_text

pytestmark = pytest.mark.django_db(transaction=True)

BLOB_SEED, BLOB_BYTES = 64, 64 << 20
WRITER = f'''import json, os, pathlib, random, sys
sys.stdin.read()
what = json.loads(pathlib.Path("plan.json").read_text()).get(os.environ["CRUCIBLE_CANDIDATE_ID"], "nothing")
if what == "blob":
    pathlib.Path("code/blob.bin").write_bytes(random.Random({BLOB_SEED}).randbytes({BLOB_BYTES}))
elif what == "many":
    pathlib.Path("code/gen").mkdir()
    for n in range(5000):
        pathlib.Path(f"code/gen/m{{n}}.py").write_text(f"N = {{n}}\\n")
elif isinstance(what, int):
    pathlib.Path("code/answer.py").write_text(f"def answer():\\n    return {{what}}\\n")
'''


def growth_search(personas, tmp_path: Path, plan: dict, worker_keys: str = ""):
    repo = repo_create(tmp_path / f"repo-{uuid.uuid4().hex[:6]}", {
        "code/answer.py": "def answer():\n    return 2\n",
        "tests/test_answer.py": "def test_answer():\n    assert True\n",
        "scripts/writer.py": WRITER,
        "plan.json": json.dumps(plan),
    })
    spec = spec_text(population=2, rounds=[2, 1], trials=1)
    spec = spec.replace("refine = false\n", f"refine = false\n{worker_keys}")
    search = services.search_freeze(personas.owner, personas.alpha, spec, "HEAD", repository_path=str(repo))
    return search, repo


def object_store_kib(repo: Path) -> tuple[int, int]:
    """(loose objects, KiB of loose and packed objects) as `git count-objects -v` counts them."""
    counts = dict(line.split(": ") for line in git(repo, "count-objects", "-v").splitlines())
    return int(counts["count"]), int(counts["size"]) + int(counts["size-pack"])


def blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324  (git's object name)


def test_a_writer_that_writes_a_64_mib_file_is_refused_and_the_repository_does_not_grow(
    personas, tmp_path, data_dir
):
    search, repo = growth_search(personas, tmp_path, {"cand_001": "blob", "cand_002": 4})
    before = object_store_kib(repo)
    run = run_inline(personas, search)
    state, reason = fates(search)["cand_001"]
    assert state == "eliminated"
    assert "the patch changes 64.0 MiB in 1 file, over worker.max_patch_bytes = 10.0 MiB" in reason
    assert bytes(search.candidates.get(candidate_id="cand_001").patch) == b""  # no 86 MB row
    assert run.winner.candidate_id == "cand_002"  # an ordinary candidate still goes all the way
    loose, kib = object_store_kib(repo)
    assert loose - before[0] <= 2 and kib - before[1] <= 8  # close to nothing, not 64 MiB
    sha = blob_sha(random.Random(BLOB_SEED).randbytes(BLOB_BYTES))
    assert not (repo / ".git" / "objects" / sha[:2] / sha[2:]).exists()
    assert sha not in git(repo, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)")


def test_a_writer_that_writes_5000_small_files_is_refused_by_max_patch_files(personas, tmp_path, data_dir):
    search, repo = growth_search(personas, tmp_path, {"cand_001": "many", "cand_002": "nothing"})
    before = object_store_kib(repo)
    run_inline(personas, search)
    state, reason = fates(search)["cand_001"]
    assert state == "eliminated"
    assert "the patch changes 5,000 files, over worker.max_patch_files = 1,000" in reason
    assert bytes(search.candidates.get(candidate_id="cand_001").patch) == b""
    assert object_store_kib(repo) == before


def test_caps_raised_in_the_spec_let_the_same_writer_through_to_the_change_policy(
    personas, tmp_path, data_dir
):
    search, repo = growth_search(personas, tmp_path, {"cand_001": "many", "cand_002": "nothing"},
                                 worker_keys="max_patch_files = 6000\n")
    before = object_store_kib(repo)
    run_inline(personas, search)
    candidate = search.candidates.get(candidate_id="cand_001")
    assert candidate.patch and b"code/gen/m4999.py" in bytes(candidate.patch)  # extracted, stored
    assert "not better than the baseline" in candidate.reason  # admitted, gated and scored like any other
    assert object_store_kib(repo) == before
