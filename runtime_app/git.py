"""Reading git repositories with dulwich: open, resolve refs, read files at a commit."""

from __future__ import annotations

import re
from pathlib import Path

from dulwich import porcelain
from dulwich.errors import NotGitRepository
from dulwich.objects import Blob, Commit, Tag, Tree
from dulwich.repo import Repo

_HEX = re.compile(r"^[0-9a-f]{4,40}$")


class GitError(ValueError):
    """A repository, ref or path problem, with a message a person can act on."""


def repo_open(path: str | Path) -> Repo:
    """Open a non-bare repository at exactly this path (not a parent of it)."""
    target = Path(path).expanduser()
    if not target.is_absolute():
        raise GitError(f"{path}: give an absolute path")
    try:
        exists, is_dir = target.exists(), target.is_dir()
    except OSError as error:  # e.g. a name too long for the file system
        raise GitError(f"{target}: cannot be read ({error.strerror})") from None
    if not exists:
        raise GitError(f"{target}: no such directory")
    if not is_dir:
        raise GitError(f"{target}: not a directory")
    try:
        repo = Repo(str(target))
    except NotGitRepository:
        raise GitError(f"{target}: not a git repository (no .git here)") from None
    except PermissionError:
        raise GitError(f"{target}: not readable by the Crucible server") from None
    if repo.bare:
        repo.close()
        raise GitError(f"{target}: a bare repository; register a clone with a working tree")
    return repo


def ref_resolve(repo: Repo, ref: str) -> str:
    """The commit sha a branch, tag, `HEAD` or (abbreviated) sha names."""
    ref = (ref or "").strip()
    if not ref:
        raise GitError("give a ref: a branch, a tag, HEAD or a commit sha")
    candidates = [ref.encode()] if ref == "HEAD" else [
        f"refs/heads/{ref}".encode(), f"refs/tags/{ref}".encode(), ref.encode()
    ]
    for name in candidates:
        try:
            sha = repo.refs[name]
        except KeyError:
            continue
        return _peel(repo, sha)
    if _HEX.match(ref):
        matches = [sha for sha in repo.object_store if sha.decode().startswith(ref)]
        commits = [sha for sha in matches if isinstance(repo[sha], Commit | Tag)]
        if len(commits) == 1:
            return _peel(repo, commits[0])
        if len(commits) > 1:
            raise GitError(f"{ref}: ambiguous; give more characters of the sha")
    if ref == "HEAD":
        raise GitError("HEAD: the repository has no commits yet")
    raise GitError(f"{ref}: no branch, tag or commit by that name")


def _peel(repo: Repo, sha: bytes) -> str:
    obj = repo[sha]
    while isinstance(obj, Tag):
        obj = repo[obj.object[1]]
    if not isinstance(obj, Commit):
        raise GitError(f"{sha.decode()}: not a commit")
    return obj.id.decode()


def refs_list(repo: Repo) -> dict[str, list[str]]:
    names = [name.decode() for name in repo.refs.allkeys()]
    return {
        "branches": sorted(n.removeprefix("refs/heads/") for n in names if n.startswith("refs/heads/")),
        "tags": sorted(n.removeprefix("refs/tags/") for n in names if n.startswith("refs/tags/")),
    }


def worktree_changes(repo: Repo) -> list[str]:
    """Tracked files changed in the working tree or index (untracked files don't count)."""
    status = porcelain.status(repo, untracked_files="no")
    changed = set()
    for group in status.staged.values():
        changed.update(p.decode() if isinstance(p, bytes) else p for p in group)
    changed.update(p.decode() if isinstance(p, bytes) else p for p in status.unstaged)
    # dulwich reports clean submodules as changed; their commit is pinned by the gitlink.
    index = repo.open_index()
    submodules = {path.decode() for path, entry in index.iteritems()
                  if getattr(entry, "mode", 0) & 0o170000 == 0o160000}
    return sorted(changed - submodules)


def file_at(repo: Repo, commit: str, path: str) -> bytes | None:
    """The bytes of a file at a commit, or None when no file is there."""
    tree = repo[repo[commit.encode()].tree]
    try:
        _, sha = tree.lookup_path(repo.object_store.__getitem__, path.encode())
    except KeyError:
        return None
    obj = repo[sha]
    return obj.data if isinstance(obj, Blob) else None


def is_tree(repo: Repo, commit: str, path: str) -> bool:
    tree = repo[repo[commit.encode()].tree]
    try:
        _, sha = tree.lookup_path(repo.object_store.__getitem__, path.rstrip("/").encode())
    except KeyError:
        return False
    return isinstance(repo[sha], Tree)
