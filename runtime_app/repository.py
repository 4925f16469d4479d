"""Opening a repository and resolving its refs: what runtime_app.git and runtime_app.worktrees
both stand on (git re-exports these)."""

from __future__ import annotations

import re
from pathlib import Path

from dulwich.errors import NotGitRepository
from dulwich.objects import Commit, Tag
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
