"""Worktrees for writers, trees for evaluations, and the patches that move between them.

An evaluation, trial or replay tree (tree_apply) is a plain directory of a commit's files with a
patch applied, built in a private git dir with a temporary index and `checkout-index`: not
registered with the repository, no `.git`, no repository lock, at most three git processes, so
no step waits on another's checkout and the cost does not grow with how many trees exist.

A writer's worktree is a `git worktree add --detach` checkout under `DATA_DIR/worktrees/<name>`: it
shares the repository's object store, so nothing is copied but the files. It is the
fastest way bench/worktree_creation.py measured: 1.4–6× faster than dulwich's
`worktree_add` on 5,000 files, depending on the machine's file I/O.
Every git call runs with hooks off, no system or user config, no terminal prompt, in its
own process group and under a timeout. A candidate controls the files of its worktree,
never the repository's `.git`: each call checks that the worktree's `.git` file points
back at it before git reads anything through it.

A patch is the binary-safe `git diff` of a worktree's files (tracked changes and new
untracked files, not ignored ones) against the commit it was made at, staged in a
temporary index so the worktree's own index is never touched. Before anything is hashed,
the sizes and number of the changed files are held to the patch limits (PatchLimits), and
the diff's length once it exists. Applying one builds the patched tree once in a temporary
index (`read-tree` the commit, `apply --cached`, `write-tree`: patch_stage), compares its
name-status with what the patch declares, and only then checks it out (tree_checkout): a
fresh worktree at the commit moved to that tree by `read-tree -m -u` on a temporary copy of
its index (its own index stays at the commit), each changed file checked against the tree.
Any failure leaves no worktree and raises GitError with the reason. Removing a worktree
deletes its files and its own record under `.git/worktrees/`; nothing prunes per step.

Nothing a candidate wrote reaches the repository's object store: every git call that hashes
files or patch content (`add`, `apply --cached`, `write-tree`, the checkout) writes into a
temporary object directory (ObjectScratch: GIT_OBJECT_DIRECTORY, with the repository's
objects as an alternate to read from), deleted afterwards. Only a merge a person approved
writes its tree into the repository (`worktree_tree_keep`, used by git.commit_create).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from dulwich.diff_tree import CHANGE_ADD, CHANGE_DELETE, CHANGE_MODIFY, TreeChange, tree_changes
from dulwich.index import (
    EXTENDED_FLAG_INTEND_TO_ADD,
    FLAG_EXTENDED,
    FLAG_STAGEMASK,
    ConflictedIndexEntry,
    IndexChecksumWriter,
    IndexEntry,
    read_index_dict,
    write_index_dict,
)
from dulwich.object_format import DEFAULT_OBJECT_FORMAT
from dulwich.object_store import DiskObjectStore
from dulwich.objects import Commit, TreeEntry

from runtime_app.lane import git_held
from runtime_app.policy import PatchLimits
from runtime_app.presenters import short_sha
from runtime_app.repository import GitError, ref_resolve, repo_open

GIT_TIMEOUT_SECONDS = 300.0
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_SHA = re.compile(r"[0-9a-f]{40}")
GITLINK_MODE = 0o160000
_EMPTY_BLOB = b"e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # what `git add -N` records
# Config that could run a program, change what a patch looks like or read the user's files.
_SAFE_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.excludesFile=/dev/null",
    "core.attributesFile=/dev/null",
    "core.quotePath=true",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "diff.suppressBlankEmpty=false",
    "apply.whitespace=nowarn",
    "apply.ignoreWhitespace=no",
    "advice.detachedHead=false",
)
_DIFF_OPTIONS = (
    "--binary", "--full-index", "--no-renames", "--no-ext-diff", "--no-textconv", "--no-color",
    "--no-relative", "--src-prefix=a/", "--dst-prefix=b/", "--unified=3", "--inter-hunk-context=0",
    "--diff-algorithm=default", "--indent-heuristic", "--submodule=short", "--ignore-submodules=none",
    "-O/dev/null",
)


def worktrees_root() -> Path:
    return Path(settings.DATA_DIR).resolve() / "worktrees"


# ---------------------------------------------------------------------------------------- git CLI


def git_run(
    args: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None, stdin: bytes = b"",
    timeout: float = GIT_TIMEOUT_SECONDS,
) -> bytes:
    """Run `git args` safely and return its stdout; a failure raises GitError with git's words."""
    argv = ["git", *(item for pair in _SAFE_CONFIG for item in ("-c", pair)), *args]
    with git_held():  # a git call is a command on this host: never beside a timing trial (pages aside)
        try:
            # umask 022 whatever the server's: worktrees must be readable by the sandbox's own user.
            process = subprocess.Popen(
                argv, cwd=cwd, env=git_env(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True, umask=0o022,
            )
        except OSError as error:
            raise GitError(f"git {args[0]} could not start in {cwd}: {error.strerror}") from None
        try:
            stdout, stderr = process.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise GitError(f"git {args[0]} timed out after {timeout:g} s") from None
    if process.returncode != 0:
        message = stderr.decode(errors="replace").strip().splitlines()
        detail = "; ".join(line.strip() for line in message[-4:]) or f"exit code {process.returncode}"
        raise GitError(f"git {args[0]} failed: {detail}")
    return stdout


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any GIT_ variable, plus the ones that keep git sealed."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_ATTR_NOSYSTEM="1",
        GIT_TERMINAL_PROMPT="0", GIT_ASKPASS="/bin/false", GIT_OPTIONAL_LOCKS="0", LC_ALL="C",
    )
    env.update(extra or {})
    return env


# -------------------------------------------------------------------------------------- worktrees


def name_check(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise GitError(
            f"{name!r}: a worktree name is 1–100 letters, digits, '_', '.' or '-', starts with a "
            "letter or digit and has no '..'"
        )
    return name


def worktree_create(repo_path: str | Path, commit: str, name: str) -> Path:
    """A detached checkout of `commit` at DATA_DIR/worktrees/<name>, sharing the object store."""
    name_check(name)
    repo_path, sha = _commit_resolve(repo_path, commit)
    target = worktrees_root() / name
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        target.mkdir()  # claims the name atomically; git fills an empty directory
    except FileExistsError:
        raise GitError(f"worktree {name}: {target} already exists; remove it first") from None
    args = ["worktree", "add", "--quiet", "--detach", str(target), sha]
    try:
        try:
            with repo_lock(repo_path, shared=True):  # adds never wait on each other, only on a prune
                git_run(args, cwd=repo_path)
        except GitError:
            # Again, alone under the exclusive lock: git reads every record as it adds one and dies on
            # one another add is still writing ("failed to read .git/worktrees/<other>/commondir").
            # A real failure fails again here, with git's words.
            _partial_remove(target)
            target.mkdir()
            with repo_lock(repo_path):
                # A record left behind (a worktree deleted by hand, or an add killed half-way) goes too.
                git_run(["worktree", "prune"], cwd=repo_path)
                git_run(args, cwd=repo_path)
    except BaseException as error:
        _partial_remove(target)
        if isinstance(error, GitError):
            raise GitError(f"worktree {name}: {error}") from None
        raise
    return target


def worktree_remove(repo_path: str | Path, path: str | Path) -> None:
    """Delete a worktree's files, whatever state a candidate left them in, and its record in git
    (its own `worktrees/<id>` directory only: no `git worktree prune` of the whole repository)."""
    root = worktrees_root()
    path = Path(path)
    if path.parent.resolve() != root:
        raise GitError(f"{path}: not a worktree under {root}; refusing to delete it")
    name_check(path.name)
    target = root / path.name
    _partial_remove(target)
    with repo_lock(repo_path, shared=True):  # never beside a prune; an add picks another record name
        admin = _admin_dir_find(repo_path, target)
        if admin is not None:
            _partial_remove(admin)


def worktree_prune(repo_path: str | Path) -> None:
    """Forget every worktree of the repository whose directory no longer exists."""
    with repo_lock(repo_path):
        git_run(["worktree", "prune"], cwd=Path(repo_path))


def _admin_dir_find(repo_path: str | Path, worktree: Path) -> Path | None:
    """The repository's record of the worktree at `worktree`: the `worktrees/<id>` directory of
    the repository's common dir whose `gitdir` names `worktree/.git` (None if there is none).

    Found from the repository's side, never by trusting the worktree's own `.git` file: a
    candidate can rewrite that to name any directory.
    """
    try:
        records = _common_dir(repo_path) / "worktrees"
        dot_git = Path(os.path.abspath(worktree / ".git"))
        candidates = list(records.iterdir()) if records.is_dir() else []
    except (OSError, GitError):
        return None
    expected = records / worktree.name  # git names the record after the directory when it is free
    for admin in sorted(candidates, key=lambda entry: entry != expected):  # its own name first
        try:
            pointed = (admin / "gitdir").read_text().strip()
        except OSError:
            continue
        if Path(os.path.abspath(pointed)) == dot_git and not admin.is_symlink() and admin.is_dir():
            return admin
    return None


def _common_dir(repo_path: str | Path) -> Path:
    repo = repo_open(repo_path)
    try:
        return Path(repo.commondir()).resolve()
    finally:
        repo.close()


@contextlib.contextmanager
def repo_lock(repo_path: str | Path, *, shared: bool = False):
    """A repository-wide lock across threads and processes. Worktree adds and record removals
    take it shared, so they never wait on each other: git makes each add's record with an atomic
    mkdir (a new name if taken). An add that dies reading a record another add is still writing
    is made again alone, under the exclusive lock (worktree_create). A prune takes it exclusive:
    it could drop the record of a worktree being added. Other users (agent snapshots) take it
    exclusive."""
    locks = Path(settings.DATA_DIR).resolve() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(str(Path(repo_path).resolve()).encode()).hexdigest()[:20]
    with open(locks / f"repo-{key}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def permissions_restore(path: Path) -> None:
    """Make every directory under path (not following symlinks) searchable and writable again."""
    if path.is_symlink() or not path.is_dir():
        return
    path.chmod(stat.S_IMODE(path.lstat().st_mode) | stat.S_IRWXU)
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                permissions_restore(Path(entry.path))


def worktree_admin_dir(worktree: str | Path) -> Path:
    """The repository's private directory for this worktree, checked to point back at it.

    A candidate can rewrite its worktree's `.git` file to aim git at a directory it made,
    with a config that runs programs; the back-pointer `gitdir` lives in the repository's
    own `.git/worktrees/<name>/`, which the sandbox does not let it write.
    """
    worktree = Path(worktree).resolve()
    dot_git = worktree / ".git"
    try:
        mode = dot_git.lstat().st_mode
        text = dot_git.read_bytes()[:4096].decode() if stat.S_ISREG(mode) else ""
    except (OSError, UnicodeDecodeError):
        text = ""
    admin = Path(text.removeprefix("gitdir: ").strip()) if text.startswith("gitdir: ") else None
    if admin is None or not admin.is_absolute():
        raise GitError(f"{worktree}: not a git worktree (its .git is not a gitdir file)")
    admin = admin.resolve()
    try:
        back = Path((admin / "gitdir").read_text().strip()).resolve()
    except OSError:
        back = None
    if back != dot_git or admin.parent.name != "worktrees" or admin.is_relative_to(worktree):
        raise GitError(f"{worktree}: its .git does not point at a worktree record that points back")
    return admin


def _commit_resolve(repo_path: str | Path, commit: str) -> tuple[Path, str]:
    repo = repo_open(repo_path)
    try:
        return Path(repo.path), ref_resolve(repo, commit)
    finally:
        repo.close()


def _commit_sha(repo_path: str | Path, commit: str) -> str:
    """`commit` if it is already a full sha (git checks it where it is used), else resolved."""
    return commit if _SHA.fullmatch(commit) else _commit_resolve(repo_path, commit)[1]


def _partial_remove(path: Path) -> None:
    if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        permissions_restore(path)
        shutil.rmtree(path)


def _worktree_git(
    worktree: Path, index: Path | None = None, scratch: ObjectScratch | None = None,
) -> tuple[Path, dict[str, str]]:
    """The checked worktree root and the environment that points git at it (and an index, and
    a scratch object directory)."""
    worktree = Path(worktree).resolve()
    env = {"GIT_DIR": str(worktree_admin_dir(worktree)), "GIT_WORK_TREE": str(worktree)}
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    if scratch is not None:
        env.update(scratch.env)
    return worktree, env


# -------------------------------------------------------------------------- scratch objects


class PatchLimitError(GitError):
    """A worktree's changes are over worker.max_patch_bytes or worker.max_patch_files."""


@dataclass(frozen=True)
class ObjectScratch:
    """A temporary object directory: git writes every object it makes there and reads the
    repository's objects as an alternate, so what a candidate wrote never enters the repository."""

    path: Path
    repository_objects: Path

    @property
    def env(self) -> dict[str, str]:
        quoted = str(self.repository_objects).replace("\\", "\\\\").replace('"', '\\"')
        # C-quoted, so a ':' in the repository's path is not read as a list separator.
        return {"GIT_OBJECT_DIRECTORY": str(self.path), "GIT_ALTERNATE_OBJECT_DIRECTORIES": f'"{quoted}"'}

    def store(self) -> DiskObjectStore:
        """The scratch objects and, through its alternates file, the repository's (for dulwich)."""
        return DiskObjectStore(str(self.path))


@contextlib.contextmanager
def object_scratch(repo_path: str | Path) -> Iterator[ObjectScratch]:
    """An ObjectScratch over the objects of the repository at repo_path, removed on exit."""
    repo = repo_open(repo_path)
    try:
        objects = Path(repo.commondir()).resolve() / "objects"
    finally:
        repo.close()
    with _scratch_over(objects) as scratch:
        yield scratch


@contextlib.contextmanager
def _scratch_over(objects: Path) -> Iterator[ObjectScratch]:
    if "\n" in str(objects):
        raise GitError(f"{objects!r}: a repository path with a line break cannot be read as an alternate")
    with tempfile.TemporaryDirectory(prefix="crucible-objects-") as temp:
        path = Path(temp) / "objects"
        (path / "info").mkdir(parents=True)
        (path / "pack").mkdir()
        (path / "info" / "alternates").write_text(f"{objects}\n")
        yield ObjectScratch(path, objects)


def _worktree_objects(worktree: Path) -> Path:
    """The object store a worktree shares: its repository's (the admin dir is .git/worktrees/<name>)."""
    return worktree_admin_dir(worktree).parent.parent / "objects"


# ---------------------------------------------------------------------------------------- patches


@dataclass(frozen=True)
class Patch:
    """A git diff as bytes, with what it does: (added, deleted, path) per file, None if binary."""

    text: bytes
    sha256: str
    numstat: list[tuple[int | None, int | None, str]] = field(default_factory=list)
    diff_lines: int = 0
    files: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.text


def patch_from_text(
    text: bytes, *, numstat: list[tuple[int | None, int | None, str]] | None = None,
) -> Patch:
    """Describe a git diff: its SHA-256, numstat (as `git apply --numstat` reads it, unless the
    caller has it) and files."""
    numstat = _numstat_entries(text) if numstat is None else numstat
    sources = [source for _, source in _blocks(text) if source]
    files = list(dict.fromkeys([*(path for _, _, path in numstat), *sources]))
    diff_lines = sum((added or 0) + (deleted or 0) for added, deleted, _ in numstat)
    return Patch(text, hashlib.sha256(text).hexdigest(), numstat, diff_lines, files)


def patch_extract(
    worktree: str | Path, *, base: str | None = None, limits: PatchLimits | None = None,
) -> Patch:
    """The patch from `base` (default: the commit the worktree was made at) to its files now.

    Tracked changes and new untracked files that are not ignored; binary files as git binary
    patches. Staged through a temporary index: the worktree's own index is not touched, and
    nothing is hashed into the repository's objects. Raises PatchLimitError when the changes are
    over `limits` (default: PatchLimits()): judged on the changed files' count and sizes before
    any of them is hashed, then on the diff's length.

    Two git processes for a worktree at its own commit: `status` (the limits), then one `diff`
    of the files against base giving the patch and its numstat. The temporary index starts as a
    copy of the worktree's own (written at its commit by `worktree add`, in the repository's
    `.git`, which the sandbox keeps read-only: its stat data spares status re-reading unchanged
    files, and it records the sizes of deleted ones); the new files are added to it as
    intent-to-add entries in this process, so the diff shows them whole, as `git add --all`
    then `git diff --cached` did, byte for byte. An explicit base starts from `read-tree`; an
    embedded repository among the new files is staged by `git add` (a gitlink), as before.
    """
    limits = limits or PatchLimits()
    worktree = Path(worktree).resolve()
    with _scratch_over(_worktree_objects(worktree)) as scratch, \
            tempfile.TemporaryDirectory(prefix="crucible-index-") as temp:
        index = Path(temp) / "index"
        worktree, env = _worktree_git(worktree, index, scratch)
        admin = Path(env["GIT_DIR"])
        # A split index keeps entries elsewhere: read-tree then, as for an explicit base.
        own = base is None and (admin / "index").is_file() and not any(admin.glob("sharedindex.*"))
        base = _base_resolve(worktree, env, base)
        if own:
            shutil.copyfile(admin / "index", index)
        else:
            _base_read(worktree, env, base)
        untracked = _changes_limit(worktree, env, limits, index if own else None)
        diff = ["diff", "--numstat", "-z", "--patch", *_DIFF_OPTIONS]
        if any(path.endswith(b"/") for path in untracked):
            git_run(["add", "--all", "--", "."], cwd=worktree, env=env)
            out = git_run([*diff, "--cached", base, "--"], cwd=worktree, env=env)
        else:
            _intent_to_add(index, worktree, untracked)
            out = git_run([*diff, base, "--"], cwd=worktree, env=env)
    numstat, text = _numstat_split(out)
    refusal = limits.text_refusal(len(text))
    if refusal:
        raise PatchLimitError(refusal)
    patch = patch_from_text(text, numstat=numstat if len(numstat) == len(_blocks(text)) else None)
    refusal = limits.files_refusal(len(patch.files))
    if refusal:
        raise PatchLimitError(refusal)
    return patch


def _numstat_split(out: bytes) -> tuple[list[tuple[int | None, int | None, str]], bytes]:
    """`git diff --numstat -z --patch` output as (numstat, patch): each numstat entry ends in a
    NUL and one more NUL separates them from the patch (no output at all for no change)."""
    if not out:
        return [], b""
    end = out.find(b"\0\0")
    if end < 0:
        raise GitError("git diff gave a numstat without a patch")
    return _numstat_parse(out[: end + 1]), out[end + 2:]


def _intent_to_add(index: Path, worktree: Path, paths: Sequence[bytes]) -> None:
    """Add `paths` to the (temporary) index as intent-to-add entries, as `git add -N` does: git
    then diffs each as a new file read from disk. Written without the cached-tree extension,
    which a new entry would make stale."""
    if not paths:
        return
    with open(index, "rb") as handle:
        entries = read_index_dict(handle)
    for path in paths:
        try:
            mode = os.lstat(worktree / os.fsdecode(path)).st_mode
        except OSError:
            continue  # gone since status listed it: nothing to add
        if stat.S_ISLNK(mode):
            git_mode = 0o120000
        elif stat.S_ISREG(mode):
            git_mode = 0o100755 if mode & stat.S_IXUSR else 0o100644
        else:
            continue
        entries[path] = IndexEntry(
            ctime=0, mtime=0, dev=0, ino=0, mode=git_mode, uid=0, gid=0, size=0, sha=_EMPTY_BLOB,
            flags=FLAG_EXTENDED, extended_flags=EXTENDED_FLAG_INTEND_TO_ADD,
        )
    with open(index, "wb") as handle:
        writer = IndexChecksumWriter(handle, DEFAULT_OBJECT_FORMAT)
        write_index_dict(writer, entries)
        writer.write_checksum()


def _changes_limit(
    worktree: Path, env: dict[str, str], limits: PatchLimits, own_index: Path | None = None,
) -> list[bytes]:
    """Refuse changes over the limits from their paths and sizes alone, before git hashes them;
    return the untracked files that are not ignored (what `git add --all` would add).

    The index holds `base` (read-tree, or `own_index`: the worktree's own index, copied). `git
    status` compares each tracked file with it in memory (writing no object) and names the
    files that differ (its second status letter: index against the files) and the untracked
    ones that are not ignored. Added and modified files count at their size on disk, deleted
    ones at their size in base (the size `own_index` recorded, else the blob's). Status writes
    the refreshed (temporary) index. Submodules are not entered: that would run git inside a
    directory the candidate controls.
    """
    out = git_run(["status", "--porcelain=v2", "-z", "--untracked-files=all", "--ignore-submodules=all",
                   "--no-renames"], cwd=worktree, env={**env, "GIT_OPTIONAL_LOCKS": "1"})
    fields = iter(out.split(b"\0"))
    changed: list[bytes] = []
    untracked: list[bytes] = []
    deleted: list[tuple[bytes, bytes]] = []  # path and the base's blob id of deleted files
    for entry in fields:
        if entry.startswith(b"? "):
            changed.append(entry[2:])
            untracked.append(entry[2:])
        elif entry.startswith((b"1 ", b"2 ")):
            parts = entry.split(b" ", 8 if entry.startswith(b"1 ") else 9)
            if entry.startswith(b"2 "):
                next(fields, None)  # a rename's original path (renames are off; never expected)
            worktree_status, index_sha, path = parts[1][1:2], parts[7], parts[-1]
            if worktree_status == b"D":
                deleted.append((path, index_sha))
            elif worktree_status != b".":
                changed.append(path)
    files = len(changed) + len(deleted)
    refusal = limits.files_refusal(files)
    if refusal:
        raise PatchLimitError(refusal)
    total = 0
    for path in changed:
        with contextlib.suppress(OSError):  # gone between the listing and now: nothing to add
            total += os.lstat(worktree / os.fsdecode(path)).st_size
    if deleted and own_index is not None:
        with open(own_index, "rb") as handle:
            recorded = read_index_dict(handle)
        total += sum(getattr(recorded.get(path), "size", 0) for path, _ in deleted)
    elif deleted:
        sizes = git_run(["cat-file", "--batch-check=%(objectsize)"], cwd=worktree, env=env,
                        stdin=b"\n".join(sha for _, sha in deleted) + b"\n")
        total += sum(int(size) for size in sizes.split() if size.isdigit())
    refusal = limits.bytes_refusal(total, files)
    if refusal:
        raise PatchLimitError(refusal)
    return untracked


def worktree_tree(
    worktree: str | Path, *, base: str | None = None, scratch: ObjectScratch | None = None,
) -> str:
    """The sha of the tree of the worktree's files as they are now (what patch_extract diffs).

    Its objects go to `scratch` (to read the tree afterwards, e.g. for the change policy) or,
    without one, to a private scratch removed on return: the sha then only names the tree.
    """
    worktree = Path(worktree).resolve()
    if scratch is None:
        with _scratch_over(_worktree_objects(worktree)) as own:
            return worktree_tree(worktree, base=base, scratch=own)
    with tempfile.TemporaryDirectory(prefix="crucible-index-") as temp:
        worktree, env = _worktree_git(worktree, Path(temp) / "index", scratch)
        _files_stage(worktree, env, _base_resolve(worktree, env, base))
        return git_run(["write-tree"], cwd=worktree, env=env).decode().strip()


def worktree_tree_keep(worktree: str | Path) -> str:
    """The tree of the worktree's files, written into the repository's own object store.

    Only for a merge a person approved (git.commit_create): its commit needs every blob and
    tree in the repository. Everything else hashes into an ObjectScratch.
    """
    with tempfile.TemporaryDirectory(prefix="crucible-index-") as temp:
        worktree, env = _worktree_git(Path(worktree), Path(temp) / "index")
        _files_stage(worktree, env, _base_resolve(worktree, env, None))
        return git_run(["write-tree"], cwd=worktree, env=env).decode().strip()


def patched_tree(
    repo_path: str | Path, commit: str, patch_text: bytes, *, scratch: ObjectScratch | None = None,
) -> str:
    """The sha of `commit`'s tree with the patch applied, built in a temporary index only: no
    checkout, no filters, nothing run. For reading trees (compare), never for running a
    candidate. Its objects go to `scratch` (or a private one removed on return, as for
    worktree_tree). GitError says why a patch does not apply (`git apply` is all or nothing)."""
    if scratch is None:
        with object_scratch(repo_path) as own:
            return patched_tree(repo_path, commit, patch_text, scratch=own)
    repo_path, sha = _commit_resolve(repo_path, commit)
    with tempfile.TemporaryDirectory(prefix="crucible-index-") as temp:
        env = {"GIT_INDEX_FILE": str(Path(temp) / "index"), **scratch.env}
        git_run(["read-tree", sha], cwd=repo_path, env=env)
        if patch_text:
            try:
                git_run(["apply", "--cached", "--binary", "-"], cwd=repo_path, env=env, stdin=patch_text)
            except GitError as error:
                raise GitError(f"it does not apply to {short_sha(sha)} ({error})") from None
        return git_run(["write-tree"], cwd=repo_path, env=env).decode().strip()


def patch_stage(
    repo_path: str | Path, commit: str, patch_text: bytes, scratch: ObjectScratch, *,
    numstat: list[tuple[int | None, int | None, str]] | None = None,
) -> str:
    """The patched tree (patched_tree, its objects in `scratch`), checked to change exactly what
    the patch declares; `numstat` is the patch's, when the caller already has it. GitError says
    why not: not a git diff, does not apply, or the tree differs from the declaration."""
    try:
        declared = patch_name_status(patch_text, numstat=numstat)
    except GitError as error:
        raise GitError(f"not a well-formed git diff ({error})") from None
    sha = _commit_sha(repo_path, commit)
    if not patch_text:  # nothing to apply: the commit's own tree, read without a git call
        with contextlib.closing(scratch.store()) as store:
            try:
                commit_object = store[sha.encode()]
            except KeyError:
                commit_object = None
        if not isinstance(commit_object, Commit):
            raise GitError(f"{commit}: not a commit of this repository")
        return commit_object.tree.decode()
    tree = patched_tree(repo_path, sha, patch_text, scratch=scratch)
    with contextlib.closing(scratch.store()) as store:
        applied = _tree_changes(store, store[sha.encode()].tree, tree.encode())
    if applied != declared:
        raise GitError(f"the applied tree changes {_describe(applied)} but the patch declares "
                       f"{_describe(declared)}")
    return tree


def tree_checkout(repo_path: str | Path, commit: str, tree: str, name: str, scratch: ObjectScratch) -> Path:
    """A fresh worktree at `commit` whose files are `tree` (made by patch_stage into `scratch`).

    The checkout moves a temporary copy of the worktree's index from `commit` to `tree`
    (`read-tree -m -u`: only the changed files are written), so the worktree's own index stays
    at `commit` and names only objects the repository has; the changed files on disk are then
    checked against `tree`. Any failure removes the worktree and raises GitError.
    """
    sha = _commit_sha(repo_path, commit)
    worktree = worktree_create(repo_path, sha, name)
    try:
        with contextlib.closing(scratch.store()) as store:
            changes = _tree_entries_changed(store, store[sha.encode()].tree, tree.encode())
            if changes:
                with tempfile.TemporaryDirectory(prefix="crucible-index-") as temp:
                    index = Path(temp) / "index"
                    # The fresh checkout's index, stat data and all: `-m -u` needs files that match it.
                    shutil.copyfile(worktree_admin_dir(worktree) / "index", index)
                    worktree, env = _worktree_git(worktree, index, scratch)
                    git_run(["read-tree", "-m", "-u", sha, tree], cwd=worktree, env=env)
                    _checkout_verify(worktree, env, store, changes)
    except BaseException as error:
        with contextlib.suppress(GitError):
            worktree_remove(repo_path, worktree)
        if isinstance(error, GitError):
            raise GitError(f"patch rejected for {name}: {error}") from None
        raise
    return worktree


def patch_apply(
    repo_path: str | Path, commit: str, patch_text: bytes, name: str, *,
    numstat: list[tuple[int | None, int | None, str]] | None = None,
) -> Path:
    """A fresh worktree at `commit` with the patch applied, verified against the patch.

    The patched tree is built once in a temporary index with its objects in a scratch directory
    (patch_stage), then checked out (tree_checkout): the worktree's own index stays at `commit`
    (git there sees the patch as unstaged changes) and refers only to objects the repository
    has. Rejected (GitError naming the reason, no worktree left) if the patch is not a git
    diff, does not apply, or the resulting tree's name-status differs from what it declares.
    """
    with object_scratch(repo_path) as scratch:
        try:
            tree = patch_stage(repo_path, commit, patch_text, scratch, numstat=numstat)
        except GitError as error:
            raise GitError(f"patch rejected for {name}: {error}") from None
        return tree_checkout(repo_path, commit, tree, name, scratch)


# ------------------------------------------------------------------------------------------ trees

# Highest-precedence attributes of a tree's private git dir: no filter, eol or encoding rule a
# candidate's `.gitattributes` names is applied, so the files on disk are the tree's bytes.
_TREE_ATTRIBUTES = "* -text -crlf -eol -filter -ident -working-tree-encoding\n"


def tree_apply(
    repo_path: str | Path, commit: str, patch_text: bytes, name: str, *,
    numstat: list[tuple[int | None, int | None, str]] | None = None,
) -> Path:
    """A plain directory at DATA_DIR/worktrees/<name> holding `commit`'s files with the patch
    applied, verified as patch_apply verifies (a well-formed git diff that applies, whose applied
    name-status is what it declares, its changed files on disk checked against the result).

    Not a git worktree: no `.git` in it, nothing written under the repository's `.git`, no
    repository lock, so its cost does not grow with how many trees exist and no step waits on
    another's checkout. Git runs in a private git dir (empty config, no hooks, every attribute
    unset) over a temporary index and a scratch object directory: `read-tree` the commit,
    `apply --cached` (with `--numstat` when the caller has none), `checkout-index -a` into the
    tree; an empty patch is one `read-tree --reset -u`. The applied changes are read from the two
    index states in this process. Any failure leaves nothing behind and raises GitError.
    """
    name_check(name)
    sha = _commit_sha(repo_path, commit)
    target = worktrees_root() / name
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        target.mkdir()  # claims the name atomically
    except FileExistsError:
        raise GitError(f"tree {name}: {target} already exists; remove it first") from None
    try:
        target.chmod(0o755)  # whatever the server's umask: the sandbox's own user reads the tree
        with object_scratch(repo_path) as scratch:
            _tree_build(scratch, sha, patch_text, target, numstat)
    except BaseException as error:
        _partial_remove(target)
        if isinstance(error, GitError):
            raise GitError(f"patch rejected for {name}: {error}") from None
        raise
    return target


def tree_remove(path: str | Path) -> None:
    """Delete a tree made by tree_apply (or a legacy worktree's files: git forgets its record at
    the next prune, and worktree_create prunes when a name is still registered), whatever state a
    command left it in. Refuses anything not directly under DATA_DIR/worktrees."""
    root = worktrees_root()
    path = Path(path)
    if path.parent.resolve() != root:
        raise GitError(f"{path}: not a tree under {root}; refusing to delete it")
    name_check(path.name)
    _partial_remove(root / path.name)


def _tree_build(
    scratch: ObjectScratch, sha: str, patch_text: bytes, target: Path,
    numstat: list[tuple[int | None, int | None, str]] | None,
) -> None:
    git_dir = scratch.path.parent  # the scratch's own temporary directory
    (git_dir / "refs").mkdir()
    (git_dir / "HEAD").write_text(f"{sha}\n")
    (git_dir / "config").write_text("")
    (git_dir / "info").mkdir()
    (git_dir / "info" / "attributes").write_text(_TREE_ATTRIBUTES)
    index = git_dir / "index"
    env = {**scratch.env, "GIT_DIR": str(git_dir), "GIT_INDEX_FILE": str(index),
           "GIT_CEILING_DIRECTORIES": str(git_dir.parent)}
    tree_env = {**env, "GIT_WORK_TREE": str(target)}
    if not patch_text:
        if numstat:
            raise GitError("not a well-formed git diff (an empty patch declares changes)")
        try:
            git_run(["read-tree", "--reset", "-u", f"{sha}^{{commit}}"], cwd=target, env=tree_env)
        except GitError as error:
            raise GitError(f"{sha}: not a commit of this repository ({error})") from None
        return
    if not _blocks(patch_text):  # what patch_name_status would say, before any git process
        raise GitError("not a well-formed git diff (the patch has no git diff headers; only "
                       "`git diff` output is accepted)")
    try:
        git_run(["read-tree", f"{sha}^{{commit}}"], cwd=git_dir, env=env)
    except GitError as error:
        raise GitError(f"{sha}: not a commit of this repository ({error})") from None
    before = _index_entries(index)
    args = ["apply", "--cached", "--binary"]
    if numstat is None:
        args += ["--numstat", "-z", "--apply"]  # the numstat and the apply in one process
    try:
        out = git_run([*args, "-"], cwd=git_dir, env=env, stdin=patch_text)
    except GitError as error:
        raise GitError(f"it does not apply to {short_sha(sha)} ({error})") from None
    if numstat is None:
        numstat = _numstat_parse(out)
    try:
        declared = patch_name_status(patch_text, numstat=numstat)
    except GitError as error:
        raise GitError(f"not a well-formed git diff ({error})") from None
    changes = _index_changes(before, _index_entries(index))
    applied = _changes_kinds(changes)
    if applied != declared:
        raise GitError(f"the applied tree changes {_describe(applied)} but the patch declares "
                       f"{_describe(declared)}")
    git_run(["checkout-index", "--all", "--force", "--quiet"], cwd=target, env=tree_env)
    with contextlib.closing(scratch.store()) as store:
        _checkout_verify(target, None, store, changes)


def _index_entries(index: Path) -> dict[bytes, tuple[int, bytes]]:
    """{path: (mode, sha)} of a temporary index, read in this process.

    Index versions 2 and 3 (what read-tree and apply write here) are parsed directly: only each
    entry's mode, object id and path are needed, and dulwich's full parse costs tens of ms for
    5,000 entries; any other version is read with dulwich."""
    data = index.read_bytes()
    if data[:4] != b"DIRC":
        raise GitError(f"{index}: not an index file")
    version, count = struct.unpack_from(">II", data, 4)
    if version not in (2, 3):
        return _index_entries_dulwich(index)
    out = {}
    position = 12
    for _ in range(count):
        (mode,) = struct.unpack_from(">I", data, position + 24)
        (flags,) = struct.unpack_from(">H", data, position + 60)
        header = 64 if flags & FLAG_EXTENDED else 62
        end = data.index(b"\0", position + header)
        path = data[position + header : end]
        if flags & FLAG_STAGEMASK:
            raise GitError(f"{path.decode(errors='surrogateescape')} is left conflicted")
        out[path] = (mode, data[position + 40 : position + 60].hex().encode())
        position += (header + len(path) + 8) & ~7
    return out


def _index_entries_dulwich(index: Path) -> dict[bytes, tuple[int, bytes]]:
    with open(index, "rb") as handle:
        entries = read_index_dict(handle)
    out = {}
    for path, entry in entries.items():
        if isinstance(entry, ConflictedIndexEntry):
            raise GitError(f"{path.decode(errors='surrogateescape')} is left conflicted")
        out[path] = (entry.mode, entry.sha)
    return out


def _index_changes(
    old: dict[bytes, tuple[int, bytes]], new: dict[bytes, tuple[int, bytes]],
) -> list[TreeChange]:
    """The file-level changes from one index state to another (a type change is a modify)."""
    changes = []
    for path in sorted(old.keys() | new.keys()):
        before, after = old.get(path), new.get(path)
        if before == after:
            continue
        old_entry = TreeEntry(path, *before) if before else None
        new_entry = TreeEntry(path, *after) if after else None
        kind = CHANGE_ADD if before is None else CHANGE_DELETE if after is None else CHANGE_MODIFY
        changes.append(TreeChange(kind, old_entry, new_entry))
    return changes


def patch_name_status(
    text: bytes, *, numstat: list[tuple[int | None, int | None, str]] | None = None,
) -> dict[str, str]:
    """What a git diff declares it does, as {path: "A" | "D" | "M"} once all its parts are applied.

    The kind of each part comes from its `diff --git` header lines; its path from
    `git apply --numstat` (or `numstat`, when the caller already ran it on this text), so both
    must agree on how many parts there are.
    """
    blocks = _blocks(text)
    entries = _numstat_entries(text) if numstat is None else numstat
    if len(blocks) != len(entries):
        raise GitError(
            f"the patch has {len(entries)} file diffs but {len(blocks)} git diff headers; "
            "only `git diff` output is accepted"
        )
    declared: dict[str, str] = {}
    for (kind, source), (_, _, path) in zip(blocks, entries, strict=True):
        changes = [(path, "A" if kind in "RC" else kind)]
        if kind == "R":
            changes.insert(0, (source, "D"))
        for changed, status in changes:
            _status_combine(declared, changed, status)
    return declared


def _tree_entries_changed(store: DiskObjectStore, old: bytes, new: bytes) -> list[TreeChange]:
    """The file-level changes from tree `old` to tree `new`, read in this process (no git call)."""
    return list(tree_changes(store, old, new, change_type_same=True))


def _tree_changes(store: DiskObjectStore, old: bytes, new: bytes) -> dict[str, str]:
    """{path: A | D | M} from tree `old` to `new`, as `git diff-tree -r --no-renames` names them
    (a type change is an M)."""
    return _changes_kinds(_tree_entries_changed(store, old, new))


def _changes_kinds(entries: Sequence[TreeChange]) -> dict[str, str]:
    kinds = {CHANGE_ADD: "A", CHANGE_DELETE: "D"}
    changes = {}
    for change in entries:
        path = (change.new.path if change.type == CHANGE_ADD else change.old.path) or change.new.path
        changes[path.decode(errors="surrogateescape")] = kinds.get(change.type, "M")
    return changes


def _checkout_verify(worktree: Path, env: dict[str, str] | None, store: DiskObjectStore,
                     changes: Sequence[TreeChange]) -> None:
    """Every changed path on disk is what the tree holds: the same bytes, link target and
    executable bit, and deleted paths gone. A file the checkout converted (an in-tree
    `.gitattributes` eol or filter rule) is hashed by git the way `git add` would, and must
    give the tree's blob back; without `env` (a tree_apply tree, where nothing converts) it
    is refused."""
    converted: list[tuple[bytes, bytes]] = []
    for change in changes:
        if change.type == CHANGE_DELETE:
            shown = change.old.path.decode(errors="surrogateescape")
            on_disk = worktree / os.fsdecode(change.old.path)
            if os.path.lexists(on_disk) and (on_disk.is_symlink() or not on_disk.is_dir()):
                raise GitError(f"after checkout, {shown} is still on disk")
            continue
        entry = change.new
        shown = entry.path.decode(errors="surrogateescape")
        on_disk = worktree / os.fsdecode(entry.path)
        if stat.S_ISDIR(entry.mode) or entry.mode == GITLINK_MODE:
            continue  # a submodule is an empty directory in a checkout
        try:
            mode = on_disk.lstat().st_mode
            if stat.S_ISLNK(entry.mode):
                same = stat.S_ISLNK(mode) and os.fsencode(os.readlink(on_disk)) == store[entry.sha].data
            elif not stat.S_ISREG(mode) or bool(mode & stat.S_IXUSR) != bool(entry.mode & stat.S_IXUSR):
                same = False
            elif on_disk.read_bytes() == store[entry.sha].data:
                same = True
            else:
                same = env is not None and b"\n" not in entry.path  # one path a line for hash-object
                converted.append((entry.path, entry.sha))
        except OSError:
            same = False
        if not same:
            raise GitError(f"after checkout, {shown} on disk differs from the patched tree")
    if converted and env is not None:
        out = git_run(["hash-object", "--stdin-paths"], cwd=worktree, env=env,
                      stdin=b"".join(path + b"\n" for path, _ in converted)).split()
        for index, (path, sha) in enumerate(converted):
            if index >= len(out) or out[index] != sha:
                shown = path.decode(errors="surrogateescape")
                raise GitError(f"after checkout, {shown} on disk differs from the patched tree")


def _base_resolve(worktree: Path, env: dict[str, str], base: str | None) -> str:
    """The commit to diff against: `base` as given (a full sha: read-tree checks it names a
    commit), or the worktree's HEAD read from its record, which the candidate cannot write."""
    if base is not None:
        if not _SHA.fullmatch(base):
            raise GitError(f"{base!r}: give the base as a full 40-character commit sha")
        return base
    try:
        head = (Path(env["GIT_DIR"]) / "HEAD").read_text().strip()
    except OSError:
        head = ""
    if _SHA.fullmatch(head):  # detached, as every worktree here is made: no git call needed
        return head
    try:
        out = git_run(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], cwd=worktree, env=env)
    except GitError:
        raise GitError(f"{worktree}: base HEAD is not a commit of this repository") from None
    return out.decode().strip()


def _base_read(worktree: Path, env: dict[str, str], base: str) -> None:
    """Fill the (temporary) index with base's tree; `^{commit}` makes git refuse a non-commit."""
    try:
        git_run(["read-tree", f"{base}^{{commit}}"], cwd=worktree, env=env)
    except GitError as error:
        raise GitError(f"{worktree}: base {base} is not a commit of this repository ({error})") from None


def _files_stage(worktree: Path, env: dict[str, str], base: str) -> None:
    """Fill the (temporary) index with base, then with every file on disk that is not ignored.

    Starting from base keeps tracked files that match an ignore rule; entries read from a
    tree have no stat data, so every file is hashed again rather than trusted by its mtime.
    """
    _base_read(worktree, env, base)
    git_run(["add", "--all", "--", "."], cwd=worktree, env=env)


def _numstat_entries(text: bytes) -> list[tuple[int | None, int | None, str]]:
    """(added, deleted, path) per part of the patch, as `git apply --numstat` reads it."""
    if not text:
        return []
    with tempfile.TemporaryDirectory(prefix="crucible-numstat-") as temp:
        out = git_run(["apply", "--numstat", "-z", "-"], cwd=Path(temp), stdin=text,
                      env={"GIT_CEILING_DIRECTORIES": str(Path(temp).parent)})
    return _numstat_parse(out)


def _numstat_parse(out: bytes) -> list[tuple[int | None, int | None, str]]:
    entries = []
    for entry in out.split(b"\0")[:-1]:
        added, deleted, path = entry.split(b"\t", 2)
        entries.append((_count(added), _count(deleted), path.decode(errors="surrogateescape")))
    return entries


def _count(value: bytes) -> int | None:
    return None if value == b"-" else int(value)


def _blocks(text: bytes) -> list[tuple[str, str]]:
    """Per `diff --git` part: its kind, A(dded) D(eleted) R(enamed) C(opied) or M(odified), and
    for a rename or copy the path it comes from."""
    blocks: list[tuple[str, str]] = []
    in_header = False
    for line in text.split(b"\n"):
        if line.startswith(b"diff --git "):
            blocks.append(("M", ""))
            in_header = True
        elif in_header and line.startswith((b"--- ", b"@@ ", b"GIT binary patch", b"Binary files ")):
            in_header = False
        elif in_header:
            for prefix, kind in ((b"new file mode ", "A"), (b"deleted file mode ", "D"),
                                 (b"rename from ", "R"), (b"copy from ", "C")):
                if line.startswith(prefix):
                    source = _unquote(line.removeprefix(prefix)) if kind in "RC" else ""
                    blocks[-1] = (kind, source)
    return blocks


_ESCAPES = {ord("a"): 7, ord("b"): 8, ord("f"): 12, ord("n"): 10, ord("r"): 13, ord("t"): 9,
            ord("v"): 11, ord('"'): 34, ord("\\"): 92}


def path_unquote(name: bytes) -> bytes | None:
    """A path as git writes it: as is, or C-quoted with octal escapes; None if malformed."""
    if not name.startswith(b'"'):
        return name
    if not name.endswith(b'"') or len(name) < 2:
        return None
    out, body, position = bytearray(), name[1:-1], 0
    try:
        while position < len(body):
            byte = body[position]
            if byte != ord("\\"):
                out.append(byte)
                position += 1
            elif body[position + 1: position + 2].isdigit():
                out.append(int(body[position + 1: position + 4], 8))
                position += 4
            else:
                out.append(_ESCAPES[body[position + 1]])
                position += 2
    except (KeyError, IndexError, ValueError):
        return None
    return bytes(out)


def _unquote(name: bytes) -> str:
    """A path as git writes it in a header (path_unquote; a malformed quoting is kept as written)."""
    unquoted = path_unquote(name)
    return (name if unquoted is None else unquoted).decode(errors="surrogateescape")


_COMBINED = {("A", "M"): "A", ("M", "M"): "M", ("M", "D"): "D", ("D", "A"): "M", ("A", "D"): None}


def _status_combine(declared: dict[str, str], path: str, status: str) -> None:
    """Fold a later part of the patch touching the same path into what the earlier ones did."""
    if path not in declared:
        declared[path] = status
        return
    pair = (declared[path], status)
    if pair not in _COMBINED:
        raise GitError(f"the patch touches {path} twice in ways that cannot follow each other")
    combined = _COMBINED[pair]
    if combined is None:
        del declared[path]
    else:
        declared[path] = combined


def _describe(changes: dict[str, str]) -> str:
    if not changes:
        return "nothing"
    return ", ".join(f"{status} {path}" for path, status in sorted(changes.items()))
