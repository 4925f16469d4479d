"""Live tails: the last output of a command while it runs, for the page that watches its subject.

A command run for a subject (`services.command_run(..., subject=("candidate", 7))`) gets a `Tail`:
the sandbox's reader thread feeds it both streams as they arrive, and it keeps their last
TAIL_BYTES in memory. Only what must be shown reaches the disk, as one JSON file per running
command in DATA_DIR/tails/ (0600 in a 0700 directory; the data dir is never in a sandboxed
command's view, and the file is written by the runtime, not by the command):

- nothing for a command that ends within FIRST_WRITE_SECONDS (most gates and trials);
- after that, what runs and since when (no output) every REFRESH_SECONDS, so readers can tell a
  live command from one a dead worker left behind (STALE_SECONDS);
- its redacted output at most every WRITE_SECONDS, only while a page watches the subject (a
  watch marker it touched within WATCH_SECONDS).

The file is removed once the command's receipt is written. The output is redacted as the
receipt is (the sandbox hands over the same secret values), its first line dropped when the
window cut it, and a trailing part that could be the start of a secret held back until the
rest arrives.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings

from runtime_app.sandbox import redact

TAIL_BYTES = 64 << 10
FIRST_WRITE_SECONDS = 0.5
WRITE_SECONDS = 0.5
REFRESH_SECONDS = 5.0
WATCH_SECONDS = 10.0
STALE_SECONDS = 30.0
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


class Tail:
    """The live tail of one command. `begin`, then `feed`/`tick` from the sandbox's reader
    thread, then `close` once the receipt is written; nothing touches the disk before `tick`."""

    def __init__(self, subject: tuple[str, int], label: str = "", cap: int = TAIL_BYTES) -> None:
        key = _key(subject)
        self.cap = cap
        self.label = label[:200]
        self.path = tails_dir() / f"{key}.{uuid.uuid4().hex}.json"
        self.marker = tails_dir() / f"{key}.watch"
        self.buffer = bytearray()
        self.total = 0
        self.secrets: Sequence[str] = ()
        self.command = ""
        self.started_at = ""
        self._started = 0.0
        self._next_check = float("inf")  # until begin()
        self._written = 0.0  # when the file was last written (monotonic), 0 for never
        self._dirty = False  # output arrived since the file last showed it
        self._shown = False  # the file's last write carried the output
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
        """Called often by the reader thread: writes the file when it is due (cheap otherwise)."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + WRITE_SECONDS
        watched = self.watched()
        if watched and (self._dirty or not self._shown):
            self._write(now, with_output=True)
        elif not self._written or now - self._written >= REFRESH_SECONDS:
            self._write(now, with_output=watched)

    def watched(self) -> bool:
        try:
            return time.time() - self.marker.stat().st_mtime < WATCH_SECONDS
        except OSError:
            return False

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
            with contextlib.suppress(OSError):
                _write_private(self.path, json.dumps(record).encode())
                self._written, self._shown = now, with_output
                self._dirty = self._dirty and not with_output

    def close(self) -> None:
        """The receipt is written (or the command never ran): the tail goes."""
        with self._lock:
            self._closed = True
            with contextlib.suppress(OSError):
                self.path.unlink(missing_ok=True)


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
    """A command running now for a subject, as its tail file last described it."""

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
    marker = tails_dir() / f"{_key(subject)}.watch"
    with contextlib.suppress(OSError):
        marker.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        marker.touch(mode=0o600)
        os.utime(marker)


def tails_unwatch(subject: tuple[str, int]) -> None:
    with contextlib.suppress(OSError):
        (tails_dir() / f"{_key(subject)}.watch").unlink(missing_ok=True)


def tails_running(subject: tuple[str, int]) -> list[Running]:
    """The commands running now for `subject`, oldest first; a file no writer refreshed within
    STALE_SECONDS was left by a worker that died, and is removed."""
    found = []
    now = time.time()
    for path in sorted(tails_dir().glob(f"{_key(subject)}.*.json")):
        try:
            if now - path.stat().st_mtime > STALE_SECONDS:
                path.unlink(missing_ok=True)
                continue
            record = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue  # gone between the listing and the read: the command just ended
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
