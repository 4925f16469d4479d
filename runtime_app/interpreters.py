"""What the Python interpreters that run a search's commands import by name.

The change policy refuses a file that would be imported instead of the standard library or an
installed module (runtime_app/policy.py, `ImportNames`). Which names those are is not a list
kept here: `import_names(commands, readable=…)` runs each interpreter the commands would use,
inside the sandbox and with the environment they get, and asks it: `sys.stdlib_module_names`,
`sys.builtin_module_names`, and every top-level name on its `sys.path` less the working
directory (`pkgutil.iter_modules`, the directories on the path, and
`importlib.metadata.packages_distributions()`).

The interpreters probed: every `python` and `python3` on the sandbox's PATH (Crucible's venv
first, then the system's), the first word of each command when it names a Python interpreter (`python3.12`,
`/usr/bin/python3`), and the interpreter in the `#!` line of a program a command runs
(`pytest` → `#!/…/venv/bin/python`). Each answer is cached in this process until the
interpreter or a directory on its `sys.path` changes (their modification times). A probe that
fails raises `ProbeError`: no answer is never taken for "nothing to protect".
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime_app import sandbox
from runtime_app.policy import ImportNames, command_programs

PYTHON_NAME = re.compile(r"(python|pypy)(\d+(\.\d+)*)?")
PROBE_TIMEOUT_SECONDS = 120
SHEBANG_BYTES = 512
OUTPUT_BYTES = 16 << 20  # the answer is tens of KiB; it is refused if cut
NAMESPACE_DEPTH = 3  # how deep the children of namespace packages are listed (google.cloud.x)

# Runs inside the sandbox with the commands' PATH and environment, in an empty directory: the
# working directory is dropped from sys.path, so nothing of any tree is counted as installed.
PROBE = r"""
import importlib.metadata, json, os, pkgutil, sys
here = os.getcwd()
path = [p for p in sys.path if isinstance(p, str) and p not in ("", ".") and os.path.abspath(p) != here]
regular, namespace, children = set(), set(), set()
for info in pkgutil.iter_modules(path):
    regular.add(info.name)
def portions(folders):
    found = {}
    for folder in folders:
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for entry in entries:
            full = os.path.join(folder, entry)
            if entry.isidentifier() and entry != "__pycache__" and os.path.isdir(full) and not any(
                    os.path.exists(os.path.join(full, "__init__" + s)) for s in (".py", ".pyc")):
                found.setdefault(entry, []).append(full)
    return found
def walk(prefix, folders, depth):
    for info in pkgutil.iter_modules(folders):
        children.add(prefix + info.name)
    for name, inner in portions(folders).items():
        children.add(prefix + name)
        if depth > 1:
            walk(prefix + name + ".", inner, depth - 1)
top = portions(path)
for name, folders in top.items():
    if name not in regular:
        namespace.add(name)
        walk(name + ".", folders, DEPTH)
try:
    distributions = sorted(importlib.metadata.packages_distributions())
except Exception as error:
    print(json.dumps({"error": f"importlib.metadata failed: {error!r}"}))
    raise SystemExit(3)
print(json.dumps({
    "executable": sys.executable, "version": sys.version.split()[0], "path": path,
    "stdlib": sorted(getattr(sys, "stdlib_module_names", ())),
    "builtin": sorted(sys.builtin_module_names), "regular": sorted(regular),
    "namespace": sorted(namespace), "children": sorted(children), "distributions": distributions,
}))
""".replace("DEPTH", str(NAMESPACE_DEPTH))


class ProbeError(Exception):
    """An interpreter the commands use could not say what it imports."""


@dataclass(frozen=True)
class Probed:
    """One interpreter's answer."""

    interpreter: str  # as the commands reach it (a PATH entry or a `#!` line)
    executable: str
    version: str
    path: tuple[str, ...]  # its sys.path, less the working directory
    stdlib: frozenset[str]
    builtin: frozenset[str]
    regular: frozenset[str]  # modules and packages with an __init__ on its path
    namespace: frozenset[str]  # names only namespace packages provide (dotted: their children)
    distributions: frozenset[str]  # packages_distributions() keys

    @property
    def label(self) -> str:
        return f"Python {self.version} at {self.interpreter}"


_cache: dict[tuple[str, str], tuple[tuple[tuple[str, int], ...], Probed]] = {}
_lock = threading.Lock()


def _stamp(paths: Iterable[str]) -> tuple[tuple[str, int], ...]:
    """The modification times that tell an installed or removed module: the interpreter's and
    those of the directories on its path (a missing one counts as -1)."""
    stamped = []
    for path in paths:
        try:
            stamped.append((path, os.stat(path).st_mtime_ns))
        except OSError:
            stamped.append((path, -1))
    return tuple(stamped)


def _is_python(path: Path) -> bool:
    return bool(PYTHON_NAME.fullmatch(path.name) or PYTHON_NAME.fullmatch(Path(os.path.realpath(path)).name))


def _shebang(path: Path, tree: Path, readable: Sequence[Path], isolation: str | None) -> Path | None:
    """The interpreter named in `path`'s `#!` line (`#!/usr/bin/env python3` looked up on the
    sandbox's PATH), or None."""
    try:
        with path.open("rb") as handle:
            head = handle.read(SHEBANG_BYTES)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if not words:
        return None
    if Path(words[0]).name == "env":
        rest = [word for word in words[1:] if not word.startswith("-") and "=" not in word]
        if not rest:
            return None
        return sandbox.sandbox_which(rest[0], tree=tree, readable=readable, isolation=isolation)
    return Path(words[0])


def interpreters_find(commands: Sequence[str], *, tree: Path, readable: Sequence[Path] = (),
                      isolation: str | None = None) -> list[Path]:
    """The Python interpreters the commands would run, as host paths (see the module's doc)."""
    found: list[Path] = []
    # Every `python` and `python3` on the PATH, not only the first: a script's `#!/usr/bin/python3`
    # reaches one behind Crucible's venv.
    for folder in sandbox.sandbox_path(tree, readable, isolation):
        for name in ("python", "python3"):
            candidate = Path(folder) / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                found.append(candidate)
    for program in command_programs(commands):
        path: Path | None
        if program.startswith("/"):
            path = Path(program) if os.path.isfile(program) else None
        elif "/" in program:
            continue  # a repo script: what it runs is looked up by PATH (`python`, `python3`) or named in it
        else:
            path = sandbox.sandbox_which(program, tree=tree, readable=readable, isolation=isolation)
        if path is None:
            continue
        if _is_python(path):
            found.append(path)
            continue
        interpreter = _shebang(path, tree, readable, isolation)
        if interpreter is not None and _is_python(interpreter) and interpreter.is_file():
            found.append(interpreter)
    # `python` and `python3` of one directory are one interpreter with one environment.
    unique: dict[tuple[str, str], Path] = {}
    for path in found:
        unique.setdefault((os.path.realpath(path), os.path.realpath(path.parent)), path)
    return list(unique.values())


def _probe_run(interpreter: Path, tree: Path, readable: Sequence[Path], isolation: str | None) -> Probed:
    limits = sandbox.Limits(output_bytes=OUTPUT_BYTES, cpu_seconds=PROBE_TIMEOUT_SECONDS)
    try:
        receipt = sandbox.run([str(interpreter), "-c", PROBE], cwd=tree, timeout=PROBE_TIMEOUT_SECONDS,
                              isolation=isolation, readable=readable, writable=False, limits=limits)
    except sandbox.SandboxError as error:
        raise ProbeError(f"{interpreter} could not be started in the sandbox: {error}") from None
    text = receipt.stdout_excerpt
    if receipt.exit_code != 0:
        said = (receipt.stderr_excerpt or text).strip().splitlines()[-1:] or ["no output"]
        raise ProbeError(f"{interpreter} exited with {receipt.exit_code} when asked what it imports: "
                         f"{said[0]}")
    if receipt.stdout_bytes != len(text.encode()):
        raise ProbeError(f"{interpreter}'s list of importable names was cut or altered on its way out")
    try:
        data = json.loads(text)
        return Probed(
            interpreter=str(interpreter), executable=str(data["executable"]), version=str(data["version"]),
            path=tuple(str(item) for item in data["path"]),
            stdlib=frozenset(data["stdlib"]), builtin=frozenset(data["builtin"]),
            regular=frozenset(data["regular"]), namespace=frozenset(data["namespace"] + data["children"]),
            distributions=frozenset(data["distributions"]),
        )
    except (ValueError, KeyError, TypeError) as error:
        raise ProbeError(f"{interpreter} did not answer with its importable names: {error}") from None


def interpreter_probe(interpreter: Path, *, readable: Sequence[Path] = (), isolation: str | None = None
                      ) -> Probed:
    """What `interpreter` imports, asked inside the sandbox (cached until it or its path changes)."""
    chosen = sandbox.isolation_choose(isolation)
    key = (str(interpreter), chosen)
    with _lock:
        cached = _cache.get(key)
        if cached is not None and _stamp(path for path, _ in cached[0]) == cached[0]:
            return cached[1]
        with tempfile.TemporaryDirectory(prefix="crucible-probe-") as folder:
            tree = Path(folder)
            tree.chmod(0o755)  # an unprivileged sandbox user must be able to enter it
            probed = _probe_run(interpreter, tree, readable, isolation)
        _cache[key] = (_stamp([os.path.realpath(interpreter), str(interpreter), *probed.path]), probed)
        return probed


def import_names(commands: Sequence[str], *, readable: Sequence[Path] = (), isolation: str | None = None
                 ) -> ImportNames:
    """The names no file of a patch may stand in for, from every interpreter the commands use.
    A failure is returned as `ImportNames(error=…)`, which the change policy turns into a refusal
    of every file that could be imported by name."""
    try:
        with tempfile.TemporaryDirectory(prefix="crucible-probe-") as folder:
            interpreters = interpreters_find(commands, tree=Path(folder), readable=readable,
                                             isolation=isolation)
        if not interpreters:
            raise ProbeError("no Python interpreter (`python`, `python3`) is on the sandbox's PATH")
        answers = [interpreter_probe(path, readable=readable, isolation=isolation) for path in interpreters]
    except (ProbeError, sandbox.SandboxError) as error:
        return ImportNames(error=f"the interpreters that run the commands could not be asked what they "
                                 f"import ({error})")
    return ImportNames(
        stdlib=frozenset().union(*(answer.stdlib | answer.builtin for answer in answers)),
        installed=frozenset().union(*(answer.regular | answer.namespace | answer.distributions
                                      for answer in answers)),
        regular=frozenset().union(*(answer.regular | answer.builtin for answer in answers)),
        namespaces=frozenset().union(*(answer.namespace for answer in answers)),
        interpreters=tuple(answer.label for answer in answers),
    )
