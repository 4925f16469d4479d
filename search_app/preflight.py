"""Commands that cannot start are refused before anything runs, with the reason.

Freeze and start call `preflight_problems`: for the writer, every gate and the score, each
simple command's program must resolve inside the sandbox as it will be run (a bare name on the
sandbox's PATH, an absolute path the sandbox shows, a `./x` in the baseline tree) and so must the
script its interpreter names (`python x.py`, `bash -e s.sh`, `node x.js` …), relative to the
tree or under a declared read path. A line this module cannot parse is not checked rather than
refused. At run time, `start_failure` tells a command that could not start (the spec's failure:
the search stops after the first) from a script the candidate's patch deleted (its own failure).
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from dulwich.errors import NotTreeError
from dulwich.objects import Blob, SubmoduleEncountered

from runtime_app import sandbox
from runtime_app.fleet import Preset, host_is_local, preset_get
from runtime_app.git import GitError, file_at, is_tree, repo_open
from runtime_app.keys import provider_key
from runtime_app.presenters import short_sha
from runtime_app.worktrees import worktrees_root
from search_app.frozen import search_spec
from search_app.hidden import HostReport, read_path_records, readable_for
from search_app.spec import SearchSpec
from search_app.step_result import StepResult

if TYPE_CHECKING:
    from search_app.context import StepContext

_SEPARATORS = {";", "&&", "||", "|", "&", "|&", "\n"}
_REDIRECTIONS = {">", ">>", "<", ">&", "<&", ">|", "&>", "&>>", "<>"}
# Beyond this parser: a line with any of these is not checked (never refused for it).
_UNPARSED_WORDS = {"(", ")", "<<", "<<<", "<<-", ";;"}
_KEYWORDS = {"{", "}", "if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case",
             "esac", "function", "select", "!", "[["}  # only where a command starts
_BUILTINS = {"cd", "export", "set", "unset", "true", "false", ":", "echo", "printf", "test", "[", "exit",
             "return", "shift", "read", "wait", "trap", "umask", "ulimit", "alias", "unalias", "source", ".",
             "eval", "local", "pwd", "type", "hash", "getopts", "let", "declare", "typeset", "readonly",
             "break", "continue", "times", "kill", "jobs", "fg", "bg", "exec", "command"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_INTERPRETER = re.compile(r"^(?:(?P<python>python[0-9.]*|pypy[0-9.]*)|(?P<shell>sh|bash|dash|zsh|ksh)"
                          r"|(?P<node>node|nodejs)|(?P<ruby>ruby)|(?P<perl>perl))$")
# Options that take the next word as their value, per interpreter.
_OPTION_VALUES = {
    "python": {"-W", "-X", "--check-hash-based-pycs"},
    "shell": {"-o", "-O", "+o", "+O"},
    "node": {"-r", "--require", "--import", "--loader", "--experimental-loader", "--conditions", "-C",
             "--input-type", "--env-file"},
    "ruby": {"-I", "-r", "-C", "-E", "-F"},
    "perl": {"-I", "-M", "-m", "-x"},
}
# Options that make the interpreter run inline code, a module or its stdin: no script to check.
_INLINE = {
    "python": re.compile(r"^(?:-[bBdEhiIOPqsSuvVx]*[cm]|-)$"),
    "shell": re.compile(r"^(?:[-+][A-Za-z]*[cs][A-Za-z]*|-)$"),
    "node": re.compile(r"^(?:-[ep]|-pe|--eval|--print|-)$"),
    "ruby": re.compile(r"^(?:-[A-Za-z]*e|-)$"),
    "perl": re.compile(r"^(?:-[A-Za-z]*[eE]|-)$"),
}
# Wrappers that run the rest of the line as a command, and their options that take a value.
_WRAPPERS = {"exec": {"-a"}, "command": set(), "nohup": set(), "time": {"-f", "-o"}, "setsid": set(),
             "nice": {"-n", "--adjustment"}, "timeout": {"-s", "-k", "--signal", "--kill-after"},
             "env": {"-u", "--unset"}}
_WRAPPER_UNPARSED = {"-C", "--chdir", "-S", "--split-string", "-v", "-V"}  # `env -C`, `command -v` …
_UNKNOWN = re.compile(r"[$`*?\[\]~]")  # a word whose value only the shell knows


@dataclass(frozen=True)
class Invocation:
    """One simple command of a line: its program, and the script its interpreter runs (if any)."""

    program: str
    script: str | None = None
    cwd: str | None = ""  # where it runs, relative to the tree ("" its root; None: not known here)
    args: tuple[str, ...] = field(default=(), compare=False)  # its words after the program

    def tree_path(self, path: str) -> str | None:
        """`path` (relative to where it runs) as a path in the tree; None when not known."""
        return None if self.cwd is None else posixpath.normpath(posixpath.join(self.cwd, path))


def invocations(line: str) -> list[Invocation] | None:
    """The simple commands of a shell line, or None when the line is beyond this parser."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>\n")
    lexer.whitespace, lexer.whitespace_split = " \t\r", True
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote: the shell will say so
        return None
    if any(word in _UNPARSED_WORDS or "$(" in word or "`" in word for word in words):
        return None
    found: list[Invocation] = []
    current: list[str] = []
    cwd: str | None = ""
    for word in [*words, ";"]:
        if not current and word in _KEYWORDS:
            return None
        if word not in _SEPARATORS:
            current.append(word)
            continue
        simple = _simple(current)
        current = []
        if simple is None:
            continue
        if simple[0] == "cd":
            cwd = _cd(cwd, simple[1:])
        elif simple[0] not in _BUILTINS:
            found.append(Invocation(simple[0], _script_of(simple), cwd, tuple(simple[1:])))
    return found


def _cd(cwd: str | None, args: list[str]) -> str | None:
    """Where a `cd` leads, relative to the tree; None when this parser cannot follow it."""
    if cwd is None or len(args) != 1 or args[0].startswith(("/", "-")) or _UNKNOWN.search(args[0]):
        return None
    target = posixpath.normpath(posixpath.join(cwd, args[0]))
    if target == ".." or target.startswith("../"):
        return None
    return "" if target == "." else target


def _simple(words: list[str]) -> list[str] | None:
    """A simple command's words without redirections, assignments and wrappers (`env`, `timeout`
    …); None when there is none, or when a wrapper does what this parser does not follow."""
    kept, skip = [], False
    for index, word in enumerate(words):
        if skip:
            skip = False
        elif word in _REDIRECTIONS:
            skip = True
        elif not (word.isdigit() and index + 1 < len(words) and words[index + 1] in _REDIRECTIONS):
            kept.append(word)  # (a digit before a redirection is its file descriptor: `2>`)
    while kept and _ASSIGNMENT.match(kept[0]):
        kept.pop(0)
    while len(kept) > 1 and kept[0] in _WRAPPERS:
        wrapper = kept.pop(0)
        while kept and (kept[0].startswith("-") or (wrapper == "env" and _ASSIGNMENT.match(kept[0]))):
            option = kept.pop(0)
            if option in _WRAPPER_UNPARSED:
                return None
            if option == "--":
                break
            if option in _WRAPPERS[wrapper] and kept:
                kept.pop(0)
        if wrapper == "timeout" and kept:
            kept.pop(0)  # the duration
    return kept or None


def _script_of(words: list[str]) -> str | None:
    """The script an interpreter runs: its first non-option argument (None for inline code)."""
    match = _INTERPRETER.match(posixpath.basename(words[0]))
    if not match:
        return None
    kind = match.lastgroup
    assert kind is not None  # every alternative of _INTERPRETER is a named group
    rest = iter(words[1:])
    for word in rest:
        if _INLINE[kind].match(word):
            return None
        if word == "--":
            return next(rest, None)
        if word in _OPTION_VALUES[kind]:
            next(rest, None)
        elif not word.startswith("-") and not (kind == "shell" and word.startswith("+")):
            return word
    return None


# -------------------------------------------------------------------------------- preflight

def _visibility(path: Path, *, tree: Path, readable: Iterable[Path]) -> str | None:
    return sandbox.visibility_problem(path, tree=tree, readable=list(readable))


def _which(program: str, *, tree: Path, readable: Iterable[Path]) -> Path | None:
    return sandbox.sandbox_which(program, tree=tree, readable=list(readable))


@dataclass
class _Place:
    """Where a section's commands run: the tree (the baseline, plus hidden files for the
    evaluator), the host paths they may read, and the spec key that declares those."""

    section: str
    tree: Path
    readable: list[Path]
    in_tree: Callable[[str], str | None]  # a tree path → None if present, else why not
    repository: Path | None = None  # the repository on the host, whose own paths commands never see


def preflight_problems(spec: SearchSpec, repository_path: str, baseline_commit: str) -> list[str]:
    """Every command of `spec` that cannot start inside the sandbox, one message each (naming the
    command, the path and what to do); and whether the repository can be shown to it at all."""
    return preflight_report(spec, repository_path, baseline_commit)[0]


def preflight_report(spec: SearchSpec, repository_path: str,
                     baseline_commit: str) -> tuple[list[str], list[str]]:
    """(problems, warnings): `preflight_problems`, and the files commands name that may be missing
    but may also be made before they are read (`command_findings`)."""
    problems: list[str] = []
    warnings: list[str] = []
    tree = worktrees_root() / "preflight"  # where evaluation trees live; no tree is made here
    git_dir = Path(repository_path) / ".git"
    if not os.path.isdir(repository_path):
        return [f"{repository_path}: no such directory on this host, so there is no repository to show "
                "commands; put the repository back there, or freeze the spec again against where it is "
                "now"], []
    repository = repository_problem(repository_path, tree)
    if repository:
        problems.append(repository)
    try:
        repo = repo_open(repository_path)
    except GitError as error:
        return [*problems, str(error)], []
    hidden = list(spec.evaluator.files)
    with repo:
        def in_tree(for_evaluator: bool) -> Callable[[str], str | None]:
            def check(path: str) -> str | None:
                if for_evaluator and any(path == h or path.startswith(h.rstrip("/") + "/") for h in hidden):
                    return None
                return _tree_problem(repo, baseline_commit, path, for_evaluator)
            return check

        commands = []
        if spec.worker.command:
            commands.append(("worker.command", "worker", spec.worker.command))
        gates = enumerate(spec.hard_gates.commands)
        commands += [(f"hard_gates.commands[{number}]", "hard_gates", gate) for number, gate in gates]
        commands.append(("score.command", "score", spec.score.command))
        earlier: list[str] = []  # the evaluator's commands before this one (each starts from a pristine tree)
        for where, section, command in commands:
            # Writers work in a git worktree and are shown its git dir; the evaluator's trees are
            # plain directories whose commands see no repository.
            readable = [*([git_dir] if section == "worker" else []), *readable_for(spec, section)]
            place = _Place(section, tree, readable, in_tree(section != "worker"), Path(repository_path))
            shebang = partial(_shebang, repo, baseline_commit)
            before = earlier if section != "worker" else []
            refused, warned = command_findings(command, place, shebang, before)
            problems += [f"{where} `{command}`: {message}" for message in refused]
            warnings += [f"{where} `{command}`: {message}" for message in warned]
            if section != "worker":
                earlier.append(command)
    return problems, warnings


def freeze_problems(spec: SearchSpec, repository_path: str, baseline_commit: str, *,
                    without_key: bool = False) -> list[str]:
    """Why freezing `spec` against this baseline is refused: every command that cannot start or
    names a file the baseline lacks (`preflight_report`), and a writer provider with no key."""
    problems = preflight_problems(spec, repository_path, baseline_commit)
    if not without_key:
        problems += provider_key_problems(spec.worker.provider)
    return problems


def search_path_warnings(search: Any) -> list[str]:
    """The files a frozen search's commands name that may be missing (`preflight_report`)."""
    return preflight_report(search_spec(search), search.repository_path, search.baseline_commit)[1]


def repository_problem(repository_path: str, tree: Path) -> str | None:
    """Why commands run in `tree` could not use the repository's git dir, or None.

    Commands are shown `<repository>/.git` (bound after the private /tmp, through the stage when
    the sandbox user cannot reach it: a repository under /tmp, a home or the data dir is fine).
    When that `.git` is a file (a linked worktree, a submodule), the git dir it points to is not
    shown, and git fails inside every command."""
    git_dir = Path(repository_path) / ".git"
    needed = _git_dir_of(git_dir)
    if needed is None or needed == git_dir:
        return None
    hidden = _visibility(needed, tree=tree, readable=[git_dir])
    if not hidden:
        return None
    main = needed.parent if needed.name == ".git" else None
    what = f"register {main}, the checkout that holds it, instead" if main else \
        "register a clone whose .git is a directory instead"
    return (f"{repository_path}: the repository's git dir {needed} cannot be shown inside the sandbox "
            f"({hidden}): its .git is a file pointing there, and commands are shown only {git_dir}; {what}")


def _git_dir_of(dot_git: Path) -> Path | None:
    """The directory git keeps a repository's objects and refs in, as worktrees made from it name
    it: `.git` itself, or where a `.git` file points (its common dir for a linked worktree);
    None when `.git` is neither (the repository check says why)."""
    if dot_git.is_dir():
        return dot_git
    try:
        first = dot_git.read_text(errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return None
    if not first.startswith("gitdir:"):
        return None
    pointed = Path(os.path.normpath(dot_git.parent / first.removeprefix("gitdir:").strip()))
    try:
        common = (pointed / "commondir").read_text().strip()
    except OSError:
        return pointed  # a submodule's or a separate git dir: no common dir of its own
    return Path(os.path.normpath(pointed / common))


def command_problem(command: str, place: _Place, shebang: Callable[[str], str | None]) -> str | None:
    """Why `command` cannot start where `place` says it runs, or None (also when it is not parsed)."""
    problems, _ = command_findings(command, place, shebang)
    return problems[0] if problems else None


def command_findings(command: str, place: _Place, shebang: Callable[[str], str | None],
                     earlier: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """(problems, warnings) of one command line: its programs and interpreter scripts must start
    (the first problem ends the check, as the shell would), and every other file it names must be
    in the tree (`_argument_findings`). A tree path that an earlier part of the same line may
    make (`make && ./build/app`) is only warned about."""
    problems: list[str] = []
    warnings: list[str] = []
    parsed = invocations(command) or []
    for index, invocation in enumerate(parsed):
        made = _made_before(parsed[:index])
        program = invocation.program
        if "/" not in program and not _UNKNOWN.search(program) and \
                _which(program, tree=place.tree, readable=place.readable) is None:
            return [f"`{program}` is not on the PATH inside the sandbox; fix the name, install it in the "
                    f"toolchain (/usr/bin), or give its absolute path and declare it in "
                    f"{place.section}.read_paths (under CRUCIBLE_READ_ROOTS)"], warnings
        for path, executable in ((program, True), (invocation.script, False)):
            if not path or _UNKNOWN.search(path) or (executable and "/" not in path):
                continue
            relative = None if path.startswith("/") else invocation.tree_path(path)
            if relative is not None and made(relative) and place.in_tree(relative) is not None:
                warnings.append(f"{path} is not in the baseline tree; an earlier part of this command "
                                "must make it, or it fails")
                continue
            problem = _path_problem(path, place, invocation, executable=executable, shebang=shebang,
                                    line=command)
            if problem:
                return [problem], warnings
        refused, warned = _argument_findings(invocation, place, made, earlier)
        problems += refused
        warnings += warned
    return problems, warnings


# ------------------------------------------------------------------ the files a command names
#
# Beyond its program and script, a command names files as arguments (`pytest tests/test_a.py`,
# `git diff -- expected_result.json`, `jq . data/in.json`). A word names a file in the tree when
# it is not an option, holds nothing only the shell knows and no URL or `key=value` syntax, is
# relative, and looks like a path: it has a `/`, or a suffix of a file kind (`x.py`, `a.json`).
# It is checked only when it is anchored in the tree — its parent directory is there (refused if
# the file is not) or only its first component is (warned: a typo, or a directory a step makes).
# The value of an output option (`-o out.json`, `--write out/x`) is made, not read: never checked.

_NOT_A_PATH = re.compile(r"[$`*?\[\]{}~=:@<>|;&'\"\\\s,]|://|\.\.\.")
_FILE_SUFFIXES = {
    "py", "pyi", "sh", "bash", "js", "mjs", "cjs", "ts", "tsx", "jsx", "rb", "pl", "php", "lua", "r",
    "c", "h", "cc", "cpp", "hpp", "cxx", "rs", "go", "java", "kt", "scala", "swift", "cs", "m",
    "json", "jsonl", "toml", "yaml", "yml", "ini", "cfg", "conf", "txt", "csv", "tsv", "xml", "html",
    "md", "rst", "sql", "lock", "mk", "cmake", "gradle", "ipynb", "parquet", "npy", "pkl", "dat", "in",
}
# Options whose value is made by the command (an output), or is not a file at all.
_OUTPUT_OPTION = re.compile(r"^(?:-o|-O|--(?:out|output|write|save|dump|dest|destination|junit|junitxml|"
                            r"log|report|cache|tmp|target|build|prefix|basetemp|html|json|xml|cov)[\w-]*)$")
_NOT_FILE_OPTION = {"-m", "-c", "-k", "-e", "-p", "-E", "-W", "-X", "-n", "-j", "--eval", "--print",
                    "--expression", "--name", "--module", "--keyword", "--message", "-M", "--match"}
# Programs that make files other commands then run or read (`make && ./build/app`).
_BUILDERS = {"make", "gmake", "cmake", "ninja", "meson", "cargo", "go", "gcc", "cc", "clang", "g++", "c++",
             "clang++", "tsc", "npm", "npx", "yarn", "pnpm", "mvn", "gradle", "javac", "mkdir", "cp", "mv",
             "touch", "tee", "ln", "tar", "unzip", "curl", "wget", "rsync", "install"}


def _made_before(parts: Sequence[Invocation]) -> Callable[[str], bool]:
    """Whether the earlier parts of a line may make a tree path: one of them builds or copies
    (`_BUILDERS`), or names the path, its directory or its first component."""
    builds = any(posixpath.basename(part.program) in _BUILDERS for part in parts)
    words = {posixpath.normpath(word.split("=", 1)[-1]) for part in parts for word in part.args
             if not word.startswith("-") or "=" in word}

    def made(relative: str) -> bool:
        if builds:
            return True
        top = relative.split("/", 1)[0]
        return bool({relative, posixpath.dirname(relative), top} & words)
    return made


def _path_like(word: str) -> str | None:
    """The relative path `word` names in the tree (a pytest node id's file), or None when it is
    not a path here: an option, a URL, `key=value`, anything only the shell knows, an absolute
    path, or a bare name without a file suffix (`billing`, `origin/main` is checked by anchoring)."""
    path = word.split("::", 1)[0]
    if not path or path.startswith(("-", "/")) or _NOT_A_PATH.search(path):
        return None
    if "/" not in path:
        stem, dot, suffix = path.rpartition(".")
        if not dot or not stem.strip(".") or suffix.lower() not in _FILE_SUFFIXES:
            return None
    return path


def _argument_findings(invocation: Invocation, place: _Place, made: Callable[[str], bool],
                       earlier: Sequence[str]) -> tuple[list[str], list[str]]:
    """(problems, warnings) for the files an invocation's arguments name (see above)."""
    problems: list[str] = []
    warnings: list[str] = []
    if posixpath.basename(invocation.program) in _BUILDERS:
        return [], []  # what it names it may well make (`cp a b`, `mkdir -p out`)
    previous = ""
    for word in invocation.args:
        option, previous = previous, word
        if word == invocation.script or word.startswith("-"):
            continue
        if option.startswith("-") and "=" not in option and (
                _OUTPUT_OPTION.match(option) or option in _NOT_FILE_OPTION):
            continue
        if word.startswith("/"):
            problem = _declared_path_problem(word, place)
            if problem:
                problems.append(problem)
            continue
        path = _path_like(word)
        relative = invocation.tree_path(path) if path else None
        if path is None or relative is None or relative in (".", "..") or relative.startswith("../"):
            continue
        missing = place.in_tree(relative)
        if missing is None:
            continue
        parent = posixpath.dirname(relative)
        top = relative.split("/", 1)[0]
        if parent and place.in_tree(parent) is not None:
            if top != relative and place.in_tree(top) is None:
                warnings.append(f"{path}: neither it nor its directory {parent}/ is in the baseline tree; "
                                "fix the path, unless an earlier step makes it")
            continue  # not anchored in the tree (`origin/main`, `out/x.json`): not a tree path here
        if made(relative):
            warnings.append(f"{path} is not in the baseline tree; an earlier part of this command must "
                            "make it, or it fails")
            continue
        if posixpath.basename(invocation.program) == "git":  # a pathspec: matching nothing is no error
            warnings.append(f"{path} is not in the baseline tree, so `git` matches nothing there and this "
                            "command checks nothing of it; fix the path, or commit the file")
            continue
        gone = next((line for line in earlier if path in line), None)
        why = (f"; `{gone}` runs before it, but each command starts from the pristine baseline tree, so "
               "what an earlier command wrote is gone") if gone else ""
        problems.append(f"{path} {missing}{why}")
    return problems, warnings


def _declared_path_problem(word: str, place: _Place) -> str | None:
    """An absolute path under one of the section's declared read paths must exist on this host;
    any other absolute path (a tool, /dev/null, a scratch file) is not checked here."""
    if _UNKNOWN.search(word):
        return None
    git_dir = place.repository / ".git" if place.repository is not None else None
    for root in [path for path in place.readable if path != git_dir]:  # a writer's also has the git dir
        if word == str(root) or word.startswith(str(root).rstrip("/") + "/"):
            if not os.path.lexists(word):
                return (f"{word} is under {root}, declared in {place.section}.read_paths, but is not on "
                        "this host; fix the path, or put the file there")
            return None
    return None


def _path_problem(path: str, place: _Place, invocation: Invocation, *, executable: bool,
                  shebang: Callable[[str], str | None], line: str = "") -> str | None:
    if not path.startswith("/"):
        relative = invocation.tree_path(path)
        if relative is None:
            return None  # after a `cd` this parser cannot follow
        if relative == ".." or relative.startswith("../"):
            return (f"{path} lies outside the tree, which is all the sandbox shows of the repository; "
                    "move it into the repository")
        problem = place.in_tree(relative)
        if problem is None and executable:
            interpreter = shebang(relative)
            if interpreter:
                return f"{path}: {interpreter}"
        return f"{path} {problem}" if problem else None
    hidden = _visibility(Path(path), tree=place.tree, readable=place.readable)
    if hidden and place.repository is not None:
        in_repository = _repository_relative(path, place.repository)
        if in_repository is not None:
            return _name_in_tree(path, in_repository, place, invocation, executable, line)
    if hidden:
        return (f"{path} is not visible inside the sandbox: {hidden}; move it under the repository or "
                f"declare it in {place.section}.read_paths (under CRUCIBLE_READ_ROOTS)")
    if not os.path.exists(path):
        return f"{path} does not exist on this host; fix the path"
    if executable and not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return f"{path} is not an executable file; make it one (chmod +x) or run it through its interpreter"
    return None


def _repository_relative(path: str, repository: Path) -> str | None:
    """`path` as a path in the repository's tree, when the host path lies inside it; else None."""
    real, root = os.path.realpath(path), os.path.realpath(repository)
    if real == root or not real.startswith(root.rstrip("/") + "/"):
        return None
    return real[len(root.rstrip("/")) + 1:]


def _name_in_tree(path: str, relative: str, place: _Place, invocation: Invocation, executable: bool,
                  line: str) -> str:
    """A host path into the repository: commands run in their own tree of it, never the host's
    checkout, so the advice is the same file named relative to that tree."""
    named = posixpath.relpath(relative, invocation.cwd) if invocation.cwd else relative
    if executable and "/" not in named:
        named = "./" + named  # a bare name would be looked up on the PATH
    example = line.replace(path, named) if line and path in line else named
    advice = (f"{path} is inside the repository on the host, which commands never see: they run in "
              f"their own tree of it; name it relative to the tree (`{example}`)")
    missing = place.in_tree(relative)
    return f"{advice}; {relative} {missing}" if missing else advice


def _tree_problem(repo: Any, commit: str, path: str, evaluator: bool) -> str | None:
    """None if the baseline tree has `path`, else why not."""
    where = f"in the baseline tree ({short_sha(commit)})"
    if evaluator:
        where += " or among the hidden evaluator files"
    try:
        if file_at(repo, commit, path) is not None or is_tree(repo, commit, path):
            return None
    except (NotTreeError, KeyError, SubmoduleEncountered):
        pass
    return f"is not {where}; commit it, or fix the path"


def _tree_entry(repo: Any, commit: str, path: str) -> tuple[int, bytes] | None:
    tree = repo[repo[commit.encode()].tree]
    try:
        return tree.lookup_path(repo.object_store.__getitem__, path.encode())
    except (KeyError, NotTreeError, SubmoduleEncountered):
        return None


def _shebang(repo: Any, commit: str, path: str) -> str | None:
    """For a program run as `./x` from the tree: why it cannot start (not executable, or its
    `#!` interpreter is not in the sandbox), or None."""
    entry = _tree_entry(repo, commit, path)
    if entry is None:
        return None  # not in the tree (or a hidden file): reported, or checked at run time
    mode, sha = entry
    blob = repo[sha]
    if not isinstance(blob, Blob):
        return "a directory, not a program"
    if not mode & 0o111:
        return (f"is not executable in the baseline (git mode {mode:o}); commit it with `chmod +x`, or run "
                "it through its interpreter (`sh x.sh`, `python x.py`)")
    first = blob.data[:256].split(b"\n", 1)[0]
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if not words:
        return None
    interpreter = words[1] if posixpath.basename(words[0]) == "env" and len(words) > 1 else words[0]
    tree = worktrees_root() / "preflight"
    if "/" in interpreter:
        hidden = _visibility(Path(interpreter), tree=tree, readable=[])
        if hidden or not os.path.exists(interpreter):
            why = hidden or "not on this host"
            return f"its `#!` interpreter {interpreter} is not in the sandbox ({why})"
    elif _which(interpreter, tree=tree, readable=[]) is None:
        return f"its `#!` interpreter `{interpreter}` is not on the PATH inside the sandbox"
    return None


# ------------------------------------------------------------------------------------ start


def start_problems(search: Any) -> list[str]:
    """What `search_start` refuses for: a command that cannot start now, or a read path whose
    files changed since the search was frozen (the evaluation would not be the one frozen)."""
    spec = search_spec(search)
    problems = preflight_problems(spec, search.repository_path, search.baseline_commit)
    report = HostReport()
    read_path_records(spec, report)
    problems += [f"{key[0]}.read_paths[{key[2]}]: {message}" for key, message in report.problems]
    hashed = search.hashed_inputs or {}
    frozen = dict(hashed.get("evaluator", {}).get("read_paths", {}))
    if "read_paths" in hashed.get("evidence", {}):
        frozen["worker"] = hashed["evidence"]["read_paths"]
    for section, records in frozen.items():
        now = {record["path"]: record for record in report.read_paths.get(section, [])}
        for record in records:
            if record["path"] in now and now[record["path"]] != record:
                problems.append(f"{section}.read_paths: {record['path']} changed since the search was frozen "
                                f"({_first_change(record, now[record['path']])}); freeze the spec again")
    return problems


def _first_change(before: dict, after: dict) -> str:
    if "files" not in before or "files" not in after:
        return "its contents"
    old = {item["path"]: item for item in before["files"]}
    new = {item["path"]: item for item in after["files"]}
    for path in sorted(set(old) | set(new)):
        if old.get(path) != new.get(path):
            what = "added" if path not in old else ("removed" if path not in new else "changed")
            return f"{path} {what}"
    return "its contents"


# ---------------------------------------------------------------------------------- run time

# What a shell, an interpreter or the sandbox prints when the program, script or declared path
# a command needs is not there. Candidate code can print anything, so a match is only a claim:
# `start_failure` checks it from outside before it stops a search.
_CANNOT_START = [
    re.compile(r"^(?:\S*sh|bash|dash|zsh): (?:\d+: |line \d+: )?(?P<name>[^:\n]+): "
               r"(?P<why>not found|command not found|No such file or directory|Permission denied"
               r"|cannot execute[^\n]*|Exec format error)", re.M),
    re.compile(r"can't open file '(?P<name>[^'\n]+)': \[Errno \d+\] (?P<why>[^\n]+)"),  # python
    re.compile(r"Can't open perl script \"(?P<name>[^\"\n]+)\": (?P<why>[^\n]+)"),
    re.compile(r"ruby: (?P<why>No such file or directory) -- (?P<name>\S+)"),
    re.compile(r"Error: Cannot find module '(?P<name>[^'\n]+)'(?P<why>)"),  # node
]
# The sandbox itself could not show a declared path (bubblewrap's words, or the root stage's).
_SOURCE_MISSING = re.compile(r"^(?:bwrap: Can't find source path (?P<name>\S+): (?P<why>[^\n]+)"
                             r"|crucible sandbox: cannot stage (?P<staged>\S+))$", re.M)


@dataclass(frozen=True)
class StartFailure:
    """A command that did not start: the spec's failure (stop the search) or the candidate's."""

    message: str
    spec: bool

    def result(self, **fields: Any) -> StepResult:
        """The step's result, with `fields` (`spec_failure` stops the search, `eliminated` ends the
        candidate)."""
        if self.spec:
            return StepResult(spec_failure=self.message, **fields)
        return StepResult(eliminated=self.message, **fields)


def start_failure(receipt: Any, section: str, command: str, baseline_has: Callable[[str], bool],
                  readable: Sequence[Path] = ()) -> StartFailure | None:
    """Did `command` (the spec key `section`, e.g. `hard_gates.commands[0]`) fail to start?

    None when it started (whatever it then did). `spec=True` when the sandbox refused it, or when
    its own program, script or declared read path is missing inside the sandbox — as its output
    says (exit 126/127, "can't open file") AND as the runtime confirms from outside: every candidate
    would hit the same wall. `spec=False` when the script is a tree path the baseline has: the
    candidate's patch deleted or broke it (also when candidate code only prints such a message).
    Something the command ran in turn that was missing is the command's own failure: None.
    """
    number = f" (receipt #{receipt.pk})" if getattr(receipt, "pk", None) else ""
    if receipt.error and receipt.exit_code is None and not receipt.timed_out:
        return StartFailure(f"{section} `{command}` could not start: {receipt.error}{number}", True)
    if receipt.exit_code in (None, 0) or receipt.timed_out:
        return None
    stderr = receipt.stderr_excerpt or ""
    key = section.split(".")[0]
    for match in _SOURCE_MISSING.finditer(stderr):
        name = match["name"] or match["staged"]
        if Path(name) in readable and not os.path.lexists(name):
            return StartFailure(f"{section} `{command}` cannot start: {name}, declared in {key}.read_paths, "
                                f"is gone from the host{number}; put it back, or freeze the spec again "
                                "without it", True)
    named = _named(command)
    for pattern in _CANNOT_START:
        for match in pattern.finditer(stderr):
            found = _which_of(match["name"].strip(), named)
            if found is None:
                continue
            name, tree_path = found
            why = (match["why"] or "not found").strip()
            if tree_path:
                if _maybe_in_baseline(match["name"].strip(), name, baseline_has):
                    return StartFailure(f"{section} `{command}`: {name} is in the baseline but not runnable "
                                        f"in this candidate's tree ({why}): its patch deletes or breaks it"
                                        f"{number}", False)
            elif not _missing_in_sandbox(name, readable):
                continue  # the sandbox has it: a claim the runtime cannot confirm
            return StartFailure(f"{section} `{command}` cannot start: {name}: {why} inside the sandbox"
                                f"{number}; {_advice(name, key)}", True)
    return None


def _maybe_in_baseline(reported: str, name: str, baseline_has: Callable[[str], bool]) -> bool:
    """Might the tree path a message names be one the baseline has? Any tail of the path the
    message gives (an interpreter prints it absolute, after a `cd` this parser did not follow)
    counts, so a search is never stopped for what may be one candidate's deletion."""
    parts = posixpath.normpath(reported).lstrip("/").split("/")
    tails = {"/".join(parts[index:]) for index in range(len(parts))}
    plain = posixpath.normpath(name)
    if not plain.startswith("../"):
        tails.add(plain)
    return any(baseline_has(tail) for tail in tails if tail and tail != "..")


def _missing_in_sandbox(name: str, readable: Sequence[Path]) -> bool:
    """The runtime's own check that a program or absolute path is not there inside the sandbox."""
    tree = worktrees_root() / "preflight"
    if "/" not in name:
        return _which(name, tree=tree, readable=readable) is None
    return _visibility(Path(name), tree=tree, readable=readable) is not None or not os.path.exists(name)


def _named(command: str) -> list[tuple[str, bool]]:
    """Every program and script the command line names, and whether it is a path in the tree."""
    names = []
    for invocation in invocations(command) or []:
        program = invocation.program
        names.append((program, "/" in program and not program.startswith("/")))
        if invocation.script:
            names.append((invocation.script, not invocation.script.startswith("/")))
    return names


def _which_of(reported: str, named: Iterable[tuple[str, bool]]) -> tuple[str, bool] | None:
    """The program or script of the command a message names (an interpreter may print it absolute)."""
    for name, tree_path in named:
        plain = posixpath.normpath(name)
        if reported in (name, plain) or (tree_path and reported.endswith("/" + plain.removeprefix("./"))):
            return name, tree_path
    return None


def _advice(path: str, key: str) -> str:
    if path.startswith("/"):
        return (f"check that it exists on the host and is declared in {key}.read_paths "
                "(under CRUCIBLE_READ_ROOTS), or move it under the repository")
    if "/" in path or path.endswith((".py", ".sh", ".js", ".rb", ".pl")):
        return "commit it to the baseline, or fix the path"
    return "fix the program's name, or install it in the toolchain (/usr/bin)"


def baseline_has(repository: str, commit: str, hidden: Sequence[str]) -> Callable[[str], bool]:
    """Whether the baseline tree `commit` (in this host's `repository`) or the hidden evaluator
    files (`hidden`, their paths) hold a path."""

    def has(path: str) -> bool:
        path = posixpath.normpath(path.removeprefix("./"))
        if any(path == h or path.startswith(h.rstrip("/") + "/") for h in hidden):
            return True
        try:
            with repo_open(repository) as repo:  # a worker's own copy
                return file_at(repo, commit, path) is not None or is_tree(repo, commit, path)
        except (GitError, NotTreeError, KeyError, SubmoduleEncountered):
            return False

    return has


def search_start_failure(context: StepContext, receipt: Any, section: str, command: str
                         ) -> StartFailure | None:
    """`start_failure` for a command of the step's search (`section` its spec key): the hook
    execution.py calls when a writer, gate or trial did not succeed."""
    if receipt.succeeded:
        return None
    readable = context.readable_for(section.split(".")[0])
    has = baseline_has(context.repository, context.baseline_commit, context.hidden_paths)
    return start_failure(receipt, section, command, has, readable)


# ---------------------------------------------------------------------------- the provider
#
# A writer whose provider has no key, or whose local server is not listening, fails every call:
# each candidate then ends, after its retries, as "changed nothing". Freeze and start say so first.

PROVIDER_CONNECT_SECONDS = 1.0  # a local model server answers a TCP connect at once, or is not up
# Bedrock signs with the standard AWS credentials when it has no Bedrock API key.
_AWS_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
                    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")


def _has_credentials(preset: Preset) -> bool:
    if preset.key_variable and provider_key(preset.key_variable):
        return True
    if preset.kind == "bedrock":
        return any(os.environ.get(name) for name in _AWS_CREDENTIALS) or \
            (Path.home() / ".aws" / "credentials").exists()
    return False


def provider_problems(provider: str) -> list[str]:
    """Why the writers' provider would fail every call, checked in about a second: a local
    server must accept a TCP connection (its key is optional); any other needs its key here
    (the environment or an administrator's stored key). Empty when nothing is known wrong."""
    preset = preset_get(provider)
    if preset is None or preset.kind == "command":
        return []
    if preset.kind == "agent-cli" and not preset.cli_path().is_file():
        return [f"worker.provider `{provider}`: {preset.cli_path()} is not installed: run "
                "scripts/install_agent_clis.sh DIR with DIR at CRUCIBLE_AGENT_CLI_DIR; until then every "
                "writer fails and each candidate ends as \"changed nothing\"."]
    base_url = preset.base_url() or ""
    parsed = urlparse(base_url)
    if parsed.hostname and host_is_local(parsed.hostname):
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            socket.create_connection((parsed.hostname, port), timeout=PROVIDER_CONNECT_SECONDS).close()
        except OSError as error:
            variable = preset.base_url_variable
            where = f" (set {variable} to where it listens)" if variable else ""
            return [f"worker.provider `{provider}`: nothing answers at {base_url} "
                    f"({error.strerror or error}): start the model server{where}; until then every "
                    "writer fails and each candidate ends as \"changed nothing\"."]
        return []
    return provider_key_problems(provider)


def provider_key_problems(provider: str) -> list[str]:
    """The writers' provider needs a key Crucible does not have (neither in this process's
    environment nor stored by an administrator): freezing refuses for it. A local server's key is
    optional, a command writer needs none."""
    preset = preset_get(provider)
    if preset is None or preset.kind == "command":
        return []
    parsed = urlparse(preset.base_url() or "")
    if parsed.hostname and host_is_local(parsed.hostname):
        return []
    if not _has_credentials(preset):
        variable = preset.key_variable or "its API key"
        return [f"worker.provider `{provider}`: no {variable} is set: put it in the workers' environment "
                "or have an administrator store it (Admin → Provider keys); until then every writer "
                "fails and each candidate ends as \"changed nothing\"."]
    return []
