"""Evaluation trees (tree_apply, tree_remove): plain directories of a commit's files with a
patch applied, built without registering a worktree, writing under the repository's `.git`,
or taking the repository lock, in at most three git processes."""

from __future__ import annotations

import os
import shutil
import stat
import threading
from pathlib import Path

import pytest

from runtime_app import worktrees
from runtime_app.git import GitError
from runtime_app.worktrees import (
    patch_apply,
    patch_extract,
    patch_from_text,
    tree_apply,
    tree_remove,
    worktree_create,
)
from tests.gitrepo import BASELINE_FILES, git
from tests.runtime_app.test_worktrees import (
    BINARY,
    CONTEXT_MISMATCH,
    THERE_AND_BACK,
    TRUNCATED,
    TWO_FILES,
    files_of,
    registered,
)


def dot_git_listing(repo: Path) -> dict[str, bytes | None]:
    """Every path under the repository's .git with its bytes. (Not mtimes: git "freshens" an
    object it would have written by touching the existing copy, which changes nothing in it.)"""
    return {
        str(path.relative_to(repo)): None if path.is_dir() else path.read_bytes()
        for path in sorted((repo / ".git").rglob("*"))
    }


def git_calls(monkeypatch) -> list[str]:
    """The git subcommands run from now on (every git process starts in worktrees.git_run)."""
    calls: list[str] = []
    real = worktrees.git_run

    def counting(args, **kwargs):
        calls.append(args[0])
        return real(args, **kwargs)

    monkeypatch.setattr(worktrees, "git_run", counting)
    return calls


@pytest.fixture
def no_repo_lock(monkeypatch):
    def refused(repo_path):
        raise AssertionError(f"repo_lock taken for {repo_path}")

    monkeypatch.setattr(worktrees, "repo_lock", refused)


@pytest.fixture
def candidate_patch(repo, v1) -> bytes:
    """A writer's patch: modified, deleted, new, binary, executable and symlinked files."""
    worktree = worktree_create(repo, v1, "cand_001")
    (worktree / "code" / "certificate.py").write_text("def certificate(n):\n    return 0\n")
    (worktree / "docs" / "notes.md").unlink()
    (worktree / "data").mkdir()
    (worktree / "data" / "table.bin").write_bytes(BINARY)
    (worktree / "run.sh").write_text("#!/bin/sh\necho run\n")
    (worktree / "run.sh").chmod(0o755)
    (worktree / "link").symlink_to("README.md")
    text = patch_extract(worktree).text
    worktrees.worktree_remove(repo, worktree)
    return text


def test_a_tree_holds_the_same_files_as_an_applied_worktree_and_no_dot_git(
    repo, v1, candidate_patch, data_dir,
):
    tree = tree_apply(repo, v1, candidate_patch, "eval_001")
    applied = patch_apply(repo, v1, candidate_patch, "eval_002")
    assert tree == data_dir.resolve() / "worktrees" / "eval_001"
    assert files_of(tree) == files_of(applied)
    assert "docs/notes.md" not in files_of(tree) and files_of(tree)["data/table.bin"] == BINARY
    assert os.readlink(tree / "link") == "README.md"
    assert os.access(tree / "run.sh", os.X_OK) and not os.access(tree / "README.md", os.X_OK)
    assert not os.path.lexists(tree / ".git")


def test_building_a_tree_leaves_the_worktree_list_and_the_repository_dot_git_untouched(
    repo, v1, candidate_patch, no_repo_lock,
):
    before = (registered(repo), dot_git_listing(repo))
    tree_apply(repo, v1, candidate_patch, "eval_001")
    tree_apply(repo, v1, b"", "eval_002")
    assert (registered(repo), dot_git_listing(repo)) == before


def test_a_patch_costs_at_most_three_git_processes_and_an_empty_one_a_single_process(
    repo, v1, candidate_patch, monkeypatch,
):
    numstat = patch_from_text(candidate_patch).numstat
    calls = git_calls(monkeypatch)
    tree_apply(repo, v1, candidate_patch, "eval_001")
    assert len(calls) <= 3, calls
    calls.clear()
    tree_apply(repo, v1, candidate_patch, "eval_002", numstat=numstat)
    assert len(calls) <= 3, calls
    calls.clear()
    tree_apply(repo, v1, b"", "eval_003")
    assert len(calls) == 1, calls


def test_an_empty_patch_gives_the_commits_files(repo, v1):
    tree = tree_apply(repo, v1, b"", "eval_001")
    assert files_of(tree) == {path: text.encode() for path, text in BASELINE_FILES.items()}


def test_the_files_are_readable_by_other_users_whatever_the_servers_umask(repo, v1, candidate_patch):
    previous = os.umask(0o077)
    try:
        tree = tree_apply(repo, v1, candidate_patch, "eval_001")
    finally:
        os.umask(previous)
    for path in [tree, *tree.rglob("*")]:
        if not path.is_symlink():
            assert path.stat().st_mode & 0o004, path


@pytest.mark.parametrize(("patch", "reason"), [
    (TWO_FILES, "it does not apply to [0-9a-f]{12} .*code/certificate"),
    (CONTEXT_MISMATCH, "it does not apply to [0-9a-f]{12} .*patch does not apply"),
    (TRUNCATED, "corrupt patch"),
    (THERE_AND_BACK, "the applied tree changes nothing but the patch declares M README.md"),
    (b"--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-# certificate\n+# faster\n",
     "only `git diff` output is accepted"),
    (b"not a diff at all\n", "not a well-formed git diff"),
], ids=["second-hunk-fails", "context-mismatch", "truncated", "lying", "plain-unified", "garbage"])
def test_a_bad_or_lying_patch_is_rejected_with_its_reason_and_leaves_nothing(
    repo, v1, data_dir, patch, reason,
):
    before = dot_git_listing(repo)
    with pytest.raises(GitError, match=f"patch rejected for eval_001: .*{reason}"):
        tree_apply(repo, v1, patch, "eval_001")
    assert not (data_dir / "worktrees" / "eval_001").exists()
    assert dot_git_listing(repo) == before


def test_a_name_already_in_use_is_refused_and_the_existing_tree_is_left_alone(repo, v1):
    tree = tree_apply(repo, v1, b"", "eval_001")
    with pytest.raises(GitError, match="already exists"):
        tree_apply(repo, v1, b"", "eval_001")
    assert files_of(tree)["README.md"] == BASELINE_FILES["README.md"].encode()


def test_an_unknown_commit_is_refused_and_leaves_no_directory(repo, data_dir):
    with pytest.raises(GitError):
        tree_apply(repo, "0" * 40, b"", "eval_001")
    assert not (data_dir / "worktrees" / "eval_001").exists()


def test_trees_are_built_the_same_with_five_hundred_live_trees(
    repo, v1, candidate_patch, data_dir, monkeypatch,
):
    first = tree_apply(repo, v1, candidate_patch, "eval_000")
    for number in range(1, 500):
        shutil.copytree(first, data_dir / "worktrees" / f"eval_{number:03d}", symlinks=True)
    calls = git_calls(monkeypatch)
    tree = tree_apply(repo, v1, candidate_patch, "eval_500")
    assert files_of(tree) == files_of(first) and len(calls) <= 3
    assert registered(repo) == [str(repo)]


def test_a_candidates_gitattributes_and_the_repository_config_run_no_filter_or_hook(
    repo, v1, tmp_path, data_dir,
):
    """An attacker's patch names a filter driver the repository's config defines, asks for CRLF
    checkouts, and the repository points hooks and fsmonitor at programs: none of them runs, and
    every file on disk is the tree's exact bytes."""
    marker = tmp_path / "ran"
    program = tmp_path / "evil.sh"
    program.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {marker}\ncat\n")
    program.chmod(0o755)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for hook in ("post-checkout", "post-index-change", "pre-applypatch", "post-applypatch"):
        shutil.copy(program, hooks / hook)
    worktree = worktree_create(repo, v1, "cand_001")
    (worktree / ".gitattributes").write_text("* filter=evil eol=crlf ident\n")
    (worktree / "code" / "certificate.py").write_text("def certificate(n):\n    return 0  # $Id$\n")
    patch = patch_extract(worktree)
    worktrees.worktree_remove(repo, worktree)
    for key, value in (("filter.evil.smudge", str(program)), ("filter.evil.clean", str(program)),
                       ("filter.evil.process", str(program)), ("filter.evil.required", "true"),
                       ("core.hooksPath", str(hooks)), ("core.fsmonitor", str(program)),
                       ("core.autocrlf", "true"), ("core.eol", "crlf")):
        git(repo, "config", key, value)

    tree = tree_apply(repo, v1, patch.text, "eval_001")
    assert not marker.exists()
    assert (tree / "code" / "certificate.py").read_bytes() == b"def certificate(n):\n    return 0  # $Id$\n"
    assert (tree / "README.md").read_bytes() == BASELINE_FILES["README.md"].encode()


def test_two_trees_are_built_at_the_same_time_without_waiting_on_each_other(
    repo, v1, candidate_patch, monkeypatch, no_repo_lock,
):
    # Each build's first git call waits until the other build is in its own: a lock between
    # them would break the barrier.
    barrier = threading.Barrier(2, timeout=30)
    real = worktrees.git_run
    started: set[int] = set()

    def meeting(args, **kwargs):
        if threading.get_ident() not in started:
            started.add(threading.get_ident())
            barrier.wait()
        return real(args, **kwargs)

    monkeypatch.setattr(worktrees, "git_run", meeting)
    results: dict[str, Path | BaseException] = {}

    def build(name: str) -> None:
        try:
            results[name] = tree_apply(repo, v1, candidate_patch, name)
        except BaseException as error:
            results[name] = error

    threads = [threading.Thread(target=build, args=(name,)) for name in ("eval_001", "eval_002")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(result, Path) for result in results.values()), results
    assert files_of(results["eval_001"]) == files_of(results["eval_002"])


def test_removing_a_tree_deletes_it_whatever_state_a_command_left_it_in(repo, v1, candidate_patch):
    tree = tree_apply(repo, v1, candidate_patch, "eval_001")
    (tree / "code" / "certificate.py").chmod(0o000)
    (tree / "code").chmod(stat.S_IRUSR)
    tree.chmod(stat.S_IRUSR | stat.S_IXUSR)
    tree_remove(tree)
    assert not os.path.lexists(tree)


def test_removing_a_legacy_worktree_deletes_its_files_and_its_name_can_be_used_again(repo, v1):
    legacy = worktree_create(repo, v1, "eval_001")
    tree_remove(legacy)
    assert not os.path.lexists(legacy)
    assert files_of(worktree_create(repo, v1, "eval_001"))["README.md"]


@pytest.mark.parametrize("path", ["/tmp", "/tmp/eval_001", "eval_001", "../eval_001"])
def test_removing_refuses_any_path_not_directly_under_the_worktrees_root(data_dir, path, tmp_path):
    with pytest.raises(GitError, match="refusing to delete"):
        tree_remove(path)
