"""Worktrees under the data dir, the patches extracted from them and applied to fresh ones.

Real repositories built by tests.gitrepo; the data dir is a tmp dir; nothing is mocked."""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from dulwich import porcelain
from dulwich.patch import PatchApplicationFailure

from runtime_app import worktrees
from runtime_app.git import GitError
from runtime_app.policy import PatchLimits
from runtime_app.worktrees import (
    PatchLimitError,
    git_run,
    object_scratch,
    patch_apply,
    patch_extract,
    patch_from_text,
    patch_name_status,
    patched_tree,
    permissions_restore,
    worktree_create,
    worktree_prune,
    worktree_remove,
    worktree_tree,
)
from tests.gitrepo import BASELINE_FILES, GIT_ENV, git, repo_create

BINARY = bytes(range(256)) * 4 + b"\0\0tail\0"
HOOKS = ("post-checkout", "pre-commit", "commit-msg", "post-commit", "reference-transaction",
         "pre-applypatch", "post-index-change")


def registered(repo: Path) -> list[str]:
    lines = git(repo, "worktree", "list", "--porcelain").splitlines()
    return [line.removeprefix("worktree ") for line in lines if line.startswith("worktree ")]


def files_of(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and ".git" not in path.relative_to(root).parts
    }


def hooks_install(repo: Path, marker: Path) -> None:
    for hook in HOOKS:
        script = repo / ".git" / "hooks" / hook
        script.write_text(f"#!/bin/sh\necho {hook} >> {marker}\n")
        script.chmod(0o755)


# ---------------------------------------------------------------------------- create and remove


def test_a_worktree_is_a_detached_checkout_of_the_commit_under_the_data_dir(repo, v1, data_dir):
    worktree = worktree_create(repo, v1, "cand_001")
    assert worktree == (data_dir / "worktrees" / "cand_001").resolve()
    assert files_of(worktree) == {path: text.encode() for path, text in BASELINE_FILES.items()}
    assert git(worktree, "rev-parse", "HEAD") == v1
    assert str(worktree) in registered(repo)


def test_a_worktree_shares_the_object_store_instead_of_copying_it(repo, v1):
    worktree = worktree_create(repo, v1, "cand_001")
    assert (worktree / ".git").is_file()
    assert not list(worktree.rglob("objects"))
    assert git(worktree, "rev-parse", "--git-common-dir") == str(repo / ".git")


def test_a_worktree_is_detached_so_no_branch_is_checked_out_or_moved(repo, v1):
    worktree = worktree_create(repo, "main", "cand_001")
    assert git(worktree, "rev-parse", "--abbrev-ref", "HEAD") == "HEAD"
    assert git(worktree, "rev-parse", "HEAD") == git(repo, "rev-parse", "main")
    assert worktree_create(repo, "v1", "cand_002") and git(repo, "rev-parse", "main") != v1


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a..b", "../escape", "a/b", "-rf", ".hidden", "x" * 101, "a b", "café", "a\nb"]
)
def test_a_worktree_name_outside_the_pattern_is_refused_before_anything_is_made(repo, v1, data_dir, name):
    with pytest.raises(GitError, match="a worktree name is"):
        worktree_create(repo, v1, name)
    assert not (data_dir / "worktrees").exists() or not any((data_dir / "worktrees").iterdir())
    assert registered(repo) == [str(repo)]


def test_a_name_already_in_use_is_refused_and_the_existing_worktree_is_left_alone(repo, v1):
    worktree = worktree_create(repo, v1, "cand_001")
    (worktree / "work.txt").write_text("candidate's work\n")
    with pytest.raises(GitError, match=r"cand_001: .* already exists"):
        worktree_create(repo, v1, "cand_001")
    assert (worktree / "work.txt").read_text() == "candidate's work\n"


def test_an_unknown_commit_is_refused_and_leaves_no_directory(repo, data_dir):
    with pytest.raises(GitError, match="no branch, tag or commit"):
        worktree_create(repo, "no-such-ref", "cand_001")
    assert not (data_dir / "worktrees" / "cand_001").exists()


def test_a_git_failure_leaves_no_directory_and_no_record(repo, v1, data_dir):
    git(repo, "tag", "-a", "-m", "tree tag", "tree-tag", "v1^{tree}")
    tree_tag = git(repo, "rev-parse", "tree-tag")
    with pytest.raises(GitError, match="not a commit"):
        worktree_create(repo, tree_tag, "cand_001")
    assert not (data_dir / "worktrees" / "cand_001").exists()
    assert registered(repo) == [str(repo)]


def test_removing_a_worktree_deletes_its_files_and_its_record(repo, v1):
    worktree = worktree_create(repo, v1, "cand_001")
    (worktree / "scratch").mkdir()
    (worktree / "scratch" / "notes.txt").write_text("untracked\n")
    worktree_remove(repo, worktree)
    assert not worktree.exists()
    assert registered(repo) == [str(repo)]
    assert not (repo / ".git" / "worktrees" / "cand_001").exists()


def test_a_worktree_deleted_by_hand_is_removed_and_its_name_can_be_used_again(repo, v1):
    worktree = worktree_create(repo, v1, "cand_001")
    subprocess.run(["rm", "-rf", str(worktree)], check=True)
    assert str(worktree) in registered(repo)
    worktree_remove(repo, worktree)
    assert registered(repo) == [str(repo)]
    assert worktree_create(repo, v1, "cand_001") == worktree


def test_a_name_left_registered_by_a_crash_is_reused_after_an_automatic_prune(repo, v1):
    worktree = worktree_create(repo, v1, "cand_001")
    subprocess.run(["rm", "-rf", str(worktree)], check=True)
    assert worktree_create(repo, "main", "cand_001") == worktree
    assert registered(repo) == [str(repo), str(worktree)]
    assert git(worktree, "rev-parse", "HEAD") == git(repo, "rev-parse", "main")


def test_a_read_only_worktree_is_removed(repo, v1):
    worktree = worktree_create(repo, v1, "cand_001")
    locked = worktree / "locked"
    locked.mkdir()
    (locked / "secret.txt").write_text("x\n")
    locked.chmod(0)
    for directory in [worktree / "code", worktree / "docs", worktree]:
        directory.chmod(0o555)
    worktree_remove(repo, worktree)
    assert not worktree.exists()
    assert registered(repo) == [str(repo)]


def test_restoring_permissions_makes_every_directory_writable_without_following_symlinks(tmp_path):
    # The test suite runs as root here, where mode bits do not stop rmtree; this checks the
    # modes themselves, which is what a non-root Crucible needs.
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o500)
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "link").symlink_to(outside)
    for directory in [tree / "a" / "b", tree / "a", tree]:
        directory.chmod(0)
    permissions_restore(tree)
    for directory in [tree, tree / "a", tree / "a" / "b"]:
        assert stat.S_IMODE(directory.stat().st_mode) & 0o700 == 0o700
    assert stat.S_IMODE(outside.stat().st_mode) == 0o500


def test_a_worktree_replaced_by_a_symlink_is_unlinked_without_touching_its_target(repo, v1, tmp_path):
    worktree = worktree_create(repo, v1, "cand_001")
    subprocess.run(["rm", "-rf", str(worktree)], check=True)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("keep\n")
    worktree.symlink_to(precious)
    worktree_remove(repo, worktree)
    assert not os.path.lexists(worktree)
    assert (precious / "keep.txt").read_text() == "keep\n"
    assert registered(repo) == [str(repo)]


@pytest.mark.parametrize("path", ["/etc", "{repo}", "{data}/cand_001", "{data}/worktrees/../x"])
def test_removing_refuses_any_path_that_is_not_a_worktree_under_the_data_dir(repo, data_dir, path):
    path = path.format(repo=repo, data=data_dir)
    with pytest.raises(GitError, match="refusing to delete"):
        worktree_remove(repo, path)
    assert (repo / ".git").is_dir()


def test_writers_worktrees_are_added_at_once_without_waiting_on_each_other(repo, v1, monkeypatch):
    # Four adds meet inside git_run: under a repository-wide exclusive lock the first would hold it
    # while waiting for the others, and the barrier would break.
    barrier = threading.Barrier(4, timeout=60)
    real = worktrees.git_run
    met: set[int] = set()

    def meeting(args, **kwargs):
        if args[:2] == ["worktree", "add"] and threading.get_ident() not in met:
            met.add(threading.get_ident())  # each add's first try (one git made again is not waited for)
            barrier.wait()
        return real(args, **kwargs)

    monkeypatch.setattr(worktrees, "git_run", meeting)
    made: dict[str, Path | BaseException] = {}

    def add(name: str) -> None:
        try:
            made[name] = worktree_create(repo, v1, name)
        except BaseException as error:  # reported below, with its thread's name
            made[name] = error

    threads = [threading.Thread(target=add, args=(f"cand_00{n}",)) for n in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(path, Path) for path in made.values()), made
    for name, path in made.items():
        assert git(path, "rev-parse", "HEAD") == v1 and files_of(path) == files_of(made["cand_001"])
        assert str(path) in registered(repo), name
    for path in made.values():
        worktree_remove(repo, path)
    assert registered(repo) == [str(repo)]


def test_an_add_that_read_another_adds_half_written_record_is_made_again_alone(repo, v1, monkeypatch):
    # What git 2.39 does when two adds meet: the reader dies before making its own record.
    real, failed = worktrees.git_run, []

    def racing(args, **kwargs):
        if args[:2] == ["worktree", "add"] and not failed:
            failed.append(args)
            raise GitError("git worktree failed: fatal: failed to read .git/worktrees/cand_009/commondir")
        return real(args, **kwargs)

    monkeypatch.setattr(worktrees, "git_run", racing)
    worktree = worktree_create(repo, v1, "cand_001")
    assert failed and git(worktree, "rev-parse", "HEAD") == v1 and str(worktree) in registered(repo)


def test_a_prune_still_waits_for_the_adds_in_progress(repo, v1, monkeypatch):
    # An add holds the lock shared while git writes its record; a prune takes it exclusive, so it
    # can never drop the record of a worktree still being added.
    inside, release, added = threading.Event(), threading.Event(), threading.Event()
    order: list[str] = []
    real = worktrees.git_run

    def watched(args, **kwargs):
        if args[:2] == ["worktree", "add"]:
            inside.set()
            release.wait(60)
            out = real(args, **kwargs)
            added.set()
            return out
        if args[:2] == ["worktree", "prune"]:
            order.append("prune after the add" if added.is_set() else "prune during the add")
        return real(args, **kwargs)

    monkeypatch.setattr(worktrees, "git_run", watched)
    adding = threading.Thread(target=worktree_create, args=(repo, v1, "cand_001"))
    adding.start()
    assert inside.wait(60)
    pruning = threading.Thread(target=worktree_prune, args=(repo,))
    pruning.start()
    pruning.join(0.5)  # room for a prune that took no lock to run now (it would be seen below)
    release.set()
    adding.join()
    pruning.join()
    assert order == ["prune after the add"]
    assert str(worktrees.worktrees_root() / "cand_001") in registered(repo)


def test_prune_forgets_worktrees_whose_directory_is_gone_and_keeps_the_others(repo, v1):
    gone = worktree_create(repo, v1, "cand_001")
    kept = worktree_create(repo, v1, "cand_002")
    subprocess.run(["rm", "-rf", str(gone)], check=True)
    worktree_prune(repo)
    assert registered(repo) == [str(repo), str(kept)]


# -------------------------------------------------------------------------------- sealed git


def test_repository_hooks_never_run_when_worktrees_and_patches_are_made(repo, v1, tmp_path):
    marker = tmp_path / "hook-ran"
    hooks_install(repo, marker)
    plain_env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | GIT_ENV
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tmp_path / "plain"), v1],
                   cwd=repo, env=plain_env, check=True)
    assert "post-checkout" in marker.read_text()  # the hooks do run when git is run plainly
    marker.unlink()

    worktree = worktree_create(repo, v1, "cand_001")
    (worktree / "README.md").write_text("changed\n")
    patch = patch_extract(worktree)
    applied = patch_apply(repo, v1, patch.text, "eval_001")
    worktree_remove(repo, worktree)
    worktree_remove(repo, applied)
    assert not marker.exists()


def test_git_variables_and_user_config_of_the_server_do_not_leak_in(repo, v1, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "ignore").write_text("*.md\n")
    (home / ".gitconfig").write_text(
        f"[core]\n\texcludesFile = {home / 'ignore'}\n[diff]\n\tnoprefix = true\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "other-index"))
    worktree = worktree_create(repo, v1, "cand_001")
    (worktree / "README.md").write_text("changed\n")
    (worktree / "new.md").write_text("new\n")
    patch = patch_extract(worktree)
    assert patch.text.startswith(b"diff --git a/README.md b/README.md\n")
    assert patch.files == ["README.md", "new.md"]
    assert not (tmp_path / "other-index").exists() and not (tmp_path / "elsewhere").exists()


def test_a_git_call_that_outlives_its_timeout_is_killed_with_its_children(tmp_path):
    # A duration no other process on the machine has, so pgrep finds only this call's sleep.
    seconds = f"30.{uuid.uuid4().int % 10**9:09d}"
    started = time.monotonic()
    with pytest.raises(GitError, match=re.escape("timed out after 0.5 s")):
        git_run(["-c", f"alias.slow=!sleep {seconds}", "slow"], cwd=tmp_path, timeout=0.5)
    assert time.monotonic() - started < 5
    sleeping = subprocess.run(["pgrep", "-f", f"sleep {seconds}"], capture_output=True, text=True).stdout
    assert not sleeping.strip()


@pytest.mark.parametrize("fake_at", [".fake-git", "x/worktrees/cand_001"])
def test_a_candidate_that_rewrites_its_dot_git_file_cannot_aim_git_elsewhere(repo, v1, tmp_path, fake_at):
    marker = tmp_path / "fsmonitor-ran"
    worktree = worktree_create(repo, v1, "cand_001")
    fake = worktree / fake_at
    subprocess.run(["git", "init", "-q", "--bare", str(fake)], check=True, env={**os.environ, **GIT_ENV})
    (fake / "config").write_text(f"[core]\n\tfsmonitor = touch {marker}\n\tbare = false\n")
    (fake / "gitdir").write_text(f"{worktree / '.git'}\n")  # even the back-pointer is forged
    (worktree / ".git").write_text(f"gitdir: {fake}\n")
    with pytest.raises(GitError, match="does not point at a worktree record that points back"):
        patch_extract(worktree)
    (worktree / ".git").unlink()
    (worktree / ".git").symlink_to(fake)
    with pytest.raises(GitError, match="not a git worktree"):
        patch_extract(worktree)
    assert not marker.exists()
    worktree_remove(repo, worktree)
    assert registered(repo) == [str(repo)]


# ------------------------------------------------------------------------------------ extract


def test_an_untouched_worktree_gives_an_empty_patch(repo, v1):
    patch = patch_extract(worktree_create(repo, v1, "cand_001"))
    assert (patch.text, patch.numstat, patch.diff_lines, patch.files) == (b"", [], 0, [])
    assert patch.sha256 == hashlib.sha256(b"").hexdigest() and patch.empty


def candidate_work(worktree: Path) -> None:
    """Modified, deleted, new untracked, binary, renamed and ignored files."""
    (worktree / "code" / "certificate.py").write_text(
        "def certificate(n):\n    return (n - 1) * n * (2 * n - 1) // 6\n"
    )
    (worktree / "docs" / "notes.md").unlink()
    (worktree / "code" / "fast.py").write_text("FAST = True\n")
    (worktree / "data").mkdir()
    (worktree / "data" / "table.bin").write_bytes(BINARY)
    (worktree / "README.md").rename(worktree / "README.txt")
    (worktree / "run.log").write_text("ignored output\n")
    (worktree / "build").mkdir()
    (worktree / "build" / "cache.o").write_bytes(b"\0ignored")


@pytest.fixture
def ignoring_repo(tmp_path, data_dir) -> Path:
    return repo_create(tmp_path / "ignoring", {**BASELINE_FILES, ".gitignore": "*.log\nbuild/\n"})


def test_extract_covers_modified_deleted_new_binary_and_renamed_files_but_not_ignored_ones(ignoring_repo):
    worktree = worktree_create(ignoring_repo, "main", "cand_001")
    candidate_work(worktree)
    patch = patch_extract(worktree)
    assert patch.numstat == [
        (0, 3, "README.md"),
        (3, 0, "README.txt"),
        (1, 1, "code/certificate.py"),
        (1, 0, "code/fast.py"),
        (None, None, "data/table.bin"),
        (0, 1, "docs/notes.md"),
    ]
    assert patch.files == [path for _, _, path in patch.numstat]
    assert patch.diff_lines == 3 + 3 + 2 + 1 + 1
    assert patch.sha256 == hashlib.sha256(patch.text).hexdigest()
    assert b"GIT binary patch" in patch.text and b"run.log" not in patch.text and b"build/" not in patch.text
    assert b"new file mode 100644" in patch.text and b"deleted file mode 100644" in patch.text
    assert patch_name_status(patch.text) == {
        "README.md": "D", "README.txt": "A", "code/certificate.py": "M", "code/fast.py": "A",
        "data/table.bin": "A", "docs/notes.md": "D",
    }


def test_extract_leaves_the_worktree_index_and_status_as_they_were(repo, v1):
    worktree = worktree_create(repo, v1, "cand_001")
    candidate_work(worktree)
    index = Path(git(worktree, "rev-parse", "--git-path", "index"))
    index = index if index.is_absolute() else worktree / index
    before = (index.read_bytes(), git(worktree, "status", "--porcelain"))
    patch_extract(worktree)
    assert (index.read_bytes(), git(worktree, "status", "--porcelain")) == before
    assert "?? code/fast.py" in before[1]


def test_extracting_twice_gives_the_same_bytes_and_hash(repo, v1):
    worktree = worktree_create(repo, v1, "cand_001")
    candidate_work(worktree)
    first, second = patch_extract(worktree), patch_extract(worktree)
    assert first == second


def test_a_tracked_file_matching_an_ignore_rule_is_not_reported_as_deleted(tmp_path, data_dir):
    repo = repo_create(tmp_path / "repo", {".gitignore": "*.log\n", "keep.log": "tracked\n", "a.txt": "a\n"})
    git(repo, "add", "-f", "keep.log")
    git(repo, "commit", "-q", "-m", "track a log anyway")
    worktree = worktree_create(repo, "main", "cand_001")
    (worktree / "a.txt").write_text("b\n")
    assert patch_extract(worktree).files == ["a.txt"]
    (worktree / "keep.log").write_text("changed\n")
    assert patch_extract(worktree).files == ["a.txt", "keep.log"]


def test_extract_against_an_explicit_base_sees_changes_the_candidate_committed(repo, v1):
    worktree = worktree_create(repo, v1, "cand_001")
    (worktree / "README.md").write_text("committed by the candidate\n")
    git(worktree, "commit", "-q", "-am", "hide my change")
    assert patch_extract(worktree).empty  # HEAD moved along with the change
    assert patch_extract(worktree, base=v1).files == ["README.md"]
    with pytest.raises(GitError, match="full 40-character commit sha"):
        patch_extract(worktree, base="HEAD~1")


# -------------------------------------------------------------------------------------- apply


def test_an_extracted_patch_applied_to_a_fresh_worktree_gives_the_same_tree(repo, v1):
    source = worktree_create(repo, v1, "cand_001")
    candidate_work(source)
    patch = patch_extract(source)
    applied = patch_apply(repo, v1, patch.text, "eval_001")
    assert worktree_tree(applied) == worktree_tree(source)
    assert files_of(applied) == files_of(source)
    assert (applied / "data" / "table.bin").read_bytes() == BINARY
    assert patch_extract(applied).sha256 == patch.sha256


def test_an_applied_worktree_keeps_its_index_at_the_commit_so_it_names_only_objects_the_repo_has(repo, v1):
    source = worktree_create(repo, v1, "cand_001")
    candidate_work(source)
    patch = patch_extract(source)
    applied = patch_apply(repo, v1, patch.text, "eval_001")
    assert git(applied, "diff", "--cached", "--name-status") == ""  # nothing staged
    changed = git(applied, "diff", "--name-only").split() + git(applied, "ls-files", "--others").split()
    assert sorted(changed) == sorted(patch_name_status(patch.text))
    git(applied, "diff", "--stat")  # every object the index names is there to diff against
    git(repo, "fsck", "--no-dangling")  # and gc or fsck in the user's repository never miss one


def test_the_patched_tree_from_an_index_equals_the_tree_of_an_applied_worktree(repo, v1, data_dir):
    source = worktree_create(repo, v1, "cand_001")
    candidate_work(source)  # modified, deleted, new, binary and renamed files
    patch = patch_extract(source)
    assert patched_tree(repo, v1, patch.text) == worktree_tree(patch_apply(repo, v1, patch.text, "eval_001"))
    assert patched_tree(repo, v1, b"") == git(repo, "rev-parse", f"{v1}^{{tree}}")
    assert sorted(p.name for p in (data_dir / "worktrees").iterdir()) == ["cand_001", "eval_001"]


def test_a_patch_that_does_not_apply_gives_no_patched_tree_and_says_why(repo, v1):
    with pytest.raises(GitError, match=r"it does not apply to [0-9a-f]{12} .*code/certificate"):
        patched_tree(repo, v1, TWO_FILES)
    assert git(repo, "status", "--porcelain") == ""


def test_crlf_line_endings_survive_extract_and_apply_byte_for_byte(tmp_path, data_dir):
    repo = repo_create(tmp_path / "repo", {"README.md": "hi\n"})
    (repo / "windows.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    git(repo, "add", "windows.txt")
    git(repo, "commit", "-q", "-m", "crlf")
    source = worktree_create(repo, "main", "cand_001")
    (source / "windows.txt").write_bytes(b"one\r\nTWO\r\nthree\r\nfour\r\n")
    (source / "new.txt").write_bytes(b"mixed\r\nendings\nhere\r\n")
    patch = patch_extract(source)
    assert b"+TWO\r\n" in patch.text
    applied = patch_apply(repo, "main", patch.text, "eval_001")
    assert (applied / "windows.txt").read_bytes() == b"one\r\nTWO\r\nthree\r\nfour\r\n"
    assert (applied / "new.txt").read_bytes() == b"mixed\r\nendings\nhere\r\n"


def test_an_empty_patch_gives_a_clean_baseline_worktree(repo, v1):
    applied = patch_apply(repo, v1, b"", "eval_001")
    assert files_of(applied) == {path: text.encode() for path, text in BASELINE_FILES.items()}


def readme_diff(old: str, new: str) -> bytes:
    """A git diff of README.md's first line; the file's other two lines are its context."""
    return (
        "diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n@@ -1,3 +1,3 @@\n"
        f"-{old}\n+{new}\n \n Compute the certificate quickly.\n"
    ).encode()


# The README part applies; the second part's context line is not in the baseline.
TWO_FILES = readme_diff("# certificate", "# certificate, faster") + b"""\
diff --git a/code/certificate.py b/code/certificate.py
--- a/code/certificate.py
+++ b/code/certificate.py
@@ -1,2 +1,2 @@
 def certificate(n):
-    return sum(i * i for i in range(n + 1))
+    return (n - 1) * n * (2 * n - 1) // 6
"""


def assert_nothing_left(repo: Path, data_dir: Path, name: str) -> None:
    assert not (data_dir / "worktrees" / name).exists()
    assert registered(repo) == [str(repo)]


def test_a_multi_file_patch_whose_second_hunk_fails_is_rejected_and_nothing_is_left(repo, v1, data_dir):
    with pytest.raises(GitError, match=r"patch rejected for eval_001: it does not apply .*code/certificate"):
        patch_apply(repo, v1, TWO_FILES, "eval_001")
    assert_nothing_left(repo, data_dir, "eval_001")


def test_dulwich_apply_half_applies_the_same_patch_which_is_why_it_is_not_used(repo, v1, tmp_path):
    checkout = tmp_path / "dulwich-checkout"
    git(repo, "worktree", "add", "-q", "--detach", str(checkout), v1)
    with pytest.raises(PatchApplicationFailure):
        porcelain.apply_patch(str(checkout), io.BytesIO(TWO_FILES))
    assert (checkout / "README.md").read_text().startswith("# certificate, faster")  # no rollback


TRUNCATED = (  # a hunk cut short: its header promises five lines and two follow
    b"diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n@@ -1,5 +1,5 @@\n"
    b"-# certificate\n+# certificate, faster\n \n"
)


def test_a_patch_dulwich_checks_as_fine_but_git_apply_rejects_is_rejected(repo, v1, data_dir, tmp_path):
    checkout = tmp_path / "dulwich-checkout"
    git(repo, "worktree", "add", "-q", "--detach", str(checkout), v1)
    patch_file = tmp_path / "truncated.diff"
    patch_file.write_bytes(TRUNCATED)
    porcelain.apply_patch(str(checkout), str(patch_file), check=True)  # dulwich says it applies
    with pytest.raises(GitError, match=r"patch rejected for eval_001: .*corrupt patch"):
        patch_apply(repo, v1, TRUNCATED, "eval_001")
    assert not (data_dir / "worktrees" / "eval_001").exists()
    assert registered(repo) == [str(repo), str(checkout)]


CONTEXT_MISMATCH = b"""diff --git a/code/certificate.py b/code/certificate.py
--- a/code/certificate.py
+++ b/code/certificate.py
@@ -1,2 +1,2 @@
 def certificate(m):
-    return sum(i * i for i in range(n))
+    return (n - 1) * n * (2 * n - 1) // 6
"""


def test_a_patch_whose_context_does_not_match_is_rejected_by_the_check(repo, v1, data_dir):
    with pytest.raises(GitError, match=r"does not apply to [0-9a-f]{12} .*patch does not apply"):
        patch_apply(repo, v1, CONTEXT_MISMATCH, "eval_001")
    assert_nothing_left(repo, data_dir, "eval_001")


THERE_AND_BACK = readme_diff("# certificate", "# certificate, faster") + readme_diff(
    "# certificate, faster", "# certificate"
)


def test_a_patch_whose_applied_tree_differs_from_what_it_declares_is_rejected(repo, v1, data_dir):
    assert patch_name_status(THERE_AND_BACK) == {"README.md": "M"}
    declared = "the applied tree changes nothing but the patch declares M README.md"
    with pytest.raises(GitError, match=re.escape(declared)):
        patch_apply(repo, v1, THERE_AND_BACK, "eval_001")
    assert_nothing_left(repo, data_dir, "eval_001")


def test_a_plain_unified_diff_without_git_headers_is_rejected(repo, v1, data_dir):
    plain = b"--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-# certificate\n+# faster\n"
    with pytest.raises(GitError, match="only `git diff` output is accepted"):
        patch_apply(repo, v1, plain, "eval_001")
    assert_nothing_left(repo, data_dir, "eval_001")


def test_a_patch_to_a_path_outside_the_worktree_is_rejected_by_git(repo, v1, data_dir):
    escape = b"diff --git a/../escape.txt b/../escape.txt\nnew file mode 100644\n--- /dev/null\n" \
             b"+++ b/../escape.txt\n@@ -0,0 +1 @@\n+out\n"
    with pytest.raises(GitError, match="patch rejected"):
        patch_apply(repo, v1, escape, "eval_001")
    assert_nothing_left(repo, data_dir, "eval_001")
    assert not (data_dir / "worktrees" / "escape.txt").exists()


@pytest.mark.parametrize("new_name", ["docs/NOTES.md", "docs/né w.md", 'docs/"quoted"\ttab.md'])
def test_a_rename_patch_from_git_diff_m_declares_a_delete_and_an_add_and_applies(repo, v1, new_name):
    source = worktree_create(repo, v1, "cand_001")
    git(source, "mv", "docs/notes.md", new_name)
    renamed, reverse = (subprocess.run(
        ["git", "diff", "--cached", "-M", "--binary", "--full-index", *direction, v1], cwd=source,
        env={**os.environ, **GIT_ENV}, check=True, capture_output=True,
    ).stdout for direction in ([], ["-R"]))
    assert b"rename from docs/notes.md" in renamed
    assert patch_name_status(renamed) == {"docs/notes.md": "D", new_name: "A"}
    assert patch_name_status(reverse) == {new_name: "D", "docs/notes.md": "A"}  # quoted "rename from"
    assert patch_from_text(renamed).files == [new_name, "docs/notes.md"]
    applied = patch_apply(repo, v1, renamed, "eval_001")
    assert (applied / new_name).exists() and not (applied / "docs" / "notes.md").exists()


def test_applying_with_a_name_in_use_is_refused_and_the_existing_worktree_is_kept(repo, v1):
    existing = worktree_create(repo, v1, "eval_001")
    with pytest.raises(GitError, match="already exists"):
        patch_apply(repo, v1, b"", "eval_001")
    assert existing.exists() and str(existing) in registered(repo)


def test_git_in_a_directory_that_does_not_exist_is_a_git_error(tmp_path):
    with pytest.raises(GitError, match="could not start in"):
        git_run(["status"], cwd=tmp_path / "gone")


# ------------------------------------------------------------------- growth: objects and limits


def object_store(repo: Path) -> tuple[int, int, str]:
    """(loose objects, KiB in all, every object name) of the repository's object store."""
    counts = dict(line.split(": ") for line in git(repo, "count-objects", "-v").splitlines())
    names = git(repo, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)")
    return int(counts["count"]), int(counts["size"]) + int(counts["size-pack"]), names


def blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324  (git's object name)


HIGH = PatchLimits(max_bytes=1 << 30, max_files=100_000)


def test_extracting_a_20_mib_file_with_the_caps_raised_leaves_the_repository_object_store_unchanged(repo, v1):
    worktree = worktree_create(repo, v1, "cand_001")
    data = os.urandom(20 << 20)
    (worktree / "code" / "big.bin").write_bytes(data)
    before = object_store(repo)
    patch = patch_extract(worktree, limits=HIGH)
    assert patch.files == ["code/big.bin"] and len(patch.text) > 20 << 20
    assert worktree_tree(worktree) and patched_tree(repo, v1, patch.text)
    applied = patch_apply(repo, v1, patch.text, "eval_001")
    assert (applied / "code" / "big.bin").read_bytes() == data
    assert object_store(repo) == before
    assert blob_sha(data) not in before[2]


def test_applying_comparing_and_hashing_a_patch_write_nothing_into_the_repository(repo, v1):
    source = worktree_create(repo, v1, "cand_001")
    candidate_work(source)
    before = object_store(repo)
    patch = patch_extract(source)
    applied = patch_apply(repo, v1, patch.text, "eval_001")
    tree = worktree_tree(applied)
    assert patched_tree(repo, v1, patch.text) == tree == worktree_tree(source)
    assert object_store(repo) == before
    assert blob_sha(BINARY) not in before[2] and tree not in before[2]


def test_a_scratch_holds_the_objects_until_it_is_left_and_reads_the_repositorys_too(repo, v1):
    source = worktree_create(repo, v1, "cand_001")
    (source / "code" / "fast.py").write_text("FAST = True\n")
    with object_scratch(repo) as scratch:
        tree = worktree_tree(source, scratch=scratch)
        store = scratch.store()
        assert store[tree.encode()] and store[v1.encode()]  # its own objects and the repository's
        listing = git_run(["ls-tree", "-r", tree], cwd=repo, env=scratch.env).decode()
        assert "code/fast.py" in listing
        store.close()
    assert not scratch.path.exists()
    with pytest.raises(subprocess.CalledProcessError):
        git(repo, "cat-file", "-e", tree)


def test_a_repository_whose_path_has_a_colon_still_lends_its_objects_to_the_scratch(tmp_path, data_dir):
    repo = repo_create(tmp_path / "odd:name", BASELINE_FILES)
    source = worktree_create(repo, "main", "cand_001")
    (source / "README.md").write_text("changed\n")
    patch = patch_extract(source)
    assert patch.files == ["README.md"]
    assert patch_apply(repo, "main", patch.text, "eval_001")


def test_a_huge_file_is_refused_from_its_size_before_git_reads_it(repo, v1):
    worktree = worktree_create(repo, v1, "cand_001")
    with open(worktree / "code" / "huge.bin", "wb") as handle:
        handle.truncate(1 << 40)  # a sparse TiB: hashing it would not end in this test's lifetime
    with pytest.raises(PatchLimitError, match=re.escape(
        "the patch changes 1048576.0 MiB in 1 file, over worker.max_patch_bytes = 10.0 MiB"
    )):
        patch_extract(worktree)


def test_changes_over_max_patch_bytes_in_all_are_refused_with_the_size_and_file_count(repo, v1):
    worktree = worktree_create(repo, v1, "cand_001")
    for n in range(3):
        (worktree / "code" / f"part{n}.py").write_text(f"x = '{'a' * 592}'\n")  # 600 bytes each
    limits = PatchLimits(max_bytes=1750, max_files=10)
    with pytest.raises(PatchLimitError, match=re.escape(
        "the patch changes 1.8 KiB in 3 files, over worker.max_patch_bytes = 1.7 KiB; keep large or "
        "generated files out of the change, or raise worker.max_patch_bytes in the spec"
    )):
        patch_extract(worktree, limits=limits)
    (worktree / "code" / "part2.py").unlink()
    assert patch_extract(worktree, limits=limits).files == ["code/part0.py", "code/part1.py"]


def test_a_deleted_file_counts_at_its_size_in_the_base(repo, v1):
    worktree = worktree_create(repo, v1, "cand_001")
    (worktree / "docs" / "notes.md").unlink()  # 57 bytes in v1
    with pytest.raises(PatchLimitError, match=re.escape("the patch changes 57 bytes in 1 file")):
        patch_extract(worktree, limits=PatchLimits(max_bytes=56))
    assert patch_extract(worktree, limits=PatchLimits(max_bytes=400)).files == ["docs/notes.md"]


def test_more_files_than_max_patch_files_are_refused_before_they_are_hashed(repo, v1):
    worktree = worktree_create(repo, v1, "cand_001")
    (worktree / "code" / "gen").mkdir()
    for n in range(12):
        (worktree / "code" / "gen" / f"m{n}.py").write_text(f"N = {n}\n")
    (worktree / "docs" / "notes.md").unlink()
    with pytest.raises(PatchLimitError, match=re.escape(
        "the patch changes 13 files, over worker.max_patch_files = 12; keep generated or vendored files "
        "out of the change, or raise worker.max_patch_files in the spec"
    )):
        patch_extract(worktree, limits=PatchLimits(max_files=12))
    assert len(patch_extract(worktree, limits=PatchLimits(max_files=13)).files) == 13


def test_unchanged_ignored_and_fresh_files_do_not_count_against_the_limits(ignoring_repo):
    worktree = worktree_create(ignoring_repo, "main", "cand_001")
    (worktree / "run.log").write_bytes(b"x" * 5000)  # ignored
    (worktree / "README.md").write_text((worktree / "README.md").read_text())  # rewritten, same bytes
    (worktree / "code" / "fast.py").write_text("FAST = True\n")
    patch = patch_extract(worktree, limits=PatchLimits(max_bytes=1000, max_files=1))
    assert patch.files == ["code/fast.py"]


def test_a_diff_longer_than_max_patch_bytes_is_refused_even_when_the_files_are_within_it(repo, v1):
    worktree = worktree_create(repo, v1, "cand_001")
    (worktree / "README.md").write_text("".join(f"line {n}\n" for n in range(100)))  # 790 bytes
    limits = PatchLimits(max_bytes=1000)  # the diff is its 100 lines plus headers and the old ones
    with pytest.raises(PatchLimitError, match=r"the patch is 1\.\d KiB of diff text, over "
                                              r"worker\.max_patch_bytes = 1,000 bytes"):
        patch_extract(worktree, limits=limits)


# ------------------------------------------------------------------------ one tree, checked out


def test_a_patch_is_checked_out_from_the_tree_built_once_and_the_disk_matches_it(repo, v1):
    source = worktree_create(repo, v1, "cand_001")
    candidate_work(source)
    (source / "code" / "run.sh").write_text("#!/bin/sh\necho fast\n")
    (source / "code" / "run.sh").chmod(0o755)
    patch = patch_extract(source)
    calls = []
    real = worktrees.git_run

    def counted(args, **options):
        calls.append(args[0])
        return real(args, **options)

    worktrees.git_run = counted
    try:
        applied = patch_apply(repo, v1, patch.text, "eval_001", numstat=patch.numstat)
    finally:
        worktrees.git_run = real
    # One temporary index (read-tree, apply --cached, write-tree), a checkout and its merge.
    assert sorted(calls) == ["apply", "read-tree", "read-tree", "worktree", "write-tree"]
    assert files_of(applied) == files_of(source)
    assert os.stat(applied / "code" / "run.sh").st_mode & stat.S_IXUSR
    assert worktree_tree(applied) == worktree_tree(source) == patched_tree(repo, v1, patch.text)


def test_an_in_tree_eol_rule_the_checkout_applies_still_gives_the_patched_tree_back(repo, v1):
    source = worktree_create(repo, v1, "cand_001")
    (source / ".gitattributes").write_text("*.txt text eol=crlf\n")
    (source / "notes.txt").write_bytes(b"one\ntwo\n")
    patch = patch_extract(source)
    applied = patch_apply(repo, v1, patch.text, "eval_001")
    assert (applied / "notes.txt").read_bytes() == b"one\r\ntwo\r\n"  # converted, as git add reads back
    assert worktree_tree(applied) == patched_tree(repo, v1, patch.text)


def test_a_checkout_whose_files_differ_from_the_patched_tree_is_rejected_and_nothing_is_left(
        repo, v1, data_dir, monkeypatch):
    source = worktree_create(repo, v1, "cand_001")
    (source / "README.md").write_text("changed\n")
    patch = patch_extract(source)
    real = worktrees.git_run

    def tampering(args, **options):
        out = real(args, **options)
        if args[:3] == ["read-tree", "-m", "-u"]:
            (Path(options["cwd"]) / "README.md").write_text("something else\n")
        return out

    monkeypatch.setattr(worktrees, "git_run", tampering)
    with pytest.raises(GitError, match=re.escape("README.md on disk differs from the patched tree")):
        patch_apply(repo, v1, patch.text, "eval_001")
    monkeypatch.undo()
    worktree_remove(repo, source)
    assert_nothing_left(repo, data_dir, "eval_001")


def test_removing_a_worktree_forgets_only_its_own_record_without_a_prune(repo, v1, monkeypatch):
    kept = worktree_create(repo, v1, "cand_001")
    gone = worktree_create(repo, v1, "cand_002")
    elsewhere = worktree_create(repo, v1, "cand_003")
    subprocess.run(["rm", "-rf", str(elsewhere)], check=True)  # deleted by hand: a prune's business
    monkeypatch.setattr(worktrees, "git_run", lambda *args, **options: pytest.fail("no git call expected"))
    worktree_remove(repo, gone)
    monkeypatch.undo()
    assert registered(repo) == [str(repo), str(kept), str(elsewhere)]
    assert patch_extract(kept).empty  # the other worktree still works
    worktree_prune(repo)
    assert registered(repo) == [str(repo), str(kept)]


def test_extracting_against_the_known_baseline_asks_git_for_no_rev_parse(repo, v1, monkeypatch):
    worktree = worktree_create(repo, v1, "cand_001")
    (worktree / "README.md").write_text("changed\n")
    calls = []
    real = worktrees.git_run

    def counted(args, **options):
        calls.append(args[0])
        return real(args, **options)

    monkeypatch.setattr(worktrees, "git_run", counted)
    assert patch_extract(worktree).files == patch_extract(worktree, base=v1).files == ["README.md"]
    assert "rev-parse" not in calls
    with pytest.raises(GitError, match="is not a commit of this repository"):
        patch_extract(worktree, base="0" * 40)


# ------------------------------------------------------------------- generate's git processes


def old_extract(worktree: Path, base: str) -> bytes:
    """The patch as patch_extract made it before: read-tree, `add --all`, `diff --cached`."""
    admin = worktrees.worktree_admin_dir(worktree)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | GIT_ENV | {
        "GIT_DIR": str(admin), "GIT_WORK_TREE": str(worktree),
        "GIT_INDEX_FILE": str(worktree.parent / f"{worktree.name}.old-index"),
    }

    def run(*args: str) -> bytes:
        return subprocess.run(["git", "-c", "core.hooksPath=/dev/null", *args], cwd=worktree, env=env,
                              check=True, capture_output=True).stdout

    run("read-tree", base)
    run("add", "--all", "--", ".")
    return run("diff", "--cached", *worktrees._DIFF_OPTIONS, base, "--")


def test_generate_takes_at_most_three_git_processes(ignoring_repo, monkeypatch):
    calls: list[str] = []
    real = worktrees.git_run
    monkeypatch.setattr(worktrees, "git_run", lambda args, **kw: calls.append(args[0]) or real(args, **kw))
    worktree = worktree_create(ignoring_repo, "main", "cand_001")
    candidate_work(worktree)
    patch_extract(worktree)
    assert len(calls) <= 3, calls


def test_the_patch_is_byte_for_byte_what_add_all_and_diff_cached_gave(ignoring_repo, monkeypatch):
    base = git(ignoring_repo, "rev-parse", "main")
    worktree = worktree_create(ignoring_repo, base, "cand_001")
    candidate_work(worktree)
    (worktree / "tests" / "test_certificate.py").unlink()
    (worktree / "tests" / "test_certificate.py").symlink_to("../code/fast.py")  # a type change
    (worktree / "scripts" / "benchmark_candidate.sh").chmod(0o755)  # a mode change
    (worktree / "tools").mkdir()
    (worktree / "tools" / "run.sh").write_text("#!/bin/sh\r\necho crlf\r\n")
    (worktree / "tools" / "run.sh").chmod(0o755)
    (worktree / "link").symlink_to("tools/run.sh")
    (worktree / "empty.txt").write_bytes(b"")
    (worktree / "no-newline.txt").write_bytes(b"last line")
    patch = patch_extract(worktree)
    assert patch.text == old_extract(worktree, base)
    assert patch.numstat == worktrees._numstat_entries(patch.text)  # as `git apply --numstat` reads it
    assert patch == patch_from_text(patch.text)
