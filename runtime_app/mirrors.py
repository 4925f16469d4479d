"""Per-worker mirrors: a search's baseline on a worker that does not share the web node's disk.

A worker runs a step against `repository_local(...)`: the repository at its registered path when
that path exists on this host and holds the baseline commit (one machine, or a shared disk), or
else a mirror under DATA_DIR/mirrors/<name> into which it fetches the baseline from the web node
(CRUCIBLE_GIT_URL, read-only git smart HTTP, search_app/git_http.py).

A mirror is a plain `git init` repository whose files are never checked out: its `.git` is the
git dir worktrees are made from and the sandbox shows, exactly as for a registered repository.
One mirror per repository path, so searches of one repository share its objects; each fetched
baseline is kept under `refs/crucible/searches/<search pk>`. A lock file per mirror makes
concurrent steps (threads or processes) fetch once; a commit already there is not fetched again.

The credential is a per-search token both sides derive from the secret key. It travels only in
git's environment (`GIT_CONFIG_*`, an `http.extraHeader`): never in argv, the URL, the mirror's
config, a receipt, a log line or a sandboxed command.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings

from runtime_app.git import GitError, repo_open
from runtime_app.presenters import short_sha
from runtime_app.worktrees import git_run

FETCH_USER = "crucible"
BASELINE_REF = "refs/crucible/baseline"
FETCH_ATTEMPTS = 3
FETCH_RETRY_SECONDS = 2.0
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


class MirrorError(GitError):
    """The baseline is not on this host and could not be fetched."""


def fetch_token(search_pk: int) -> str:
    """The secret a worker shows to fetch search `search_pk`'s baseline (and nothing else)."""
    message = f"crucible-git-fetch:{search_pk}".encode()
    return hmac.new(str(settings.SECRET_KEY).encode(), message, hashlib.sha256).hexdigest()


def fetch_url(search_id: str) -> str:
    """Where workers fetch a search's baseline from (no credential in it)."""
    return f"{settings.CONFIG.git_url}/git/searches/{search_id}.git"


def mirrors_root() -> Path:
    return Path(settings.DATA_DIR).resolve() / "mirrors"


def mirror_path(repository_path: str) -> Path:
    """The mirror of the repository registered at `repository_path`: readable, and stable per path."""
    digest = hashlib.sha256(repository_path.encode()).hexdigest()[:16]
    stem = _SAFE_NAME.sub("-", Path(repository_path).name).strip("-.")[:40] or "repository"
    return mirrors_root() / f"{stem}-{digest}"


def holds(path: str | Path, commit: str) -> bool:
    """Whether a (non-bare) repository exists at `path` and has `commit`."""
    try:
        repo = repo_open(path)
    except GitError:
        return False
    try:
        return commit.encode() in repo.object_store
    finally:
        repo.close()


def repository_local(repository_path: str, commit: str, *, search_pk: int, search_id: str) -> str:
    """The repository this host runs a search's steps against: its registered path if that holds
    the baseline here, else this host's mirror, with the baseline fetched into it if missing."""
    if holds(repository_path, commit):
        return repository_path
    if not settings.CONFIG.git_url:
        raise MirrorError(
            f"{repository_path} does not exist on this host (or does not hold the baseline "
            f"{short_sha(commit)}), "
            "and CRUCIBLE_GIT_URL is not set: give workers the repository at that path, or set "
            "CRUCIBLE_GIT_URL to the web node's URL so they fetch the baseline from it"
        )
    mirror = mirror_path(repository_path)
    with _mirror_lock(mirror):
        if not (mirror / ".git").is_dir():
            _mirror_init(mirror)
        if not holds(mirror, commit):
            _fetch(mirror, search_pk, search_id)
        if not holds(mirror, commit):
            raise MirrorError(f"{fetch_url(search_id)} did not serve the baseline {short_sha(commit)}")
    return str(mirror)


@contextlib.contextmanager
def _mirror_lock(mirror: Path) -> Iterator[None]:
    mirror.parent.mkdir(parents=True, exist_ok=True)
    # flock is per open file: threads of one process exclude each other as processes do.
    with open(mirror.parent / f"{mirror.name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _mirror_init(mirror: Path) -> None:
    partial = mirror.with_name(mirror.name + ".init")
    if partial.exists():
        shutil.rmtree(partial)  # a crash half-way through an earlier init
    partial.mkdir()
    git_run(["init", "--quiet", str(partial)], cwd=mirror.parent)
    # No background gc in a repository worktrees are being made from.
    for key, value in (("gc.auto", "0"), ("maintenance.auto", "false")):
        git_run(["config", key, value], cwd=partial)
    partial.rename(mirror)


def _fetch(mirror: Path, search_pk: int, search_id: str) -> None:
    credential = base64.b64encode(f"{FETCH_USER}:{fetch_token(search_pk)}".encode()).decode()
    # Config from the environment: git sends the header but writes it nowhere, and follows no redirect.
    env = {
        "GIT_CONFIG_COUNT": "2",
        "GIT_CONFIG_KEY_0": "http.extraHeader", "GIT_CONFIG_VALUE_0": f"Authorization: Basic {credential}",
        "GIT_CONFIG_KEY_1": "http.followRedirects", "GIT_CONFIG_VALUE_1": "false",
    }
    refspec = f"+{BASELINE_REF}:refs/crucible/searches/{int(search_pk)}"
    argv = ["fetch", "--quiet", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head",
            fetch_url(search_id), refspec]
    for attempt in range(FETCH_ATTEMPTS):
        try:
            git_run(argv, cwd=mirror, env=env)
            return
        except GitError as error:
            # A 401 makes git ask for a user name it may not prompt for: the token was refused.
            if any(words in str(error) for words in ("could not read Username", "Authentication failed")):
                raise MirrorError(f"{fetch_url(search_id)} refused this worker's fetch token: is "
                                  "CRUCIBLE_SECRET_KEY the same on the web nodes and the workers?") from None
            if attempt + 1 == FETCH_ATTEMPTS:
                raise MirrorError(f"fetching the baseline of {search_id} from CRUCIBLE_GIT_URL failed: "
                                  f"{error}") from None
            # A web node restarting, or a blip: a step should not fail for that.
            time.sleep(FETCH_RETRY_SECONDS * (attempt + 1))
