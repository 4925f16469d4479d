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

import math
import re
import shlex
import tomllib
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dulwich.diff_tree import tree_changes
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
_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
_DRIVE = re.compile(r"^[A-Za-z]:")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class PolicyRules:
    """What a patch may change. Paths are repo-relative with `/` separators."""

    write_roots: tuple[str, ...] = ()
    exact_files: tuple[str, ...] = ()
    protected_paths: tuple[str, ...] = ()
    score_script: str | None = None
    forbid_test_changes: bool = True
    max_file_bytes: int = 1_000_000
    max_patch_bytes: int = DEFAULT_MAX_PATCH_BYTES
    max_patch_files: int = DEFAULT_MAX_PATCH_FILES

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


def policy_check(store: Any, baseline_tree: bytes | str | None, patched_tree: bytes | str,
                 rules: PolicyRules) -> PolicyVerdict:
    """Every rule the change from `baseline_tree` to `patched_tree` breaks (none: accepted).

    `store` is a dulwich object store or a Repo; the tree ids may also be commit ids.
    """
    store = getattr(store, "object_store", store)
    old_id = None if baseline_tree is None else _tree_id(store, baseline_tree)
    new_id = _tree_id(store, patched_tree)
    checker = _Checker(store, old_id, new_id, rules)
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
        if new is not None:
            self._entry(shown, old, new)
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
