"""The sandbox: every command a writer, gate, trial or reviewer runs goes through `run()`.

Layers, outermost first (docs/sandbox.md explains each and what it does not stop):

1. A new session and process group, killed as a group on timeout and when the command ends,
   so background processes die with it; the command's own exit is reaped with its rusage.
2. Per-run cgroups where the host lets us make them (pids, cpu accounting, memory): `pids.max`
   binds root too, every member is killed at the end, the memory of the command's whole tree is
   capped, and CPU time and peak memory are read from them, whatever isolation runs it.
3. bubblewrap when `CRUCIBLE_SANDBOX` allows and it can start, as an **allow-list**: the command
   sees its tree, the toolchain (/usr, /etc, /bin, /lib*, Crucible's Python, the admin's
   `CRUCIBLE_SANDBOX_TOOLCHAIN`), the paths the caller declares readable, a private /tmp and
   /dev/shm of fixed sizes (bubblewrap's own root and /dev are read-only) —
   nothing else of the host (no data dir, no home, no other repositories, no /run and so no host
   Unix sockets). No network, `--cap-drop ALL`, its own pid namespace and session. When the server
   runs as root, bubblewrap itself runs as an unprivileged uid (`CRUCIBLE_SANDBOX_UID`), so
   root-only host files stay unreadable even where they are mounted.
4. A fresh tree per command when asked (`fresh=True`): the command runs on a throwaway overlay
   (or copy) of a pristine tree, its writes held in a sized tmpfs, so they never reach the next
   command; `read_only` paths inside the tree are bound read-only on top.
5. rlimits through `prlimit` inside all of that: CPU seconds, address space, open files,
   file size and processes.

The environment is built from an allow-list; names that look like secrets never pass, and
the values of the server's secrets (plus any the caller declares) are redacted from what is
recorded. Output is kept as a head and a tail, with its total size and SHA-256 of the raw
stream; a command run for a subject also feeds its combined output to a live tail
(runtime_app.tails). Every command holds the measurement lane (runtime_app.lane) while it runs:
shared, or exclusive for a timing trial.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import select
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from django.conf import settings

from runtime_app.lane import SHARED, lane_hold
from runtime_app.models import Receipt

if TYPE_CHECKING:
    from runtime_app.egress import EgressProxy
    from runtime_app.tails import Tail

logger = logging.getLogger(__name__)
BUBBLEWRAP = "bubblewrap"
RLIMITS_ONLY = "rlimits-only"
MODES = ("required", "preferred", "off")
SANDBOX_HOME = "/tmp/home"  # noqa: S108  (inside the sandbox's private tmpfs)
# Where a score command finds $CRUCIBLE_METRICS_FILE under bubblewrap (outside its tree).
METRICS_DIR_INSIDE = "/run/crucible"
METRICS_NAME = "metrics.json"
# The most of a trial's results (its stdout, each results file) the runtime keeps to compare.
RESULTS_LIMIT = 16 << 20
# The report descriptor: the write end of a pipe handed to a command's own process (run's
# `report_file`), its number in this variable; what comes through it is read up to REPORT_LIMIT.
REPORT_FD_VARIABLE = "CRUCIBLE_REPORT_FD"
REPORT_LIMIT = 1 << 20
# Where the egress proxy's folder (its socket and forwarder) is bound under bubblewrap, and the
# port its forwarder listens on in the sandbox's own loopback (runtime_app.egress).
EGRESS_DIR_INSIDE = "/run/crucible-egress"
EGRESS_PORT = 8787
# The names of the proxy's socket and forwarder in that folder (runtime_app.egress puts them there).
SOCKET_NAME = "proxy.sock"
FORWARDER_NAME = "forwarder.py"
# The host's system directories every command may read (merged-/usr links are kept as links).
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Runtime-owned variables whose names look secret-like but carry no secret.
RUNTIME_VARIABLES = frozenset({"CRUCIBLE_MAX_TOKENS"})
REDACTED = "[redacted]"
# Names that never enter a sandbox, whatever a spec declares.
_SECRET_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|AUTH|COOKIE|SESSION|SIGNATURE|CERT|DSN"
    r"|^DATABASE_URL$|^REDIS_URL$|^(ANTHROPIC|OPENAI|AWS|AZURE|GOOGLE|GEMINI|DEEPSEEK|HF|GITHUB|GH)_",
    re.IGNORECASE,
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_READ_CHUNK = 65536


class SandboxError(Exception):
    """The command was refused before it started: bad arguments or isolation not available."""


@dataclass(frozen=True)
class Limits:
    """Ceilings for one command; `processes` counts every process of the run. What it may write
    outside its tree lives in memory, so each such place is a sized tmpfs, and `memory_bytes`
    caps the memory of its whole tree (its tmpfs pages included) where a memory cgroup can."""

    cpu_seconds: int = 600
    address_space_bytes: int = 8 << 30  # per process
    open_files: int = 1024
    file_size_bytes: int = 1 << 30  # any one file it writes, anywhere
    processes: int = 256
    output_bytes: int = 32 << 10  # kept per stream: half from the head, half from the tail
    tmp_bytes: int = 512 << 20  # its private /tmp (and HOME) under bubblewrap
    shm_bytes: int = 64 << 20  # its private /dev/shm under bubblewrap
    tree_write_bytes: int = 1 << 30  # all it writes into a fresh tree's overlay
    memory_bytes: int = 8 << 30  # its whole process tree, where a memory cgroup can hold it

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SandboxError(f"limit {name}={value!r} must be a whole number above 0")

    def prlimit_args(self) -> list[str]:
        return [
            f"--cpu={self.cpu_seconds}", f"--as={self.address_space_bytes}",
            f"--nofile={self.open_files}", f"--fsize={self.file_size_bytes}",
            f"--nproc={self.processes}",
        ]


# ------------------------------------------------------------------------------ environment


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def path_dirs() -> list[str]:
    """The server's PATH with Crucible's Python first: where a command's programs are looked up."""
    server = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    return [str(Path(sys.executable).parent), *server.split(os.pathsep)]


def env_build(
    declared: Mapping[str, str] | None, *, home: str, path: Sequence[str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """The command's whole environment and the declared names refused as secret-like.

    `path` is the PATH the command gets (default: `path_dirs()`); under bubblewrap only the
    directories it can see.
    """
    env = {
        "PATH": os.pathsep.join(dict.fromkeys(part for part in (path or path_dirs()) if part)),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "HOME": home,
        "TMPDIR": "/tmp" if home == SANDBOX_HOME else home,  # noqa: S108  (private under bubblewrap)
    }
    refused = []
    for name, value in (declared or {}).items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise SandboxError(f"environment name {name!r} is not a valid variable name")
        if not isinstance(value, str) or "\0" in value:
            raise SandboxError(f"environment value of {name} must be text without NUL bytes")
        if is_secret_name(name) and name not in RUNTIME_VARIABLES:
            refused.append(name)
            continue
        env[name] = value
    return env, sorted(refused)


def secret_values(extra: Iterable[str] = ()) -> list[str]:
    """Values never to be recorded: the server's secret-named variables, its key, and `extra`."""
    values = {value for name, value in os.environ.items() if is_secret_name(name) and len(value) >= 8}
    values.add(settings.SECRET_KEY)
    values.update(value for value in extra if value and len(value) >= 4)
    # Longest first, so a secret that contains another is redacted whole.
    return sorted(values, key=len, reverse=True)


def redact(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


# --------------------------------------------------------------------------------- capture


class _Capture:
    """A stream's head and tail, its size and the SHA-256 of every byte, in bounded memory."""

    def __init__(self, cap: int, sink: BinaryIO | None = None) -> None:
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.digest = hashlib.sha256()
        self.sink = sink  # every byte up to RESULTS_LIMIT also goes here (a trial's results)

    def feed(self, chunk: bytes) -> None:
        if self.sink is not None and self.total < RESULTS_LIMIT:
            with contextlib.suppress(ValueError, OSError):  # closed: a pipe held open past the end
                self.sink.write(chunk[: RESULTS_LIMIT - self.total])
        self.total += len(chunk)
        self.digest.update(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_cap:  # trim rarely: amortised O(1) per byte
                del self.tail[: len(self.tail) - self.tail_cap]

    def excerpt(self, secrets: Sequence[str]) -> str:
        tail = bytes(self.tail[-self.tail_cap :]) if self.tail else b""
        skipped = self.total - len(self.head) - len(tail)
        text = bytes(self.head).decode(errors="replace")
        if skipped:
            text += f"\n… {skipped:,} bytes not kept …\n"
        text += tail.decode(errors="replace")
        return redact(text, secrets)


def _pump(process: subprocess.Popen, captures: dict[int, _Capture], stop: threading.Event,
          tail: Tail | None = None) -> None:
    """Read both pipes until they close, or until told to stop once the command is gone; the
    command's `tail`, if any, gets both streams as they arrive (runtime_app.tails)."""
    selector = selectors.DefaultSelector()
    for stream in (process.stdout, process.stderr):
        selector.register(stream, selectors.EVENT_READ)
    open_count = 2
    while open_count:
        # Seen before the select: a command reaped before it began left all it wrote in the pipes,
        # so this select sees it. (Looked at after, a loaded host could set it between an empty
        # select and the look, while the last output was arriving: a trial's only line was lost.)
        stopping = stop.is_set()
        events = selector.select(timeout=0.05)
        for key, _ in events:
            chunk = os.read(key.fd, _READ_CHUNK)
            if chunk:
                captures[key.fd].feed(chunk)
                if tail is not None:
                    tail.feed(chunk)
            else:
                selector.unregister(key.fileobj)
                open_count -= 1
        if tail is not None:
            try:
                tail.tick()
            except Exception:  # a live view must never stop the pipes from being drained
                logger.warning("the live tail of a command failed; it is dropped", exc_info=True)
                tail = None
        if not events and stopping:
            break  # something escaped the kill and holds a pipe; stop listening to it
    selector.close()


def _feed_stdin(process: subprocess.Popen, data: bytes) -> None:
    try:
        if data:
            process.stdin.write(data)
    except (BrokenPipeError, OSError):
        pass  # the command did not read all of its input; that is its business
    finally:
        with contextlib.suppress(OSError):
            process.stdin.close()


# ------------------------------------------------------------------------ process containment


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


_V1_ROOT = Path("/sys/fs/cgroup")
_V1_FILES = {"pids": "pids.max", "cpuacct": "cpuacct.usage", "memory": "memory.max_usage_in_bytes"}


def _probe_parent(parent: Path, needed: str, enable: str = "") -> bool:
    """Can per-run cgroups holding `needed` be made under `parent`? (made once per process)"""
    try:
        parent.mkdir(exist_ok=True)
        if enable:
            (parent / "cgroup.subtree_control").write_text(enable)
        probe = parent / f"probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        probe.mkdir()
        ok = (probe / needed).exists()
        probe.rmdir()
    except OSError:
        return False
    return ok


@functools.cache
def cgroup_parents() -> dict[str, Path]:
    """Where per-run cgroups can be made on this host, by controller: cgroup v1's `pids`,
    `cpuacct` and `memory` hierarchies, or one v2 directory under the key "v2"."""
    found = {}
    for controller, needed in _V1_FILES.items():
        if (_V1_ROOT / controller / "cgroup.procs").exists() and \
                _probe_parent(_V1_ROOT / controller / "crucible", needed):
            found[controller] = _V1_ROOT / controller / "crucible"
    if found:
        return found
    available = set(_read(_V1_ROOT / "cgroup.subtree_control").split())
    wanted = [name for name in ("pids", "cpu", "memory") if name in available]
    if "pids" in wanted and _probe_parent(_V1_ROOT / "crucible", "pids.max",
                                          " ".join(f"+{name}" for name in wanted)):
        found["v2"] = _V1_ROOT / "crucible"
    return found


def pids_cgroup_parent() -> Path | None:
    """Where per-run pids cgroups are made, or None (no cgroup can cap a root fork bomb here)."""
    parents = cgroup_parents()
    return parents.get("pids") or parents.get("v2")


class _RunCgroups:
    """The cgroups of one run. The *containment* cgroup (pids) holds every process of the run from
    the start: killing its members leaves nothing behind. The *accounting* cgroups (CPU, memory)
    are joined by the command itself, just before it starts (`_JOIN_LATE`), so their counters are
    the command's whole tree and nothing of the sandbox that set it up."""

    def __init__(self, parents: dict[str, Path], limit: int, identity: tuple[int, int] | None,
                 memory: int | None = None) -> None:
        name = f"run-{os.getpid()}-{uuid.uuid4().hex[:10]}"
        self.paths: dict[str, Path] = {}  # controller (or v2 leaf) -> cgroup directory
        self.made: list[Path] = []
        self.memory_limited = False
        try:
            if "v2" in parents:
                # Two leaves under one run cgroup: processes may not sit beside v2 child cgroups.
                run = self._make(parents["v2"] / name)
                enabled = _read(parents["v2"] / "cgroup.subtree_control").split()
                (run / "cgroup.subtree_control").write_text(" ".join(f"+{name}" for name in enabled))
                self.paths = {"run": run, "setup": self._make(run / "setup"),
                              "command": self._make(run / "command")}
                (run / "pids.max").write_text(str(limit))
            else:
                for controller, parent in parents.items():
                    self.paths[controller] = self._make(parent / name)
                (self.paths["pids"] / "pids.max").write_text(str(limit))
            for path in self.late:  # the sandbox's user moves itself in
                if identity is not None:
                    os.chown(path, *identity)
            if memory is not None:
                self.memory_limited = self._limit_memory(memory)
        except OSError:
            self.remove()
            raise

    def _limit_memory(self, limit: int) -> bool:
        """Cap the command's memory cgroup (it holds what it writes to its tmpfs too)."""
        leaf, name = ((self.paths["command"], "memory.max") if "command" in self.paths
                      else (self.paths.get("memory"), "memory.limit_in_bytes"))
        if leaf is None or not (leaf / name).exists():
            return False
        (leaf / name).write_text(str(limit))
        return True

    def oom_kills(self) -> int:
        """How many of the command's processes the kernel killed at its memory limit."""
        leaf = self.paths.get("command") or self.paths.get("memory")
        if leaf is None:
            return 0
        text = _read(leaf / ("memory.events" if "command" in self.paths else "memory.oom_control"))
        return next((int(line.split()[1]) for line in text.splitlines()
                     if line.startswith("oom_kill ") and line.split()[1].isdigit()), 0)

    def contain(self, outer: int) -> None:
        """Put a starting bubblewrap run (`outer`: the process that becomes bubblewrap itself) into
        the containment cgroup as it starts: the first cgroup move of a run can wait for an RCU grace
        period (measured: 4 ms median on this loaded 2-core host, then 0.05 ms for the moves right
        after it), and made here, that wait overlaps bubblewrap's own start instead of following it.
        It is never counted: the accounting cgroups get only the sandbox (`admit`)."""
        leaf = self.paths.get("setup") or self.paths["pids"]
        (leaf / "cgroup.procs").write_text(str(outer))

    def admit(self, child: int) -> None:
        """Put a bubblewrap sandbox, waiting at its block fd, into every cgroup of the run: the
        command it then starts, and all that descends from it, is contained and accounted. (bubblewrap
        itself, outside, is the run's process group leader: reaped and killed with the group.)
        One write per hierarchy: each move can wait for an RCU grace period on cgroup v1."""
        if "command" in self.paths:
            (self.paths["command"] / "cgroup.procs").write_text(str(child))
            return
        for name in ("pids", "cpuacct", "memory"):
            if name in self.paths:
                (self.paths[name] / "cgroup.procs").write_text(str(child))

    def _make(self, path: Path) -> Path:
        path.mkdir()
        self.made.append(path)
        return path

    @property
    def early(self) -> list[str]:
        """cgroup.procs files the run joins before anything runs."""
        leaf = self.paths.get("setup") or self.paths["pids"]
        return [str(leaf / "cgroup.procs")]

    @property
    def late(self) -> list[Path]:
        """cgroup.procs files the command joins as it starts."""
        names = ("command",) if "command" in self.paths else ("cpuacct", "memory")
        return [self.paths[name] / "cgroup.procs" for name in names if name in self.paths]

    @property
    def accounts(self) -> bool:
        return "command" in self.paths or {"cpuacct", "memory"} <= set(self.paths)

    def members(self) -> list[int]:
        leaves = [self.paths["setup"], self.paths["command"]] if "setup" in self.paths else \
            [self.paths["pids"]]
        return [int(word) for leaf in leaves for word in _read(leaf / "cgroup.procs").split()]

    def kill_all(self) -> set[int]:
        """SIGKILL every member until none is left; returns the ones found alive."""
        found: set[int] = set()
        deadline = time.monotonic() + 5
        pause = 0.001  # most are gone within a millisecond of their SIGKILL: look again soon
        while (pids := self.members()) and time.monotonic() < deadline:
            for pid in pids:
                found.add(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
        return found

    def peak(self) -> int | None:
        text = _read((self.paths.get("run") or self.paths["pids"]) / "pids.peak").strip()
        return int(text) if text.isdigit() else None

    def accounting(self) -> dict[str, float | int] | None:
        """CPU seconds (user, system) and peak memory of every process of the command's tree."""
        if "command" in self.paths:
            leaf = self.paths["command"]
            stat = dict(line.split() for line in _read(leaf / "cpu.stat").splitlines()
                        if len(line.split()) == 2)
            peak = _read(leaf / "memory.peak").strip()
            if "user_usec" not in stat or not peak.isdigit():
                return None
            return {"user_cpu_seconds": int(stat["user_usec"]) / 1e6,
                    "sys_cpu_seconds": int(stat["system_usec"]) / 1e6, "max_rss_kib": int(peak) // 1024}
        if not self.accounts:
            return None
        total = _read(self.paths["cpuacct"] / "cpuacct.usage").strip()
        user = _read(self.paths["cpuacct"] / "cpuacct.usage_user").strip()
        system = _read(self.paths["cpuacct"] / "cpuacct.usage_sys").strip()
        peak = _read(self.paths["memory"] / "memory.max_usage_in_bytes").strip()
        if not all(text.isdigit() for text in (total, user, system, peak)):
            return None
        # The total is counted to the nanosecond; the user/system split only per scheduler tick.
        seconds, user_share = int(total) / 1e9, int(user) / max(int(user) + int(system), 1)
        if int(user) + int(system) == 0:
            user_share = 1.0
        return {"user_cpu_seconds": seconds * user_share, "sys_cpu_seconds": seconds * (1 - user_share),
                "max_rss_kib": int(peak) // 1024}

    def remove(self) -> None:
        for path in reversed(self.made):  # leaves first
            for _ in range(100):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


@functools.cache
def _pid_depth() -> int:
    """How many pid namespaces this server's processes are nested in (1 on a plain host)."""
    return len(_nspid(os.getpid()))


def _nspid(pid: int) -> list[str]:
    return next((line.split()[1:] for line in _read(Path(f"/proc/{pid}/status")).splitlines()
                 if line.startswith("NSpid:")), [])


def _sandbox_init(pid: int) -> bool:
    """Whether `pid` is bubblewrap's own init (pid 1 of the command's pid namespace): bubblewrap
    reports the command's exit before that init has finished exiting, and it is no stray."""
    ids = _nspid(pid)
    return len(ids) == _pid_depth() + 1 and ids[-1] == "1"


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class _Handshake:
    """bubblewrap's `--info-fd` and `--block-fd`: once the sandbox is set up (mounts, uid, namespaces)
    it waits before it starts the command, while the runtime, from outside, puts it into the run's
    cgroups; then releases it. No process of the candidate exists before that, no shell runs to
    join them (one exec less per command), and the command holds no cgroup file. If the runtime
    cannot admit it, the run is killed where it waits: the command never starts. (rlimits stay
    inside, by `prlimit`: set from outside, prlimit(2) needs CAP_SYS_RESOURCE, which a container may
    lack, and RLIMIT_NPROC set before bubblewrap makes its user namespace would count every
    sandbox's processes together.)"""

    def __init__(self) -> None:
        self.info_read, self.info_write = os.pipe()  # close-on-exec: Popen's pass_fds hands over one end
        self.block_read, self.block_write = os.pipe()

    def argv(self) -> list[str]:
        return ["--info-fd", str(self.info_write), "--block-fd", str(self.block_read)]

    def child_fds(self) -> list[int]:
        return [self.info_write, self.block_read]

    def started(self) -> None:
        """After the start: only the run holds the child's ends now."""
        for fd in (self.info_write, self.block_read):
            os.close(fd)
        self.info_write = self.block_read = -1

    def child_pid(self, deadline: float) -> int | None:
        """The sandbox's pid once bubblewrap has made it, or None: it ended first (a stage it refused)
        or the deadline passed."""
        data = b""
        while b"}" not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.info_read], [], [], remaining)[0]:
                return None
            chunk = os.read(self.info_read, 4096)
            if not chunk:
                return None
            data += chunk
        found = re.search(rb'"child-pid":\s*(\d+)', data)
        return int(found.group(1)) if found else None

    def release(self) -> None:
        os.write(self.block_write, b"1")

    def close(self) -> None:
        for fd in (self.info_read, self.info_write, self.block_read, self.block_write):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.info_read = self.info_write = self.block_read = self.block_write = -1


def _admit(process: subprocess.Popen, handshake: _Handshake, cgroups: _RunCgroups | None,
           deadline: float) -> None:
    """Admit a bubblewrap run into its cgroups and let it start the command. Past the
    deadline it stays blocked (the timeout kills it); if it cannot be admitted, it is killed."""
    child = None
    try:
        if cgroups is not None:
            cgroups.contain(process.pid)
        child = handshake.child_pid(deadline)
        if child is None:
            return
        if cgroups is not None:
            cgroups.admit(child)  # into the containment cgroup too, if bubblewrap made it before the move
    except ProcessLookupError:
        return  # it ended before it started the command: its receipt says how
    except OSError as error:
        _killpg(process.pid)
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            stream.close()
        raise SandboxError(f"the sandbox could not be put in its cgroups: {error}") from None
    handshake.release()


# Run last, inside the sandbox (rlimits only): the command moves itself into its accounting cgroups
# through file descriptors the runtime opened for it (their paths are not visible in there).
_JOIN_LATE = ('while [ "$1" != -- ]; do echo 0 > "$1" || { echo "crucible sandbox: cannot join $1" >&2; '
              'exit 125; }; shift; done; shift; exec "$@"')


# ------------------------------------------------------------------------------ bubblewrap


def sandbox_mode() -> str:
    return settings.CONFIG.sandbox


def sandbox_identity() -> tuple[int, int] | None:
    """(uid, gid) bubblewrap runs commands as: the unprivileged `CRUCIBLE_SANDBOX_UID` when the
    server runs as root, else None (the server's own user, already unprivileged)."""
    if os.geteuid() != 0:
        return None
    uid = settings.CONFIG.sandbox_uid
    return uid, uid


def _identity_argv(identity: tuple[int, int] | None) -> list[str]:
    if identity is None:
        return []
    uid, gid = identity
    return [shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]


def _interpreter_prefixes() -> list[Path]:
    """Crucible's venv and base interpreter, by the paths Python names them (which commands
    such as a reviewer are started by) and by their real paths."""
    named = [Path(os.path.abspath(sys.prefix)), Path(os.path.abspath(sys.base_prefix))]
    return sorted({*named, *(path.resolve() for path in named)})


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def toolchain_paths() -> list[Path]:
    """Host directories every sandboxed command may read: the system directories, Crucible's
    Python (the venv and the interpreter it was made from) and the admin's additions."""
    return list(_toolchain(tuple(settings.CONFIG.sandbox_toolchain)))


@functools.cache
def _toolchain(extra: tuple[Path, ...]) -> tuple[Path, ...]:
    system = [Path(name) for name in SYSTEM_DIRS if os.path.lexists(name)]
    real_system = [path.resolve() for path in system]
    kept = [path for path in (*_interpreter_prefixes(), *extra)
            if path.exists() and not any(_inside(path.resolve(), root) for root in real_system)]
    return (*system, *dict.fromkeys(kept))


@functools.cache
def _toolchain_real(extra: tuple[Path, ...]) -> tuple[Path, ...]:
    return tuple(path.resolve() for path in _toolchain(extra))


class _View:
    """The host paths a command's view is made of, to tell what it can see."""

    def __init__(self, tree: Path, readable: Sequence[Path]) -> None:
        extra = tuple(settings.CONFIG.sandbox_toolchain)
        points = [tree, *readable, *_toolchain(extra), tree.resolve(), *(path.resolve() for path in readable),
                  *_toolchain_real(extra)]
        # Plain string prefixes: this runs for every PATH entry of every command.
        self.prefixes = tuple(dict.fromkeys(str(point).rstrip("/") + "/" for point in points))

    def _covered(self, path: str) -> bool:
        return (path.rstrip("/") + "/").startswith(self.prefixes)

    def problem(self, target: Path) -> str | None:
        target = Path(os.path.normpath(target))
        real = Path(os.path.realpath(target))
        if self._covered(str(target)) or self._covered(str(real)):
            return None
        if _inside(target, Path("/tmp")):  # noqa: S108
            return "sandboxed commands get a private /tmp"
        if _inside(real, Path(settings.DATA_DIR).resolve()):
            return "it lies in Crucible's data dir, which commands never see"
        if _inside(real, Path.home().resolve()):
            return "it lies in the server's home directory, which commands never see"
        shown = ", ".join(str(point) for point in toolchain_paths())
        return f"commands see only their tree, declared read paths and the toolchain ({shown})"


def visibility_problem(
    path: str | Path, *, tree: str | Path, readable: Sequence[str | Path] = (), isolation: str | None = None,
) -> str | None:
    """None if the host `path` can be read by a command run in `tree` with `readable` paths (as
    `run()` would run it); otherwise the reason it cannot, in words for a person."""
    if isolation_choose(isolation) != BUBBLEWRAP:
        return None
    tree_path = Path(tree).resolve()
    target = Path(path) if Path(path).is_absolute() else tree_path / path
    return _View(tree_path, [Path(item).resolve() for item in readable]).problem(target)


def sandbox_path(
    tree: str | Path, readable: Sequence[str | Path] = (), isolation: str | None = None
) -> list[str]:
    """The PATH a command gets: `path_dirs()` without the directories it could not see."""
    parts = [part for part in path_dirs() if part and Path(part).is_absolute()]
    if isolation_choose(isolation) != BUBBLEWRAP:
        return parts
    view = _View(Path(tree).resolve(), [Path(item).resolve() for item in readable])
    seen = []
    for part, real in _real_paths(tuple(parts)):
        normal = os.path.normpath(part)
        if view._covered(normal) or view._covered(real):  # as problem() sees it, without the words why
            # A link to a visible directory is not itself mounted: the command finds its target.
            seen.append(part if view._covered(part) and real == normal else real)
    return list(dict.fromkeys(seen))


@functools.lru_cache(maxsize=16)
def _real_paths(parts: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Each PATH directory with its real path: the server's PATH is stable for its life, and
    resolving it for every command cost about 1 ms."""
    return tuple((part, os.path.realpath(part)) for part in parts)


def sandbox_which(
    program: str, *, tree: str | Path, readable: Sequence[str | Path] = (), isolation: str | None = None,
) -> Path | None:
    """Where a bare program name (`python`, `bash`) resolves on the PATH a command gets, or None."""
    for folder in sandbox_path(tree, readable, isolation):
        candidate = Path(folder) / program
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


# How a run starts where no stager serves it (rlimits only, the probes, a host without `nsenter`),
# before any process of it can fork: it joins the run's cgroups, then, when
# bubblewrap needs sources its unprivileged uid cannot reach (a 0700 data dir, a home), builds the
# stage it binds them from, as root in the private mount namespace `unshare` made, and runs the rest.
# A `mount -a` per fstab mounts the stage in one process: a tmpfs over an unused system directory,
# a slot per such source, and for a fresh tree a sized tmpfs (that bounds what the command can write
# into it) holding the upper folder of its overlay (one exec each cost 3-5 ms on a loaded host).
_START = r"""fail() { echo "crucible sandbox: $*" >&2; exit 125; }
while [ "$1" != -- ]; do echo $$ > "$1" || fail "cannot join $1"; shift; done; shift
while [ "$1" != -- ]; do
  case $1 in
    need) [ -e "$2" ] || fail "cannot stage $2"; shift 2;;
    file) : > "$2" || fail "cannot stage $2"; shift 2;;
    dirs) install -d -m "$2" -o "$3" -g "$4" -- "$5" "$6" || fail "no room for a fresh tree"; shift 6;;
    mount) mount -a -T "$2" || fail "the stage could not be mounted"; shift 2;;
    *) fail "unknown step $1";;
  esac
done; shift
exec "$@"
"""
_STAGE_BASES = ("/run", "/mnt", "/srv", "/media", "/sys")


def _fstab_escape(path: str | Path) -> str:
    """A path as an fstab field: blanks and backslashes in octal, as libmount reads them."""
    return "".join(f"\\{ord(char):03o}" if char in " \t\n\\" else char for char in str(path))


def _start_argv(joins: Sequence[str], steps: Sequence[str], rest: list[str]) -> list[str]:
    """`rest`, started by _START when there are cgroups to join or stage steps to take."""
    if not joins and not steps:
        return rest
    unshare = [shutil.which("unshare") or "unshare", "--mount", "--propagation", "private", "--"]
    return [*(unshare if steps else []), "/bin/sh", "-c", _START, "sh", *joins, "--", *steps, "--", *rest]


class _Stage:
    """Where bubblewrap binds each host path from: the path itself when the sandbox user can
    reach it, else a slot of the stage (see _START)."""

    def __init__(self, identity: tuple[int, int] | None) -> None:
        self.identity = identity
        self.binds: list[tuple[Path, str, bool]] = []  # source, slot, whether it is a file
        self.overlays: list[tuple[str, int, int, str]] = []  # lower's slot, root's mode, size, slot
        self.slots = 0
        self.sources: list[Path] = []
        self.base = ""
        self.prefix = ""  # of this run's slots in a stager's shared base

    def source(self, path: Path) -> Path:
        self.sources.append(path)
        if self.identity is None or _reachable(path, *self.identity):
            return path
        return self._bind(path)

    def overlay(self, lower: Path, size: int) -> Path:
        """A throwaway overlay of `lower` whose writes (at most `size` bytes) go to a tmpfs that
        is gone with the run; only as root, the sandbox user (`identity`) owning its root."""
        self.sources.append(lower)
        low = self._bind(lower)  # the overlay's options then name a slot, never the tree's own path
        slot = self._slot()
        self.overlays.append((low.name, os.lstat(lower).st_mode & 0o7777, size, slot))
        return Path("@stage") / slot

    def _bind(self, path: Path) -> Path:
        slot = self._slot()
        self.binds.append((path, slot, path.is_file() and not path.is_dir()))
        return Path("@stage") / slot

    def _slot(self) -> str:
        self.slots += 1
        return str(self.slots - 1)  # replaced by the real base once every source is known

    def argv(self, scratch: _Scratch, joins: Sequence[str], rest: list[str]) -> list[str]:
        """The whole run: join `joins`, build the stage (its fstabs go in `scratch`), run `rest`."""
        if not self.binds:
            return _start_argv(joins, [], rest)
        self.base = next((base for base in _STAGE_BASES if Path(base).is_dir() and not Path(base).is_symlink()
                          and not any(_inside(source.resolve(), Path(base)) for source in self.sources)), "")
        if not self.base:
            raise SandboxError("no free system directory to stage the sandbox's mounts in")
        base = self.base
        first = [f"crucible-stage {base} tmpfs mode=0755,size=64k 0 0"]
        first += [f"{_fstab_escape(source)} {base}/{slot} none bind,X-mount.mkdir 0 0"
                  for source, slot, is_file in self.binds if not is_file]
        first += [f"crucible-writes {base}/{slot}w tmpfs mode=0700,size={size},X-mount.mkdir 0 0"
                  for _, _, size, slot in self.overlays]
        steps = [word for source, _, _ in self.binds for word in ("need", str(source))]
        steps += ["mount", self._fstab(scratch.file(".fstab"), first)]
        uid, gid = self.identity or (0, 0)
        for _, mode, _, slot in self.overlays:  # the merged root shows the upper folder's owner and mode
            steps += ["dirs", f"{mode:o}", str(uid), str(gid), f"{base}/{slot}w/upper",
                      f"{base}/{slot}w/work"]
        then = [f"crucible {base}/{slot} overlay lowerdir={base}/{low},upperdir={base}/{slot}w/upper,"
                f"workdir={base}/{slot}w/work,X-mount.mkdir 0 0" for low, _, _, slot in self.overlays]
        files = [(source, slot) for source, slot, is_file in self.binds if is_file]
        # A file's slot is a file, made in the stage's tmpfs once it is mounted.
        steps += [word for _, slot in files for word in ("file", f"{base}/{slot}")]
        then += [f"{_fstab_escape(source)} {base}/{slot} none bind 0 0" for source, slot in files]
        if then:
            steps += ["mount", self._fstab(scratch.file(".fstab"), then)]
        return _start_argv(joins, steps, self.resolve(rest))

    @staticmethod
    def _fstab(path: Path, lines: list[str]) -> str:
        path.write_text("".join(f"{line}\n" for line in lines))
        return str(path)

    def resolve(self, argv: list[str]) -> list[str]:
        at = f"{self.base}/{self.prefix}"
        return [part.replace("@stage/", at, 1) if part.startswith("@stage/") else part for part in argv]

    def entered(self, rest: list[str]) -> tuple[list[str], Callable[[], None]] | None:
        """`rest` (bubblewrap and all after it) run as the sandbox user in this worker's stager's
        namespace, its slots mounted there (see runtime_app.sandbox_stager), and what unmounts them
        once the run has ended; None when the stage must be made per run (no stager here, nothing to
        stage, or a source inside the stager's base)."""
        if self.identity is None or not self.binds:
            return None
        stager = _stager()
        if stager is None or any(_inside(source.resolve(), Path(stager.base)) for source in self.sources):
            return None
        run = uuid.uuid4().hex[:12]
        self.base, self.prefix = stager.base, f"{run}-"
        uid, gid = self.identity
        try:
            stager.ask({"run": run, "binds": [[str(source), self.prefix + slot, is_file]
                                              for source, slot, is_file in self.binds],
                        "overlays": [[self.prefix + low, mode, size, self.prefix + slot, uid, gid]
                                     for low, mode, size, slot in self.overlays]})
        except (_StagerGone, SandboxError):  # made per run instead, which says in its receipt what failed
            self.base = self.prefix = ""
            return None
        enter = [shutil.which("nsenter") or "nsenter", f"--mount={stager.namespace}",
                 f"--setuid={uid}", f"--setgid={gid}", "--"]
        return [*enter, *self.resolve(rest)], lambda: stager.release(run)


class _StagerGone(Exception):
    """The stager ended or answered nonsense: the run makes its stage itself."""


class _Stager:
    """This worker process's stager (runtime_app.sandbox_stager): a root process in a private mount
    namespace, started once, that mounts each run's stage slots when asked and unmounts them after."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.lock = threading.Lock()
        self.process = subprocess.Popen(
            [shutil.which("unshare") or "unshare", "--mount", "--propagation", "private", "--",
             sys.executable, "-I", "-S", str(Path(__file__).with_name("sandbox_stager.py")), base],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            ready = json.loads(self.process.stdout.readline() or b"{}")
            # By path, not an inherited descriptor (nsenter would leave it open in the command);
            # its inode is checked before each run, so a reused pid is never entered.
            self.namespace = f"/proc/{int(ready['ready'])}/ns/mnt"
            self.inode = os.stat(self.namespace).st_ino
        except (OSError, ValueError, KeyError, TypeError):
            self.stop()
            raise

    def alive(self) -> bool:
        try:
            return self.process.poll() is None and os.stat(self.namespace).st_ino == self.inode
        except OSError:
            return False

    def ask(self, request: dict) -> None:
        with self.lock:
            try:
                self.process.stdin.write(json.dumps(request).encode() + b"\n")
                self.process.stdin.flush()
                answer = json.loads(self.process.stdout.readline() or b"null")
            except (OSError, ValueError) as error:
                raise _StagerGone(str(error)) from None
        if not isinstance(answer, dict):
            raise _StagerGone("the stager ended")
        if "error" in answer:
            raise SandboxError(f"the sandbox's stage could not be mounted: {answer['error']}")

    def release(self, run: str) -> None:
        """Unmount a run's slots; not waited for (the stager answers nothing to it), so a run never
        waits for the stager to be scheduled as it ends. Gone: its namespace, slots and all, went too."""
        with self.lock, contextlib.suppress(OSError):
            self.process.stdin.write(json.dumps({"release": run}).encode() + b"\n")
            self.process.stdin.flush()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()
        self.process.wait()


_stagers: dict[int, _Stager | None] = {}
_stagers_lock = threading.Lock()


def _stager() -> _Stager | None:
    """This worker process's stager, started on first use (again if it died); None where it cannot
    run (then each run makes its own stage, as before)."""
    with _stagers_lock:
        pid = os.getpid()  # a forked worker gets its own: the parent's pipes are not its to use
        current = _stagers.get(pid, False)
        if current is None:
            return None
        if isinstance(current, _Stager):
            if current.alive():
                return current
            current.stop()
        base = next((base for base in _STAGE_BASES if Path(base).is_dir() and not Path(base).is_symlink()),
                    "")
        try:
            _stagers[pid] = _Stager(base) if base and shutil.which("nsenter") else None
        except (OSError, ValueError):
            _stagers[pid] = None
        return _stagers[pid]


def _reachable(path: Path, uid: int, gid: int) -> bool:
    """Whether `uid` can search every directory on the way to `path` (not following the last link)."""
    real = Path(os.path.realpath(path.parent)) / path.name
    for folder in [*reversed(real.parents)]:
        try:
            info = os.stat(folder)
        except OSError:
            return False
        bit = stat.S_IXUSR if info.st_uid == uid else (stat.S_IXGRP if info.st_gid == gid else stat.S_IXOTH)
        if not info.st_mode & bit:
            return False
    return True


def _view_argv(tree: Path, source: Path, writable: bool, readable: Sequence[Path], read_only: Sequence[str],
               metrics_path: Path | None, stage: _Stage, limits: Limits, egress_dir: Path | None = None,
               results: Mapping[str, Path] | None = None) -> tuple[list[str], list[dict[str, str | int]]]:
    """bubblewrap's mount arguments for an allow-list view, and the mounts as a receipt lists them.
    `source` is where the tree's content comes from (the tree, a fresh copy, or a stage slot)."""
    argv: list[str] = []
    mounts: list[dict[str, str | int]] = []

    def bind(src: Path, dst: Path, mode: str, shown: Path | None = None) -> None:
        argv.extend(["--bind" if mode == "rw" else "--ro-bind", str(src), str(dst)])
        mounts.append({"source": str(shown or src), "target": str(dst), "mode": mode})

    for path in toolchain_paths():
        if path.is_symlink() and str(path) in SYSTEM_DIRS:
            argv += ["--symlink", os.readlink(path), str(path)]
            mounts.append({"source": os.readlink(path), "target": str(path), "mode": "symlink"})
        else:
            bind(stage.source(path), path, "ro", path)
    # Each place it may write outside its tree is a tmpfs of a fixed size: memory it cannot overrun.
    shm, tmp = "/dev/shm", "/tmp"  # noqa: S108  (the sandbox's own, private)
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.shm_bytes), "--tmpfs", shm,
             "--size", str(limits.tmp_bytes), "--tmpfs", tmp, "--dir", SANDBOX_HOME]
    mounts += [{"source": "proc", "target": "/proc", "mode": "proc"},
               {"source": "devtmpfs (minimal)", "target": "/dev", "mode": "dev, read-only"},
               {"source": "tmpfs", "target": shm, "mode": "tmpfs", "size_bytes": limits.shm_bytes},
               {"source": "tmpfs", "target": tmp, "mode": "tmpfs", "size_bytes": limits.tmp_bytes}]
    # Readable paths inside the tree go after it, or its bind would cover them.
    before = [path for path in readable if not _inside(path, tree)]
    after = [path for path in readable if _inside(path, tree)]
    for path in before:
        bind(stage.source(path), path, "ro", path)
    bind(source, tree, "rw" if writable else "ro", tree)
    for path in after:
        bind(stage.source(path), path, "ro", path)
    for relative in read_only:
        bind(source / relative, tree / relative, "ro", tree / relative)
    # A results file is a host file bound in place (bubblewrap makes its folders in the fresh tree):
    # what the command writes there outlives the throwaway tree.
    for relative, host in (results or {}).items():
        bind(stage.source(host), tree / relative, "rw", host)
    if metrics_path is not None:  # one file, written in place: no folder to fill
        bind(stage.source(metrics_path), Path(METRICS_DIR_INSIDE) / METRICS_NAME, "rw", metrics_path)
    if egress_dir is not None:  # the proxy's socket is the one way out; read-only still connects
        bind(stage.source(egress_dir), Path(EGRESS_DIR_INSIDE), "ro", egress_dir)
    # bubblewrap's own root and /dev are tmpfs too, unsized: nothing may be written there.
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    return argv, mounts


_FLAGS = ["--unshare-all", "--cap-drop", "ALL", "--new-session", "--die-with-parent", "--clearenv"]


@functools.cache
def _probe(identity: tuple[int, int] | None) -> tuple[bool, str]:
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return False, "bubblewrap (bwrap) is not installed"
    base = Path(tempfile.mkdtemp(prefix="crucible-probe-"))  # 0700: the tree inside needs the stage
    tree = base / "tree"
    try:
        tree.mkdir()
        tree_hand_over(tree, identity)
        stage = _Stage(identity)
        view, _ = _view_argv(tree, stage.source(tree), False, [], [], None, stage, Limits())
        argv = stage.argv(_Scratch(base), [],
                          [*_identity_argv(identity), bwrap, *view, *_FLAGS, "--", "/bin/true"])
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired, SandboxError) as error:
        return False, f"bubblewrap could not start: {error}"
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip()
        if identity is not None:
            why += (f" (as the unprivileged uid {identity[0]}: this host may not allow unprivileged user "
                    "namespaces)")
        return False, f"bubblewrap could not start: {why}"
    return True, "bubblewrap starts"


def bubblewrap_probe() -> tuple[bool, str]:
    """Can bubblewrap start here, as run() starts it? (answer, reason); checked once per identity."""
    return _probe(sandbox_identity())


bubblewrap_probe.cache_clear = _probe.cache_clear  # tests reset the probe as before


def isolation_choose(mode: str | None = None) -> str:
    """The isolation a run gets under `mode` (default: the setting); raises if `required` fails."""
    mode = mode or sandbox_mode()
    if mode not in MODES:
        raise SandboxError(f"isolation {mode!r}; use one of {', '.join(MODES)}")
    if mode == "off":
        return RLIMITS_ONLY
    available, reason = bubblewrap_probe()
    if available:
        return BUBBLEWRAP
    if mode == "required":
        raise SandboxError(f"CRUCIBLE_SANDBOX=required and {reason}; refusing to run")
    return RLIMITS_ONLY


# ----------------------------------------------------------------------------- fresh trees


@functools.cache
def overlay_available() -> bool:
    """Can this (root) server give each command a throwaway overlay of a pristine tree?"""
    if os.geteuid() != 0 or "overlay" not in _read(Path("/proc/filesystems")) or not shutil.which("unshare"):
        return False
    base = Path(tempfile.mkdtemp(prefix="crucible-overlay-probe-"))
    try:
        (base / "lower").mkdir()
        stage = _Stage((0, 0))
        stage.overlay(base / "lower", 1 << 20)
        done = subprocess.run(stage.argv(_Scratch(base), [], ["true"]), capture_output=True, timeout=30,
                              check=False)
        return done.returncode == 0
    except (OSError, subprocess.TimeoutExpired, SandboxError):
        return False
    finally:
        shutil.rmtree(base, ignore_errors=True)


def tree_hand_over(tree: Path, identity: tuple[int, int] | None) -> None:
    """Make every entry of `tree` owned by the sandbox user (only those that are not already),
    so an unprivileged command can write the tree it was given. Links are not followed."""
    if identity is None:
        return
    uid, gid = identity

    def own(path: str) -> None:
        info = os.lstat(path)
        if info.st_uid != uid or info.st_gid != gid:
            os.lchown(path, uid, gid)

    own(str(tree))
    for root, dirs, files in os.walk(tree):
        for name in (*dirs, *files):
            own(os.path.join(root, name))


# --------------------------------------------------------------------------------------- run


@dataclass
class _Plan:
    """What one run is made of, decided before it starts; `scratch` is removed after it."""

    argv: list[str]
    popen_env: dict[str, str]
    popen_cwd: str
    env_names: list[str]
    refused: list[str]
    scratch: _Scratch
    metrics_path: Path | None
    view: dict
    enforced: dict[str, str]  # how each limit on writes is held, for the receipt
    results_paths: dict[str, Path] = field(default_factory=dict)  # where each results file is read after
    results_root: Path | None = None  # with rlimits only: the tree they are in
    unstage: Callable[[], None] | None = None  # unmounts its slots in the stager, after it ended


def _copy_tree(tree: Path, copy: Path) -> None:
    """A full copy (reflinked where the file system can) for a fresh tree without an overlay."""
    subprocess.run(["cp", "-a", "--reflink=auto", f"{tree}/.", str(copy)], check=True, capture_output=True)


@functools.cache
def _memory_folder() -> Path | None:
    """This user's private folder on the host's /dev/shm (a tmpfs), or None where there is none."""
    folder = Path(f"/dev/shm/crucible-{os.geteuid()}")  # noqa: S108  (checked: ours, a folder, 0700)
    with contextlib.suppress(FileExistsError, FileNotFoundError):
        folder.mkdir(mode=0o700)
    try:
        info = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        return None  # someone else's, or open to others: use the data dir
    return folder


class _Scratch:
    """A run's own files and folder on the host, made only when it needs them: its folder in the
    data dir (or `base`), its small files in memory where it can (a folder cost 3-4 ms to make and
    remove on this ext4 disk, a written file 1.3 ms, the same file on a tmpfs 0.06 ms)."""

    def __init__(self, base: Path | None = None) -> None:
        self.base = base
        self.memory = None if base is not None else _memory_folder()
        self.folder: Path | None = None
        self.files: list[Path] = []

    def _base(self) -> Path:
        if self.base is None:
            self.base = Path(settings.DATA_DIR).resolve() / "sandbox"
            self.base.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.base

    def dir(self) -> Path:
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="run-", dir=self._base()))
        return self.folder

    def file(self, suffix: str) -> Path:
        handle, name = tempfile.mkstemp(prefix="run-", suffix=suffix, dir=self.memory or self._base())
        os.close(handle)
        self.files.append(Path(name))
        return self.files[-1]

    def remove(self) -> None:
        for path in self.files:
            path.unlink(missing_ok=True)
        if self.folder is not None:
            _scratch_remove(self.folder)


def _plan(argv: list[str], *, chosen: str, tree: Path, cwd: Path, env: Mapping[str, str] | None,
          limits: Limits, readable: list[Path], read_only: list[str], writable: bool, fresh: bool,
          metrics: bool, accounting: bool, joins: Sequence[str], join_late: Sequence[str],
          egress_dir: Path | None = None, results: Sequence[str] = (), report_fd: int | None = None,
          handshake: _Handshake | None = None) -> _Plan:
    prlimit = shutil.which("prlimit")
    if not prlimit:
        raise SandboxError("prlimit (util-linux) is not installed; commands cannot be limited")
    scratch = _Scratch()
    try:
        return _plan_in(scratch, prlimit, argv, chosen=chosen, tree=tree, cwd=cwd, env=env,
                        limits=limits, readable=readable, read_only=read_only, writable=writable,
                        fresh=fresh, metrics=metrics, accounting=accounting, joins=joins, join_late=join_late,
                        egress_dir=egress_dir, results=results, report_fd=report_fd, handshake=handshake)
    except BaseException:
        scratch.remove()  # a refused run leaves nothing behind
        raise


def _plan_in(scratch: _Scratch, prlimit: str, argv: list[str], *, chosen: str, tree: Path, cwd: Path,
             env: Mapping[str, str] | None, limits: Limits, readable: list[Path], read_only: list[str],
             writable: bool, fresh: bool, metrics: bool, accounting: bool, joins: Sequence[str],
             join_late: Sequence[str], egress_dir: Path | None = None, results: Sequence[str] = (),
             report_fd: int | None = None, handshake: _Handshake | None = None) -> _Plan:
    metrics_path = scratch.file(".json") if metrics else None
    # The descriptor's number is the same in the command's process: every stage before it keeps it.
    report = {} if report_fd is None else {REPORT_FD_VARIABLE: str(report_fd)}
    if chosen != BUBBLEWRAP:
        home = scratch.dir() / "home"
        home.mkdir()
        run_tree = tree
        if fresh:  # no bubblewrap to bind a copy over the pristine path: run in the copy itself
            run_tree = scratch.dir() / "tree"
            _copy_tree(tree, run_tree)
        declared = {**(env or {}), **report}
        if metrics_path is not None:
            declared["CRUCIBLE_METRICS_FILE"] = str(metrics_path)
        env_full, refused = env_build(declared, home=str(home))
        run_cwd = run_tree / cwd.relative_to(tree)
        plan = _Plan(_start_argv(joins, [], [prlimit, *limits.prlimit_args(), "--", *join_late, *argv]),
                     env_full, str(run_cwd),
                     sorted(env_full), refused, scratch, metrics_path,
                     {"uid": os.geteuid(), "gid": os.getegid(), "network": "host (no isolation)",
                      "mounts": "the host's file system (no isolation)",
                      "tree": "a fresh copy" if fresh else
                      ("the tree" if writable else "read-only (not enforced)"),
                      **({"read_only_paths": "not enforced"} if read_only else {})},
                     {"tmp_enforced_by": "none (rlimits only: the host's /tmp and /dev/shm)",
                      "tree_writes_enforced_by": "none (rlimits only; each file at most file_size_bytes)"})
        plan.results_paths = {relative: run_tree / relative for relative in results}  # read before removal
        plan.results_root = run_tree
        return plan
    identity = sandbox_identity()
    if fresh or writable:  # a read-only tree is only read: it must be readable by others (0644)
        tree_hand_over(tree, identity)
    declared = {**(env or {}), **report}
    if metrics_path is not None:
        if identity is not None:
            os.chown(metrics_path, *identity)
        declared["CRUCIBLE_METRICS_FILE"] = f"{METRICS_DIR_INSIDE}/{METRICS_NAME}"
    env_full, refused = env_build(declared, home=SANDBOX_HOME,
                                  path=sandbox_path(tree, readable, chosen_mode(chosen)))
    stage = _Stage(identity)
    how = "read-write" if writable else "read-only"
    writes = "none (the tree itself, on disk; each file at most file_size_bytes)" if writable else "read-only"
    if fresh and overlay_available():
        source = stage.overlay(tree, limits.tree_write_bytes)
        how = "a fresh overlay of the pristine tree (its writes are discarded)"
        writes = "tmpfs size (the fresh overlay's writes)"
    elif fresh:
        copy = scratch.dir() / "tree"
        _copy_tree(tree, copy)
        source = stage.source(copy)
        how = "a fresh copy of the pristine tree (its writes are discarded)"
        writes = "none (a fresh copy on disk; each file at most file_size_bytes)"
    else:
        source = stage.source(tree)
    results_paths = {relative: _results_host_file(scratch, tree, relative, identity) for relative in results}
    view, mounts = _view_argv(tree, source, writable or fresh, readable, read_only, metrics_path, stage,
                              limits, egress_dir, results_paths)
    bwrap = [shutil.which("bwrap") or "bwrap", *view, *_FLAGS]
    if not accounting:
        bwrap.append("--as-pid-1")  # no cgroup to count the tree: rusage must reach the command itself
    for name, value in env_full.items():
        bwrap += ["--setenv", name, value]
    bwrap += ["--chdir", str(cwd)]
    unstage = None
    if handshake is not None:  # the runtime admits it to its cgroups from outside
        rest = [*bwrap, *handshake.argv(), "--", prlimit, *limits.prlimit_args(), "--", *argv]
        entered = stage.entered(rest)
        full, unstage = entered or (stage.argv(scratch, [], [*_identity_argv(identity), *rest]), None)
    else:
        full = stage.argv(scratch, joins, [*_identity_argv(identity), *bwrap, "--", prlimit,
                                           *limits.prlimit_args(), "--", *join_late, *argv])
    uid, gid = identity or (os.geteuid(), os.getegid())
    return _Plan(full, {}, "/", sorted(env_full), refused, scratch, metrics_path,
                 {"uid": uid, "gid": gid, "network": "none (own network namespace; no host sockets)",
                  "tree": how, "mounts": mounts,
                  **({"read_only_paths": list(read_only)} if read_only else {})},
                 {"tmp_enforced_by": "tmpfs size (/tmp and /dev/shm; / and /dev read-only)",
                  "tree_writes_enforced_by": writes}, results_paths, unstage=unstage)


def _results_host_file(scratch: _Scratch, tree: Path, relative: str,
                       identity: tuple[int, int] | None) -> Path:
    """The host file bound at `relative` in the command's tree: what the pristine tree holds there
    (a regular file, not followed through a link), owned by the sandbox user, who writes it in place."""
    host = scratch.file(".result")
    before = _regular_read(tree / relative, RESULTS_LIMIT, tree)
    if before:
        host.write_bytes(before)
    if identity is not None:
        os.chown(host, *identity)
    return host


def _regular_read(path: Path, limit: int, root: Path | None = None) -> bytes | None:
    """Up to `limit` + 1 bytes of a regular file, never through a link (at its last component, or
    in a folder on the way that leads out of `root`), a pipe or a device; None when there is none."""
    try:
        folder = Path(os.path.realpath(path.parent))
        if root is not None and not _inside(folder, Path(os.path.realpath(root))):
            return None
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(handle, "rb") as source:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            return None
        return source.read(limit + 1)


def chosen_mode(chosen: str) -> str:
    """The CRUCIBLE_SANDBOX mode that gives an isolation already chosen."""
    return "required" if chosen == BUBBLEWRAP else "off"


def run(
    command: Sequence[str] | str,
    *,
    cwd: str | Path,
    timeout: float,
    env: Mapping[str, str] | None = None,
    limits: Limits | None = None,
    isolation: str | None = None,
    tree: str | Path | None = None,
    stdin: bytes = b"",
    readable: Sequence[str | Path] = (),
    redact_values: Iterable[str] = (),
    kind: str = Receipt.Kind.COMMAND,
    writable: bool = True,
    cancel: threading.Event | None = None,
    fresh: bool = False,
    read_only: Sequence[str] = (),
    metrics_file: str | Path | None = None,
    lane: str = SHARED,
    tail: Tail | None = None,
    egress: EgressProxy | None = None,
    stdout_file: str | Path | None = None,
    results_files: Mapping[str, str | Path] | None = None,
    report_file: str | Path | None = None,
) -> Receipt:
    """Run `command` (argv list, or a shell line for /bin/sh) contained, and describe it.

    `tree` is the one writable place (default: `cwd`), and `cwd` must lie inside it.
    `readable` are host paths re-exposed read-only under bubblewrap (a worktree's git dir).
    `writable=False` binds the tree read-only (bubblewrap only; with rlimits only the
    receipt says it was not enforced). `fresh=True` runs the command on a throwaway overlay (or
    copy) of the tree, which stays pristine; `read_only` are tree-relative paths bound read-only
    on top. With `metrics_file`, the command gets `$CRUCIBLE_METRICS_FILE` outside its tree and
    what it writes there is copied to `metrics_file` afterwards. With `report_file`, the command's
    own process gets the write end of a pipe (its number in `$CRUCIBLE_REPORT_FD`, inheritable, so
    the command decides whether its children get it) and what came through it (at most 1 MiB) is
    written to `report_file` when the command ends. `lane` is the measurement lane
    mode held while the command runs (`exclusive` for timing trials). Setting `cancel` stops the
    command like a timeout. A `tail` (runtime_app.tails) gets its combined output while it runs,
    redacted as the receipt is. With a started `egress` proxy (runtime_app.egress) the command
    runs under its forwarder, which serves the proxy on the sandbox's own 127.0.0.1 (the URL is in
    `$CRUCIBLE_EGRESS_URL`); the proxy's records and totals go into the receipt.
    A trial's results reach the caller outside the command: with `stdout_file`, its whole stdout
    (up to RESULTS_LIMIT) is written there too; `results_files` maps tree-relative paths to host
    files, and what the command wrote at each path (in place: under bubblewrap it is a bound
    file, so renaming over it or removing it fails) is copied there after it ends, up to
    RESULTS_LIMIT + 1 bytes (more means cut). The receipt says what came back of each.
    Returns an unsaved Receipt; `services.receipt_record` writes it.
    """
    limits = limits or Limits()
    argv, cwd_path, tree_path = _command_checked(command, cwd=cwd, tree=tree, timeout=timeout,
                                                 read_only=read_only)
    readable_paths = [Path(path).resolve() for path in readable]
    chosen = isolation_choose(isolation)
    secrets = secret_values([*redact_values, *(egress.redact_values() if egress else ())])
    run_argv, egress_view = (argv, None) if egress is None else _egress_argv(argv, egress, chosen)
    egress_mark = len(egress.records) if egress is not None else 0  # a proxy may serve several commands
    parents = cgroup_parents()
    # The tree's copy and its removal are work on this host too: a trial never runs beside them.
    with lane_hold(lane) as lane_wait:
        cgroups = _cgroups_open(parents, limits, chosen)
        accounting = cgroups is not None and cgroups.accounts
        late_fds: list[int] = []
        report = _ReportPipe() if report_file is not None else None
        handshake = _Handshake() if chosen == BUBBLEWRAP else None
        try:
            if accounting and handshake is None:
                late_fds = [os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in cgroups.late]
            join_late = ["/bin/sh", "-c", _JOIN_LATE, "sh", *(f"/proc/self/fd/{fd}" for fd in late_fds),
                         "--"] if late_fds else []
            plan = _plan(run_argv, chosen=chosen, tree=tree_path, cwd=cwd_path, env=env, limits=limits,
                         readable=readable_paths, read_only=list(read_only), writable=writable, fresh=fresh,
                         metrics=metrics_file is not None, accounting=accounting,
                         joins=cgroups.early if cgroups and handshake is None else [], join_late=join_late,
                         egress_dir=egress.socket_path.parent if egress and chosen == BUBBLEWRAP else None,
                         results=_results_checked(results_files),
                         report_fd=report.write_fd if report else None, handshake=handshake)
        except BaseException:
            for fd in late_fds:
                os.close(fd)
            if report:
                report.close()
            if handshake:
                handshake.close()
            if cgroups:
                cgroups.remove()
            raise
        full_argv = plan.argv
        processes_enforced_by = (
            "pids-cgroup" if cgroups else ("rlimit" if os.geteuid() != 0 else "none (root, no pids cgroup)")
        )
        captures: dict[int, _Capture] = {}
        timed_out = cancelled = False
        stray = oom_kills = 0
        reported = ""
        peak = figures = None
        status = 0
        rusage = None
        sink: BinaryIO | None = None
        try:
            started_at = datetime.now(UTC)
            started = time.monotonic()
            if tail is not None:
                tail.begin([redact(part, secrets) for part in argv], secrets)
            sink = open(stdout_file, "wb") if stdout_file is not None else None  # noqa: SIM115
            try:
                process = subprocess.Popen(
                    full_argv, cwd=plan.popen_cwd, env=plan.popen_env, stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                    pass_fds=[*late_fds, *([report.write_fd] if report else []),
                              *(handshake.child_fds() if handshake else [])],
                )
            except OSError as error:
                raise SandboxError(f"the sandbox could not start: {error}") from None
            finally:
                for fd in late_fds:
                    os.close(fd)
                if report:
                    report.started()  # only the command holds the write end now
                if handshake:
                    handshake.started()
            if handshake:
                _admit(process, handshake, cgroups, started + timeout)
            captures = {process.stdout.fileno(): _Capture(limits.output_bytes, sink),
                        process.stderr.fileno(): _Capture(limits.output_bytes)}
            timed_out, cancelled, status, rusage, stray, ended = _wait(
                process, captures, stdin, started + timeout, cancel, cgroups, tail, chosen == BUBBLEWRAP)
            duration = ended - started
            finished_at = started_at + timedelta(seconds=duration)
            if cgroups:
                peak = cgroups.peak()
                figures = cgroups.accounting() if accounting else None
                oom_kills = cgroups.oom_kills() if cgroups.memory_limited else 0
            metrics_copied = _metrics_collect(plan.metrics_path, metrics_file)
            results_copied = _results_collect(plan.results_paths, results_files or {}, plan.results_root)
            if report and report_file is not None:
                reported = report.collect(Path(report_file))
        finally:
            if sink is not None:
                sink.close()
            if cgroups:
                cgroups.remove()
            if report:
                report.close()
            if handshake:
                handshake.close()
            if plan.unstage:
                plan.unstage()
            plan.scratch.remove()

    exit_code, signal_number = _exit_of(status, chosen=chosen, killed=timed_out or cancelled)
    out, err = captures.values()
    if figures is None:
        figures = {"user_cpu_seconds": rusage.ru_utime if rusage else None,
                   "sys_cpu_seconds": rusage.ru_stime if rusage else None,
                   "max_rss_kib": rusage.ru_maxrss if rusage else None}
    measured_by = "cgroup" if accounting and figures is not None and cgroups is not None else "rusage"
    totals = {} if egress is None else _egress_totals(egress, egress_mark, chosen, plan, egress_view)
    return Receipt(
        kind=kind,
        argv=[redact(part, secrets) for part in argv],
        cwd=str(cwd_path.relative_to(tree_path)),
        env_names=plan.env_names,
        env_refused=plan.refused,
        started_at=started_at,
        finished_at=finished_at,
        duration_seconds=round(duration, 6),
        exit_code=exit_code,
        signal=signal_number,
        timed_out=timed_out,
        isolation=chosen,
        limits={**asdict(limits), "timeout_seconds": timeout, "processes_enforced_by": processes_enforced_by,
                "memory_enforced_by": "memory-cgroup" if cgroups and cgroups.memory_limited else
                "none (no memory cgroup; each process at most address_space_bytes)", **plan.enforced},
        rusage={**{name: value if value is None or name == "max_rss_kib" else round(value, 6)
                   for name, value in figures.items()}, "measured_by": measured_by},
        stdout_excerpt=out.excerpt(secrets),
        stdout_bytes=out.total,
        stdout_sha256=out.digest.hexdigest(),
        stderr_excerpt=err.excerpt(secrets),
        stderr_bytes=err.total,
        stderr_sha256=err.digest.hexdigest(),
        detail={
            **({"cancelled": True} if cancelled else {}),
            **({} if writable else {"read_only": "bubblewrap" if chosen == BUBBLEWRAP else "not enforced"}),
            **({"stray_processes_killed": stray} if stray else {}),
            **({"peak_processes": peak} if peak is not None else {}),
            **({"oom_killed": oom_kills} if oom_kills else {}),  # processes killed at memory_bytes
            "sandbox": plan.view,
            "lane": {"mode": lane, "waited_seconds": round(lane_wait, 6)},
            **({} if metrics_file is None else
               {"metrics_file": "written" if metrics_copied else "not written"}),
            **({} if stdout_file is None else
               {"stdout_file": "whole" if out.total <= RESULTS_LIMIT else f"cut at {RESULTS_LIMIT:,} bytes"}),
            **({"results_files": results_copied} if results_files else {}),
            **({} if report_file is None else {"report_descriptor": reported or "not written"}),
            **({} if egress is None else
               {"egress": {**egress.describe(egress_mark), "forwarder": egress_view}}),
        },
        **totals,
    )


def _command_checked(command: Sequence[str] | str, *, cwd: str | Path, tree: str | Path | None,
                     timeout: float, read_only: Sequence[str]) -> tuple[list[str], Path, Path]:
    """run's arguments checked before anything starts: (argv, working directory, tree), resolved."""
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    if not argv or not all(isinstance(part, str) and part and "\0" not in part for part in argv[:1]):
        raise SandboxError("the command is empty")
    if any(not isinstance(part, str) or "\0" in part for part in argv):
        raise SandboxError("every argument must be text without NUL bytes")
    if not 0 < timeout <= 86_400:
        raise SandboxError(f"timeout {timeout!r} must be between 0 and 86400 seconds")
    cwd_path = Path(cwd).resolve()
    tree_path = Path(tree).resolve() if tree is not None else cwd_path
    if not cwd_path.is_dir():
        raise SandboxError(f"working directory {cwd} does not exist")
    if not _inside(cwd_path, tree_path):
        raise SandboxError(f"working directory {cwd} is outside the tree {tree}")
    for relative in read_only:
        if Path(relative).is_absolute() or ".." in Path(relative).parts:
            raise SandboxError(f"read-only path {relative!r} must lie inside the tree")
    return argv, cwd_path, tree_path


def _cgroups_open(parents: Mapping[str, Path], limits: Limits, chosen: str) -> _RunCgroups | None:
    """The command's own cgroups under `parents`, or None when there are none to make or they cannot
    be made (the rlimits still hold)."""
    if not parents:
        return None
    try:
        # Nobody joins from inside any more (bubblewrap runs are admitted from outside): no chown.
        return _RunCgroups(parents, limits.processes, None, limits.memory_bytes)
    except OSError:
        return None


def _exit_of(status: int, *, chosen: str, killed: bool) -> tuple[int | None, int | None]:
    """(exit code, signal) of a wait status; a command killed at its timeout or cancel says SIGKILL."""
    exit_code: int | None
    signal_number: int | None = None
    if os.WIFSIGNALED(status):
        exit_code, signal_number = None, os.WTERMSIG(status)
    else:
        exit_code = os.WEXITSTATUS(status)
        # bubblewrap and the cgroup shim report a child's fatal signal as 128 + N.
        if chosen == BUBBLEWRAP and exit_code > 128 and exit_code - 128 < signal.NSIG:
            signal_number = exit_code - 128
    if killed:
        signal_number = signal.SIGKILL
    return exit_code, signal_number


def _egress_totals(egress: EgressProxy, mark: int, chosen: str, plan: _Plan, egress_view: dict) -> dict:
    """What the command's model calls through the proxy used and cost, as receipt fields; under
    bubblewrap the plan's view of the network names the proxy."""
    egress.settle()  # the last call's record may still be being written
    spent = egress.usage(mark)
    totals = {name: spent[name] for name in ("input_tokens", "output_tokens", "cache_write_tokens",
                                              "cache_read_tokens", "cost_microusd")}
    totals["price_table_version"] = "+".join(spent["price_table_versions"])[:64]
    if chosen == BUBBLEWRAP:
        plan.view["network"] = (f"only the egress proxy (to {egress.upstream}), "
                                f"at 127.0.0.1:{egress_view['port']}")
    return totals


def _egress_argv(argv: list[str], egress: EgressProxy, chosen: str) -> tuple[list[str], dict]:
    """`argv` under the egress forwarder, and how the receipt describes it: under bubblewrap the
    proxy's folder is bound at EGRESS_DIR_INSIDE and the port is fixed (the sandbox's own loopback);
    with rlimits only the forwarder takes a free port of the host's loopback."""
    folder = Path(EGRESS_DIR_INSIDE) if chosen == BUBBLEWRAP else egress.socket_path.parent
    port = egress.port or (EGRESS_PORT if chosen == BUBBLEWRAP else 0)
    # -I -S: the forwarder is standard library only, and no variable or site file may change it.
    client_env = [f"--env={name}={value}" for name, value in egress.client_env.items()]
    forwarder = [sys.executable, "-I", "-S", str(folder / FORWARDER_NAME),
                 "--socket", str(folder / SOCKET_NAME), "--port", str(port), *client_env, "--"]
    return [*forwarder, *argv], {"port": port, "socket": str(folder / SOCKET_NAME),
                                 "url_variable": "CRUCIBLE_EGRESS_URL"}


def _wait(process: subprocess.Popen, captures: dict[int, _Capture], stdin: bytes, deadline: float,
          cancel: threading.Event | None, cgroups: _RunCgroups | None, tail: Tail | None = None,
          bubblewrap: bool = False) -> tuple[bool, bool, int, object, int, float]:
    """Feed stdin, read both pipes and reap the command by its deadline; kill its group (and
    cgroups) on timeout or cancel, and whatever it left behind.
    (timed_out, cancelled, status, rusage, stray processes killed, when it was reaped)"""
    timed_out = cancelled = False
    stop = threading.Event()
    reader = threading.Thread(target=_pump, args=(process, captures, stop, tail), daemon=True)
    writer = threading.Thread(target=_feed_stdin, args=(process, stdin), daemon=True) if stdin else None
    reader.start()
    if writer is not None:
        writer.start()
    else:
        process.stdin.close()  # nothing to feed: no thread for it
    outcome: list[tuple[int, int, object, float]] = []
    # The moment it is reaped is when the command ended: its wall time stops there.
    waiter = threading.Thread(target=lambda: outcome.append((*os.wait4(process.pid, 0), time.monotonic())),
                              daemon=True)
    waiter.start()
    while waiter.is_alive():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        if cancel is not None and cancel.is_set():
            cancelled = True
            break
        waiter.join(min(remaining, 0.1) if cancel is not None else remaining)
    if timed_out or cancelled:
        _killpg(process.pid)
        if cgroups:
            cgroups.kill_all()
        waiter.join()
    _, status, rusage, ended = outcome[0]
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4 above
    # Counted before any kill: a killed group can be gone before a count after it looks.
    left = set(cgroups.members()) if cgroups else set()
    init = {pid for pid in left if _sandbox_init(pid)} if bubblewrap else set()
    _killpg(process.pid)  # whatever the command left running in its group dies with it
    stray = len((left | cgroups.kill_all()) - init) if cgroups else 0  # and whatever left the group
    stop.set()
    reader.join(10)
    if reader.is_alive():  # something outside the kill still holds a pipe: say so, keep what came
        logger.warning("the output of pid %s was still open 10 s after it ended; the receipt has "
                       "what came before", process.pid)
    if writer is not None:
        writer.join(1)
    for stream in (process.stdin, process.stdout, process.stderr):
        stream.close()
    return timed_out, cancelled, status, rusage, stray, ended


def _metrics_collect(metrics_path: Path | None, metrics_file: str | Path | None) -> bool:
    """Copy what the command wrote to $CRUCIBLE_METRICS_FILE to where the caller wants it; a file
    it left empty was not written."""
    if metrics_path is None or metrics_file is None:
        return False
    target = Path(metrics_file)
    target.unlink(missing_ok=True)
    try:  # without bubblewrap the command could have put a link or a pipe in its place
        handle = os.open(metrics_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    with os.fdopen(handle, "rb") as source:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            return False
        data = source.read((1 << 20) + 1)  # the reader refuses anything over 1 MiB
    if not data:
        return False
    target.write_bytes(data)
    return True


def _results_checked(results_files: Mapping[str, str | Path] | None) -> list[str]:
    """The tree-relative paths of `results_files`, refused unless each stays inside the tree."""
    relatives = list(results_files or {})
    for relative in relatives:
        parts = Path(relative).parts
        if not relative or "\0" in relative or Path(relative).is_absolute() or {"..", ".git"} & set(parts):
            raise SandboxError(f"results file {relative!r} must be a path inside the tree")
    return relatives


def _results_collect(results_paths: Mapping[str, Path], results_files: Mapping[str, str | Path],
                     results_root: Path | None) -> dict[str, str]:
    """Copy what the command left at each results path to where the caller wants it: "written",
    "not written" (no regular file, or an empty one) or "cut" (larger than RESULTS_LIMIT: the first
    RESULTS_LIMIT + 1 bytes are copied). With rlimits only the files are in the command's own tree
    (`results_root`), and are not read through a link out of it."""
    said = {}
    for relative, target in results_files.items():
        Path(target).unlink(missing_ok=True)
        path = results_paths.get(relative)
        data = _regular_read(path, RESULTS_LIMIT, results_root) if path is not None else None
        if not data:
            said[relative] = "not written"
            continue
        Path(target).write_bytes(data)
        said[relative] = "written" if len(data) <= RESULTS_LIMIT else f"cut at {RESULTS_LIMIT:,} bytes"
    return said


class _ReportPipe:
    """The report descriptor (docs/sandbox.md, the score contract): a pipe whose write end only the
    command's own process is handed; a thread reads it while the command runs (a writer never
    blocks on a full pipe) and keeps at most REPORT_LIMIT bytes."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()  # both close-on-exec: Popen's pass_fds hands over one
        self.data = bytearray()
        self.too_large = False
        self.stop = threading.Event()
        self.reader: threading.Thread | None = None

    def started(self) -> None:
        os.close(self.write_fd)
        self.write_fd = -1
        os.set_blocking(self.read_fd, False)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError):  # closed under it after a 5 s wait: keep what came
            while True:
                ready, _, _ = select.select([self.read_fd], [], [], 0.1)
                if not ready:
                    if self.stop.is_set():
                        return
                    continue
                try:
                    chunk = os.read(self.read_fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    return  # every holder of the write end has closed it
                self.too_large = self.too_large or len(self.data) + len(chunk) > REPORT_LIMIT
                if not self.too_large:  # the rest is drained, so a writer never blocks
                    self.data += chunk

    def collect(self, target: Path) -> str:
        """After the command ended: what came, written to `target`; how the receipt says it."""
        self.stop.set()  # a process that outlived the command may hold the write end: stop waiting
        if self.reader is not None:
            self.reader.join(5)
        target.unlink(missing_ok=True)
        if self.too_large:
            return "more than 1 MiB (not read)"
        if not self.data:
            return ""
        target.write_bytes(bytes(self.data))
        return "written"

    def close(self) -> None:
        self.stop.set()
        if self.reader is not None:
            self.reader.join(5)
        for fd in (self.read_fd, self.write_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.read_fd = self.write_fd = -1


def _scratch_remove(scratch: Path) -> None:
    # The command may have left unreadable or unwritable folders behind: root removes them anyway,
    # another user first gives itself the rights back.
    if os.geteuid() != 0:
        for root, dirs, _ in os.walk(scratch):
            for name in dirs:
                with contextlib.suppress(OSError):
                    os.chmod(os.path.join(root, name), 0o700)
    shutil.rmtree(scratch, ignore_errors=True)


def artifact_describe(tree: str | Path, relative: str) -> dict:
    """{path, size, sha256} of a file a command left in its tree, for a receipt's artifacts."""
    path = Path(tree) / relative
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return {"path": relative, "size": size, "sha256": digest.hexdigest()}
