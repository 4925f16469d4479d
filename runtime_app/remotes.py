"""Repositories registered by git URL: the web node's own clone of a remote, kept up to date.

A repository lives where it was registered. By path, it is a clone on the web node's disk. By
URL, the web node clones it into `DATA_DIR/repositories/` when it is registered, fetches its
branches and tags again before each freeze, and pushes a merged branch back to it; workers never
need the remote, they fetch a search's baseline from the web node (`runtime_app.mirrors`).

Which remotes may be cloned is the administrator's choice, never a request's: a URL must lie
under one of `CRUCIBLE_REPO_URLS` (scheme, host, port and whole path segments), carry no
credentials, query or fragment, and git may speak only that URL's protocol and follows no
redirects. Credentials for private remotes come from the web node's user (ssh keys, `~/.netrc`).
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import SplitResult, urlsplit

from django.conf import settings

from runtime_app.git import GitError
from runtime_app.worktrees import git_run

SCHEMES = ("https", "http", "ssh", "git", "file")
_UNSAFE = re.compile(r"[\s\x00-\x1f\x7f%\\]")


class RemoteError(ValueError):
    """A URL cannot be registered or a remote cannot be reached; the message says why."""


def _split(url: str) -> SplitResult:
    if _UNSAFE.search(url):
        raise RemoteError(f"{url!r}: a repository URL may not contain spaces, control characters, "
                          "'%' or '\\'.")
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise RemoteError(f"{url!r}: use a URL starting with " + ", ".join(f"{s}://" for s in SCHEMES) + ".")
    if parts.username is not None or parts.password is not None:
        raise RemoteError(f"{parts.scheme}://{parts.hostname}/…: put no user name or password in the URL; "
                          "the web node's own credentials (ssh keys, ~/.netrc) are used.")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise RemoteError(f"{url!r}: a repository URL has no query or fragment.")
    if parts.scheme != "file" and not parts.hostname:
        raise RemoteError(f"{url!r} names no host.")
    segments = parts.path.split("/")
    if any(segment in (".", "..") for segment in segments) or parts.path.startswith("//"):
        raise RemoteError(f"{url!r}: a repository URL may not contain '.' or '..' segments.")
    try:
        parts.port  # noqa: B018  (a malformed port raises here)
    except ValueError:
        raise RemoteError(f"{url!r}: its port is not a number.") from None
    return parts


def _key(parts: SplitResult) -> tuple[str, str, int | None, list[str]]:
    path = [segment for segment in parts.path.split("/") if segment]
    return parts.scheme, (parts.hostname or "").lower(), parts.port, path


def remote_url_check(url: str, *, allowed: Sequence[str] | None = None) -> str:
    """The URL, stripped, if it may be registered: under one of the allowed prefixes
    (CRUCIBLE_REPO_URLS when not given); RemoteError otherwise."""
    url = (url or "").strip()
    if not url:
        raise RemoteError("Give the repository's git URL.")
    prefixes = settings.CONFIG.repo_urls if allowed is None else allowed
    if not prefixes:
        raise RemoteError("No remotes are allowed yet: an administrator lists the URLs repositories may "
                          "be cloned from in CRUCIBLE_REPO_URLS.")
    scheme, host, port, path = _key(_split(url))
    for prefix in prefixes:
        p_scheme, p_host, p_port, p_path = _key(_split(prefix))
        if (scheme, host, port) == (p_scheme, p_host, p_port) and path[: len(p_path)] == p_path:
            return url
    raise RemoteError(f"{url} is not under an allowed remote ({', '.join(prefixes)}).")


def _remote_git(args: Sequence[str], url: str, *, cwd: Path, timeout: float = 600.0) -> bytes:
    """git against a remote: only that URL's protocol, no redirects, no submodules, no prompts."""
    scheme = urlsplit(url).scheme
    sealed = {"protocol.allow": "never", f"protocol.{scheme}.allow": "always",
              "http.followRedirects": "false", "submodule.recurse": "false",
              "core.sshCommand": "ssh -o BatchMode=yes"}
    env = {"GIT_ALLOW_PROTOCOL": scheme, "GIT_CONFIG_COUNT": str(len(sealed))}
    for index, (key, value) in enumerate(sealed.items()):
        env[f"GIT_CONFIG_KEY_{index}"], env[f"GIT_CONFIG_VALUE_{index}"] = key, value
    return git_run(args, cwd=cwd, env=env, timeout=timeout)


def clones_root() -> Path:
    return Path(settings.DATA_DIR).resolve() / "repositories"


def clone_path(project_pk: int, url: str) -> Path:
    """Where the web node keeps its clone of `url` for a project: one per (project, URL)."""
    tail = _key(_split(url))[3]
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", (tail[-1] if tail else "repository").removesuffix(".git"))[:60]
    digest = hashlib.sha256(url.encode()).hexdigest()[:12]
    return clones_root() / str(project_pk) / f"{stem or 'repository'}-{digest}"


def remote_clone(url: str, destination: Path) -> Path:
    """Clone `url` into `destination` (a working tree, like a repository registered by path).
    A clone that fails leaves nothing behind."""
    destination.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if (destination / ".git").is_dir():
        remote_fetch(url, destination)
        return destination
    shutil.rmtree(destination, ignore_errors=True)
    try:
        _remote_git(["clone", "--quiet", "--no-recurse-submodules", "--", url, str(destination)], url,
                    cwd=destination.parent)
    except GitError as error:
        shutil.rmtree(destination, ignore_errors=True)
        raise RemoteError(f"Could not clone {url}: {error}") from None
    return destination


def remote_fetch(url: str, clone: Path) -> None:
    """Bring the clone's branches and tags up to the remote's (Crucible's own branches stay), and
    its working tree to its HEAD: nobody edits this clone but Crucible."""
    try:
        _remote_git(["fetch", "--quiet", "--update-head-ok", "--no-recurse-submodules", "--", url,
                     "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"], url, cwd=clone)
        git_run(["reset", "--quiet", "--hard", "HEAD"], cwd=clone)
    except GitError as error:
        raise RemoteError(f"Could not fetch {url}: {error}") from None


def remote_push(url: str, clone: Path, branch: str) -> None:
    """Push `branch` of the clone to the remote (never forced: a branch that moved there is refused)."""
    ref = f"refs/heads/{branch}"
    try:
        _remote_git(["push", "--quiet", "--no-recurse-submodules", "--", url, f"{ref}:{ref}"], url, cwd=clone)
    except GitError as error:
        raise RemoteError(f"Could not push {branch} to {url}: {error}") from None
