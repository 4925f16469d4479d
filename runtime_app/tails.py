"""Live tails: the last output of a command while it runs, for the page that watches its subject.

A command run for a subject (`services.command_run(..., subject=("candidate", 7))`) gets a `Tail`:
the sandbox's reader thread feeds it both streams as they arrive, and it keeps their last
TAIL_BYTES in memory. Only what must be shown leaves the process, as one record per running
command in the tail store:

- nothing for a command that ends within FIRST_WRITE_SECONDS (most gates and trials);
- after that, what runs and since when (no output) every REFRESH_SECONDS, so readers can tell a
  live command from one a dead worker left behind (STALE_SECONDS);
- its redacted output at most every WRITE_SECONDS, only while a page watches the subject (a
  watch marker it set within WATCH_SECONDS).

The record is removed once the command's receipt is written. The output is redacted as the
receipt is (the sandbox hands over the same secret values), its first line dropped when the
window cut it, and a trailing part that could be the start of a secret held back until the
rest arrives.

The store is chosen once per process (`store()`), by REDIS_URL:

- embedded (no REDIS_URL), `FileStore`: one JSON file per running command in DATA_DIR/tails/
  (0600 in a 0700 directory; the data dir is never in a sandboxed command's view, and the file is
  written by the runtime, not by the command) and a `<subject>.watch` file whose mtime is the
  watch; a reader removes a file no writer refreshed within STALE_SECONDS.
- distributed (REDIS_URL), `RedisStore`: web nodes and workers share no disk, so the record is
  the string `crucible:tail:<subject>:<id>`, its TTL of STALE_SECONDS renewed by every write (a
  dead worker's tail expires by itself), listed in the set `crucible:tails:<subject>`, and the
  watch is `crucible:tail-watch:<subject>` with a TTL of WATCH_SECONDS. A Redis error never fails
  a step or a page: it is logged once at warning (until Redis answers again), the command carries
  on without its tail and the page shows none.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import shlex
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import redis
from django.conf import settings

from runtime_app.sandbox import redact

logger = logging.getLogger(__name__)

TAIL_BYTES = 64 << 10
FIRST_WRITE_SECONDS = 0.5
WRITE_SECONDS = 0.5
REFRESH_SECONDS = 5.0
WATCH_SECONDS = 10.0
STALE_SECONDS = 30.0
REDIS_TIMEOUT_SECONDS = 2.0  # the reader thread waits this long at most on a Redis that hangs
_SUBJECT_TYPE = re.compile(r"[a-z][a-z_]{0,31}")


def tails_dir() -> Path:
    return Path(settings.DATA_DIR) / "tails"


def _key(subject: tuple[str, int]) -> str:
    subject_type, subject_id = subject
    if not _SUBJECT_TYPE.fullmatch(str(subject_type)) or not isinstance(subject_id, int):
        raise ValueError(f"not a tail subject: {subject!r}")
    return f"{subject_type}-{subject_id}"


def command_text(argv: Sequence[str]) -> str:
    """The command as a person typed it: a shell line as is, an argv list quoted."""
    if len(argv) == 3 and argv[0] == "/bin/sh" and argv[1] == "-c":
        return argv[2]
    return shlex.join(argv)


def _hold_back(text: str, secrets: Sequence[str]) -> str:
    """`text` without a trailing part that is the start of a secret (its rest not printed yet)."""
    cut = len(text)
    for secret in secrets:
        for size in range(min(len(secret) - 1, len(text)), 0, -1):
            if text.endswith(secret[:size]):
                cut = min(cut, len(text) - size)
                break
    return text[:cut]


# ---------------------------------------------------------------------------------- stores


class StoreError(Exception):
    """The store cannot be reached: a writer carries on without its tail, a reader shows none."""


class TailStore(Protocol):
    """Where the records of running commands and the watch markers live, by subject key. A store
    that cannot be reached raises StoreError (the file store never does: a disk error there is a
    record not written, or not listed)."""

    def write(self, key: str, tail_id: str, record: dict[str, Any]) -> bool:
        """Store the record of a running command; False if it was not stored (try again later)."""
        ...

    def remove(self, key: str, tail_id: str) -> None: ...

    def records(self, key: str) -> list[dict[str, Any]]:
        """The records of the subject's live commands, in no particular order."""
        ...

    def watched(self, key: str) -> bool: ...

    def watch(self, key: str) -> None: ...

    def unwatch(self, key: str) -> None: ...


def _tail_path(key: str, tail_id: str) -> Path:
    return tails_dir() / f"{key}.{tail_id}.json"


class FileStore:
    """DATA_DIR/tails/ on this machine's disk: the embedded mode, where every process shares it."""

    def write(self, key: str, tail_id: str, record: dict[str, Any]) -> bool:
        try:
            _write_private(_tail_path(key, tail_id), json.dumps(record).encode())
        except OSError:
            return False
        return True

    def remove(self, key: str, tail_id: str) -> None:
        with contextlib.suppress(OSError):
            _tail_path(key, tail_id).unlink(missing_ok=True)

    def records(self, key: str) -> list[dict[str, Any]]:
        """Also removes a file no writer refreshed within STALE_SECONDS (its worker died)."""
        found = []
        now = time.time()
        for path in sorted(tails_dir().glob(f"{key}.*.json")):
            try:
                if now - path.stat().st_mtime > STALE_SECONDS:
                    path.unlink(missing_ok=True)
                    continue
                found.append(json.loads(path.read_bytes()))
            except (OSError, ValueError):
                continue  # gone between the listing and the read: the command just ended
        return found

    def watched(self, key: str) -> bool:
        try:
            return time.time() - (tails_dir() / f"{key}.watch").stat().st_mtime < WATCH_SECONDS
        except OSError:
            return False

    def watch(self, key: str) -> None:
        marker = tails_dir() / f"{key}.watch"
        with contextlib.suppress(OSError):
            marker.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            marker.touch(mode=0o600)
            os.utime(marker)

    def unwatch(self, key: str) -> None:
        with contextlib.suppress(OSError):
            (tails_dir() / f"{key}.watch").unlink(missing_ok=True)


class RedisStore:
    """Redis at REDIS_URL: the distributed mode, where workers and web nodes share no disk."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_SECONDS,
                                           socket_connect_timeout=REDIS_TIMEOUT_SECONDS)
        self._failing = False  # logged already: one warning per outage, not one per poll

    @staticmethod
    def tail_key(key: str, tail_id: str) -> str:
        return f"crucible:tail:{key}:{tail_id}"

    @staticmethod
    def index_key(key: str) -> str:
        return f"crucible:tails:{key}"

    @staticmethod
    def watch_key(key: str) -> str:
        return f"crucible:tail-watch:{key}"

    @contextlib.contextmanager
    def _reaching(self) -> Iterator[None]:
        try:
            yield
        except (redis.RedisError, OSError) as error:
            if not self._failing:
                self._failing = True
                logger.warning("live tails: Redis failed (%s); commands run without their tail "
                               "and pages show none until it answers", error)
            raise StoreError(str(error)) from error
        if self._failing:
            self._failing = False
            logger.info("live tails: Redis answers again")

    def write(self, key: str, tail_id: str, record: dict[str, Any]) -> bool:
        ttl = round(STALE_SECONDS * 1000)
        with self._reaching():
            pipe = self.client.pipeline()  # MULTI/EXEC: a listed tail always has its record
            pipe.set(self.tail_key(key, tail_id), json.dumps(record), px=ttl)
            pipe.sadd(self.index_key(key), tail_id)
            pipe.pexpire(self.index_key(key), ttl)  # outlives every record it lists
            pipe.execute()
        return True

    def remove(self, key: str, tail_id: str) -> None:
        with self._reaching():
            pipe = self.client.pipeline()
            pipe.delete(self.tail_key(key, tail_id))
            pipe.srem(self.index_key(key), tail_id)
            pipe.execute()

    def records(self, key: str) -> list[dict[str, Any]]:
        with self._reaching():
            ids = sorted(member.decode() for member in self.client.smembers(self.index_key(key)))
            values = self.client.mget([self.tail_key(key, tail_id) for tail_id in ids]) if ids else []
            expired = [tail_id for tail_id, value in zip(ids, values, strict=True) if value is None]
            if expired:  # their writers died: the records expired, the index still names them
                self.client.srem(self.index_key(key), *expired)
        found = []
        for value in values:
            with contextlib.suppress(ValueError):
                if value is not None:
                    found.append(json.loads(value))
        return found

    def watched(self, key: str) -> bool:
        with self._reaching():
            return bool(self.client.exists(self.watch_key(key)))

    def watch(self, key: str) -> None:
        with self._reaching():
            self.client.set(self.watch_key(key), b"1", px=round(WATCH_SECONDS * 1000))

    def unwatch(self, key: str) -> None:
        with self._reaching():
            self.client.delete(self.watch_key(key))


@functools.cache
def _store_for(redis_url: str | None) -> TailStore:
    return RedisStore(redis_url) if redis_url else FileStore()


def store() -> TailStore:
    """This process's tail store: Redis when REDIS_URL is set, else files in the data dir."""
    return _store_for(settings.CONFIG.redis_url)


# ---------------------------------------------------------------------------------- writer


class Tail:
    """The live tail of one command. `begin`, then `feed`/`tick` from the sandbox's reader
    thread, then `close` once the receipt is written; nothing reaches the store before `tick`."""

    def __init__(self, subject: tuple[str, int], label: str = "", cap: int = TAIL_BYTES) -> None:
        self.key = _key(subject)
        self.id = uuid.uuid4().hex
        self.store = store()
        self.cap = cap
        self.label = label[:200]
        self.path = _tail_path(self.key, self.id)  # where the file store keeps it
        self.buffer = bytearray()
        self.total = 0
        self.secrets: Sequence[str] = ()
        self.command = ""
        self.started_at = ""
        self._started = 0.0
        self._next_check = float("inf")  # until begin()
        self._written = 0.0  # when the record was last written (monotonic), 0 for never
        self._dirty = False  # output arrived since the record last showed it
        self._shown = False  # the record's last write carried the output
        self._closed = False
        self._lock = threading.Lock()

    def begin(self, argv: Sequence[str], secrets: Sequence[str]) -> None:
        """The command starts: its redacted argv and the values to redact from its output."""
        self.command = command_text(argv)
        self.secrets = secrets
        self.started_at = datetime.now(UTC).isoformat()
        self._started = time.monotonic()
        self._next_check = self._started + FIRST_WRITE_SECONDS

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.buffer += chunk
        if len(self.buffer) > 2 * self.cap:  # trim rarely: amortised O(1) per byte
            del self.buffer[: len(self.buffer) - self.cap]
        self._dirty = True

    def tick(self) -> None:
        """Called often by the reader thread: writes the record when it is due (cheap otherwise)."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + WRITE_SECONDS
        try:
            watched = self.watched()
            if watched and (self._dirty or not self._shown):
                self._write(now, with_output=True)
            elif not self._written or now - self._written >= REFRESH_SECONDS:
                self._write(now, with_output=watched)
        except StoreError:  # logged by the store; the command goes on without its tail
            self._next_check = float("inf")

    def watched(self) -> bool:
        return self.store.watched(self.key)

    def text(self) -> str:
        """The redacted window of output, as a page shows it."""
        window = bytes(self.buffer[-self.cap:])
        cut = self.total > len(window)
        text = window.decode(errors="replace")
        if cut:  # the window starts mid-line (perhaps mid-secret): show whole lines only
            text = text.partition("\n")[2]
        return _hold_back(redact(text, self.secrets), self.secrets)

    def _write(self, now: float, *, with_output: bool) -> None:
        record = {"label": self.label, "command": self.command, "started_at": self.started_at,
                  "bytes": self.total, "output": with_output,
                  "cut": with_output and self.total > len(self.buffer[-self.cap:]),
                  "text": self.text() if with_output else ""}
        with self._lock:
            if self._closed:
                return
            if self.store.write(self.key, self.id, record):
                self._written, self._shown = now, with_output
                self._dirty = self._dirty and not with_output

    def close(self) -> None:
        """The receipt is written (or the command never ran): the tail goes."""
        with self._lock:
            self._closed = True
            if self._written:
                with contextlib.suppress(StoreError):  # the record's TTL removes it then
                    self.store.remove(self.key, self.id)


def tail_for(subject: tuple[str, int] | None, label: str = "") -> Tail | None:
    """The tail of a command run for `subject`, or None (no subject, or one a tail cannot name)."""
    if subject is None:
        return None
    try:
        return Tail(subject, label)
    except ValueError:
        return None


def _write_private(path: Path, data: bytes) -> None:
    """Replace `path` atomically with `data`, readable by the server's user only."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")  # mkstemp makes it 0600
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


# ---------------------------------------------------------------------------------- readers


@dataclass(frozen=True)
class Running:
    """A command running now for a subject, as its tail record last described it."""

    label: str
    command: str
    started_at: datetime | None
    text: str
    bytes: int
    cut: bool
    output: bool  # False until a watcher's marker reached the writer

    @property
    def elapsed_seconds(self) -> float | None:
        return (datetime.now(UTC) - self.started_at).total_seconds() if self.started_at else None


def tails_watch(subject: tuple[str, int]) -> None:
    """A page watches `subject`: its running commands write their output for WATCH_SECONDS."""
    with contextlib.suppress(StoreError):  # logged by the store: the page shows no output
        store().watch(_key(subject))


def tails_unwatch(subject: tuple[str, int]) -> None:
    with contextlib.suppress(StoreError):
        store().unwatch(_key(subject))


def tails_running(subject: tuple[str, int]) -> list[Running]:
    """The commands running now for `subject`, oldest first; none when the store fails. A tail
    no writer refreshed within STALE_SECONDS was left by a worker that died, and is dropped."""
    try:
        records = store().records(_key(subject))
    except StoreError:  # logged by the store: the page shows no tail
        return []
    found = []
    for record in records:
        if not isinstance(record, dict):
            continue
        try:
            started = datetime.fromisoformat(str(record.get("started_at", "")))
        except ValueError:
            started = None
        found.append(Running(label=str(record.get("label", "")), command=str(record.get("command", "")),
                             started_at=started, text=str(record.get("text", "")),
                             bytes=int(record.get("bytes") or 0), cut=bool(record.get("cut")),
                             output=bool(record.get("output"))))
    return sorted(found, key=lambda running: running.started_at or datetime.min.replace(tzinfo=UTC))
