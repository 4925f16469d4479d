"""patch_admit holds every patch to the rules' size caps, whatever route it came by (a refinement,
an evaluation, a replay: a stored patch, not a freshly extracted one), and judges it without
writing anything into the repository's object store."""

from __future__ import annotations

import re
import uuid

import pytest

from runtime_app import services
from runtime_app.policy import PatchLimits, PolicyRules
from runtime_app.worktrees import patch_extract, worktree_create, worktree_remove
from tests.gitrepo import git

pytestmark = pytest.mark.django_db

RULES = PolicyRules(write_roots=("code",), protected_paths=("tests",))
HIGH = PatchLimits(max_bytes=1 << 30, max_files=100_000)


def candidate_patch(repo, v1, edit) -> bytes:
    worktree = worktree_create(repo, v1, f"cand_{uuid.uuid4().hex[:6]}")
    try:
        edit(worktree)
        return patch_extract(worktree, limits=HIGH).text
    finally:
        worktree_remove(repo, worktree)


def admit(repo, v1, patch_text: bytes, rules: PolicyRules = RULES):
    return services.patch_admit(repo, v1, patch_text, f"eval_{uuid.uuid4().hex[:6]}", rules)


def object_store(repo) -> str:
    return git(repo, "count-objects", "-v") + git(repo, "cat-file", "--batch-all-objects", "--batch-check")


def many_files(worktree) -> None:
    for n in range(3):
        (worktree / "code" / f"m{n}.py").write_text(f"N = {n}\n")


def test_a_stored_patch_over_max_patch_bytes_is_refused_at_policy_before_it_is_applied(repo, v1, data_dir):
    text = candidate_patch(repo, v1, lambda w: (w / "code" / "big.py").write_text("x = 1\n" * 500))
    worktree, receipt = admit(repo, v1, text, PolicyRules(write_roots=("code",), max_patch_bytes=2000))
    assert worktree is None and receipt.exit_code == 1
    assert (receipt.detail["verdict"], receipt.detail["stage"]) == ("rejected", "policy")
    assert re.fullmatch(r"the patch is 3\.\d KiB of diff text, over worker\.max_patch_bytes = 2\.0 KiB; "
                        r"make a smaller change, or raise worker\.max_patch_bytes in the spec",
                        receipt.detail["reason"])
    assert not list((data_dir / "worktrees").iterdir())  # never applied


def test_a_stored_patch_with_more_files_than_max_patch_files_is_refused_at_policy(repo, v1, data_dir):
    text = candidate_patch(repo, v1, many_files)
    worktree, receipt = admit(repo, v1, text, PolicyRules(write_roots=("code",), max_patch_files=2))
    assert worktree is None and receipt.detail["stage"] == "policy"
    assert receipt.detail["reason"].startswith("the patch changes 3 files, over worker.max_patch_files = 2;")
    assert receipt.detail["files"] == ["code/m0.py", "code/m1.py", "code/m2.py"]
    assert not list((data_dir / "worktrees").iterdir())
    assert admit(repo, v1, text, PolicyRules(write_roots=("code",), max_patch_files=3))[0] is not None


def test_judging_a_patch_writes_nothing_into_the_repository_yet_the_policy_reads_its_content(repo, v1):
    binary = candidate_patch(repo, v1, lambda w: (w / "code" / "blob.bin").write_bytes(b"\0" * 50 + b"x"))
    plain = candidate_patch(repo, v1, lambda w: (w / "code" / "fast.py").write_text("FAST = True\n"))
    before = object_store(repo)
    refused, receipt = admit(repo, v1, binary)
    assert refused is None and "code/blob.bin: a binary file" in receipt.detail["reason"]
    admitted, receipt = admit(repo, v1, plain)
    assert receipt.detail["verdict"] == "admitted" and (admitted / "code" / "fast.py").exists()
    assert object_store(repo) == before
