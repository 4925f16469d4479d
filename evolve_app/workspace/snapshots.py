"""A workspace under git: import, snapshots, changed paths, restore and rollback, through dulwich
and the sealed git CLI."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

from dulwich import porcelain
from dulwich.ignore import IgnoreFilter, IgnoreFilterManager
from dulwich.index import Index, commit_tree, index_entry_from_stat
from dulwich.objects import Blob, Commit, ObjectID
from dulwich.refs import Ref, check_ref_format
from dulwich.repo import Repo

from evolve_app.workspace.files import _atomic_write
from evolve_app.workspace.validation import (
    _GITLINK,
    DEFAULT_AUTHOR,
    EXCLUDED_DIR,
    WorkspaceError,
    WorkspaceInvalid,
    _infer,
    _root,
    _tree_files,
    workspace_check,
    workspace_validate,
)
from runtime_app.git import GitError, commit_create, ref_resolve, repo_open, tag_create
from runtime_app.worktrees import git_run, repo_lock


def _import_with_manifest(root: Path, manifest_text: str, author: str) -> str:
    """A confirmed import preview: check everything as it would be, then write manifest.yaml
    (and prompts/system.md), then import. Anything failing leaves the folder as it was."""
    problems, _ = workspace_check(root, manifest_text=manifest_text)
    if problems:
        raise WorkspaceInvalid(problems)
    inferred = _infer(root)
    had_git, had_prompts = os.path.lexists(root / ".git"), os.path.lexists(root / "prompts")
    written: list[Path] = []
    try:
        if inferred.prompt is not None:
            (root / "prompts").mkdir(exist_ok=True)
            _atomic_write(root / "prompts" / "system.md", inferred.prompt)
            written.append(root / "prompts" / "system.md")
        _atomic_write(root / "manifest.yaml", manifest_text.encode("utf-8"))
        written.append(root / "manifest.yaml")
        return workspace_import(root, author=author)
    except BaseException:
        for path in written:
            with contextlib.suppress(OSError):
                path.unlink()
        if not had_prompts:
            with contextlib.suppress(OSError):
                (root / "prompts").rmdir()
        if not had_git and (root / ".git").is_dir() and not (root / ".git").is_symlink():
            shutil.rmtree(root / ".git", ignore_errors=True)
        raise


# ------------------------------------------------------------------------------------------------ git


def workspace_import(path: str | Path, *, author: str = DEFAULT_AUTHOR, manifest_text: str | None = None
                     ) -> str:
    """Bring a valid workspace under git: `git init` if it is not a repository (branch `main`),
    exclude evolution/ from history, commit every file, tag `evo-0` (annotated) unless it
    exists. Returns the commit sha (HEAD when an existing repository had nothing to commit).

    `manifest_text` confirms a folder's import preview (`workspace_preview`): the folder has no
    manifest.yaml; the text is written as one (and the prompt to prompts/system.md) only once
    everything checks, and taken back if the import then fails.

    Raises WorkspaceInvalid listing every problem when the workspace does not validate.
    """
    root = _root(path)
    if manifest_text is not None:
        return _import_with_manifest(root, manifest_text, author)
    problems = workspace_validate(root)
    if problems:
        raise WorkspaceInvalid(problems)
    with repo_lock(root):
        if not (root / ".git").exists():
            porcelain.init(str(root)).close()
            repo = Repo(str(root))
            repo.refs.set_symbolic_ref(Ref(b"HEAD"), Ref(b"refs/heads/main"))
            repo.close()
        repo = _repo(root)
        try:
            _exclude_add(repo)
            head = _head(repo)
            tree = _stage_all(repo)
            if head is None or _commit_tree(repo, head) != tree:
                message = "Import workspace" if head is None else "Import workspace: its uncommitted files"
                head = _commit(root, repo, message, author, {"Crucible-Snapshot": "import"})
            if Ref(b"refs/tags/evo-0") not in repo.refs:
                _tag(root, "evo-0", head, "Workspace imported into Crucible", author)
            return head
        finally:
            repo.close()


def workspace_snapshot(path: str | Path, tag: str, message: str, trailers: dict[str, str] | None = None,
                       *, author: str = DEFAULT_AUTHOR) -> str:
    """Commit the workspace's files as they are (additions, changes and deletions; evolution/ and
    ignored files left out) and tag the commit `tag` (annotated). Returns the commit sha.

    Every snapshot is its own commit, even when no file changed (its tree then equals its
    parent's): its message and trailers (cycle, engine ...) stay in `git log`, and `pre-evo-N`
    and `evo-N` are always distinct commits. An existing tag is never moved: WorkspaceError,
    and nothing is committed.
    """
    root = _root(path)
    if (not isinstance(tag, str) or not check_ref_format(Ref(f"refs/tags/{tag}".encode()))
            or tag.startswith("-")):
        raise WorkspaceError(f"{tag!r}: not a valid tag name")
    with repo_lock(root):
        repo = _repo(root)
        try:
            if Ref(f"refs/tags/{tag}".encode()) in repo.refs:
                raise WorkspaceError(f"tag {tag} already exists; snapshot tags are never moved")
            _stage_all(repo)
            sha = _commit(root, repo, message, author, trailers or {})
            _tag(root, tag, sha, message, author)
            return sha
        finally:
            repo.close()


def workspace_changed_paths(path: str | Path, base_ref: str, head_ref: str) -> list[tuple[str, str]]:
    """(status, path) for each file that differs between two commits: A, D, M or T (no renames)."""
    root = _root(path)
    base, head = _resolve(root, base_ref), _resolve(root, head_ref)
    out = workspace_git(root, ["diff-tree", "-r", "-z", "--no-renames", "--name-status", base, head])
    fields = out.split(b"\0")
    return [(status.decode(), name.decode("utf-8", "surrogateescape"))
            for status, name in zip(fields[0::2], fields[1::2], strict=False) if status]


def workspace_ref_and_tree(root: Path, ref: str) -> tuple[str, str]:
    """`ref`'s commit, and the tree a snapshot would commit from the files on disk now."""
    with repo_lock(root):
        repo = _repo(root)
        try:
            return _ref(repo, ref), _worktree_tree(repo)
        finally:
            repo.close()


def workspace_changes(path: str | Path, ref: str) -> list[tuple[str, str]]:
    """(status, path) for each file where the working tree, as a snapshot would commit it now
    (untracked files included; ignored files and evolution/ not), differs from `ref`. The index
    is not touched and no filter runs."""
    root = _root(path)
    base, tree = workspace_ref_and_tree(root, ref)
    out = workspace_git(root, ["diff-tree", "-r", "-z", "--no-renames", "--name-status", base, tree])
    fields = out.split(b"\0")
    return [(status.decode(), name.decode("utf-8", "surrogateescape"))
            for status, name in zip(fields[0::2], fields[1::2], strict=False) if status]


def workspace_restore(path: str | Path, ref: str) -> str:
    """Make the working tree and index equal to `ref`'s tree; HEAD and history stay as they are.

    Files that are not in `ref` are removed (untracked ignored files are kept), files that are
    are written back byte for byte. `.git` and evolution/ are never touched. Returns the commit
    sha restored. Used to revert a failed or rejected cycle to `pre-evo-N`.
    """
    root = _root(path)
    with repo_lock(root):
        repo = _repo(root)
        try:
            sha = _ref(repo, ref)
            _restore(root, repo, sha)
            return sha
        finally:
            repo.close()


def workspace_rollback(path: str | Path, ref: str, *, author: str = DEFAULT_AUTHOR,
                       force: bool = False) -> str:
    """A NEW commit on top of HEAD whose tree is `ref`'s tree ("Roll back to <ref>", trailer
    `Crucible-Rollback-To: <ref>`); the working tree follows. Nothing is rewritten. Refuses
    when the working tree has uncommitted changes, unless `force` (they are then discarded)."""
    root = _root(path)
    with repo_lock(root):
        repo = _repo(root)
        try:
            target = _ref(repo, ref)
            head = _head(repo)
            if head is None:
                raise WorkspaceError("the workspace has no commits yet; import it first")
            if not force and _worktree_tree(repo) != _commit_tree(repo, head):
                raise WorkspaceError("the workspace has uncommitted changes; snapshot them first, or roll "
                                     "back with force=True to discard them")
            _restore(root, repo, target)
            return _commit(root, repo, f"Roll back to {ref}", author, {"Crucible-Rollback-To": ref})
        finally:
            repo.close()


def workspace_git(root: Path, args: list[str]) -> bytes:
    """The sealed git CLI (hooks off, no user/system config) in the workspace's own repository."""
    return git_run(args, cwd=root, env={"GIT_DIR": str(Path(_repo_controldir(root))),
                                        "GIT_WORK_TREE": str(root),
                                        "GIT_CEILING_DIRECTORIES": str(root.parent)})


def _repo_controldir(root: Path) -> str:
    repo = _repo(root)
    try:
        return repo.controldir()
    finally:
        repo.close()


def _repo(root: Path) -> Repo:
    try:
        return repo_open(root)
    except GitError as error:
        raise WorkspaceError(f"{error}; import the workspace first") from None


def _resolve(root: Path, ref: str) -> str:
    repo = _repo(root)
    try:
        return _ref(repo, ref)
    finally:
        repo.close()


def _ref(repo: Repo, ref: str) -> str:
    if not isinstance(ref, str):
        raise WorkspaceError(f"{ref!r}: give a ref as text")
    try:
        return ref_resolve(repo, ref)
    except GitError as error:
        raise WorkspaceError(str(error)) from None


def _head(repo: Repo) -> str | None:
    try:
        return ref_resolve(repo, "HEAD")
    except GitError:
        return None


def _commit(root: Path, repo: Repo, message: str, author: str, trailers: dict[str, str]) -> str:
    """Commit the repository's index on top of HEAD (its branch follows, or a detached HEAD)."""
    head_target = repo.refs.read_ref(Ref(b"HEAD")) or b""
    branch = None
    if head_target.startswith(b"ref: refs/heads/"):
        branch = head_target.removeprefix(b"ref: refs/heads/").strip().decode()
    parent = _head(repo)
    try:
        sha = commit_create(root, message=message, author=author, trailers=trailers, parent_commit=parent,
                            branch=branch)
    except GitError as error:
        raise WorkspaceError(str(error)) from None
    head_before = ObjectID(parent.encode()) if parent else None
    if branch is None and not repo.refs.set_if_equals(Ref(b"HEAD"), head_before, ObjectID(sha.encode())):
        raise WorkspaceError("HEAD moved while committing; not moved")
    return sha


def _tag(root: Path, name: str, sha: str, message: str, author: str) -> None:
    try:
        tag_create(root, name, sha, message, author)
    except GitError as error:
        raise WorkspaceError(str(error)) from None


def _exclude_add(repo: Repo) -> None:
    """`/evolution/` in .git/info/exclude, and out of the index if an old commit tracked it."""
    exclude = Path(repo.commondir()) / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    current = exclude.read_text(errors="replace") if exclude.is_file() else ""
    line = f"/{EXCLUDED_DIR}/"
    if line not in current.splitlines():
        with open(exclude, "a") as handle:
            handle.write(("" if not current or current.endswith("\n") else "\n") +
                         "# Crucible: observations stay outside the workspace's history\n" + line + "\n")


def _ignores(repo: Repo, root: Path) -> IgnoreFilterManager:
    """.gitignore files and info/exclude only: no user-level ignore file, as git_run's git sees it."""
    filters = []
    with contextlib.suppress(OSError):
        filters.append(IgnoreFilter.from_path(os.path.join(repo.commondir(), "info", "exclude")))
    return IgnoreFilterManager(str(root), filters, False)


def _excluded(rel: str) -> bool:
    return rel == EXCLUDED_DIR or rel.startswith(EXCLUDED_DIR + "/")


def _worktree_entries(repo: Repo, root: Path,
                      index: Index) -> dict[bytes, tuple[int, ObjectID, os.stat_result]]:
    """{path: (mode, blob sha, stat)} of the files git would commit now: tracked ones still on disk
    and untracked ones not ignored; their blobs are added to the object store. Raw bytes: no
    filter, no line-ending conversion."""
    ignores = _ignores(repo, root)
    tracked = {path.decode("utf-8", "surrogateescape") for path in index}
    entries: dict[bytes, tuple[int, ObjectID, os.stat_result]] = {}
    for rel in _tree_files(root):
        if _excluded(rel) or (rel not in tracked and ignores.is_ignored(rel)):
            continue
        full = root / rel
        info = os.lstat(full)
        if stat.S_ISLNK(info.st_mode):
            blob, mode = Blob.from_string(os.fsencode(os.readlink(full))), stat.S_IFLNK
        elif stat.S_ISREG(info.st_mode):
            blob = Blob.from_string(full.read_bytes())
            mode = 0o100755 if info.st_mode & 0o111 else 0o100644
        else:
            continue  # sockets, fifos: not content
        if blob.id not in repo.object_store:
            repo.object_store.add_object(blob)
        entries[rel.encode("utf-8", "surrogateescape")] = (mode, blob.id, info)
    return entries


def _stage_all(repo: Repo) -> str:
    """Make the repository's index hold exactly the files on disk; returns the index's tree sha."""
    root = Path(repo.path).resolve()
    index = repo.open_index()
    entries = _worktree_entries(repo, root, index)
    index.clear()
    for path, (mode, sha, info) in entries.items():
        index[path] = index_entry_from_stat(info, sha, mode=mode)
    index.write()
    return index.commit(repo.object_store).decode()


def _worktree_tree(repo: Repo) -> str:
    """The tree sha of the files on disk, computed without touching the index file."""
    root = Path(repo.path).resolve()
    entries = _worktree_entries(repo, root, repo.open_index())
    return commit_tree(repo.object_store, [(p, sha, mode) for p, (mode, sha, _) in entries.items()]).decode()


def _commit_tree(repo: Repo, sha: str) -> str:
    """The tree sha of commit `sha`."""
    commit = repo[sha.encode()]
    if not isinstance(commit, Commit):
        raise WorkspaceError(f"{sha}: not a commit")
    tree: bytes = commit.tree
    return tree.decode()


def _blob_data(repo: Repo, sha: ObjectID) -> bytes:
    """The content of the blob a tree entry names (a file or a symlink's target)."""
    blob = repo[sha]
    if not isinstance(blob, Blob):
        raise WorkspaceError(f"{sha.decode()}: not a file")
    return blob.data


def _tree_path_check(path: bytes) -> str:
    rel = path.decode("utf-8", "surrogateescape")
    parts = rel.split("/")
    if any(part in ("", ".", "..") or part.lower() == ".git" or "\0" in part for part in parts):
        raise WorkspaceError(f"the commit holds an unsafe path {rel!r}; refusing to write it")
    return rel


def _restore(root: Path, repo: Repo, sha: str) -> None:
    commit = repo[sha.encode()]
    if not isinstance(commit, Commit):
        raise WorkspaceError(f"{sha}: not a commit")
    wanted: dict[str, tuple[int, ObjectID]] = {}
    for entry in repo.object_store.iter_tree_contents(commit.tree):
        rel = _tree_path_check(entry.path)
        if not _excluded(rel) and entry.mode != _GITLINK:
            wanted[rel] = (entry.mode, entry.sha)
    index = repo.open_index()
    tracked = {path.decode("utf-8", "surrogateescape") for path in index}
    ignores = _ignores(repo, root)
    _extras_remove(root, wanted, tracked, ignores)  # first, so no file is in the way of a folder

    index.clear()
    for rel, (mode, blob_sha) in sorted(wanted.items()):
        full = root / rel
        _parents_make(root, full.parent)
        if full.is_dir() and not full.is_symlink():
            shutil.rmtree(full)
        if stat.S_ISLNK(mode):
            if os.path.lexists(full):
                full.unlink()
            os.symlink(os.fsdecode(_blob_data(repo, blob_sha)), full)
        else:
            data = _blob_data(repo, blob_sha)
            file_mode = 0o755 if mode & 0o111 else 0o644
            same = (full.is_file() and not full.is_symlink() and full.stat().st_size == len(data)
                    and full.read_bytes() == data)
            if same:
                if (stat.S_IMODE(full.stat().st_mode) & 0o111) != (file_mode & 0o111):
                    full.chmod(file_mode)
            else:
                if full.is_symlink():
                    full.unlink()
                _atomic_write(full, data, file_mode)
        index_entry = index_entry_from_stat(os.lstat(full), blob_sha, mode=mode)
        index[rel.encode("utf-8", "surrogateescape")] = index_entry
    index.write()
    # Again under the restored .gitignore files: an untracked file they do not ignore would
    # otherwise slip into the next snapshot.
    _extras_remove(root, wanted, set(wanted), _ignores(repo, root))


def _extras_remove(root: Path, wanted: dict[str, tuple[int, ObjectID]], tracked: set[str],
                   ignores: IgnoreFilterManager) -> None:
    """Delete every file that is not in `wanted`, except untracked ones the ignore rules ignore
    (caches and the like), then the folders left empty. Decided before anything is deleted."""
    doomed = [rel for rel in _tree_files(root)
              if rel not in wanted and not _excluded(rel) and (rel in tracked or not ignores.is_ignored(rel))]
    for rel in doomed:
        (root / rel).unlink()
    _empty_dirs_remove(root)


def _parents_make(root: Path, folder: Path) -> None:
    """Make folder and its parents under root as real directories: a symlink or file in the way
    is removed, so nothing is ever written through a link."""
    path = root
    for part in folder.relative_to(root).parts:
        path = path / part
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            path.unlink()
        if not path.exists():
            path.mkdir()


def _empty_dirs_remove(root: Path) -> None:
    """Remove empty directories under root, deepest first (not .git, not evolution/)."""
    folders = []
    for top, dirs, _ in os.walk(root, followlinks=False):
        at_root = Path(top) == root
        dirs[:] = [d for d in dirs if d != ".git" and not (at_root and d == EXCLUDED_DIR)]
        if not at_root:
            folders.append(top)
    for top in reversed(folders):
        with contextlib.suppress(OSError):
            if not os.listdir(top):
                os.rmdir(top)
