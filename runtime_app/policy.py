"""The change policy: which changes a candidate's patch may make, judged tree against tree.

`policy_check(store, baseline_tree, patched_tree, rules)` compares two git trees in a dulwich
object store and returns a `PolicyVerdict`: accepted, or every violation found, each with the
path and a reason a person can act on. It is pure: it only reads objects, never writes, never
runs a process, and never looks at a working directory.

Deny rules win over allow rules: a file under a write root is still refused when it is a test,
a protected path, a symlink, and so on. Paths are matched against deny rules after folding
letter case, accents, invisible characters and look-alike letters (Cyrillic `е` for `e`,
fullwidth `ｔ` for `t`), so `Tests/x.py` or `tеsts/x.py` counts as `tests/`; the allow rules
(`write_roots`, `exact_files`) match literally. A rename is judged as a delete of the old path
plus an add of the new one, so both paths must be allowed.
"""

from __future__ import annotations

import ast
import configparser
import fnmatch
import functools
import math
import posixpath
import re
import shlex
import tomllib
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dulwich.diff_tree import tree_changes
from dulwich.object_store import iter_tree_contents
from dulwich.objects import Blob, Commit, Tree, TreeEntry

REGULAR, EXECUTABLE, SYMLINK, GITLINK = 0o100644, 0o100755, 0o120000, 0o160000
BINARY_SNIFF_BYTES = 8000  # what git looks at to call a file binary
MIB = 1 << 20
# Per candidate, in all (spec keys worker.max_patch_bytes and worker.max_patch_files): each
# changed file is already held to max_file_bytes, so 10 MiB is ten such files rewritten whole,
# far above a real code change, and 1,000 files is a wide refactor but not a generated tree.
DEFAULT_MAX_PATCH_BYTES = 10 * MIB
DEFAULT_MAX_PATCH_FILES = 1000

# Test files and test configuration (matched on folded names, at any depth).
TEST_SEGMENTS = frozenset({"test", "tests"})
TEST_CONFIG_NAMES = frozenset({
    "conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini",
    "setup.cfg", ".coveragerc",
})
STARTUP_NAMES = frozenset({"sitecustomize.py", "usercustomize.py"})
CI_DIRS = frozenset({".github", ".gitlab", ".circleci", ".ci", ".buildkite"})
CI_FILES = frozenset({
    ".gitlab-ci.yml", "jenkinsfile", "azure-pipelines.yml", ".travis.yml", "noxfile.py",
    "bitbucket-pipelines.yml", ".drone.yml", "appveyor.yml", ".appveyor.yml",
})
# pyproject.toml keys whose change alters how tests run or are measured.
PYPROJECT_TEST_KEYS = (
    ("tool", "pytest"), ("tool", "coverage"), ("tool", "tox"), ("project", "entry-points", "pytest11"),
)

# Letters that look like Latin ones but are not folded by NFKC (fullwidth and mathematical
# forms are). Upper and lower case are mapped separately because they look different.
_LOOKALIKES = str.maketrans({
    # Cyrillic
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "ѕ": "s", "і": "i",
    "ј": "j", "һ": "h", "ԁ": "d", "ԛ": "q", "ԝ": "w", "ӏ": "l", "к": "k", "ү": "y",
    "А": "A", "В": "B", "Е": "E", "Ѕ": "S", "І": "I", "Ј": "J", "К": "K", "М": "M", "Н": "H",
    "О": "O", "Р": "P", "С": "C", "Т": "T", "Х": "X", "У": "Y", "Ү": "Y", "Ӏ": "l", "Ԁ": "D",
    # Greek
    "α": "a", "γ": "y", "η": "n", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "υ": "u",
    "χ": "x", "ω": "w",
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N",
    "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
    # Armenian and Latin extras
    "օ": "o", "ս": "u", "ı": "i", "ȷ": "j", "ɡ": "g", "ɑ": "a",
})
# Packaging metadata, matched on folded names at any depth: what the interpreter reads from a
# directory on sys.path besides modules. importlib.metadata's MetadataPathFinder (`Lookup` in
# importlib/metadata/__init__.py) takes every child ending `.dist-info` or `.egg-info`, and
# `EGG-INFO` inside a `.egg`, as an installed distribution, whose `entry_points.txt` is where
# pytest finds `pytest11` plugins to load (PluginManager.load_setuptools_entrypoints); site.py's
# addsitedir runs `*.pth` lines; setuptools' develop installs are `*.egg-link`; and the import
# system loads `__pycache__/*.pyc` (unchecked-hash pycs without looking at the source) or a
# sourceless `x.pyc` instead of `x.py`.
METADATA_DIR_SUFFIXES = (".dist-info", ".egg-info", ".egg")
METADATA_FILE_SUFFIXES = (".egg-link", ".pth", ".pyc", ".pyo")
METADATA_NAMES = frozenset({"entry_points.txt", "egg-info", "__pycache__"})
# Test-runner state read at start-up: pytest's cache provider decides from it which tests
# `--lf`, `--ff`, `--nf` and `--sw` run (_pytest/cacheprovider.py).
RUNNER_STATE_DIRS = frozenset({".pytest_cache"})
# How a file in a directory on sys.path is imported by name: `name.py`, a sourceless
# `name.pyc`, an extension module `name.<abi tag>.so` / `name.pyd` (importlib.machinery's
# SOURCE_SUFFIXES, BYTECODE_SUFFIXES and EXTENSION_SUFFIXES, on any platform).
MODULE_SUFFIXES = (".py", ".pyw", ".pyc", ".pyo", ".so", ".pyd")
PACKAGE_INITS = tuple(f"__init__{suffix}" for suffix in MODULE_SUFFIXES)
PYTEST_DEFAULT_FILES = ("test_*.py", "*_test.py")
UNITTEST_DEFAULT_FILES = ("test*.py",)
PYTEST_CONFIGS = (("pytest.ini", "pytest"), (".pytest.ini", "pytest"), ("tox.ini", "pytest"),
                  ("setup.cfg", "tool:pytest"))
_PUNCTUATION = frozenset("();<>|&")
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
_WRAPPERS = frozenset({"env", "exec", "command", "builtin", "time", "nice", "nohup", "sudo", "xargs"})
_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
_DRIVE = re.compile(r"^[A-Za-z]:")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class ImportNames:
    """The names the interpreters that run the commands import from outside the tree (probed
    by runtime_app.interpreters): no file on a directory of their sys.path may stand in for one.
    `regular` are names a module or a package with an `__init__` provides (a namespace package
    of the same name found earlier on sys.path loses to them); `namespaces` are names only
    namespace packages provide, and their children as dotted names (`google.protobuf`).
    `error` says why the interpreters could not be asked: then every file that could be
    imported by name from such a directory is refused with it."""

    stdlib: frozenset[str] = frozenset()
    installed: frozenset[str] = frozenset()
    regular: frozenset[str] = frozenset()
    namespaces: frozenset[str] = frozenset()
    interpreters: tuple[str, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class PolicyRules:
    """What a patch may change. Paths are repo-relative with `/` separators.

    `commands` are the commands that judge a tree (gates and score): which directories they
    put on sys.path and which modules they load as test-runner plugins is read from them and
    from the baseline's test configuration. `import_names` are the names no file there may
    stand in for (None: that rule is off, as for callers that judge no commands)."""

    write_roots: tuple[str, ...] = ()
    exact_files: tuple[str, ...] = ()
    protected_paths: tuple[str, ...] = ()
    score_script: str | None = None
    forbid_test_changes: bool = True
    max_file_bytes: int = 1_000_000
    max_patch_bytes: int = DEFAULT_MAX_PATCH_BYTES
    max_patch_files: int = DEFAULT_MAX_PATCH_FILES
    commands: tuple[str, ...] = ()
    import_dirs: tuple[str, ...] = ()
    import_names: ImportNames | None = field(default=None, compare=True)

    @property
    def limits(self) -> PatchLimits:
        return PatchLimits(self.max_patch_bytes, self.max_patch_files)


@dataclass(frozen=True)
class PatchLimits:
    """How much one candidate's patch may change in all: `max_bytes` of content (every file it
    adds or modifies at its new size, every file it deletes at its old size) and of diff text,
    and `max_files` paths (a rename is two). Judged on file sizes before any diff is built,
    then confirmed on the diff."""

    max_bytes: int = DEFAULT_MAX_PATCH_BYTES
    max_files: int = DEFAULT_MAX_PATCH_FILES

    def files_refusal(self, files: int) -> str | None:
        if files <= self.max_files:
            return None
        return (f"the patch changes {files:,} files, over worker.max_patch_files = {self.max_files:,}; "
                "keep generated or vendored files out of the change, or raise worker.max_patch_files "
                "in the spec")

    def bytes_refusal(self, changed_bytes: int, files: int) -> str | None:
        if changed_bytes <= self.max_bytes:
            return None
        return (f"the patch changes {size_text(changed_bytes)} in {files:,} file{'s' if files != 1 else ''}, "
                f"over worker.max_patch_bytes = {size_text(self.max_bytes)}; keep large or generated "
                "files out of the change, or raise worker.max_patch_bytes in the spec")

    def text_refusal(self, text_bytes: int) -> str | None:
        if text_bytes <= self.max_bytes:
            return None
        return (f"the patch is {size_text(text_bytes)} of diff text, over worker.max_patch_bytes = "
                f"{size_text(self.max_bytes)}; make a smaller change, or raise worker.max_patch_bytes "
                "in the spec")


def size_text(count: int) -> str:
    """A byte count for people: `812 bytes`, `3.5 KiB`, `64.0 MiB`."""
    if count >= MIB:
        return f"{count / MIB:.1f} MiB"
    if count >= 1024:
        return f"{count / 1024:.1f} KiB"
    return f"{count:,} byte{'s' if count != 1 else ''}"


@dataclass(frozen=True, order=True)
class Violation:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass(frozen=True)
class PolicyVerdict:
    violations: tuple[Violation, ...] = ()

    @property
    def accepted(self) -> bool:
        return not self.violations

    def __str__(self) -> str:
        if self.accepted:
            return "accepted"
        return "refused:\n" + "\n".join(f"- {violation}" for violation in self.violations)


def command_script(command: str) -> str | None:
    """The repo file a command runs, when its first word is a repo path (`./scripts/x.sh` →
    `scripts/x.sh`); None for commands found on PATH (`make bench`, `python -m timeit`)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    while words and _ENV_ASSIGNMENT.match(words[0]):
        words.pop(0)
    if not words or "/" not in words[0] or words[0].startswith(("/", "~", "$")):
        return None
    parts = _rule_parts(words[0])
    return None if not parts or ".." in parts else "/".join(parts)


def simple_commands(command: str) -> list[list[str]]:
    """A shell line as its simple commands, each a list of words (`cd code && python x.py` →
    `[["cd", "code"], ["python", "x.py"]]`); redirections and their targets are left out."""
    lexer = shlex.shlex(command.replace("\n", " ; "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        tokens = command.split()
    found: list[list[str]] = [[]]
    skip = False
    for token in tokens:
        if skip:
            skip = False
        elif token and set(token) <= _PUNCTUATION:
            if "<" in token or ">" in token:
                skip = not token.endswith("&")  # `2>&1` has its target in the token
                if found[-1] and found[-1][-1].isdigit():
                    found[-1].pop()  # the `2` of `2>`
            elif found[-1]:
                found.append([])
        else:
            found[-1].append(token)
    return [words for words in found if words]


def _command_parts(words: list[str]) -> tuple[dict[str, str], str, list[str]]:
    """(environment assignments, program, arguments) of a simple command, seen through `env`,
    `exec`, `time` and the like."""
    assignments: dict[str, str] = {}
    rest = list(words)
    while rest:
        if _ENV_ASSIGNMENT.match(rest[0]):
            name, _, value = rest.pop(0).partition("=")
            assignments[name] = value
        elif posixpath.basename(rest[0]) in _WRAPPERS:
            rest.pop(0)
            while rest and rest[0].startswith("-"):
                rest.pop(0)
        elif rest[0] == "timeout" and len(rest) > 1:
            del rest[:2]
        else:
            break
    return assignments, (rest[0] if rest else ""), rest[1:]


def command_programs(commands: Iterable[str]) -> list[str]:
    """The program each simple command of `commands` starts (`PYTHONPATH=x python3 -m y` →
    `python3`), in order, each once."""
    programs = []
    for command in commands:
        for words in simple_commands(command):
            _, program, _ = _command_parts(words)
            if program:
                programs.append(program)
    return list(dict.fromkeys(programs))


@dataclass
class CommandFacts:
    """What the commands (and the baseline's test configuration) say about imports: the
    directories they put on sys.path (each with why), the modules they load as test-runner
    plugins, the file patterns their runners collect as tests, and where they run."""

    import_dirs: dict[str, str] = field(default_factory=dict)
    plugins: dict[str, str] = field(default_factory=dict)
    test_patterns: dict[str, str] = field(default_factory=dict)
    working_dirs: set[str] = field(default_factory=set)
    scripts: set[str] = field(default_factory=set)  # repo programs the commands run

    def merge(self, other: CommandFacts) -> None:
        for folder, why in other.import_dirs.items():
            self.dir_add(folder, why)
        for name, why in other.plugins.items():
            self.plugins.setdefault(name, why)
        for pattern, why in other.test_patterns.items():
            self.test_patterns.setdefault(pattern, why)
        self.working_dirs |= other.working_dirs

    def dir_add(self, folder: str | None, why: str) -> None:
        if folder is not None:
            self.import_dirs.setdefault(folder, why)

    def plugin_add(self, name: str, why: str) -> None:
        name = name.strip()
        if name and not name.startswith("no:"):
            self.plugins.setdefault(name, why)


def _repo_dir(cwd: str, path: str) -> str | None:
    """A command's relative path as a repo directory (`""` is the root); None when it leaves
    the repository or cannot be known (`$VAR`, `~`, absolute)."""
    if not path or path.startswith(("/", "~", "$")) or "$" in path or "`" in path:
        return None
    joined = posixpath.normpath(posixpath.join(cwd or ".", path))
    if joined == "..." or joined.startswith("../") or joined == "..":
        return None
    return "" if joined == "." else joined


def _runner_options(facts: CommandFacts, words: list[str], cwd: str, shown: str, unittest: bool) -> None:
    """pytest's `-p NAME`, `-o key=value`, `--rootdir`, and unittest's `-s`, `-t`, `-p PATTERN`."""
    index = 0
    while index < len(words):
        word = words[index]
        value = words[index + 1] if index + 1 < len(words) else ""
        name, equals, attached = word.partition("=")
        if word.startswith("-p") and not word.startswith("--"):
            value = word[2:] or value
            if unittest:
                facts.test_patterns.setdefault(value, f"the test file pattern of `{shown}`")
            else:
                facts.plugin_add(value, f"loaded as a pytest plugin by `-p {value}` in `{shown}`")
        elif word in ("-o", "--override-ini") or (name == "--override-ini" and equals):
            key, _, setting = (attached if equals else value).partition("=")
            _ini_setting(facts, key.strip(), setting, cwd, f"`-o {key.strip()}` in `{shown}`")
        elif name == "--rootdir" or (unittest and name in ("-s", "--start-directory", "-t",
                                                            "--top-level-directory")):
            target = attached if equals else value
            facts.dir_add(_repo_dir(cwd, target), f"`{target}` ({name} in `{shown}`)")
        index += 1


def _ini_setting(facts: CommandFacts, key: str, value: str, cwd: str, where: str) -> None:
    """One pytest setting that decides imports: `pythonpath`, `python_files`, `addopts`."""
    if key == "pythonpath":
        for item in value.split():
            facts.dir_add(_repo_dir(cwd, item), f"`{item}` (pytest's pythonpath in {where})")
    elif key == "python_files":
        for pattern in value.split():
            facts.test_patterns.setdefault(pattern, f"pytest's python_files in {where}")
    elif key == "addopts":
        try:
            words = shlex.split(value)
        except ValueError:
            words = value.split()
        _runner_options(facts, words, cwd, f"addopts in {where}", unittest=False)


def command_facts(commands: Iterable[str]) -> CommandFacts:
    """What the commands alone say (see CommandFacts); the baseline's configuration is added by
    the policy check, which can read it."""
    facts = CommandFacts()
    facts.dir_add("", "the repository root (every command's working directory)")
    for command in commands:
        cwd = ""
        facts.working_dirs.add(cwd)
        for words in simple_commands(command):
            assignments, program, args = _command_parts(words)
            if program == "cd":
                target = next((arg for arg in args if not arg.startswith("-")), "")
                moved = _repo_dir(cwd, target) if target else ""
                if moved is not None:
                    cwd = moved
                    facts.working_dirs.add(cwd)
                    facts.dir_add(cwd, f"`{cwd or '.'}` (a command runs there: `cd {target}`)")
                continue
            if program == "export":
                assignments.update(arg.partition("=")[::2] for arg in args if _ENV_ASSIGNMENT.match(arg))
            for item in assignments.get("PYTHONPATH", "").split(":"):
                facts.dir_add(_repo_dir(cwd, item), f"`{item}` (PYTHONPATH in `{command}`)")
            for item in re.split(r"[,\s]+", assignments.get("PYTEST_PLUGINS", "")):
                facts.plugin_add(item, f"loaded as a pytest plugin by PYTEST_PLUGINS in `{command}`")
            if assignments.get("PYTEST_ADDOPTS"):
                _ini_setting(facts, "addopts", assignments["PYTEST_ADDOPTS"], cwd,
                             f"PYTEST_ADDOPTS in `{command}`")
            run = args[0] if posixpath.basename(program) in _SHELLS and args else program
            if "/" in run or run.endswith(".sh"):
                script = _repo_dir(cwd, run)
                if script:
                    facts.scripts.add(script)
            for position, word in enumerate([program, *args]):
                if word.endswith((".py", ".pyw")) or ("/" in word and position == 0):
                    script = _repo_dir(cwd, word)
                    if script is not None:
                        folder = posixpath.dirname(script)
                        facts.dir_add(folder, f"`{folder or '.'}` (the directory of `{script}`, which a "
                                              "command runs)")
            runner = " ".join(words)
            unittest = "unittest" in words or "unittest" in program
            if unittest:
                for pattern in UNITTEST_DEFAULT_FILES:
                    facts.test_patterns.setdefault(pattern,
                                                   f"unittest's default test file pattern (`{runner}`)")
            if unittest or "pytest" in runner or "py.test" in runner:
                _runner_options(facts, args, cwd, runner, unittest)
    return facts


def policy_check(store: Any, baseline_tree: bytes | str | None, patched_tree: bytes | str,
                 rules: PolicyRules) -> PolicyVerdict:
    """Every rule the change from `baseline_tree` to `patched_tree` breaks (none: accepted).

    `store` is a dulwich object store or a Repo; the tree ids may also be commit ids.
    """
    store = getattr(store, "object_store", store)
    old_id = None if baseline_tree is None else _tree_id(store, baseline_tree)
    new_id = _tree_id(store, patched_tree)
    checker = _Checker(store, old_id, new_id, rules)
    if rules.commands or rules.import_names is not None:
        checker.facts = _facts(store, old_id, rules)
    for change in tree_changes(store, old_id, new_id, want_unchanged=False):
        checker.change(_present(change.old), _present(change.new))
    return PolicyVerdict(tuple(sorted(checker.found)))


# --- the checker ----------------------------------------------------------------------------


class _Checker:
    def __init__(self, store: Any, baseline_id: bytes | None, patched_id: bytes, rules: PolicyRules) -> None:
        self.store, self.baseline_id, self.patched_id, self.rules = store, baseline_id, patched_id, rules
        self.found: set[Violation] = set()
        self.roots = [_rule_parts(root) for root in rules.write_roots]
        self.files = [_rule_parts(name) for name in rules.exact_files]
        self.protected = [(name, _rule_parts(name)) for name in rules.protected_paths]
        self.script = _rule_parts(rules.score_script) if rules.score_script else None
        self.listings: dict[tuple[bytes | None, bytes], dict[str, set[bytes]]] = {}
        self.facts: CommandFacts | None = None

    def add(self, path: str, reason: str) -> None:
        self.found.add(Violation(path, reason))

    def change(self, old: TreeEntry | None, new: TreeEntry | None) -> None:
        entry = new or old
        assert entry is not None
        raw = entry.path
        text = raw.decode("utf-8", errors="replace")
        shown = _shown(raw)
        literal = [unicodedata.normalize("NFC", part) for part in text.split("/")]
        folded = [_lookalike(part) for part in literal]
        for reason in _path_tricks(raw, text):
            self.add(shown, reason)
        self._names(shown, literal, folded)
        self._allowed(shown, literal)
        # A `.pth` is already refused as a start-up file while tests are protected.
        startup = self.rules.forbid_test_changes and folded[-1].endswith(".pth")
        plain_metadata = _metadata_kinds([part.lower() for part in literal])
        for reason in [] if startup else _metadata_kinds(folded):
            self.add(shown, reason + _hint(literal, folded, plain_metadata, reason))
        if new is not None:
            self._entry(shown, old, new)
        if new is not None and self.facts is not None:
            self._imports(shown, literal, folded)
        if new is not None and old is None:
            self._collision(shown, raw)
        if self.rules.forbid_test_changes and folded[-1] == "pyproject.toml":
            self._pyproject(shown, old, new)

    def _names(self, shown: str, literal: list[str], folded: list[str]) -> None:
        # A rule matched only through look-alikes gets a note saying how the path reads; one
        # matched through letter case alone does not (`Tests/` plainly reads as `tests/`).
        plain = [part.lower() for part in literal]
        note = _note(literal, folded)
        if any(part.startswith(".git") or part == "git~1" for part in folded):
            hint = "" if any(part.startswith(".git") for part in plain) else note
            self.add(shown, "git metadata and settings (`.git/`, `.gitattributes`, `.gitmodules`, "
                            f"`.gitignore` …) cannot be changed by a patch{hint}")
        for name, parts in self.protected:
            if folded[: len(parts)] == [_lookalike(part) for part in parts]:
                hint = "" if [part.lower() for part in parts] == plain[: len(parts)] else note
                self.add(shown, f"`{name}` is a protected path (hard_gates.protected_paths) and "
                                f"cannot be changed{hint}")
                break
        if self.script is not None and folded == [_lookalike(part) for part in self.script]:
            hint = "" if plain == [part.lower() for part in self.script] else note
            self.add(shown, f"`{self.rules.score_script}` is the score script the evaluator runs and "
                            f"cannot be changed{hint}")
        if self.rules.forbid_test_changes:
            plain_kinds = set(_test_kinds(plain))
            for kind in _test_kinds(folded):
                self.add(shown, kind + ("" if kind in plain_kinds else note))

    def _allowed(self, shown: str, literal: list[str]) -> None:
        if any(literal[: len(root)] == root for root in self.roots):
            return
        if any(literal == name for name in self.files):
            return
        if not self.roots and not self.files:
            self.add(shown, "writers may change no paths here (write_roots and exact_files are both "
                            "empty); add a write root to the spec")
            return
        allowed = ", ".join([*self.rules.write_roots, *self.rules.exact_files])
        self.add(shown, f"outside the paths writers may change ({allowed}); keep the change under "
                        "a write root or in an exact file")

    def _entry(self, shown: str, old: TreeEntry | None, new: TreeEntry) -> None:
        if new.mode == SYMLINK:
            self.add(shown, "symlinks cannot be added or changed; commit the content as a regular file")
            return
        if new.mode == GITLINK:
            self.add(shown, "submodules cannot be added or changed; commit the code as regular files")
            return
        if new.mode not in (REGULAR, EXECUTABLE):
            self.add(shown, f"unusual file mode {new.mode:o}; only regular files (100644 or 100755) "
                            "can be added")
            return
        if old is not None and old.mode != new.mode:
            self.add(shown, f"file mode changed from {old.mode:o} to {new.mode:o}; keep the baseline's "
                            "mode")
        data = self._text(new)
        if len(data) > self.rules.max_file_bytes:
            self.add(shown, f"{len(data):,} bytes, over the {self.rules.max_file_bytes:,}-byte limit for "
                            "a changed file; keep large or generated data out of the patch")
        if b"\0" in data[:BINARY_SNIFF_BYTES]:
            self.add(shown, f"a binary file (a NUL byte in its first {BINARY_SNIFF_BYTES:,} bytes); "
                            "only text files can be changed")

    def _pyproject(self, shown: str, old: TreeEntry | None, new: TreeEntry | None) -> None:
        new_sections = _test_sections(self._text(new))
        if new_sections is None:
            self.add(shown, "not valid TOML after the patch, so its test sections cannot be checked; "
                            "fix the file (forbid_test_changes)")
            return
        old_sections = _test_sections(self._text(old)) or {}  # a broken baseline counts as none
        if new_sections != old_sections:
            keys = ", ".join(f"[{'.'.join(k)}]" for k in PYPROJECT_TEST_KEYS)
            self.add(shown, f"changes test sections of pyproject.toml ({keys}); leave them as in the "
                            "baseline (forbid_test_changes)")

    def _text(self, entry: TreeEntry | None) -> bytes:
        if entry is None or entry.mode not in (REGULAR, EXECUTABLE):
            return b""
        blob = self.store[entry.sha]
        return blob.as_raw_string() if isinstance(blob, Blob) else b""

    def _collision(self, shown: str, raw: bytes) -> None:
        """An added path whose name, or a directory it adds, differs from a sibling only in letter
        case or Unicode form: one file on macOS and Windows, two in git. Directories that were
        already in the baseline are not the patch's doing and are not counted."""
        parts = raw.split(b"/")
        for depth, part in enumerate(parts):
            directory = b"/".join(parts[:depth])
            existed = self._listing(self.baseline_id, directory).get(_fold(part), set())
            if depth < len(parts) - 1 and part in existed:
                continue
            others = sorted(self._listing(self.patched_id, directory).get(_fold(part), set()) - {part})
            if others:
                clash = b"/".join([*parts[:depth], others[0]])
                self.add(shown, f"collides with `{_shown(clash)}` on case-insensitive file systems "
                                "(the names differ only in letter case or Unicode form); rename it")
                return

    def _listing(self, root: bytes | None, directory: bytes) -> dict[str, set[bytes]]:
        """The names in a directory of a tree, grouped by how a case-insensitive file system sees
        them; empty when the directory is not there."""
        key = (root, directory)
        if key not in self.listings:
            tree: Any = self.store[root] if root is not None else None
            for part in directory.split(b"/") if directory else []:
                if tree is None:
                    break
                try:
                    _, sha = tree[part]
                except KeyError:
                    tree = None
                    break
                tree = self.store[sha]
                if not isinstance(tree, Tree):
                    tree = None
            groups: dict[str, set[bytes]] = {}
            if tree is not None:
                for item in tree.iteritems():
                    groups.setdefault(_fold(item.path), set()).add(item.path)
            self.listings[key] = groups
        return self.listings[key]

    # --- what the commands import ---------------------------------------------------------

    def _imports(self, shown: str, literal: list[str], folded: list[str]) -> None:
        """A file on a directory the commands put on sys.path that stands in for a module they
        import by name: a standard or installed one, or a test-runner plugin."""
        assert self.facts is not None
        for folder, why in self.facts.import_dirs.items():
            parts = [_lookalike(part) for part in folder.split("/")] if folder else []
            if len(folded) <= len(parts) or folded[: len(parts)] != parts:
                continue
            if self.rules.import_names is not None:
                self._shadow(shown, literal, folded, len(parts), why)
            if self.rules.forbid_test_changes:
                self._plugin(shown, folded[len(parts):])
        if self.rules.forbid_test_changes:
            for pattern, why in self.facts.test_patterns.items():
                if fnmatch.fnmatchcase(folded[-1], _lookalike(pattern)):
                    self.add(shown, f"collected as a test file ({why}: `{pattern}`); test files cannot be "
                                    "changed (forbid_test_changes)")

    def _shadow(self, shown: str, literal: list[str], folded: list[str], start: int, why: str) -> None:
        names = self.rules.import_names
        assert names is not None
        known = _names_folded(names)
        prefix = ""
        for depth in range(start, len(folded)):
            is_file = depth == len(folded) - 1
            name = _module_name(folded[depth]) if is_file else folded[depth]
            if name is None or name == "__init__":
                return
            here = literal[: depth + 1]
            if is_file:
                regular, existed = True, self._has(self.baseline_id, here)
            else:
                regular = any(self._has(self.patched_id, [*here, init]) for init in PACKAGE_INITS)
                existed = any(self._has(self.baseline_id, [*here, init]) for init in PACKAGE_INITS)
            if names.error:
                new_name = regular or not self._has(self.baseline_id, here, tree=True)
                if depth == start and new_name and not existed and name.isidentifier():
                    self.add(shown, f"could be imported by name by the commands (it is in {why}, which is on "
                                    "sys.path), and "
                                    f"{names.error}; nothing can be checked for shadowing until they can, so "
                                    "fix the interpreters or the sandbox and run the evaluation again")
                return
            dotted = prefix + name
            if dotted not in known.every:
                return
            if not regular:
                if dotted in known.namespaces:  # its portions merge: look at what this one adds
                    prefix = dotted + "."
                    continue
                if dotted in known.regular or self._has(self.baseline_id, here, tree=True):
                    return  # a regular module later on sys.path wins over a namespace portion
            elif existed:
                return  # the baseline's own module, the code under test
            origin = known.every[dotted]
            kind = ("the standard library's" if origin.split(".")[0] in names.stdlib
                    else "the installed module")
            made = "/".join(literal[: depth + 1]) + ("" if is_file else "/")
            asked = ", ".join(names.interpreters) or "the interpreters that run them"
            self.add(shown, f"would be imported instead of {kind} `{origin}` by the commands: `{made}` is in "
                            f"{why}, which is on sys.path (names from {asked}); rename it")
            return

    def _plugin(self, shown: str, relative: list[str]) -> None:
        assert self.facts is not None
        folders = relative[:-1]
        module = _module_name(relative[-1])
        chain = folders if module == "__init__" else [*folders, module] if module else None
        for plugin, why in self.facts.plugins.items():
            parts = [_lookalike(part) for part in plugin.split(".")]
            if folders[: len(parts)] == parts or (chain and parts[: len(chain)] == chain):
                self.add(shown, f"part of `{plugin}`, {why}: test-runner plugins cannot be changed "
                                "(forbid_test_changes)")

    def _tree(self, sha: bytes) -> Any:
        """A tree object read once per check: a 5,000-file folder is parsed once, not per lookup."""
        trees = self.__dict__.setdefault("_trees", {})
        if sha not in trees:
            trees[sha] = self.store[sha]
        return trees[sha]

    def _has(self, root: bytes | None, parts: list[str], *, tree: bool = False) -> bool:
        """Whether `root` has a file (or, with `tree`, a directory) at the literal path `parts`."""
        if root is None:
            return False
        node: Any = self._tree(root)
        for index, part in enumerate(parts):
            try:
                mode, sha = node[part.encode()]
            except KeyError:
                return False
            if index < len(parts) - 1:
                if mode != 0o040000:
                    return False
                node = self._tree(sha)
            else:
                return (mode == 0o040000) == tree
        return False


def read_only_paths(paths: Iterable[str], rules: PolicyRules, extra: Iterable[str] = ()) -> list[str]:
    """The paths of a tree that no command may change while it runs (bound read-only in the
    sandbox): protected paths, the score script, `extra` (hidden evaluator files) and, with
    `forbid_test_changes`, tests, test configuration, start-up files and CI files. As few as
    cover them: a `tests/` directory once, not each file in it."""
    present = list(paths)
    found = {path.strip("/") for path in [*extra, *rules.protected_paths] if path.strip("/")}
    if rules.score_script:
        found.add(rules.score_script)
    if rules.forbid_test_changes:
        for path in present:
            parts = path.split("/")
            lowered = [part.lower() for part in parts]
            folder = next((depth for depth, part in enumerate(lowered[:-1])
                           if part in TEST_SEGMENTS or part in CI_DIRS), None)
            if folder is not None:
                found.add("/".join(parts[: folder + 1]))
            elif _test_kinds(lowered) or lowered[-1] == "pyproject.toml":
                found.add(path)
    existing = set(present) | {"/".join(path.split("/")[:depth]) for path in present
                               for depth in range(1, path.count("/") + 1)}
    kept = sorted(path for path in found if path in existing)
    return [path for path in kept if not any(path.startswith(other + "/") for other in kept)]


# --- names ----------------------------------------------------------------------------------


def _test_kinds(parts: list[str]) -> list[str]:
    """The test rules a path breaks, judged on its segments as given (literal or folded)."""
    kinds = []
    name = parts[-1]
    stem, _, suffix = name.rpartition(".")
    test_module = suffix == "py" and (
        stem in TEST_SEGMENTS or stem.startswith("test_") or stem.endswith("_test"))
    if test_module or any(part in TEST_SEGMENTS for part in parts):
        kinds.append("test files cannot be changed (forbid_test_changes); leave the tests as they are and "
                     "change the code under test")
    if name in TEST_CONFIG_NAMES:
        kinds.append(f"`{name}` is test configuration and cannot be changed (forbid_test_changes)")
    if name in STARTUP_NAMES or (suffix == "pth" and stem):
        kinds.append(f"`{name}` runs inside every Python process, tests included, and cannot be changed "
                     "(forbid_test_changes)")
    state = next((part for part in parts[:-1] if part in RUNNER_STATE_DIRS), None)
    if state:
        kinds.append(f"pytest's cache (`{state}/`) decides which tests run (`--lf`, `--ff`, `--sw`) and "
                     "cannot be changed (forbid_test_changes)")
    ci = next((f"{part}/" for part in parts[:-1] if part in CI_DIRS), None)
    ci = ci or (name if name in CI_FILES else None)
    if ci:
        kinds.append(f"CI configuration (`{ci}`) cannot be changed (forbid_test_changes)")
    return kinds


def _path_tricks(raw: bytes, text: str) -> list[str]:
    reasons = []
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        reasons.append("the path is not valid UTF-8; use a UTF-8 file name")
    if text.startswith("/") or _DRIVE.match(text):
        reasons.append("an absolute path; a patch may only name paths inside the repository")
    if "\\" in text:
        reasons.append("the path has a backslash, which Windows reads as a directory separator; use `/` "
                       "only and no backslash in names")
    parts = text.split("/")[1:] if text.startswith("/") else text.split("/")
    if any(part in ("", ".", "..") for part in parts):
        reasons.append("the path has a `..`, `.` or empty segment that can step outside its directory; "
                       "name the file by its plain repo path")
    hidden = sorted({f"U+{ord(c):04X}" for c in text if unicodedata.category(c) in _INVISIBLE})
    if hidden:
        reasons.append(f"the path has control or invisible characters ({', '.join(hidden)}); rename it "
                       "with visible characters only")
    return reasons


def _lookalike(part: str) -> str:
    """A path segment as a reader sees it: compatibility forms folded (fullwidth, ligatures),
    accents and invisible characters dropped, look-alike letters mapped to Latin, case folded,
    and the trailing dots and spaces Windows ignores removed. `git~1` is `.git`'s short name."""
    text = unicodedata.normalize("NFKD", part)
    text = "".join(c for c in text if unicodedata.category(c) not in ("Mn", "Me", "Cf"))
    text = unicodedata.normalize("NFKC", text.translate(_LOOKALIKES).casefold())
    text = text.translate(_LOOKALIKES)
    return text.rstrip(" .") or text


def _fold(part: bytes) -> str:
    """What a case-insensitive, normalization-insensitive file system (macOS, Windows) sees."""
    text = part.decode("utf-8", errors="replace")
    text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", text).casefold())


def _note(literal: list[str], folded: list[str]) -> str:
    if literal == folded:
        return ""
    return (f" (`{'/'.join(literal)}` reads as `{'/'.join(folded)}` once letter case, accents and "
            "look-alike characters are ignored)")


def _rule_parts(path: str) -> list[str]:
    """A rule's path as segments: `\\` read as `/`, `.` and empty segments dropped."""
    return [_nfc(p) for p in path.replace("\\", "/").split("/") if p not in ("", ".")]


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _shown(raw: bytes) -> str:
    """The path for people: UTF-8 decoded (bad bytes as `\\xNN`), control characters escaped."""
    text = raw.decode("utf-8", errors="backslashreplace")
    return "".join(f"\\x{ord(c):02x}" if unicodedata.category(c) == "Cc" else c for c in text)


# --- imports ----------------------------------------------------------------------------------


def _module_name(name: str) -> str | None:
    """The module a file in a directory on sys.path is imported as (`json.py`, `json.pyc`,
    `json.cpython-312-x86_64-linux-gnu.so` → `json`), or None when it is no module."""
    for suffix in MODULE_SUFFIXES:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
            return (stem.split(".")[0] if suffix in (".so", ".pyd") else stem) or None
    return None


@dataclass(frozen=True)
class _FoldedNames:
    every: dict[str, str]  # folded → as the interpreter spells it
    regular: frozenset[str]
    namespaces: frozenset[str]


@functools.lru_cache(maxsize=16)
def _names_folded(names: ImportNames) -> _FoldedNames:
    every: dict[str, str] = {}
    for name in sorted(names.stdlib | names.installed | names.regular | names.namespaces):
        every.setdefault(_lookalike(name), name)
    return _FoldedNames(every, frozenset(_lookalike(name) for name in names.regular),
                        frozenset(_lookalike(name) for name in names.namespaces))


def _metadata_kinds(parts: list[str]) -> list[str]:
    """The packaging-metadata and bytecode rules a path breaks (on its segments as given)."""
    kinds = []
    name = parts[-1]
    meta = next((part for part in parts[:-1]
                 if part.endswith(METADATA_DIR_SUFFIXES) or part == "egg-info"), None)
    if meta is None and (name.endswith((*METADATA_DIR_SUFFIXES, *METADATA_FILE_SUFFIXES[:2]))
                         or name in METADATA_NAMES - {"__pycache__"}):
        meta = name
    if meta is not None:
        kinds.append(f"packaging metadata (`{meta}`): the interpreter reads it from a directory on sys.path "
                     "as an installed distribution, its entry points (pytest loads `pytest11` ones as "
                     "plugins) or start-up code (importlib.metadata, site.py); a patch cannot add or "
                     "change it")
    if "__pycache__" in parts or name.endswith((".pyc", ".pyo")):
        kinds.append("compiled bytecode (`__pycache__/`, `.pyc`) is imported instead of its source; a patch "
                     "carries source only")
    return kinds


def _hint(literal: list[str], folded: list[str], plain: list[str], reason: str) -> str:
    return "" if reason in plain else _note(literal, folded)


_facts_cache: dict[tuple[Any, ...], CommandFacts] = {}


def _facts(store: Any, baseline_id: bytes | None, rules: PolicyRules) -> CommandFacts:
    """CommandFacts of the commands, the write roots and the baseline's test configuration
    (a pure function of immutable objects, so kept for the next candidate of the search)."""
    key = (baseline_id, rules.commands, rules.write_roots, rules.import_dirs)
    cached = _facts_cache.get(key)
    if cached is None:
        cached = _facts_build(store, baseline_id, rules)
        if len(_facts_cache) >= 64:
            _facts_cache.clear()
        _facts_cache[key] = cached
    return cached


def _facts_build(store: Any, baseline_id: bytes | None, rules: PolicyRules) -> CommandFacts:
    facts = command_facts(rules.commands)
    # A shell script a command runs is read for its own commands (one level deep).
    for script in sorted(facts.scripts) if baseline_id is not None else []:
        lines = (_blob_at(store, baseline_id, script) or b"").decode("utf-8", errors="replace").splitlines()
        shebang = lines[0][2:].split() if lines and lines[0].startswith("#!") else []
        if script.endswith(".sh") or (shebang and posixpath.basename(shebang[-1]) in _SHELLS):
            facts.merge(command_facts(line for line in lines if not line.lstrip().startswith("#")))
    for root in rules.write_roots:
        folder = "/".join(_rule_parts(root))
        facts.dir_add(folder, f"the write root `{root}`")
    for item in rules.import_dirs:
        folder = "/".join(_rule_parts(item))
        facts.dir_add(folder, f"`{item}`")
    if baseline_id is None:
        return facts
    for cwd in sorted(facts.working_dirs):
        _configs_read(store, baseline_id, facts, cwd)
    # pytest (import mode `prepend`) puts the first directory above each test module and
    # conftest.py that has no __init__.py on sys.path; a root conftest names plugins to load.
    files = {entry.path.decode(errors="replace") for entry in iter_tree_contents(store, baseline_id)}
    patterns = [*PYTEST_DEFAULT_FILES, *facts.test_patterns]
    for path in sorted(files):
        name = posixpath.basename(path)
        if name != "conftest.py" and not (name.endswith(".py") and any(fnmatch.fnmatchcase(name, p)
                                                                         for p in patterns)):
            continue
        folder = posixpath.dirname(path)
        while folder and posixpath.join(folder, "__init__.py") in files:
            folder = posixpath.dirname(folder)
        facts.dir_add(folder, f"`{folder or '.'}` (pytest puts it on sys.path to import `{path}`)")
        if name == "conftest.py":
            for plugin in _conftest_plugins(_blob_at(store, baseline_id, path) or b""):
                facts.plugin_add(plugin, f"loaded as a pytest plugin by `pytest_plugins` in `{path}`")
    return facts


def _configs_read(store: Any, baseline_id: bytes, facts: CommandFacts, cwd: str) -> None:
    """pytest's settings that decide imports, from the baseline's config files in `cwd`."""
    for name, section in PYTEST_CONFIGS:
        path = posixpath.join(cwd, name) if cwd else name
        data = _blob_at(store, baseline_id, path)
        if data is None:
            continue
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(data.decode("utf-8", errors="replace"))
        except configparser.Error:
            continue
        if parser.has_section(section):
            for key in ("pythonpath", "python_files", "addopts"):
                if parser.has_option(section, key):
                    _ini_setting(facts, key, parser.get(section, key), cwd, f"`{path}`")
    path = posixpath.join(cwd, "pyproject.toml") if cwd else "pyproject.toml"
    data = _blob_at(store, baseline_id, path)
    try:
        document = tomllib.loads(data.decode("utf-8")) if data else {}
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError, ValueError):
        return
    tool = document.get("tool", {}) if isinstance(document.get("tool"), dict) else {}
    pytest_table = tool.get("pytest", {}) if isinstance(tool.get("pytest"), dict) else {}
    for table in (pytest_table.get("ini_options", {}), pytest_table):
        if not isinstance(table, dict):
            continue
        for key in ("pythonpath", "python_files", "addopts"):
            value = table.get(key)
            if isinstance(value, list):
                words = [str(item) for item in value]
                value = shlex.join(words) if key == "addopts" else " ".join(words)
            if isinstance(value, str):
                _ini_setting(facts, key, value, cwd, f"`{path}`")


def _conftest_plugins(data: bytes) -> list[str]:
    """The modules a conftest.py names in `pytest_plugins = …` (a string or a list of them)."""
    try:
        module = ast.parse(data)
    except (SyntaxError, ValueError):
        return []
    found: list[str] = []
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(target, ast.Name) and target.id == "pytest_plugins"
                                                for target in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            items = [value] if isinstance(value, str) else value if isinstance(value, list | tuple) else ()
            found += [part for item in items if isinstance(item, str) for part in item.split(",")]
    return found


def _blob_at(store: Any, tree_id: bytes, path: str) -> bytes | None:
    node: Any = store[tree_id]
    parts = path.split("/")
    for index, part in enumerate(parts):
        if not isinstance(node, Tree):
            return None
        try:
            mode, sha = node[part.encode()]
        except KeyError:
            return None
        node = store[sha]
        if index == len(parts) - 1:
            return node.as_raw_string() if isinstance(node, Blob) and mode in (REGULAR, EXECUTABLE) else None
    return None


# --- trees and TOML ---------------------------------------------------------------------------


def _present(entry: TreeEntry | None) -> TreeEntry | None:
    return entry if entry is not None and entry.path is not None else None


def _tree_id(store: Any, tree: bytes | str) -> bytes:
    sha = tree.encode() if isinstance(tree, str) else tree
    try:
        obj = store[sha]
    except KeyError:
        raise ValueError(f"{sha.decode(errors='replace')}: no such tree in the repository") from None
    if isinstance(obj, Commit):
        obj = store[obj.tree]
    if not isinstance(obj, Tree):
        raise ValueError(f"{sha.decode(errors='replace')}: not a tree or a commit")
    return obj.id


def _test_sections(data: bytes) -> dict[str, Any] | None:
    """pyproject.toml's test tables, comparable across formatting; None when not valid TOML."""
    if not data:
        return {}
    try:
        document = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError, ValueError):
        return None
    sections = {}
    for keys in PYPROJECT_TEST_KEYS:
        node: Any = document
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            sections[".".join(keys)] = _comparable(node)
    return sections


def _comparable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((key, _comparable(item)) for key, item in value.items()))
    if isinstance(value, list):
        return tuple(_comparable(item) for item in value)
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    return (type(value).__name__, value)
