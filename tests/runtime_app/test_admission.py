"""A candidate's patch admitted into a plain evaluation tree: the numstat read in this process says
what `git apply --numstat` says, a patch is judged by the change policy on the files the tree holds,
and a refused one leaves nothing behind."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from runtime_app import services
from runtime_app.admission import numstat_read, tree_judge
from runtime_app.policy import PolicyRules
from runtime_app.worktrees import (
    patch_extract,
    patch_from_text,
    tree_remove,
    worktree_create,
    worktree_remove,
)
from tests.gitrepo import git

pytestmark = pytest.mark.django_db

RULES = PolicyRules(write_roots=("code", "src"), protected_paths=("tests",))


def candidate_patch(repo: Path, v1: str, edit) -> bytes:
    worktree = worktree_create(repo, v1, f"cand_{uuid.uuid4().hex[:6]}")
    try:
        edit(worktree)
        return patch_extract(worktree).text
    finally:
        worktree_remove(repo, worktree)


def many_kinds(worktree: Path) -> None:
    code = worktree / "code"
    (code / "certificate.py").write_text("--- looks like a header\n+++ and so does this\n")
    (code / "with space.py").write_text("x = 1\n")
    (code / 'quote"d.py').write_text("y = 2\n")
    (code / "ünï.py").write_text("z = 3\n")
    (code / "empty.py").write_text("")
    (code / "blob.bin").write_bytes(b"\0\1\2binary")
    (code / "no_newline.py").write_text("w = 4")
    (worktree / "README.md").unlink()
    os.chmod(worktree / "scripts" / "benchmark_candidate.sh", 0o755)  # noqa: S103  (a mode change)


def test_the_numstat_read_in_process_is_git_s(repo, v1):
    text = candidate_patch(repo, v1, many_kinds)
    assert numstat_read(text) == patch_from_text(text).numstat


@pytest.mark.parametrize("text", [
    b"diff --git a/a.py b/b.py\nsimilarity index 90%\nrename from a.py\nrename to b.py\n",
    b"some words first\ndiff --git a/a.py b/a.py\n",
    b"diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/b.py\n@@ -1 +1 @@\n-a\n+b\n",
])
def test_a_patch_out_of_git_diff_s_shape_is_left_to_git(text):
    assert numstat_read(text) is None


def test_an_admitted_plain_tree_holds_the_patched_files_and_no_git_dir(repo, v1, data_dir):
    text = candidate_patch(repo, v1, lambda w: (w / "code" / "certificate.py").write_text("fast = 1\n"))
    listed = git(repo, "worktree", "list")
    tree, receipt = services.patch_admit(repo, v1, text, "eval_plain", RULES, plain=True)
    assert receipt.detail["verdict"] == "admitted" and tree == data_dir / "worktrees" / "eval_plain"
    assert (tree / "code" / "certificate.py").read_text() == "fast = 1\n"
    assert (tree / "tests" / "test_certificate.py").exists() and not (tree / ".git").exists()
    assert git(repo, "worktree", "list") == listed  # nothing registered
    tree_remove(tree)


def test_the_policy_judges_a_plain_tree_and_a_refused_one_is_removed(repo, v1, data_dir):
    text = candidate_patch(repo, v1, lambda w: (w / "tests" / "test_certificate.py").write_text("pass\n"))
    tree, receipt = services.patch_admit(repo, v1, text, "eval_refused", RULES, plain=True)
    assert tree is None and receipt.detail["stage"] == "policy"
    assert {v["path"] for v in receipt.detail["violations"]} == {"tests/test_certificate.py"}
    assert not (data_dir / "worktrees" / "eval_refused").exists()


@pytest.mark.parametrize("edit", ["a file becomes a directory", "a directory becomes a file"])
def test_a_path_that_changes_from_file_to_directory_is_judged_and_admitted(repo, v1, data_dir, edit):
    def change(worktree: Path) -> None:
        code = worktree / "code"
        if edit == "a file becomes a directory":
            (code / "certificate.py").unlink()
            (code / "certificate.py").mkdir()
            (code / "certificate.py" / "inner.py").write_text("x = 1\n")
        else:
            (code / "pkg").mkdir()
            (code / "pkg" / "mod.py").write_text("y = 2\n")

    text = candidate_patch(repo, v1, change)
    if edit == "a directory becomes a file":  # commit the directory, then the patch replaces it
        base = worktree_create(repo, v1, "base_dir")
        change(base)
        git(base, "add", "-A")
        git(base, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "dir")
        v1 = git(base, "rev-parse", "HEAD")
        worktree_remove(repo, base)
        text = candidate_patch(repo, v1, lambda w: (shutil.rmtree(w / "code" / "pkg"),
                                                    (w / "code" / "pkg").write_text("z = 3\n")))
    tree, receipt = services.patch_admit(repo, v1, text, "eval_kinds", RULES, plain=True)
    assert receipt.detail["verdict"] == "admitted", receipt.detail
    tree_remove(tree)


def test_a_submodule_in_a_plain_tree_is_refused(repo, v1, data_dir):
    sha = v1
    text = (f"diff --git a/src/sub b/src/sub\nnew file mode 160000\nindex 0000000..{sha[:7]}\n--- /dev/null\n"
            f"+++ b/src/sub\n@@ -0,0 +1 @@\n+Subproject commit {sha}\n").encode()
    tree, receipt = services.patch_admit(repo, v1, text, "eval_submodule", RULES, plain=True)
    assert tree is None and receipt.detail["verdict"] == "rejected"
    assert "submodule" in receipt.detail["reason"]
    assert not (data_dir / "worktrees" / "eval_submodule").exists()


def test_a_numstat_that_names_another_path_than_git_applied_refuses_the_patch(repo, v1, data_dir):
    """The in-process numstat is only ever trusted as far as tree_apply checks it against git."""
    text = candidate_patch(repo, v1, lambda w: (w / "code" / "certificate.py").write_text("fast = 1\n"))
    detail: dict = {}
    wrong = [(1, 2, "code/other.py")]
    assert tree_judge(repo, v1, text, "eval_wrong", RULES, wrong, detail) is None
    assert detail["stage"] == "apply" and "declares" in detail["reason"]
    assert not (data_dir / "worktrees" / "eval_wrong").exists()


def test_an_evaluation_tree_needs_no_git_process_beyond_three(repo, v1, data_dir, monkeypatch):
    text = candidate_patch(repo, v1, lambda w: (w / "code" / "certificate.py").write_text("fast = 1\n"))
    started: list[list[str]] = []
    real = subprocess.Popen

    class Counting(real):  # type: ignore[misc,valid-type]
        def __init__(self, args, *rest, **options):
            if not isinstance(args, str | bytes) and Path(str(args[0])).name == "git":
                started.append(list(args))
            super().__init__(args, *rest, **options)

    monkeypatch.setattr(subprocess, "Popen", Counting)
    tree, receipt = services.patch_admit(repo, v1, text, "eval_counted", RULES, plain=True)
    assert receipt.detail["verdict"] == "admitted"
    assert len(started) <= 3, started
    tree_remove(tree)
