"""Typed read and write access to a workspace's files (AgentWorkspace): names checked, no
symlinks followed, writes atomic."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from evolve_app.types import SkillMeta
from evolve_app.workspace.validation import (
    _NAME,
    DRAFTS_DIR,
    EXCLUDED_DIR,
    Manifest,
    Problem,
    WorkspaceError,
    _dir_files,
    _file_name_problem,
    _plain_file,
    _root,
    skill_front_matter,
    workspace_manifest,
    workspace_validate,
)

logger = logging.getLogger(__name__)

class AgentWorkspace:
    """Typed read/write access to every part of the workspace contract (the seed's methods).

    Names are checked (skills, categories, drafts: `[a-z0-9][a-z0-9_-]{0,63}`; fragments and
    tools: such a name plus `.md` / `.py`); a bad one raises WorkspaceError, as does a path that
    runs through a symlink. Writes are atomic (a temporary file renamed into place).
    """

    def __init__(self, path: str | Path):
        self.root = _root(path)
        # A-Evolve's folder attributes, which its engines use.
        self.prompts_dir, self.skills_dir = self.root / "prompts", self.root / "skills"
        self.drafts_dir, self.tools_dir = self.root / "skills" / DRAFTS_DIR, self.root / "tools"
        self.memory_dir, self.evolution_dir = self.root / "memory", self.root / EXCLUDED_DIR

    def __repr__(self) -> str:
        return f"AgentWorkspace({str(self.root)!r})"

    @property
    def manifest(self) -> Manifest:
        return workspace_manifest(self.root)

    def validate(self) -> list[Problem]:
        return workspace_validate(self.root)

    # prompts
    def read_prompt(self) -> str:
        return self._read("prompts/system.md", what="the system prompt")

    def write_prompt(self, text: str) -> None:
        self._write("prompts/system.md", text)

    def list_fragments(self) -> list[str]:
        return [Path(rel).name for rel in _dir_files(self.root, "prompts/fragments")
                if not _file_name_problem(Path(rel).name, ".md")]

    def read_fragment(self, name: str) -> str:
        return self._read(f"prompts/fragments/{_file_name(name, '.md')}", what=f"fragment {name}")

    def write_fragment(self, name: str, text: str) -> None:
        self._write(f"prompts/fragments/{_file_name(name, '.md')}", text)

    # skills
    def list_skills(self) -> list[SkillMeta]:
        """Skills whose SKILL.md has valid front matter, by name (workspace_validate reports the others)."""
        skills = []
        for rel in self._skill_files():
            folder = rel.split("/")[1]
            try:
                data, issues = skill_front_matter(self._read(rel), folder)
            except (WorkspaceError, UnicodeDecodeError):
                continue
            if data is not None and not issues:
                skills.append(SkillMeta(name=folder, description=str(data["description"]).strip(),
                                        path=f"skills/{folder}"))
        return skills

    def read_skill(self, name: str) -> str:
        return self._read(f"skills/{_name(name, 'skill')}/SKILL.md", what=f"skill {name}")

    def write_skill(self, name: str, content: str) -> None:
        """Write skills/<name>/SKILL.md after checking its front matter names this skill."""
        name = _name(name, "skill")
        _, issues = skill_front_matter(content, name)
        if issues:
            line, _, message = issues[0]
            raise WorkspaceError(f"skills/{name}/SKILL.md line {line}: {message}")
        self._write(f"skills/{name}/SKILL.md", content)

    def delete_skill(self, name: str) -> None:
        """Remove the skill's folder with everything in it."""
        folder = self._path(f"skills/{_name(name, 'skill')}")
        if not (folder / "SKILL.md").is_file():
            raise WorkspaceError(f"skill {name}: there is no skills/{name}/SKILL.md")
        shutil.rmtree(folder)

    # drafts
    def list_drafts(self) -> list[dict[str, str]]:
        """[{"name", "content"}] for each skills/_drafts/<name>.md, as upstream returns them."""
        drafts = []
        for rel in _dir_files(self.root, f"skills/{DRAFTS_DIR}"):
            file_name = Path(rel).name
            if not _file_name_problem(file_name, ".md"):
                with contextlib.suppress(WorkspaceError, UnicodeDecodeError):
                    drafts.append({"name": file_name.removesuffix(".md"), "content": self._read(rel)})
        return drafts

    def read_draft(self, name: str) -> str:
        return self._read(f"skills/{DRAFTS_DIR}/{_name(name, 'draft')}.md", what=f"draft {name}")

    def write_draft(self, name: str, content: str) -> None:
        self._write(f"skills/{DRAFTS_DIR}/{_name(name, 'draft')}.md", content)

    def clear_drafts(self) -> None:
        """Delete every skills/_drafts/<name>.md (A-Evolve's call after drafts are reviewed)."""
        for rel in _dir_files(self.root, f"skills/{DRAFTS_DIR}"):
            if rel.endswith(".md"):
                self._path(rel).unlink(missing_ok=True)

    def delete_draft(self, name: str) -> None:
        path = self._path(f"skills/{DRAFTS_DIR}/{_name(name, 'draft')}.md")
        if not path.is_file():
            raise WorkspaceError(f"draft {name}: there is no skills/{DRAFTS_DIR}/{name}.md")
        path.unlink()

    # memory
    def read_memories(self, category: str = "episodic", limit: int | None = None) -> list[dict[str, Any]]:
        """The category's entries, oldest first (the last `limit` when given). Lines that are not
        JSON objects are skipped with a warning, as upstream does; workspace_validate reports them."""
        rel = f"memory/{_name(category, 'memory category')}.jsonl"
        if not self._path(rel).exists():
            return []
        entries = []
        for number, line in enumerate(self._read(rel).split("\n"), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as error:
                logger.warning("%s line %d skipped: not valid JSON (%s)", rel, number, error.msg)
                continue
            if isinstance(entry, dict):
                entries.append(entry)
            else:
                logger.warning("%s line %d skipped: not a JSON object", rel, number)
        return entries[-limit:] if limit else entries

    def add_memory(self, entry: dict[str, Any], category: str = "episodic") -> None:
        """Append one entry as a JSON line to memory/<category>.jsonl."""
        if not isinstance(entry, dict):
            raise WorkspaceError(f"a memory entry is a dict, not {type(entry).__name__}")
        rel = f"memory/{_name(category, 'memory category')}.jsonl"
        line = json.dumps(entry, ensure_ascii=False, default=str)
        path = self._path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path(rel)  # the folder just made is checked again
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(path, flags, 0o644)
        try:
            needs_newline = os.fstat(fd).st_size > 0 and os.pread(fd, 1, os.fstat(fd).st_size - 1) != b"\n"
            os.write(fd, (("\n" if needs_newline else "") + line + "\n").encode())
        finally:
            os.close(fd)

    def read_all_memories(self, limit: int = 100) -> list[dict[str, Any]]:
        """The last `limit` entries of all categories (by category name, then file order), each with
        a `_category` key added, as upstream returns them."""
        entries: list[dict[str, Any]] = []
        for rel in _dir_files(self.root, "memory"):
            stem = Path(rel).stem
            if rel.endswith(".jsonl") and _NAME.fullmatch(stem):
                entries.extend({**entry, "_category": entry.get("_category", stem)}
                               for entry in self.read_memories(stem))
        return entries[-limit:] if limit else entries

    # tools
    def read_tool_registry(self) -> list[dict[str, Any]]:
        """The `tools:` entries of tools/registry.yaml ([] when there is none)."""
        if not self._path("tools/registry.yaml").exists():
            return []
        try:
            data = yaml.safe_load(self._read("tools/registry.yaml"))
        except yaml.YAMLError as error:
            raise WorkspaceError(f"tools/registry.yaml: not valid YAML ({error})") from None
        tools = data.get("tools") if isinstance(data, dict) else None
        return [entry for entry in tools or [] if isinstance(entry, dict)] if isinstance(tools, list) else []

    def write_tool_registry(self, tools: list[dict[str, Any]]) -> None:
        for entry in tools:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise WorkspaceError("each registry entry is a dict with a 'name'")
            _file_name(entry["name"], ".py")
        self._write("tools/registry.yaml", yaml.safe_dump({"tools": tools}, sort_keys=False,
                                                          allow_unicode=True))

    def read_tool(self, name: str) -> str:
        return self._read(f"tools/{_file_name(name, '.py')}", what=f"tool {name}")

    def write_tool(self, name: str, code: str) -> None:
        """Write tools/<name>.py (`name` with or without `.py`) after checking it parses as Python."""
        file_name = _file_name(name, ".py")
        try:
            compile(code, file_name, "exec", dont_inherit=True)  # parsed, never run
        except SyntaxError as error:
            raise WorkspaceError(f"tools/{file_name} line {error.lineno}: Python syntax error: {error.msg}") \
                from None
        except ValueError as error:
            raise WorkspaceError(f"tools/{file_name}: not Python source ({error})") from None
        self._write(f"tools/{file_name}", code)

    # files
    def _skill_files(self) -> list[str]:
        skills = self.root / "skills"
        if not skills.is_dir() or skills.is_symlink():
            return []
        return [f"skills/{folder.name}/SKILL.md" for folder in sorted(skills.iterdir())
                if not folder.name.startswith("_") and _NAME.fullmatch(folder.name)
                and not folder.is_symlink() and _plain_file(folder / "SKILL.md")]

    def _path(self, rel: str) -> Path:
        """root/rel, refusing a path any part of which is a symlink."""
        path = self.root
        for part in rel.split("/"):
            path = path / part
            if path.is_symlink():
                raise WorkspaceError(f"{rel}: {path.relative_to(self.root)} is a symlink; refusing to use it")
        return path

    def _read(self, rel: str, what: str | None = None) -> str:
        path = self._path(rel)
        if not path.is_file():
            raise WorkspaceError(f"{what or rel}: {rel} does not exist")
        try:
            return path.read_bytes().decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError:
            raise WorkspaceError(f"{rel}: not UTF-8 text") from None

    def _write(self, rel: str, text: str) -> None:
        if not isinstance(text, str):
            raise WorkspaceError(f"{rel}: give the content as text, not {type(text).__name__}")
        path = self._path(rel)
        if path.is_dir():
            raise WorkspaceError(f"{rel}: a directory is in the way")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path(rel)
        _atomic_write(path, text.encode())


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise WorkspaceError(f"{what} name {value!r}: use 1-64 lowercase letters, digits, '-' or '_', "
                             "starting with a letter or digit (no paths, no dots)")
    return value


def _file_name(value: Any, suffix: str) -> str:
    """`name` or `name<suffix>` → the checked file name `name<suffix>`."""
    if isinstance(value, str) and not value.endswith(suffix):
        value = value + suffix
    problem = _file_name_problem(value, suffix) if isinstance(value, str) else "give a name"
    if problem:
        raise WorkspaceError(problem)
    name: str = value  # a str: anything else is a problem above
    return name


def _atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
