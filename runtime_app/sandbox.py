"""The sandbox: every command a writer, gate, trial or reviewer runs goes through `run()`.

Layers, outermost first (docs/sandbox.md explains each and what it does not stop):

1. A new session and process group, killed as a group on timeout and when the command ends,
   so background processes die with it; the command's own exit is reaped with its rusage.
2. A `pids` cgroup per run where the host lets us make one (it binds root too), else
   RLIMIT_NPROC, which binds only non-root users.
3. bubblewrap when `CRUCIBLE_SANDBOX` allows and it can start: no network, read-only root,
   a private `/tmp`, the server's home, data dir and checkout hidden, the tree the only writable place,
   `--cap-drop ALL`, its own pid namespace and session, dying with its parent.
4. rlimits through `prlimit` inside all of that: CPU seconds, address space, open files,
   file size and processes.

The environment is built from an allow-list; names that look like secrets never pass, and
the values of the server's secrets (plus any the caller declares) are redacted from what is
recorded. Output is kept as a head and a tail, with its total size and SHA-256 of the raw
stream.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings

from runtime_app.models import Receipt

BUBBLEWRAP = "bubblewrap"
RLIMITS_ONLY = "rlimits-only"
MODES = ("required", "preferred", "off")
SANDBOX_HOME = "/tmp/home"  # noqa: S108  (inside the sandbox's private tmpfs)
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
    """Ceilings for one command; `processes` counts every process of the run."""

    cpu_seconds: int = 600
    address_space_bytes: int = 8 << 30
    open_files: int = 1024
    file_size_bytes: int = 1 << 30
    processes: int = 256
    output_bytes: int = 32 << 10  # kept per stream: half from the head, half from the tail

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


def env_build(declared: Mapping[str, str] | None, *, home: str) -> tuple[dict[str, str], list[str]]:
    """The command's whole environment and the declared names refused as secret-like."""
    python_bin = str(Path(sys.executable).parent)
    env = {
        "PATH": os.pathsep.join([python_bin, os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")]),
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
        if is_secret_name(name):
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

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.digest = hashlib.sha256()

    def feed(self, chunk: bytes) -> None:
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


def _pump(process: subprocess.Popen, captures: dict[int, _Capture], stop: threading.Event) -> None:
    """Read both pipes until they close, or until told to stop once the command is gone."""
    selector = selectors.DefaultSelector()
    for stream in (process.stdout, process.stderr):
        selector.register(stream, selectors.EVENT_READ)
    open_count = 2
    while open_count:
        events = selector.select(timeout=0.05)
        for key, _ in events:
            chunk = os.read(key.fd, _READ_CHUNK)
            if chunk:
                captures[key.fd].feed(chunk)
            else:
                selector.unregister(key.fileobj)
                open_count -= 1
        if not events and stop.is_set():
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


@functools.cache
def pids_cgroup_parent() -> Path | None:
    """Where per-run pids cgroups can be made on this host, or None (checked once per process)."""
    candidates = [Path("/sys/fs/cgroup/pids")]
    if "pids" in _read(Path("/sys/fs/cgroup/cgroup.subtree_control")):
        candidates.append(Path("/sys/fs/cgroup"))
    for root in candidates:
        parent = root / "crucible"
        try:
            parent.mkdir(exist_ok=True)
            if root == Path("/sys/fs/cgroup"):
                (parent / "cgroup.subtree_control").write_text("+pids")
            probe = parent / f"probe-{os.getpid()}"
            probe.mkdir()
            ok = (probe / "pids.max").exists()
            probe.rmdir()
        except OSError:
            continue
        if ok:
            return parent
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class _PidsCgroup:
    """A cgroup holding every process of one run; killing it leaves nothing behind."""

    def __init__(self, parent: Path, limit: int) -> None:
        self.path = parent / f"run-{os.getpid()}-{uuid.uuid4().hex[:10]}"
        self.path.mkdir()
        (self.path / "pids.max").write_text(str(limit))

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def members(self) -> list[int]:
        return [int(word) for word in _read(self.procs).split()]

    def kill_all(self) -> int:
        """SIGKILL every member until none is left; returns how many were found alive."""
        found: set[int] = set()
        deadline = time.monotonic() + 5
        while (pids := self.members()) and time.monotonic() < deadline:
            for pid in pids:
                found.add(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        return len(found)

    def peak(self) -> int | None:
        text = _read(self.path / "pids.peak").strip()
        return int(text) if text.isdigit() else None

    def remove(self) -> None:
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.02)


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


# ------------------------------------------------------------------------------ bubblewrap


def sandbox_mode() -> str:
    return settings.CONFIG.sandbox


@functools.cache
def bubblewrap_probe() -> tuple[bool, str]:
    """Can bubblewrap start here with the flags run() uses? (answer, reason); checked once."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return False, "bubblewrap (bwrap) is not installed"
    argv = [bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",  # noqa: S108
            "--unshare-all", "--cap-drop", "ALL", "--new-session", "--die-with-parent", "--clearenv",
            "--", "/bin/true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"bubblewrap could not start: {error}"
    if done.returncode != 0:
        return False, f"bubblewrap could not start: {done.stderr.decode(errors='replace').strip()}"
    return True, "bubblewrap starts"


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


def _interpreter_prefixes() -> set[Path]:
    return {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}


def _hidden_paths() -> list[Path]:
    """Host places a command must not read: the server's home, Crucible's data dir and its own
    checkout. The checkout also holds the pyproject.toml that pytest would otherwise take as the
    config of a worktree under the default data dir (`var/`), loading Crucible's settings."""
    hidden = [Path.home(), Path(settings.DATA_DIR)]
    base = Path(settings.BASE_DIR).resolve()
    # Installed into site-packages, "the checkout" is the interpreter's own library: keep it.
    if not any(_inside(base, prefix) for prefix in _interpreter_prefixes()):
        hidden.append(base)
    # Parents first: a place inside another is covered after it, or the outer tmpfs would hide it.
    return sorted({path.resolve() for path in hidden if path.exists()}, key=lambda path: len(path.parts))


def _bubblewrap_argv(
    tree: Path, cwd: Path, env: Mapping[str, str], readable: Sequence[Path], writable: bool = True
) -> list[str]:
    argv = ["bwrap", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # noqa: S108
    hidden = [path for path in _hidden_paths() if path != tree]
    # A hidden place that holds the tree is covered first and the tree bound over it; one
    # inside the tree is covered after the tree's bind, which would otherwise expose it.
    before = [path for path in hidden if not _inside(path, tree)]
    after = [path for path in hidden if _inside(path, tree)]
    for path in before:
        argv += ["--tmpfs", str(path)]
    # Crucible's own Python stays usable (gates run pytest with it) even if it lives in a home.
    interpreter = _interpreter_prefixes()
    covered = [*before, Path("/tmp")]  # noqa: S108  (the private tmpfs covers the host's /tmp)
    exposed = [*readable, *(p for p in sorted(interpreter) if any(_inside(p, h) for h in covered))]
    for path in exposed:
        argv += ["--ro-bind", str(path), str(path)]
    argv += ["--bind" if writable else "--ro-bind", str(tree), str(tree)]
    for path in after:
        argv += ["--tmpfs", str(path)]
    argv += ["--dir", SANDBOX_HOME]
    argv += ["--unshare-all", "--cap-drop", "ALL", "--new-session", "--die-with-parent", "--clearenv"]
    for name, value in env.items():
        argv += ["--setenv", name, value]
    return [*argv, "--chdir", str(cwd), "--"]


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


# --------------------------------------------------------------------------------------- run


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
    kind: str = "command",
    writable: bool = True,
    cancel: threading.Event | None = None,
) -> Receipt:
    """Run `command` (argv list, or a shell line for /bin/sh) contained, and describe it.

    `tree` is the one writable place (default: `cwd`), and `cwd` must lie inside it.
    `readable` are host paths re-exposed read-only under bubblewrap (a worktree's git dir).
    `writable=False` binds the tree read-only (bubblewrap only; with rlimits only the
    receipt says it was not enforced). Setting `cancel` stops the command like a timeout.
    Returns an unsaved Receipt; `services.receipt_record` writes it.
    """
    limits = limits or Limits()
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
    readable_paths = [Path(path).resolve() for path in readable]
    prlimit = shutil.which("prlimit")
    if not prlimit:
        raise SandboxError("prlimit (util-linux) is not installed; commands cannot be limited")
    chosen = isolation_choose(isolation)
    secrets = secret_values(redact_values)

    scratch: Path | None = None
    if chosen == BUBBLEWRAP:
        env_full, refused = env_build(env, home=SANDBOX_HOME)
        outer = _bubblewrap_argv(tree_path, cwd_path, env_full, readable_paths, writable)
        full_argv, popen_env, popen_cwd = [*outer, prlimit, *limits.prlimit_args(), "--", *argv], {}, "/"
    else:
        scratch = Path(tempfile.mkdtemp(prefix="crucible-home-"))
        env_full, refused = env_build(env, home=str(scratch))
        full_argv = [prlimit, *limits.prlimit_args(), "--", *argv]
        popen_env, popen_cwd = env_full, str(cwd_path)

    cgroup_parent = pids_cgroup_parent()
    cgroup = None
    if cgroup_parent is not None:
        try:
            cgroup = _PidsCgroup(cgroup_parent, limits.processes)
        except OSError:
            cgroup = None
    if cgroup is not None:
        # Join the cgroup before exec, so no process of the run is ever outside it.
        full_argv = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup.procs), *full_argv]
    processes_enforced_by = (
        "pids-cgroup" if cgroup else ("rlimit" if os.geteuid() != 0 else "none (root, no pids cgroup)")
    )

    captures: dict[int, _Capture] = {}
    started_at = datetime.now(UTC)
    started = time.monotonic()
    timed_out = False
    cancelled = False
    stray = 0
    peak = None
    status = 0
    rusage = None
    try:
        try:
            process = subprocess.Popen(
                full_argv, cwd=popen_cwd, env=popen_env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            )
        except OSError as error:
            raise SandboxError(f"the sandbox could not start: {error}") from None
        captures = {process.stdout.fileno(): _Capture(limits.output_bytes),
                    process.stderr.fileno(): _Capture(limits.output_bytes)}
        stop = threading.Event()
        reader = threading.Thread(target=_pump, args=(process, captures, stop), daemon=True)
        writer = threading.Thread(target=_feed_stdin, args=(process, stdin), daemon=True)
        reader.start()
        writer.start()
        outcome: list[tuple[int, int, object]] = []
        waiter = threading.Thread(target=lambda: outcome.append(os.wait4(process.pid, 0)), daemon=True)
        waiter.start()
        deadline = started + timeout
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
            if cgroup:
                cgroup.kill_all()
            waiter.join()
        _, status, rusage = outcome[0]
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4 above
        # Whatever the command left running in its group or cgroup dies with it.
        _killpg(process.pid)
        if cgroup:
            stray = cgroup.kill_all()
            peak = cgroup.peak()
        stop.set()
        reader.join(10)
        writer.join(1)
        for stream in (process.stdin, process.stdout, process.stderr):
            stream.close()
    finally:
        if cgroup:
            cgroup.remove()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    finished_at = datetime.now(UTC)
    duration = time.monotonic() - started

    exit_code: int | None
    signal_number: int | None = None
    if os.WIFSIGNALED(status):
        exit_code, signal_number = None, os.WTERMSIG(status)
    else:
        exit_code = os.WEXITSTATUS(status)
        # bubblewrap and the cgroup shim report a child's fatal signal as 128 + N.
        if chosen == BUBBLEWRAP and exit_code > 128 and exit_code - 128 < signal.NSIG:
            signal_number = exit_code - 128
    if timed_out or cancelled:
        signal_number = signal.SIGKILL
    out, err = captures.values()
    return Receipt(
        kind=kind,
        argv=[redact(part, secrets) for part in argv],
        cwd=str(cwd_path.relative_to(tree_path)),
        env_names=sorted(env_full),
        env_refused=refused,
        started_at=started_at,
        finished_at=finished_at,
        duration_seconds=round(duration, 6),
        exit_code=exit_code,
        signal=signal_number,
        timed_out=timed_out,
        isolation=chosen,
        limits={**asdict(limits), "timeout_seconds": timeout, "processes_enforced_by": processes_enforced_by},
        rusage={
            "user_cpu_seconds": round(rusage.ru_utime, 6) if rusage else None,
            "sys_cpu_seconds": round(rusage.ru_stime, 6) if rusage else None,
            "max_rss_kib": rusage.ru_maxrss if rusage else None,
        },
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
        },
    )


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
