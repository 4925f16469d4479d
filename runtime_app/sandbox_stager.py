"""The stager: one root process per worker process, in a private mount namespace of its own, that
mounts each run's stage there (docs/sandbox.md, "an unprivileged uid").

bubblewrap runs as the unprivileged sandbox user, who cannot reach a 0700 data dir or home; each
such source is first bound, as root, at a slot of a tmpfs stage in a private mount namespace, and
bubblewrap binds it from there. Made per run, that namespace cost three processes (`unshare`, a
shell, `mount -a`) and `setpriv`; here it is made once, the stager mounts a run's slots by system
call when asked, and the run enters the namespace with one `nsenter`, which also drops to the
sandbox user. Nothing of a slot is visible outside that namespace (its propagation is private),
only root can enter it, and each run's slots are unmounted when it ends.

Standard library only; run as `unshare --mount --propagation private -- python -I -S this BASE`.
Requests and answers are JSON lines on stdin and stdout. It exits when stdin closes.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys

MS_BIND = 4096
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    if _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                   data.encode() if data else None) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount {source} on {target}: {os.strerror(error)}")


def _stage(base: str, request: dict) -> list[str]:
    """Mount one run's slots; returns what was mounted, innermost last (released in reverse)."""
    made: list[str] = []
    try:
        for source, slot, is_file in request["binds"]:
            target = os.path.join(base, slot)
            if not os.path.exists(source):
                raise OSError(f"cannot stage {source}")
            if is_file:
                os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            else:
                os.mkdir(target, 0o755)
            made.append(target)
            _mount(source, target, None, MS_BIND, None)
        for lower, mode, size, slot, uid, gid in request["overlays"]:
            writes, target = os.path.join(base, slot + "w"), os.path.join(base, slot)
            os.mkdir(writes, 0o700)
            made.append(writes)
            _mount("crucible-writes", writes, "tmpfs", 0, f"mode=0700,size={int(size)}")
            for name in ("upper", "work"):  # the merged root shows the upper folder's owner and mode
                os.mkdir(os.path.join(writes, name))
                os.chown(os.path.join(writes, name), uid, gid)
                os.chmod(os.path.join(writes, name), mode)
            os.mkdir(target, 0o755)
            made.append(target)
            _mount("crucible", target, "overlay", 0,
                   f"lowerdir={os.path.join(base, lower)},upperdir={writes}/upper,workdir={writes}/work")
    except BaseException:
        _release(made)
        raise
    return made


def _release(made: list[str]) -> None:
    for target in reversed(made):
        _libc.umount2(target.encode(), MNT_DETACH)  # not mounted (a failed stage): nothing to undo
        with contextlib.suppress(OSError):
            os.rmdir(target) if os.path.isdir(target) and not os.path.islink(target) else os.unlink(target)


def main() -> None:
    base = sys.argv[1]
    # No parent-death signal: it follows the thread that started the stager, not the worker. Its
    # stdin is held only by the worker process, so it ends (and so does its namespace, once no run
    # is inside it) when the worker does, however the worker ends.
    _mount("crucible-stage", base, "tmpfs", 0, "mode=0755,size=1m")
    runs: dict[str, list[str]] = {}
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if "release" in request:  # not answered: the run has ended and does not wait for it
            _release(runs.pop(request["release"], []))
            continue
        try:
            runs[request["run"]] = _stage(base, request)
            answer: dict = {"ok": True}
        except (OSError, ValueError, KeyError, TypeError) as error:
            answer = {"error": str(error)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
