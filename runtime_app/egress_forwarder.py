"""Inside the sandbox: a TCP port on the sandbox's own loopback that leads to the egress proxy.

    python egress_forwarder.py --socket PATH --port N [--env NAME=VALUE ...] -- CMD ARGS...

Listens on 127.0.0.1:N (N=0 picks a free port), copies every connection's bytes both ways to
the Unix socket PATH (runtime_app.egress, outside the sandbox), starts CMD with
`CRUCIBLE_EGRESS_URL=http://127.0.0.1:<port>` (and each `--env`, "{url}" in its value replaced
by that URL) added to its environment, and exits with CMD's
exit code (128 + N if a signal ended it). Standard library only: it runs under whatever Python
the sandbox can see, before anything else of the command.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading

_CHUNK = 65536
_PR_SET_PDEATHSIG = 1


def _pipe(source: socket.socket, target: socket.socket) -> None:
    """Copy until `source` ends, then end `target`'s writing half (the other way may go on)."""
    try:
        while chunk := source.recv(_CHUNK):
            target.sendall(chunk)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)


def _serve(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError as error:
        sys.stderr.write(f"egress forwarder: cannot reach the egress proxy: {error}\n")
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    _pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _accept(listener: socket.socket, path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # SSE events go out at once
        threading.Thread(target=_serve, args=(client, path), daemon=True).start()


def _die_with_parent() -> None:
    """The command dies when the forwarder does (Linux; best effort elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="egress_forwarder.py")
    parser.add_argument("--socket", required=True, help="the egress proxy's Unix socket")
    parser.add_argument("--port", type=int, default=0, help="the loopback port to listen on")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the command")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("no command after --")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", options.port))
    except OSError as error:
        sys.stderr.write(f"egress forwarder: cannot listen on 127.0.0.1:{options.port}: {error}\n")
        return 125
    listener.listen(64)
    port = listener.getsockname()[1]
    threading.Thread(target=_accept, args=(listener, options.socket), daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    extra = dict(item.partition("=")[::2] for item in options.env)
    env = {**os.environ, **{name: value.replace("{url}", url) for name, value in extra.items()},
           "CRUCIBLE_EGRESS_URL": url}
    try:
        child = subprocess.Popen(command, env=env, preexec_fn=_die_with_parent)
    except OSError as error:
        sys.stderr.write(f"egress forwarder: cannot start {command[0]}: {error}\n")
        return 127
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # passed on, not swallowed
        signal.signal(number, lambda signum, _frame: child.send_signal(signum))
    code = child.wait()
    listener.close()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
