"""The tools an LLM writer gets over its worktree: a file editor confined to the write roots,
and a shell whose every call runs in the sandbox with a receipt.

Reviewers get the read-only subset (`view` and a read-only shell). Paths are repo-relative;
`..`, absolute paths, anything under `.git` and any path through a symlink are refused with
a message the model can act on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MAX_VIEW_BYTES = 200_000
MAX_RESULT_CHARS = 20_000

EDITOR_TOOL = {
    "name": "editor",
    "description": (
        "View and edit files in your working directory. Commands: view (a file with line numbers, or a "
        "directory listing), create (a new file or a full replacement), str_replace (replace one exact, "
        "unique occurrence of old_str with new_str), insert (insert_text after line insert_line; 0 = top). "
        "Paths are relative to the repository root."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert"]},
            "path": {"type": "string"},
            "file_text": {"type": "string"},
            "old_str": {"type": "string"},
            "new_str": {"type": "string"},
            "insert_line": {"type": "integer"},
            "insert_text": {"type": "string"},
        },
        "required": ["command", "path"],
    },
}
SHELL_TOOL = {
    "name": "shell",
    "description": ("Run a shell command in your working directory, in a sandbox without network. "
                    "Returns its exit code and output (head and tail if long)."),
    "input_schema": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"],
    },
}


class ToolError(Exception):
    """A tool call the model got wrong; the message goes back to it as an error result."""


def _resolve(worktree: Path, path: Any) -> tuple[Path, str]:
    if not isinstance(path, str) or not path.strip():
        raise ToolError("give `path`, relative to the repository root")
    relative = path.strip()
    while relative.startswith("./"):
        relative = relative[2:]
    parts = Path(relative).parts
    if Path(relative).is_absolute() or ".." in parts:
        raise ToolError(f"{path}: use a path inside the repository, without `..`")
    if any(part.lower() == ".git" for part in parts):
        raise ToolError(f"{path}: the git directory is off limits")
    target = worktree / relative
    probe = worktree
    for part in parts:
        probe = probe / part
        if probe.is_symlink():
            raise ToolError(f"{path}: goes through a symlink; refused")
    return target, "/".join(parts)


def _writable(shown: str, write_roots: Sequence[str], exact_files: Sequence[str]) -> bool:
    for root in write_roots:
        root = root.strip("/")
        if root in ("", ".") or shown == root or shown.startswith(root + "/"):
            return True
    return shown in exact_files


def editor_run(worktree: Path, tool_input: dict[str, Any], *, write_roots: Sequence[str] = (),
               exact_files: Sequence[str] = (), read_only: bool = False) -> str:
    """Carry out one editor call; returns the text for the tool result, raises ToolError."""
    command = tool_input.get("command")
    target, shown = _resolve(worktree, tool_input.get("path"))
    if command == "view":
        if target.is_dir():
            names = sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir() if p.name != ".git")
            return "\n".join(names) or "(empty directory)"
        if not target.is_file():
            raise ToolError(f"{shown}: no such file")
        data = target.read_bytes()[:MAX_VIEW_BYTES]
        lines = data.decode(errors="replace").splitlines()
        return "\n".join(f"{number:6d}\t{line}" for number, line in enumerate(lines, start=1))
    if command not in ("create", "str_replace", "insert"):
        raise ToolError(f"unknown command {command!r}; use view, create, str_replace or insert")
    if read_only:
        raise ToolError("this tool set is read-only")
    if not _writable(shown, write_roots, exact_files):
        allowed = ", ".join([*write_roots, *exact_files]) or "nothing"
        raise ToolError(f"{shown}: outside the paths you may change ({allowed})")
    if command == "create":
        text = tool_input.get("file_text")
        if not isinstance(text, str):
            raise ToolError("create needs `file_text`")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return f"{shown}: written ({len(text.encode())} bytes)"
    if not target.is_file():
        raise ToolError(f"{shown}: no such file; create it first")
    content = target.read_text(errors="replace")
    if command == "str_replace":
        old, new = tool_input.get("old_str"), tool_input.get("new_str", "")
        if not isinstance(old, str) or not old or not isinstance(new, str):
            raise ToolError("str_replace needs a non-empty `old_str` and a `new_str`")
        count = content.count(old)
        if count != 1:
            raise ToolError(f"{shown}: old_str occurs {count} times; it must occur exactly once")
        target.write_text(content.replace(old, new, 1))
        return f"{shown}: replaced 1 occurrence"
    line, text = tool_input.get("insert_line"), tool_input.get("insert_text")
    lines = content.splitlines(keepends=True)
    if not isinstance(line, int) or isinstance(line, bool) or not 0 <= line <= len(lines):
        raise ToolError(f"insert_line must be between 0 and {len(lines)}")
    if not isinstance(text, str):
        raise ToolError("insert needs `insert_text`")
    if text and not text.endswith("\n"):
        text += "\n"
    lines.insert(line, text)
    target.write_text("".join(lines))
    return f"{shown}: inserted after line {line}"


def tool_dispatch(name: str, tool_input: Any, *, worktree: Path, shell: Callable[[str], str],
                  write_roots: Sequence[str] = (), exact_files: Sequence[str] = (),
                  read_only: bool = False) -> tuple[str, bool]:
    """(result text, is_error) for one tool call of the model."""
    try:
        if not isinstance(tool_input, dict):
            raise ToolError("the tool input must be an object")
        if name == "editor":
            text = editor_run(worktree, tool_input, write_roots=write_roots, exact_files=exact_files,
                              read_only=read_only)
        elif name == "shell":
            command = tool_input.get("command")
            if not isinstance(command, str) or not command.strip():
                raise ToolError("give the shell `command` to run")
            text = shell(command)
        else:
            raise ToolError(f"unknown tool {name!r}")
    except ToolError as error:
        return str(error), True
    except OSError as error:
        return f"{error.strerror or error}", True
    if len(text) > MAX_RESULT_CHARS:
        text = text[: MAX_RESULT_CHARS // 2] + "\n… cut …\n" + text[-MAX_RESULT_CHARS // 2:]
    return text, False
