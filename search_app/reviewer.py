"""Crucible's built-in read-only reviewer: reads a patch on stdin, prints a JSON verdict.

It runs in the sandbox with the patched tree bound read-only as its working directory and
stands in for an LLM reviewer. It never approves a merge; with `selection.review = "blocking"`
(the default) its reject eliminates a provisional winner, otherwise it is advice shown next to
the approve button.

A candidate's code runs inside every gate and trial, so it can reach the process that judges
it: the test runner's plugin manager through `gc`, a frame's globals, a patched clock, an exit
with status 0, an environment variable that tells a trial from a gate. This reviewer reads the
changed Python files with `ast` and flags, on the patch's added lines (and anywhere in a
function the patch changes), what the code REACHES, by category, not by text:

1. the interpreter or the judging process: the interpreter's own modules (`gc`, `inspect`,
   `builtins`, `ctypes`, `atexit`, `signal`, `importlib`, ...), `sys` beyond its plain values,
   the test runner's distributions (derived from the commands the spec runs and the installed
   distributions' metadata: pytest's closure is `pytest`, `_pytest`, `pluggy`, its plugins...),
   private modules (`_thread`, `_pytest`), hook functions (`pytest_*`, `load_tests`), and the
   object model's attributes (`__globals__`, `__subclasses__`, `f_back`, `tb_frame`, derived
   from the interpreter's function, type, frame, traceback and code objects);
2. writes to attributes of anything imported (`time.perf_counter = ...`, `setattr(module, ...)`,
   `sys.stdout = ...`), rebinding a builtin, `__builtins__`;
3. dynamic access that hides what is reached (`__import__`, `getattr` with a computed name,
   `globals()`, `eval`/`exec`/`compile`): the reviewer cannot tell what it reaches, so it does
   not pretend to;
4. exit paths and process control (`os._exit`, `sys.exit`, `raise SystemExit`, `os.kill`,
   signals, `atexit`);
5. the measurement context (argv, flags, environment, cwd, parent process, `/proc`, clocks).

Every route into the judge starts at one of a handful of entry points the language defines
(an import, a builtin that hands out interpreter objects, an object-model attribute, an
attribute write): the reviewer flags the entry points, so an obfuscated attack still has to
pass one. Names are followed to what they really reach (`os.sys._getframe` is `sys._getframe`,
found by importing the standard module; a module held in a variable is itself a finding),
strings built from literals are folded (`"pytest" + "_sessionfinish"`), a source encoding other
than UTF-8 is refused, and the protected tests' own modules count as the judge.

The lists above are the part no metadata can derive: nothing marks a standard module as "the
interpreter's". What can be derived is: the test runner's distributions (from the commands and
`importlib.metadata`), the object model's attributes (from the interpreter's own objects), the
protected modules (from the protected paths), and what a re-exported name resolves to.

What no static reader can do is decide behaviour: wrong code can look honest, and code can
reach the judge by a route this reader does not know (an object a harmless-looking library
holds, a shared file). That is why
the decision rests on structural checks outside every process the candidate's code runs in
(results compared by the runtime, the runtime's own measurement, the writer/evaluation barrier,
the change policy's shadowing rules); this reviewer's reject is evidence that blocks, not the
proof that a winner is honest.

Non-Python files are read line by line with the older text rules; a shell script is flagged
whole. Copies of protected expected values are flagged in every file.

    python -I search_app/reviewer.py --protected tests,expected_result.json \
        --commands '["python -m pytest -q tests"]' < patch.diff
"""

from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import functools
import importlib.metadata
import json
import re
import shlex
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

HIGH, MEDIUM, LOW = "high", "medium", "low"

# ------------------------------------------------------------------------------- what is reached

# Modules whose documented purpose is the running interpreter or process itself. No metadata
# marks a standard-library module as such, so this one set is written out (each with its reach).
INTERPRETER_MODULES = {
    "gc": "the interpreter's live objects", "inspect": "frames of running code",
    "builtins": "the built-in names every module sees", "ctypes": "the process's raw memory",
    "cffi": "the process's raw memory", "atexit": "code run when the judge exits",
    "signal": "signal handlers of the judging process", "faulthandler": "the interpreter's fault handler",
    "tracemalloc": "the interpreter's allocations", "importlib": "the import system",
    "runpy": "the import system", "pkgutil": "the import system", "zipimport": "the import system",
    "code": "an interactive interpreter", "codeop": "code compiled from text", "pdb": "a debugger",
    "bdb": "a debugger", "trace": "the tracer", "traceback": "frames of running code",
    "sysconfig": "the interpreter's installation", "site": "the interpreter's start-up",
    "marshal": "code objects from bytes", "__main__": "the judging program's main module",
    "unittest": "the standard test runner", "doctest": "the standard test runner",
    "resource": "the process's resource use and limits", "platform": "the machine it runs on",
    "getpass": "the user it runs as", "pwd": "the user it runs as", "grp": "the user it runs as",
    "timeit": "a clock", "shelve": "objects loaded from bytes", "copyreg": "objects loaded from bytes",
}
# Modules whose import does something (opens a browser, prints): never imported to resolve a name.
IMPORT_EFFECTS = {"antigravity", "this", "__hello__", "__phello__", "idlelib", "turtledemo", "tkinter",
                  "turtle"}
# Where a third-party module re-exports one of these (`lib.sys`, `lib._os`), the chain is read
# from there: the reviewer does not import third-party code to find out.
REEXPORTED = {"sys", "os", "posix", "nt", "gc", "inspect", "builtins", "importlib", "ctypes", "atexit",
              "signal", "threading", "time", "traceback", "types", "resource", "faulthandler"}
# importlib's data-file reader reaches nothing of the process.
QUIET_SUBMODULES = {"importlib.resources"}
NETWORK_MODULES = {"socket", "ssl", "urllib", "http", "requests", "urllib3", "httpx", "aiohttp",
                   "ftplib", "smtplib", "poplib", "imaplib", "telnetlib", "xmlrpc", "asyncio.streams"}
PROGRAM_MODULES = {"subprocess", "pty"}

# `sys` is the interpreter's module: everything in it is the judge's state except these plain
# values and the process's own standard input and output. `setrecursionlimit` stays allowed: it
# raises a limit and reaches nothing, and deep memoised recursion honestly needs it.
SYS_PLAIN = {
    "maxsize", "maxunicode", "float_info", "int_info", "hash_info", "byteorder", "version",
    "version_info", "hexversion", "implementation", "platform", "intern", "getsizeof",
    "getrecursionlimit", "setrecursionlimit", "get_int_max_str_digits", "set_int_max_str_digits",
    "float_repr_style", "getdefaultencoding", "getfilesystemencoding", "stdin", "stdout", "stderr",
}
SYS_CONTEXT = {"argv", "orig_argv", "flags", "executable", "_base_executable", "prefix", "base_prefix",
               "exec_prefix", "path", "warnoptions", "_xoptions", "environ"}
SYS_EXIT = {"exit", "_exit"}

# `os` (and `posix`, `nt` beneath it) is the system interface: its files and paths are
# ordinary; these reach the process.
OS_MODULES = {"os", "posix", "nt"}
OS_CONTEXT = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv", "getcwd", "getcwdb",
              "chdir", "getpid", "getppid", "getpgid", "getpgrp", "getsid", "getuid", "geteuid",
              "getgid", "getegid", "getlogin", "getgroups", "uname", "times", "getloadavg",
              "sched_getaffinity", "getpriority", "ctermid", "ttyname", "isatty"}
OS_EXIT = {"_exit", "abort", "kill", "killpg", "fork", "forkpty", "setsid", "setpgid", "setpgrp",
           "register_at_fork", "pidfd_open", "nice", "setpriority", "sched_setaffinity"}
OS_EXIT_PREFIXES = ("exec", "spawn", "posix_spawn", "wait", "set")
OS_PROGRAMS = {"system", "popen", "startfile"}

# Clocks: code that reads one can time itself and tell a trial from a gate.
TIME_CLOCKS = {"time", "time_ns", "perf_counter", "perf_counter_ns", "process_time", "process_time_ns",
               "thread_time", "thread_time_ns", "monotonic", "monotonic_ns", "clock_gettime",
               "clock_gettime_ns", "get_clock_info", "pthread_getcpuclockid", "localtime", "ctime",
               "asctime"}
DATETIME_CLOCKS = {"now", "utcnow", "today"}
THREADING_JUDGE = {"settrace", "setprofile", "settrace_all_threads", "setprofile_all_threads",
                   "excepthook", "gettrace", "getprofile", "enumerate", "main_thread", "_active"}
TYPES_JUDGE = {"CodeType", "FunctionType", "FrameType", "TracebackType", "ModuleType", "CellType",
               "LambdaType", "MethodType"}

# The object model's attributes, derived from the interpreter's own objects: every attribute of
# frames, tracebacks, code, generators and cells, and the data dunders of functions, modules,
# types, methods and exceptions (what `x.__globals__`, `f.f_back`, `C.__mro__` reach).
_EXECUTION_KINDS = (types.FrameType, types.TracebackType, types.CodeType, types.GeneratorType,
                    types.CoroutineType, types.AsyncGeneratorType, types.CellType)
_OBJECT_KINDS = (types.FunctionType, types.ModuleType, type, types.MethodType,
                 types.BuiltinFunctionType, BaseException, *_EXECUTION_KINDS)
_ORDINARY = set().union(*(dir(kind) for kind in (object, int, float, complex, str, bytes, bytearray, list,
                                                 tuple, dict, set, frozenset, range, slice, bool)))
# Names that only describe an object (`if __name__ == "__main__"`), and reach nothing.
_DESCRIPTIVE = {"__name__", "__qualname__", "__module__", "__doc__", "__annotations__",
                "__text_signature__", "__type_params__", "__wrapped__"}
# The by-name protocol: these reach any attribute whatever its name.
_BY_NAME = {"__subclasses__", "__getattribute__", "__getattr__", "__setattr__", "__delattr__",
            "__reduce__", "__reduce_ex__", "__import__", "__builtins__", "__loader__", "__spec__", "mro",
            "__base__"}
OBJECT_MODEL = (
    {name for kind in _OBJECT_KINDS for name in dir(kind)
     if name.startswith("__") and name.endswith("__") and not callable(getattr(kind, name, None))}
    | {name for kind in _EXECUTION_KINDS for name in dir(kind)
       if not name.startswith("__") and not callable(getattr(kind, name, None))}
) - _ORDINARY - _DESCRIPTIVE | _BY_NAME
BUILTIN_NAMES = {name for name in dir(builtins) if not name.startswith("_")}
EXIT_EXCEPTIONS = {"SystemExit", "KeyboardInterrupt", "GeneratorExit", "BaseException"}
CONTEXT_PATH = re.compile(r"^/(proc|sys|dev(?!/null\b)|run)(/|$)")
# A test runner's hooks are found by name (`pytest_runtest_makereport`, pluggy's `pytest_impl`
# marker, unittest's `load_tests`): any identifier or string of that shape is a hook.
HOOK_NAME = re.compile(r"^(pytest_|load_tests$)")
# An object-model attribute named in a string (`Formatter().get_field("0.__globals__", ...)`).
ATTRIBUTE_TOKEN = re.compile(r"(?<![A-Za-z0-9])_*[A-Za-z][A-Za-z0-9_]*")
# Builtins that hand out interpreter objects or reach by name: passed around, they hide it.
REACHING_BUILTINS = {"eval", "exec", "compile", "globals", "vars", "locals", "exit", "quit", "breakpoint",
                     "getattr", "setattr", "delattr", "__import__"}

# Text rules for files the reviewer cannot read as Python.
TEXT_RULES = [
    (re.compile(r"\bos\.environ\b|\bgetenv\b|\$\{?[A-Z_]+"), MEDIUM, "reads the environment"),
    (re.compile(r"\bimport (socket|urllib|http|requests)\b|\bfrom (socket|urllib|http|requests)\b|"
                r"\b(curl|wget|nc)\b"), HIGH, "reaches the network"),
    (re.compile(r"\bsubprocess\b|\bos\.system\(|\bos\.popen\("), HIGH, "starts other programs"),
    (re.compile(r"\beval\(|\bexec\("), HIGH, "evaluates code from text"),
    (re.compile(r"pytest\.(skip|xfail)|unittest\.skip|sys\.exit\(0\)|os\._exit\(|\bexit 0\b"), HIGH,
     "skips checks or forces success"),
    (re.compile(r"pickle\.load"), LOW, "loads state saved by an earlier run"),
]
DATA_SUFFIXES = {".json", ".txt", ".csv", ".tsv", ".md", ".rst", ".toml", ".yaml", ".yml", ".ini", ".cfg",
                 ".html", ".xml", ".svg", ".lock"}
SCRIPT_SUFFIXES = {".sh", ".bash", ".zsh", ".ksh", ".fish", ".bat", ".cmd", ".ps1"}


@functools.lru_cache(maxsize=8)
def harness_modules(commands: tuple[str, ...]) -> dict[str, str]:
    """Module -> the runner it belongs to: the programs the commands run (`-m X`, a
    console script), the distributions they require, and their plugins (a distribution that
    requires the runner or plugs into its entry-point group). pytest, unittest and doctest always
    count: a script can start them without naming them."""
    try:
        owners = importlib.metadata.packages_distributions()
    except Exception:
        owners = {}
    programs: set[str] = {"pytest", "unittest", "doctest"}
    for command in commands:
        try:
            words = shlex.split(command)
        except ValueError:
            words = command.split()
        for index, word in enumerate(words):
            if word == "-m" and index + 1 < len(words):
                programs.add(words[index + 1].split(".")[0])
            elif word.startswith("-m") and len(word) > 2 and not word.startswith("--"):
                programs.add(word[2:].split(".")[0])
            elif index == 0 or words[index - 1] in {"&&", "||", ";", "|"}:
                programs.add(Path(word).name)
    found: dict[str, str] = {}
    with contextlib.suppress(Exception):  # a broken installation leaves only the named runners
        for entry in importlib.metadata.entry_points(group="console_scripts"):
            if entry.name in programs:
                found[entry.module.split(".")[0]] = entry.name
    # `python -m json.tool` names a standard module that judges nothing; the standard runners
    # (unittest, doctest) are always counted above.
    found.update({program: program for program in programs if program in owners and not _stdlib(program)})
    found.update({runner: runner for runner in ("unittest", "doctest")})
    runners = {dist for module in found for dist in owners.get(module, [])}
    wanted = set(runners)
    queue = list(runners)
    while queue:  # the runners' requirements, transitively
        for requirement in _requires(queue.pop()):
            if requirement not in wanted:
                wanted.add(requirement)
                queue.append(requirement)
    with contextlib.suppress(Exception):
        for dist in importlib.metadata.distributions():
            name = _canonical(dist.metadata["Name"] or "")
            if runners & set(_requirement_names(dist.requires)):  # a plugin: it requires the runner
                wanted.add(name)
            for entry in dist.entry_points:  # a plugin module of the runner's entry-point group
                if any(entry.group.startswith(_canonical(runner).replace("-", "_")) for runner in runners):
                    found[entry.module] = entry.group
    wanted_canonical = {_canonical(name) for name in wanted}
    for module, dists in owners.items():
        named = [dist for dist in dists if _canonical(dist) in wanted_canonical]
        if named:
            found.setdefault(module, named[0])
    return found


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requires(dist: str) -> list[str]:
    try:
        return _requirement_names(importlib.metadata.requires(dist))
    except Exception:
        return []


def _requirement_names(requires: list[str] | None) -> list[str]:
    """The distributions a requirement list names, less those only an extra asks for."""
    names = []
    for requirement in requires or []:
        if "extra ==" in requirement.replace("extra==", "extra =="):
            continue
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        if match:
            names.append(match.group(0))
    return names


def _stdlib(name: str) -> bool:
    return name in sys.stdlib_module_names


# ------------------------------------------------------------------------------------ the patch

@dataclass
class ChangedFile:
    path: str
    added: dict[int, str] = field(default_factory=dict)  # new-side line number -> text
    deleted: bool = False
    new_lines: dict[int, str] = field(default_factory=dict)  # every new-side line the patch shows


def _diff_path(text: str) -> str:
    text = text.split("\t")[0].strip()
    if text.startswith('"') and text.endswith('"'):
        text = text[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
        text = text.encode("latin-1", "replace").decode("utf-8", "replace")
    return text[2:] if text[:2] in {"a/", "b/"} else text


def patch_files(patch: str) -> list[ChangedFile]:
    """The files a unified diff changes, with the new-side numbers of its added lines."""
    files: list[ChangedFile] = []
    current: ChangedFile | None = None
    old_path, line_number = "", 0
    for raw in patch.splitlines():
        if raw.startswith("diff --git "):
            current = None
            continue
        if raw.startswith("--- "):
            old_path = _diff_path(raw[4:])
            continue
        if raw.startswith("+++ "):
            new = raw[4:].strip()
            current = ChangedFile(path=_diff_path(new) if new != "/dev/null" else old_path,
                                  deleted=new == "/dev/null")
            files.append(current)
            continue
        hunk = re.match(r"@@ -\d+(?:,\d+)? \+(\d+)", raw)
        if hunk:
            line_number = int(hunk.group(1)) - 1
            continue
        if current is None or raw.startswith("\\"):
            continue
        if raw.startswith("+"):
            line_number += 1
            current.added[line_number] = raw[1:]
            current.new_lines[line_number] = raw[1:]
        elif raw.startswith(" ") or raw == "":
            line_number += 1
            current.new_lines[line_number] = raw[1:]
    return files


# ------------------------------------------------------------------------------------- findings

@dataclass
class Finding:
    path: str
    line: int
    severity: str
    category: str
    message: str

    def as_dict(self) -> dict:
        return {"path": self.path, "line": self.line, "severity": self.severity,
                "category": self.category, "message": self.message}


JUDGE, PATCHES, HIDDEN, EXITS, CONTEXT = ("reaches the judge", "patches what it imports",
                                          "hides what it reaches", "exits or controls the process",
                                          "reads the measurement context")


@functools.lru_cache(maxsize=4096)
def resolved(qualname: str) -> tuple[str, bool]:
    """The module a dotted name really reaches, and whether the whole name is a module:
    `os.sys._getframe` -> (`sys._getframe`, False), `typing.sys` -> (`sys`, True). Standard modules
    are imported to find out (they are the interpreter's own); a third-party chain is read from a
    re-exported interpreter module's name (`lib._sys.modules` -> `sys.modules`)."""
    parts = qualname.split(".")
    top = parts[0]
    if top in sys.stdlib_module_names and top not in IMPORT_EFFECTS:
        try:
            current: object = importlib.import_module(top)
        except Exception:
            return qualname, False
        base, index = top, 1
        while index < len(parts) and isinstance(current, types.ModuleType):
            child = getattr(current, parts[index], None)
            if child is None:
                with contextlib.suppress(Exception):
                    child = importlib.import_module(f"{current.__name__}.{parts[index]}")
            if not isinstance(child, types.ModuleType):
                break
            current, base, index = child, child.__name__, index + 1
        return ".".join([base, *parts[index:]]), index == len(parts)
    for index in range(len(parts) - 1, 0, -1):
        if parts[index].lstrip("_") in REEXPORTED:
            return ".".join([parts[index].lstrip("_"), *parts[index + 1:]]), index == len(parts) - 1
    return qualname, False


def module_reach(qualname: str, harness: dict[str, str]) -> tuple[str, str, str] | None:
    """What a dotted name rooted at an imported module reaches: (severity, category, message)."""
    for module, owner in harness.items():  # the judge's own names, before any resolution
        if qualname == module or qualname.startswith(module + "."):
            return HIGH, JUDGE, f"reaches the test runner's internals ({qualname}, part of {owner})"
    real, _ = resolved(qualname)
    return _reach(real, harness, shown=qualname if real == qualname else f"{real}, as {qualname}")


def _reach(qualname: str, harness: dict[str, str], shown: str) -> tuple[str, str, str] | None:
    found = _reach_by_kind(qualname, harness)
    if found is None:
        parts = qualname.split(".")
        private = [part for part in parts[1:] if part.startswith("_") and not part.startswith("__")]
        if private:
            return HIGH, JUDGE, f"reaches private internals ({shown})"
        return None
    severity, category, message = found
    return severity, category, message.replace(f"({qualname}", f"({shown}", 1)


def _reach_by_kind(qualname: str, harness: dict[str, str]) -> tuple[str, str, str] | None:
    parts = qualname.split(".")
    top, attribute = parts[0], parts[1] if len(parts) > 1 else ""
    if any(qualname == quiet or qualname.startswith(quiet + ".") for quiet in QUIET_SUBMODULES):
        return None
    runner = harness.get(top) or next((owner for module, owner in harness.items()
                                       if qualname == module or qualname.startswith(module + ".")), None)
    if runner:
        return HIGH, JUDGE, f"reaches the test runner's internals ({qualname}, part of {runner})"
    if top == "sys":
        if not attribute or attribute in SYS_PLAIN:
            return None
        if attribute in SYS_EXIT:
            return HIGH, EXITS, f"{qualname} ends the judging process: skips checks or forces success"
        if attribute in SYS_CONTEXT:
            return HIGH, CONTEXT, f"reads the measurement context ({qualname})"
        return HIGH, JUDGE, f"reaches the interpreter ({qualname})"
    if top in OS_MODULES:
        if attribute in OS_CONTEXT:
            message = "reads the environment" if "env" in attribute else "reads the measurement context"
            return HIGH, CONTEXT, f"{message} ({qualname})"
        if attribute == "_exit":
            return HIGH, EXITS, f"{qualname} ends the judging process: skips checks or forces success"
        if attribute in OS_EXIT or attribute.startswith(OS_EXIT_PREFIXES):
            return HIGH, EXITS, f"controls the judging process ({qualname})"
        if attribute in OS_PROGRAMS:
            return HIGH, EXITS, f"starts other programs ({qualname})"
        return None
    if top in PROGRAM_MODULES:
        return HIGH, EXITS, f"starts other programs ({qualname})"
    if top in NETWORK_MODULES or ".".join(parts[:2]) in NETWORK_MODULES:
        return HIGH, JUDGE, f"reaches the network ({qualname})"
    for module, reach in INTERPRETER_MODULES.items():
        if qualname == module or qualname.startswith(module + "."):
            category = EXITS if module in {"atexit", "signal"} else CONTEXT if module in {
                "resource", "platform", "__main__", "sysconfig"} else JUDGE
            return HIGH, category, f"reaches {reach} ({qualname})"
    if top == "time" and attribute in TIME_CLOCKS:
        return HIGH, CONTEXT, f"reads a clock ({qualname}): code that times itself tells a trial from a gate"
    if top == "datetime" and parts[-1] in DATETIME_CLOCKS:
        return HIGH, CONTEXT, f"reads a clock ({qualname}): code that times itself tells a trial from a gate"
    if top == "threading" and attribute in THREADING_JUDGE:
        return HIGH, JUDGE, f"reaches the interpreter's threads ({qualname})"
    if top == "types" and attribute in TYPES_JUDGE:
        return HIGH, HIDDEN, f"builds or inspects the interpreter's objects ({qualname})"
    if top in {"pickle", "_pickle", "dill", "cloudpickle"} and (attribute.startswith("load") or
                                                               attribute == "Unpickler"):
        return HIGH, HIDDEN, f"loads objects from bytes ({qualname}): unpickling can call any function"
    if top.startswith("_") and (_stdlib(top) or top in _installed()):
        return HIGH, JUDGE, f"reaches private internals ({qualname})"
    return None


_INSTALLED: set[str] | None = None


def _installed() -> set[str]:
    global _INSTALLED
    if _INSTALLED is None:
        try:
            _INSTALLED = set(importlib.metadata.packages_distributions())
        except Exception:
            _INSTALLED = set()
    return _INSTALLED


def _folded(node: ast.AST) -> str | None:
    """The string an expression builds from literals only (`"g" + "c"`, `"".join(["g", "c"])`,
    f-strings, `%` and `.format` of literals), or None."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        left, right = _folded(node.left), _folded(node.right)
        if left is None:
            return None
        if isinstance(node.op, ast.Add):
            return None if right is None else left + right
        values = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
        parts = [_folded(value) for value in values]
        with contextlib.suppress(TypeError, ValueError):
            return None if None in parts else left % tuple(parts)
        return None
    if isinstance(node, ast.JoinedStr):
        pieces = [_folded(value.value) if isinstance(value, ast.FormattedValue) else _folded(value)
                  for value in node.values]
        return None if None in pieces else "".join(pieces)  # type: ignore[arg-type]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr in {"join", "format"} and not node.keywords:
        base = _folded(node.func.value)
        if base is None:
            return None
        listed = len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple))
        if node.func.attr == "join" and listed and isinstance(node.args[0], (ast.List, ast.Tuple)):
            items = [_folded(item) for item in node.args[0].elts]
            return None if None in items else base.join(items)  # type: ignore[arg-type]
        if node.func.attr == "format":
            arguments = [_folded(argument) for argument in node.args]
            with contextlib.suppress(IndexError, KeyError, ValueError):
                return None if None in arguments else base.format(*arguments)
    return None


class PythonReader:
    """Finds what one Python file's added code reaches."""

    def __init__(self, path: str, source: str | bytes, added: set[int], harness: dict[str, str],
                 local: set[str], protected_paths: tuple[str, ...] = ()):
        self.path, self.added, self.harness, self.local = path, added, harness, local
        self.protected_paths = tuple(path.strip("/") for path in protected_paths if path.strip("/"))
        # Bytes, as the interpreter reads them: a coding cookie decodes the file the same way here.
        self.tree = ast.parse(source, filename=path)
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.modules: set[str] = set()  # names bound by `import x`: always a module
        self.imported = self._imports()
        self.findings: dict[tuple[int, str], Finding] = {}

    # -- names
    def _imports(self) -> dict[str, str]:
        """Every name the file binds by import -> what it is (`g` -> `gc`, `pc` -> `time.perf_counter`)."""
        names: dict[str, str] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        names[alias.asname] = alias.name
                        self.modules.add(alias.asname)
                    else:
                        top = alias.name.split(".")[0]
                        names[top] = top
                        self.modules.add(top)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name != "*":
                        names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        return {name: target for name, target in names.items() if target.split(".")[0] not in self.local}

    def qualname(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.imported.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.qualname(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    # -- which nodes
    def examined(self) -> list[ast.AST]:
        """Nodes on added lines, and every node of the innermost function around an added line."""
        functions = [node for node in ast.walk(self.tree)
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
        changed_functions = []
        for line in self.added:
            around = [function for function in functions
                      if function.lineno <= line <= (function.end_lineno or function.lineno)]
            if around:
                changed_functions.append(max(around, key=lambda function: function.lineno))
        inside = {id(child) for function in changed_functions for child in ast.walk(function)}
        nodes = []
        for node in ast.walk(self.tree):
            if not hasattr(node, "lineno"):
                continue
            if id(node) in inside or any(line in self.added for line in self._span(node)):
                nodes.append(node)
        return nodes

    def _span(self, node: ast.AST) -> range:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For,
                             ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Module)):
            return self._header(node)
        return range(node.lineno, (getattr(node, "end_lineno", None) or node.lineno) + 1)  # type: ignore[attr-defined]

    def _header(self, node: ast.AST) -> range:
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])  # type: ignore[attr-defined]
        body = getattr(node, "body", None)
        end = body[0].lineno - 1 if isinstance(body, list) and body else node.lineno  # type: ignore[attr-defined]
        if isinstance(node, ast.Lambda):
            end = node.lineno
        return range(start, max(end, node.lineno) + 1)  # type: ignore[attr-defined]

    # -- findings
    def flag(self, node: ast.AST, severity: str, category: str, message: str) -> None:
        line = node.lineno  # type: ignore[attr-defined]
        if line not in self.added:
            message += " (an unchanged line of a function this patch changes)"
        key = (line, message)
        if key not in self.findings:
            self.findings[key] = Finding(self.path, line, severity, category, message)

    def reach(self, node: ast.AST, qualname: str) -> None:
        found = module_reach(qualname, self.harness)
        if found:
            self.flag(node, *found)

    def read(self) -> list[Finding]:
        for node in self.examined():
            self.visit(node)
        return sorted(self.findings.values(), key=lambda finding: (finding.line, finding.message))

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, (ast.BinOp, ast.JoinedStr, ast.Call)) and not isinstance(
                self.parents.get(node), (ast.BinOp, ast.JoinedStr)):
            folded = _folded(node)
            if folded is not None:
                self._text(node, folded)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in self.local:
                    self.reach(node, alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] in self.local:
                return
            for alias in node.names:
                self.reach(node, node.module if alias.name == "*" else f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Attribute):
            self._attribute(node)
        elif isinstance(node, ast.Name):
            self._name(node)
        elif isinstance(node, ast.Call):
            self._call(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._hook(node, node.name)
        elif isinstance(node, ast.keyword) and node.arg:
            self._hook(node, node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if not isinstance(self.parents.get(node), ast.Expr):  # a docstring runs nothing
                self._text(node, node.value)

        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
            self._subscript_write(node)

    def _text(self, node: ast.AST, text: str) -> None:
        """A string, or one built from literals ("pytest" + "_sessionfinish"): what it names."""
        self._hook(node, text)
        if CONTEXT_PATH.match(text):
            self.flag(node, HIGH, CONTEXT, f"reads the measurement context ({text!r})")
        plain = text.strip().removeprefix("./").rstrip("/")
        looked = [path for path in self.protected_paths if plain == path or plain.startswith(path + "/")]
        if looked:
            self.flag(node, HIGH, CONTEXT, f"names the judge's protected files ({looked[0]}): code that "
                                           "looks at them can tell a check from a trial")
        named = sorted(token for token in set(ATTRIBUTE_TOKEN.findall(text)) & OBJECT_MODEL if "_" in token)
        if named:
            self.flag(node, HIGH, HIDDEN, f"names the interpreter's object model in a string ({named[0]})")

    def _hook(self, node: ast.AST, name: str) -> None:
        if HOOK_NAME.match(name):
            self.flag(node, HIGH, JUDGE, f"defines or names a test-runner hook ({name}): code that can "
                                         "rewrite the verdict")

    def _attribute(self, node: ast.Attribute) -> None:
        if node.attr in OBJECT_MODEL:
            self.flag(node, HIGH, HIDDEN, f"reaches the interpreter's object model (.{node.attr})")
        self._hook(node, node.attr)
        parent = self.parents.get(node)
        qualname = self.qualname(node)
        # The whole chain is judged once, at its outermost attribute (`os.environ.get`).
        if qualname and not (isinstance(parent, ast.Attribute) and self.qualname(parent)):
            self.reach(node, qualname)
            if isinstance(node.ctx, ast.Load):
                self._module_value(node, qualname, module=False)
        if isinstance(node.ctx, (ast.Store, ast.Del)) and self.qualname(node.value):
            target = f"{self.qualname(node.value)}.{node.attr}"
            self.flag(node, HIGH, PATCHES, f"patches what it imports ({target} changes for every module of "
                                           "the judging process)")

    def _name(self, node: ast.Name) -> None:
        if node.id in {"__builtins__", "__loader__", "__spec__", "__import__"}:
            self.flag(node, HIGH, HIDDEN, f"reaches the interpreter's object model ({node.id})")
            return
        parent = self.parents.get(node)
        called = isinstance(parent, ast.Call) and parent.func is node
        if isinstance(node.ctx, ast.Load) and node.id in EXIT_EXCEPTIONS and not self._caught(node):
            self.flag(node, HIGH, EXITS, f"{node.id} ends the judging process: skips checks or forces "
                                         "success")
        if isinstance(node.ctx, ast.Load) and node.id in REACHING_BUILTINS and not called and \
                node.id not in self.imported:
            self.flag(node, HIGH, HIDDEN, f"passes the builtin {node.id} around (what it reaches cannot be "
                                          "read)")
        self._hook(node, node.id)
        if isinstance(node.ctx, ast.Store) and node.id in BUILTIN_NAMES and self._module_level(node):
            self.flag(node, MEDIUM, PATCHES, f"rebinds the builtin {node.id} for this module")
        if isinstance(node.ctx, ast.Load) and node.id in self.imported:
            self._module_value(node, self.imported[node.id], node.id in self.modules)

    def _module_value(self, node: ast.expr, qualname: str, module: bool) -> None:
        """A module used as a value (`s = os.sys`, `f(os)`): what it reaches next cannot be read."""
        parent = self.parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return
        real, is_module = resolved(qualname)
        if module or is_module:
            self.flag(node, HIGH, HIDDEN, f"passes the module {real} around (what it reaches cannot be read)")

    def _caught(self, node: ast.AST) -> bool:
        """`except SystemExit:` catches an exit, it does not cause one."""
        parent = self.parents.get(node)
        if isinstance(parent, ast.Tuple):
            parent = self.parents.get(parent)
        return isinstance(parent, ast.ExceptHandler)

    def _module_level(self, node: ast.AST) -> bool:
        parent = self.parents.get(node)
        while parent is not None:
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                return False
            parent = self.parents.get(parent)
        return True

    def _call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) and func.id not in self.imported else None
        if name in {"eval", "exec", "compile"}:
            self.flag(node, HIGH, HIDDEN, f"evaluates code from text ({name})")
        elif name in {"exit", "quit"}:
            self.flag(node, HIGH, EXITS, f"{name}() ends the judging process: skips checks or forces success")
        elif name == "breakpoint":
            self.flag(node, HIGH, JUDGE, "reaches a debugger (breakpoint)")
        elif name == "globals":
            self.flag(node, HIGH, HIDDEN, "reaches a namespace as a dict (globals())")
        elif name in {"vars", "locals"}:
            target = node.args[0] if node.args else None
            severity = HIGH if target is not None and self.qualname(target) else MEDIUM
            self.flag(node, severity, HIDDEN, f"reaches a namespace as a dict ({name}())")
        elif name in {"getattr", "setattr", "delattr", "hasattr"} and len(node.args) >= 2:
            self._by_name(node, name, node.args[0], node.args[1])
        elif name == "open" and node.args and not isinstance(node.args[0], ast.Constant):
            pass  # reading a data file by a computed path is ordinary; /proc literals are flagged
        qualname = self.qualname(func)
        if qualname in {"operator.attrgetter", "operator.methodcaller"}:
            for argument in node.args[:1]:
                if not isinstance(argument, ast.Constant):
                    self.flag(node, HIGH, HIDDEN, f"reaches an attribute by a computed name ({qualname})")
                elif isinstance(argument.value, str) and set(argument.value.split(".")) & OBJECT_MODEL:
                    self.flag(node, HIGH, HIDDEN,
                              f"reaches the interpreter's object model ({argument.value})")

    def _by_name(self, node: ast.Call, name: str, target: ast.expr, attribute: ast.expr) -> None:
        if not (isinstance(attribute, ast.Constant) and isinstance(attribute.value, str)):
            self.flag(node, HIGH, HIDDEN, f"reaches an attribute by a computed name ({name}): "
                                          "the reviewer cannot tell what it reaches")
            return
        if attribute.value in OBJECT_MODEL:
            self.flag(node, HIGH, HIDDEN, f"reaches the interpreter's object model ({attribute.value})")
        base = self.qualname(target)
        if base:
            self.reach(node, f"{base}.{attribute.value}")
            if name in {"setattr", "delattr"}:
                self.flag(node, HIGH, PATCHES,
                          f"patches what it imports ({name} on {base}.{attribute.value})")

    def _subscript_write(self, node: ast.Subscript) -> None:
        container = node.value
        if isinstance(container, ast.Call) and isinstance(container.func, ast.Name) and \
                container.func.id in {"globals", "vars", "locals"}:
            self.flag(node, HIGH, PATCHES, f"writes a namespace through {container.func.id}()")
        elif isinstance(container, ast.Attribute) and container.attr == "__dict__":
            self.flag(node, HIGH, PATCHES, "writes an object's namespace through __dict__")


# ------------------------------------------------------------------------------------- review

def expected_literals(protected: list[str]) -> set[str]:
    """Numbers of 4+ digits in protected result files: a patch that writes them is suspicious."""
    literals: set[str] = set()
    for name in protected:
        path = Path(name)
        if path.is_file() and path.suffix in {".json", ".txt", ".csv"} and path.stat().st_size < 100_000:
            literals.update(re.findall(r"\b\d{4,}\b", path.read_text(errors="replace")))
    return literals


def _is_python(path: str, first_line: str) -> bool:
    return path.endswith((".py", ".pyw")) or (first_line.startswith("#!") and "python" in first_line)


def _is_script(path: str, first_line: str) -> bool:
    return Path(path).suffix in SCRIPT_SUFFIXES or first_line.startswith("#!") or Path(path).name in {
        "Makefile", "makefile", "GNUmakefile"}


def _local_names(path: str) -> set[str]:
    """Modules the repository defines next to the file or at its root, which an import finds
    before the standard library's (never before a module built into the interpreter)."""
    names: set[str] = set()
    for folder in {Path("."), Path(path).parent}:
        try:
            for entry in folder.iterdir():
                if entry.suffix == ".py" or (entry.is_dir() and (entry / "__init__.py").exists()):
                    names.add(entry.stem)
        except OSError:
            continue
    return names - set(sys.builtin_module_names)


def protected_modules(protected: list[str]) -> dict[str, str]:
    """The judge's own Python under the protected paths (tests, score scripts), by every name an
    import could give it: `tests/test_work.py` is `test_work` and `tests.test_work`."""
    found: dict[str, str] = {}
    for name in protected:
        root = Path(name)
        files = [root] if root.is_file() else sorted(root.rglob("*.py")) if root.is_dir() else []
        for file in files[:2000]:
            if file.suffix != ".py":
                continue
            dotted = ".".join(file.with_suffix("").parts)
            for module in {file.stem, dotted, dotted.removesuffix(".__init__")}:
                if module != "__init__":
                    found[module] = f"the protected {file.as_posix()}"
    return found


def _source(changed: ChangedFile) -> bytes | None:
    """The file as patched: read from the tree, or (outside the sandbox) a new file from the patch."""
    path = Path(changed.path)
    if path.is_file():
        return path.read_bytes()
    lines = changed.new_lines
    if lines and sorted(lines) == list(range(1, len(lines) + 1)):
        return ("\n".join(lines[number] for number in sorted(lines)) + "\n").encode()
    return None


def _cookie(source: bytes) -> str | None:
    """A source encoding other than UTF-8 (`# coding: utf-7` hides code in what reads as a comment)."""
    for line in source.split(b"\n", 2)[:2]:
        match = re.match(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", line)
        if match:
            name = match.group(1).decode("ascii", "replace").lower().replace("_", "-")
            return None if name in {"utf-8", "utf8", "ascii", "us-ascii"} else name
    return None


def _read_python(changed: ChangedFile, source: bytes, harness: dict[str, str],
                 protected: dict[str, str], paths: tuple[str, ...]) -> list[Finding]:
    first = min(changed.added, default=1)
    cookie = _cookie(source)
    if cookie:
        return [Finding(changed.path, 1, HIGH, HIDDEN, f"declares the source encoding {cookie}: what runs is "
                                                       "not what a reader sees")]
    try:
        reader = PythonReader(changed.path, source, set(changed.added), {**harness, **protected},
                              _local_names(changed.path) - set(protected), paths)
        return reader.read()
    except (SyntaxError, ValueError) as error:
        line = getattr(error, "lineno", None) or first
        return [Finding(changed.path, line, HIGH, HIDDEN, "does not parse: the reviewer cannot read it")]
    except (RecursionError, MemoryError):  # nesting deeper than the parser or the reviewer reads
        return [Finding(changed.path, first, HIGH, HIDDEN, "nests too deep: the reviewer cannot read it")]


def review_file(changed: ChangedFile, harness: dict[str, str], literals: set[str],
                protected: dict[str, str] | None = None, paths: tuple[str, ...] = ()) -> list[Finding]:
    findings: list[Finding] = []
    source = None if changed.deleted else _source(changed)
    first_line = (source.split(b"\n", 1)[0].decode(errors="replace") if source is not None
                  else changed.new_lines.get(1, ""))
    if changed.deleted or not changed.added:
        pass
    elif _is_python(changed.path, first_line):
        if source is None:
            findings.append(Finding(changed.path, min(changed.added), HIGH, HIDDEN,
                                    "the reviewer cannot read the patched file"))
        else:
            findings.extend(_read_python(changed, source, harness, protected or {}, paths))
    else:
        if _is_script(changed.path, first_line):
            findings.append(Finding(changed.path, min(changed.added), HIGH, HIDDEN,
                                    "adds a script the reviewer cannot read: what it runs is unknown"))
        for number, text in sorted(changed.added.items()):
            for pattern, severity, message in TEXT_RULES:
                if pattern.search(text):
                    findings.append(Finding(changed.path, number, severity, "text", message))
        # A file Python could run (`python code/run` names no suffix) is read as Python as well.
        if source is not None and Path(changed.path).suffix not in DATA_SUFFIXES and not _cookie(source):
            judges = {**harness, **(protected or {})}
            with contextlib.suppress(SyntaxError, ValueError, RecursionError, MemoryError):
                reader = PythonReader(changed.path, source, set(changed.added), judges,
                                      _local_names(changed.path) - set(protected or {}), paths)
                findings.extend(reader.read())
    for number, text in sorted(changed.added.items()):
        copied = sorted(literal for literal in literals if re.search(rf"\b{literal}\b", text))
        if copied:
            findings.append(Finding(changed.path, number, HIGH, "copies expected results",
                                    f"hard-codes expected results ({', '.join(copied)})"))
    return findings


def review(patch: str, protected: list[str], commands: list[str] | None = None) -> dict:
    """The verdict on a patch, read against the patched tree in the working directory."""
    harness = harness_modules(tuple(commands or ()))
    literals = expected_literals(protected)
    judges = protected_modules(protected)
    findings = [finding for changed in patch_files(patch)
                for finding in review_file(changed, harness, literals, judges, tuple(protected))]
    findings.sort(key=lambda finding: {HIGH: 0, MEDIUM: 1, LOW: 2}.get(finding.severity, 3))
    verdict = "reject" if any(finding.severity == HIGH for finding in findings) else "approve"
    return {"verdict": verdict, "findings": [finding.as_dict() for finding in findings]}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--protected", default="", help="comma-separated protected and hidden paths")
    parser.add_argument("--commands", default="[]", help="the spec's commands, as a JSON list")
    args = parser.parse_args()
    patch = sys.stdin.buffer.read().decode(errors="replace")
    try:
        commands = [str(command) for command in json.loads(args.commands)]
    except (ValueError, TypeError):
        commands = []
    result = review(patch, [p for p in args.protected.split(",") if p], commands)
    for finding in result["findings"]:
        print(f"{finding['severity']}: {finding['path']}:{finding['line']}: {finding['message']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
