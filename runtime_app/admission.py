"""A candidate's patch admitted into a plain evaluation tree (runtime_app/worktrees.py `tree_apply`):
what `services.patch_admit(..., plain=True)` does after the patch limits.

The patch is applied first and judged after, on the files it put on disk: the change policy reads
a tree built in this process from the baseline's tree and, at each path the patch declares, the
file now in the tree (its bytes, link target or executable bit), in a memory object store over
the repository's (nothing is written to the repository). `tree_apply` has checked that the paths
it declares are exactly what `git apply` changed and that each changed file on disk is what git
wrote, so the policy sees every change and only the changes. No command runs in the tree before
the verdict; a refused tree is removed.

The numstat the declaration is read from is parsed here, in this process, from the patch's own
lines (`numstat_read`); when a patch is out of the shape `git diff` writes (renames, unreadable
headers) it is asked of `git apply --numstat` instead. A parse that named another path than git
would only make `tree_apply` refuse the patch, never admit a change the policy did not see.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from dulwich.object_store import MemoryObjectStore, OverlayObjectStore, commit_tree_changes
from dulwich.objects import Blob, Commit, ObjectID

from runtime_app.git import GitError, repo_open
from runtime_app.policy import GITLINK, SYMLINK, PolicyVerdict, policy_check
from runtime_app.worktrees import Patch, patch_name_status, path_unquote, tree_apply, tree_remove

Numstat = list[tuple[int | None, int | None, str]]
_NO_PATH = b"/dev/null"


def _side(name: bytes, prefix: bytes) -> bytes | None:
    """The path a `---`/`+++` line names (None for /dev/null or anything unreadable)."""
    if name.endswith(b"\t"):  # git ends a name that holds a space with a tab
        name = name[:-1]
    if name == _NO_PATH:
        return None
    path = path_unquote(name)
    if path is None or not path.startswith(prefix):
        return None
    return path[len(prefix):]


def _header_path(rest: bytes) -> bytes | None:
    """The one path of a `diff --git a/P b/P` header (no renames: both sides name it)."""
    if rest.startswith(b'"'):
        end = rest.find(b'" ', 1)
        while end != -1 and rest[end - 1: end] == b"\\":
            end = rest.find(b'" ', end + 1)
        if end == -1:
            return None
        old, new = path_unquote(rest[:end + 1]), path_unquote(rest[end + 2:])
    else:
        half = (len(rest) - 1) // 2
        old, new = rest[:half], rest[half + 1:]
        if rest[half:half + 1] != b" ":
            return None
    if old is None or new is None or not old.startswith(b"a/") or not new.startswith(b"b/"):
        return None
    return old[2:] if old[2:] == new[2:] else None


def numstat_read(text: bytes) -> Numstat | None:
    """(added, deleted, path) per file diff, as `git apply --numstat` says it (None counts for a
    binary diff), read in this process from a patch in the shape `git diff --no-renames` writes;
    None when the patch is not in that shape (the caller asks git instead)."""
    entries: list[list[Any]] = []
    in_hunk = in_binary = False
    for line in text.split(b"\n"):
        if line.startswith(b"diff --git "):
            path = _header_path(line[len(b"diff --git "):])
            entries.append([0, 0, path, None, None])  # added, deleted, header path, ---, +++
            in_hunk = in_binary = False
            continue
        if not entries:
            if line:
                return None  # text before the first file diff
            continue
        entry = entries[-1]
        if in_binary:
            continue  # its data lines are not counted
        if in_hunk:
            if line.startswith(b"+") and entry[0] is not None:
                entry[0] += 1
            elif line.startswith(b"-") and entry[1] is not None:
                entry[1] += 1
            elif not line.startswith((b" ", b"@@ ", b"\\")) and line:
                return None
        elif line.startswith(b"@@ "):
            in_hunk = True
        elif line.startswith(b"--- "):
            entry[3] = _side(line[4:], b"a/")
        elif line.startswith(b"+++ "):
            entry[4] = _side(line[4:], b"b/")
        elif line.startswith((b"GIT binary patch", b"Binary files ")):
            entry[0] = entry[1] = None
            in_binary = True
        elif line.startswith((b"rename ", b"copy ", b"similarity ", b"dissimilarity ")):
            return None
    numstat: Numstat = []
    for added, deleted, header, old, new in entries:
        named = new or old
        path = named or header
        if path is None or (header is not None and named is not None and named != header):
            return None
        numstat.append((added, deleted, path.decode(errors="surrogateescape")))
    return numstat


def patch_described(text: bytes, numstat: Numstat) -> Patch:
    """A patch as worktrees.patch_from_text describes it, from a numstat read by `numstat_read`
    (which reads no rename or copy, so every path is in the numstat)."""
    files = list(dict.fromkeys(path for _, _, path in numstat))
    diff_lines = sum((added or 0) + (deleted or 0) for added, deleted, _ in numstat)
    return Patch(text, hashlib.sha256(text).hexdigest(), numstat, diff_lines, files)


def tree_judge(repo_path: Any, commit: str, patch_text: bytes, name: str, rules: Any,
               numstat: Numstat, detail: dict[str, Any]) -> Path | None:
    """The plain tree with the patch applied (tree_apply), then the change policy on what it holds;
    the tree, or None with the refusal in `detail` (and no tree left)."""
    try:
        tree = tree_apply(repo_path, commit, patch_text, name, numstat=numstat)
    except GitError as error:
        detail.update(verdict="rejected", stage="apply", reason=str(error))
        return None
    try:
        verdict = tree_policy(repo_path, commit, tree, patch_text, numstat, rules)
    except (GitError, OSError, KeyError, ValueError, AssertionError) as error:
        tree_remove(tree)  # a tree the policy cannot read is refused, never admitted unread
        detail.update(verdict="rejected", stage="policy",
                      reason=f"its patched tree could not be read for the change policy ({error})")
        return None
    except BaseException:
        tree_remove(tree)
        raise
    if not verdict.accepted:
        tree_remove(tree)
        detail.update(verdict="rejected", stage="policy", reason=str(verdict),
                      violations=[{"path": v.path, "reason": v.reason} for v in verdict.violations])
        return None
    detail.update(verdict="admitted", stage="policy")
    return tree


def tree_policy(repo_path: Any, commit: str, tree: Path, patch_text: bytes, numstat: Numstat,
                rules: Any) -> PolicyVerdict:
    """The change policy's verdict on a tree_apply tree: the baseline's tree with, at each path the
    patch declares, what is on disk there now (a directory where a file was declared is a
    submodule, as a checkout leaves one)."""
    declared = patch_name_status(patch_text, numstat=numstat)
    with repo_open(repo_path) as repo:
        memory = MemoryObjectStore()
        store = OverlayObjectStore([memory, repo.object_store], add_store=memory)
        head = repo.object_store[ObjectID(commit.encode())]
        if not isinstance(head, Commit):
            raise GitError(f"{commit}: not a commit of this repository")
        changes: list[tuple[bytes, int | None, ObjectID | None]] = []
        for path, kind in sorted(declared.items()):
            raw = os.fsencode(path)
            if kind == "D":
                changes.append((raw, None, None))
                continue
            on_disk = tree / os.fsdecode(raw)
            info = os.lstat(on_disk)
            if stat.S_ISLNK(info.st_mode):
                blob, mode = Blob.from_string(os.fsencode(os.readlink(on_disk))), SYMLINK
            elif stat.S_ISDIR(info.st_mode):
                changes.append((raw, GITLINK, ObjectID(b"0" * 40)))
                continue
            else:
                blob = Blob.from_string(on_disk.read_bytes())
                mode = 0o100755 if info.st_mode & stat.S_IXUSR else 0o100644
            memory.add_object(blob)
            changes.append((raw, mode, blob.id))
        # Deletions first: a directory the patch replaces with a file (or a file with a directory)
        # is gone before its new entry is put in its place.
        patched = head.tree
        for part in ([change for change in changes if change[1] is None],
                     [change for change in changes if change[1] is not None]):
            if part:
                patched = commit_tree_changes(store, patched, part)
        return policy_check(store, head.tree, patched, rules)
