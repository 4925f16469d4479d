"""Reading git repositories with dulwich: open, resolve refs, read files at a commit."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

from dulwich import porcelain
from dulwich.objects import Blob, Commit, Tag, Tree
from dulwich.refs import check_ref_format
from dulwich.repo import Repo

# Re-exported: callers import a repository's basics from here with the rest.
from runtime_app.repository import GitError as GitError
from runtime_app.repository import ref_resolve as ref_resolve
from runtime_app.repository import repo_open as repo_open
from runtime_app.worktrees import worktree_admin_dir, worktree_tree_keep


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


# ------------------------------------------------------------------------ commits and tags (dulwich)

_IDENTITY = re.compile(r"[^<>\n\r\0]+ <[^<>\n\r\0]+>")
_TRAILER_KEY = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,62}")


def commit_create(
    repo_path: str | Path,
    *,
    message: str,
    author: str,
    trailers: dict[str, str],
    parent_commit: str | None,
    tree_from_worktree: str | Path | None = None,
    committer: str | None = None,
    when: datetime | None = None,
    branch: str | None = None,
) -> str:
    """A commit object made with dulwich, no hooks run; returns its sha.

    The tree is that of the files of `tree_from_worktree` (a worktree of this repository, e.g.
    one `patch_apply` made), hashed into this repository's objects (the only place candidate
    content enters them: an approved merge), or, when None, the repository's own index. `author` and
    `committer` (default: the author) are "Name <email>"; `when` defaults to now. Trailers
    follow the message after a blank line as "Key: value" lines, in the order given.
    With `branch`, refs/heads/<branch> moves to the commit only if it still points at
    `parent_commit` (or is created if it does not exist).
    """
    committer = committer or author
    for role, identity in (("author", author), ("committer", committer)):
        if not _IDENTITY.fullmatch(identity):
            raise GitError(f"{role} {identity!r}: give it as 'Name <email>'")
    text = _message_with_trailers(message, trailers)
    timestamp, offset = _when(when)
    if branch is not None and not check_ref_format(f"refs/heads/{branch}".encode()):
        raise GitError(f"{branch!r}: not a valid branch name")
    repo = repo_open(repo_path)
    try:
        parents = [ref_resolve(repo, parent_commit).encode()] if parent_commit else []
        commit = Commit()
        commit.tree = _tree_for(repo, tree_from_worktree)
        commit.parents = parents
        commit.author, commit.committer = author.encode(), committer.encode()
        commit.author_time = commit.commit_time = timestamp
        commit.author_timezone = commit.commit_timezone = offset
        commit.encoding = b"UTF-8"
        commit.message = text.encode()
        repo.object_store.add_object(commit)
        if branch is not None:
            _branch_advance(repo, branch, parents[0] if parents else None, commit.id)
        return commit.id.decode()
    finally:
        repo.close()


def tag_create(
    repo_path: str | Path, name: str, commit: str, message: str, tagger: str, when: datetime | None = None
) -> str:
    """An annotated tag refs/tags/<name> on `commit`, made with dulwich; returns the tag's sha.

    Refuses to move an existing tag.
    """
    if not _IDENTITY.fullmatch(tagger):
        raise GitError(f"tagger {tagger!r}: give it as 'Name <email>'")
    ref = f"refs/tags/{name}".encode()
    if not check_ref_format(ref):
        raise GitError(f"{name!r}: not a valid tag name")
    timestamp, offset = _when(when)
    repo = repo_open(repo_path)
    try:
        target = ref_resolve(repo, commit).encode()
        tag = Tag()
        tag.object = (Commit, target)
        tag.name = name.encode()
        tag.tagger = tagger.encode()
        tag.tag_time, tag.tag_timezone = timestamp, offset
        tag.message = (message.rstrip() + "\n").encode()
        repo.object_store.add_object(tag)
        if not repo.refs.add_if_new(ref, tag.id):
            raise GitError(f"tag {name} already exists; tags are never moved")
        return tag.id.decode()
    finally:
        repo.close()


def _when(when: datetime | None) -> tuple[int, int]:
    """Seconds since the epoch and the UTC offset in seconds, as git stores a time."""
    when = when or datetime.now(UTC)
    offset = when.utcoffset()
    if offset is None:
        raise GitError("give the time with a time zone")
    return int(when.timestamp()), int(offset.total_seconds())


def _message_with_trailers(message: str, trailers: dict[str, str]) -> str:
    body = "\n".join(line.rstrip() for line in message.strip().splitlines())
    if not body:
        raise GitError("give the commit a message")
    lines = []
    for key, value in trailers.items():
        if not _TRAILER_KEY.fullmatch(key):
            raise GitError(f"trailer {key!r}: a key is letters, digits and '-', starting with a letter")
        if not value.strip() or any(char in value for char in "\n\r\0"):
            raise GitError(f"trailer {key}: give a value on one line")
        lines.append(f"{key}: {value.strip()}")
    return body + "\n" + ("\n" + "\n".join(lines) + "\n" if lines else "")


def _tree_for(repo: Repo, worktree: str | Path | None) -> bytes:
    if worktree is None:
        return repo.open_index().commit(repo.object_store)
    admin = worktree_admin_dir(worktree)
    if admin.parent.parent != Path(repo.commondir()).resolve():
        raise GitError(f"{worktree}: a worktree of another repository")
    return worktree_tree_keep(worktree).encode()


def _branch_advance(repo: Repo, branch: str, parent: bytes | None, new: bytes) -> None:
    ref = f"refs/heads/{branch}".encode()
    if ref in repo.refs:
        if parent is None or not repo.refs.set_if_equals(ref, parent, new):
            raise GitError(f"branch {branch} does not point at the parent commit any more; not moved")
    elif not repo.refs.add_if_new(ref, new):
        raise GitError(f"branch {branch} was created meanwhile; not moved")


# ------------------------------------------------------------------------ history (read only)


def commits_log(repo: Repo, ref: str, limit: int = 20) -> list[dict]:
    """The newest `limit` commits reachable from `ref`, newest first: sha, subject, author
    ("Name <email>") and the author's date in the author's time zone."""
    start = ref_resolve(repo, ref).encode()
    commits = []
    for entry in repo.get_walker(include=[start], max_entries=limit):
        commit = entry.commit
        encoding = (commit.encoding or b"utf-8").decode("ascii", "replace")
        try:
            message = commit.message.decode(encoding, "replace")
        except LookupError:  # an encoding header Python does not know
            message = commit.message.decode("utf-8", "replace")
        zone = timezone(timedelta(seconds=commit.author_timezone))
        commits.append({
            "sha": commit.id.decode(),
            "subject": message.strip().split("\n", 1)[0],
            "author": commit.author.decode("utf-8", "replace"),
            "date": datetime.fromtimestamp(commit.author_time, tz=zone),
        })
    return commits
