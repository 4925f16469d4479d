"""Commits and tags made with dulwich for merges and evolution snapshots: explicit author,
message and trailers, no hooks, branches and tags that only move when they should."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from runtime_app.git import GitError, commit_create, ref_resolve, repo_open, tag_create
from runtime_app.worktrees import patch_apply, patch_extract, worktree_create, worktree_tree
from tests.gitrepo import GIT_ENV, git, repo_create

AUTHOR = "Ada Lovelace <ada@crucible.invalid>"
WHEN = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone(timedelta(hours=2)))
TRAILERS = {"Crucible-Search": "search-7", "Crucible-Candidate": "cand_003",
            "Crucible-Patch-SHA256": "ab" * 32}


@pytest.fixture
def patched(repo, v1) -> Path:
    """A worktree at v1 with a candidate's change applied and staged by patch_apply."""
    source = worktree_create(repo, v1, "cand_003")
    (source / "code" / "certificate.py").write_text(
        "def certificate(n):\n    return (n - 1) * n * (2 * n - 1) // 6\n"
    )
    (source / "code" / "fast.py").write_text("FAST = True\n")
    return patch_apply(repo, v1, patch_extract(source).text, "merge_003")


def show(repo: Path, *args: str) -> str:
    return git(repo, "show", "-s", *args)


def message_of(repo: Path, sha: str) -> str:
    repository = repo_open(repo)
    try:
        return repository[sha.encode()].message.decode()
    finally:
        repository.close()


def test_a_commit_from_a_patched_worktree_has_its_tree_the_parent_author_and_trailers(repo, v1, patched):
    sha = commit_create(
        repo, message="Closed form for certificate\n\nFound by search 7.", author=AUTHOR,
        trailers=TRAILERS, parent_commit=v1, tree_from_worktree=patched, when=WHEN,
    )
    assert git(repo, "cat-file", "-t", sha) == "commit"
    assert git(repo, "rev-parse", f"{sha}^{{tree}}") == worktree_tree(patched)
    assert git(repo, "rev-parse", f"{sha}^") == v1
    assert show(repo, "--format=%an <%ae>|%cn <%ce>|%aI|%cI", sha) == (
        f"{AUTHOR}|{AUTHOR}|2026-03-04T05:06:07+02:00|2026-03-04T05:06:07+02:00"
    )
    assert message_of(repo, sha) == (
        "Closed form for certificate\n\nFound by search 7.\n\n"
        "Crucible-Search: search-7\nCrucible-Candidate: cand_003\n"
        f"Crucible-Patch-SHA256: {'ab' * 32}\n"
    )
    assert show(repo, "--format=%(trailers:key=Crucible-Candidate,valueonly)", sha) == "cand_003"
    git(repo, "fsck", "--strict", "--no-dangling")


def test_a_commit_changes_no_branch_unless_asked(repo, v1, patched):
    refs_before = git(repo, "for-each-ref")
    commit_create(repo, message="snapshot", author=AUTHOR, trailers={}, parent_commit=v1,
                  tree_from_worktree=patched, when=WHEN)
    assert git(repo, "for-each-ref") == refs_before


def test_a_commit_can_create_a_branch_and_advance_it_only_from_its_parent(repo, v1, patched):
    first = commit_create(repo, message="merge", author=AUTHOR, trailers={}, parent_commit=v1,
                          tree_from_worktree=patched, when=WHEN, branch="crucible/search-7")
    assert git(repo, "rev-parse", "crucible/search-7") == first
    second = commit_create(repo, message="again", author=AUTHOR, trailers={}, parent_commit=first,
                           tree_from_worktree=patched, when=WHEN, branch="crucible/search-7")
    assert git(repo, "rev-parse", "crucible/search-7") == second
    with pytest.raises(GitError, match="does not point at the parent commit any more; not moved"):
        commit_create(repo, message="stale", author=AUTHOR, trailers={}, parent_commit=first,
                      tree_from_worktree=patched, when=WHEN, branch="crucible/search-7")
    assert git(repo, "rev-parse", "crucible/search-7") == second
    assert git(repo, "rev-parse", "main") != second  # the user's branches are untouched


def test_a_commit_from_the_repositorys_own_index_takes_what_is_staged(tmp_path, data_dir):
    files = {"manifest.yaml": "name: agent\n", "prompts/system.md": "Be brief.\n"}
    workspace = repo_create(tmp_path / "workspace", files)
    head = git(workspace, "rev-parse", "HEAD")
    (workspace / "prompts" / "system.md").write_text("Be brief and exact.\n")
    (workspace / "memory.md").write_text("unstaged notes\n")
    git(workspace, "add", "prompts/system.md")
    sha = commit_create(workspace, message="evo-1", author=AUTHOR, trailers={"Evolution-Cycle": "1"},
                        parent_commit="HEAD", when=WHEN, branch="main")
    assert git(workspace, "rev-parse", "HEAD") == sha
    assert git(workspace, "show", f"{sha}:prompts/system.md") == "Be brief and exact."
    assert git(workspace, "ls-tree", "--name-only", "-r", sha).split() == sorted(files)
    assert git(workspace, "rev-parse", f"{sha}^") == head
    assert message_of(workspace, sha) == "evo-1\n\nEvolution-Cycle: 1\n"


def test_the_same_inputs_make_the_same_commit(tmp_path, data_dir):
    shas = []
    for name in ("one", "two"):
        path = repo_create(tmp_path / name, {"a.txt": "a\n"})
        shas.append(commit_create(path, message="m", author=AUTHOR, trailers=TRAILERS,
                                  parent_commit="main", when=WHEN))
    assert shas[0] == shas[1]


def test_a_root_commit_has_no_parent(tmp_path, data_dir):
    path = repo_create(tmp_path / "repo", {"a.txt": "a\n"})
    sha = commit_create(path, message="root", author=AUTHOR, trailers={}, parent_commit=None, when=WHEN)
    assert git(path, "rev-list", "--parents", "-n", "1", sha) == sha


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ({"author": "Ada"}, "author 'Ada': give it as 'Name <email>'"),
        ({"author": "Ada <ada@x>\nEvil: yes"}, "give it as 'Name <email>'"),
        ({"committer": "<nobody>"}, "committer '<nobody>'"),
        ({"message": "  \n "}, "give the commit a message"),
        ({"trailers": {"Bad Key": "v"}}, "trailer 'Bad Key'"),
        ({"trailers": {"Key": "two\nlines"}}, "trailer Key: give a value on one line"),
        ({"trailers": {"Key": " "}}, "trailer Key: give a value on one line"),
        ({"when": datetime(2026, 1, 1)}, "with a time zone"),
        ({"parent_commit": "no-such-branch"}, "no branch, tag or commit"),
        ({"branch": "bad..name"}, "not a valid branch name"),
    ],
)
def test_a_commit_with_bad_input_is_refused_with_a_reason(repo, arguments, reason):
    refs_before = git(repo, "for-each-ref")
    values = {"message": "m", "author": AUTHOR, "trailers": {}, "parent_commit": "main", "when": WHEN}
    with pytest.raises(GitError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        commit_create(repo, **(values | arguments))
    assert git(repo, "for-each-ref") == refs_before


def test_a_worktree_of_another_repository_is_refused_as_the_tree(tmp_path, repo, patched):
    other = repo_create(tmp_path / "other", {"a.txt": "a\n"})
    with pytest.raises(GitError, match="a worktree of another repository"):
        commit_create(other, message="m", author=AUTHOR, trailers={}, parent_commit="main",
                      tree_from_worktree=patched)


def test_hooks_never_run_when_committing_or_tagging(repo, v1, patched, tmp_path):
    marker = tmp_path / "hook-ran"
    for hook in ("pre-commit", "commit-msg", "prepare-commit-msg", "post-commit", "reference-transaction"):
        script = repo / ".git" / "hooks" / hook
        script.write_text(f"#!/bin/sh\necho {hook} >> {marker}\n")
        script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | GIT_ENV
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "plain"], cwd=repo, env=env, check=True)
    assert "pre-commit" in marker.read_text()  # the hooks do run when git is run plainly
    marker.unlink()
    sha = commit_create(repo, message="merge", author=AUTHOR, trailers=TRAILERS, parent_commit=v1,
                        tree_from_worktree=patched, branch="crucible/merge")
    tag_create(repo, "evo-1", sha, "after cycle 1", AUTHOR)
    assert not marker.exists()


def test_an_annotated_tag_is_created_and_peels_to_the_commit(repo, v1):
    tag = tag_create(repo, "pre-evo-1", v1, "Before cycle 1.", AUTHOR, when=WHEN)
    assert git(repo, "cat-file", "-t", "pre-evo-1") == "tag"
    assert git(repo, "rev-parse", "refs/tags/pre-evo-1") == tag
    assert git(repo, "rev-parse", "pre-evo-1^{commit}") == v1
    assert git(repo, "cat-file", "tag", tag) == (
        f"object {v1}\ntype commit\ntag pre-evo-1\ntagger {AUTHOR} 1772593567 +0200\n\nBefore cycle 1."
    )
    repository = repo_open(repo)
    try:
        assert ref_resolve(repository, "pre-evo-1") == v1
    finally:
        repository.close()
    git(repo, "fsck", "--strict", "--no-dangling")


def test_a_tag_accepts_a_branch_name_and_a_default_time(repo):
    tag_create(repo, "evo-1", "main", "after", AUTHOR)
    assert git(repo, "rev-parse", "evo-1^{commit}") == git(repo, "rev-parse", "main")
    tagged = datetime.fromisoformat(git(repo, "for-each-ref", "--format=%(taggerdate:iso-strict)",
                                        "refs/tags/evo-1"))
    assert abs(tagged - datetime.now(UTC)) < timedelta(minutes=1)


def test_an_existing_tag_is_never_moved(repo, v1):
    before = git(repo, "rev-parse", "v1")
    with pytest.raises(GitError, match="tag v1 already exists; tags are never moved"):
        tag_create(repo, "v1", "main", "move it", AUTHOR)
    assert git(repo, "rev-parse", "v1") == before


@pytest.mark.parametrize(("name", "tagger", "reason"), [
    ("bad name", AUTHOR, "not a valid tag name"),
    ("a..b", AUTHOR, "not a valid tag name"),
    ("ok", "nobody", "tagger 'nobody'"),
])
def test_a_tag_with_bad_input_is_refused(repo, name, tagger, reason):
    with pytest.raises(GitError, match=reason):
        tag_create(repo, name, "main", "m", tagger)
    assert "refs/tags/ok" not in git(repo, "for-each-ref")
