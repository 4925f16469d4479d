"""Crucible's own copy of an imported folder, and the files of a workspace nothing of Crucible reads.

Import never writes into the user's folder: `workspace_copy` copies it (its git history too)
into the data dir, and everything after (manifest inferred for a folder without one, `evo-0`,
cycles, rollbacks) happens in the copy. `workspace_copy_problem` says, from lstat alone, why a
folder is too big to copy before a byte is written. `workspace_unused` lists the files no reader
of Crucible reads, each with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

import yaml
from dulwich.config import ConfigFile

from evolve_app.workspace.validation import (
    DRAFTS_DIR,
    EXCLUDED_DIR,
    MAX_WORKSPACE_BYTES,
    Problem,
    _mib,
    _plain_dir,
    _plain_file,
    _root,
)

# The copy holds the workspace's files (MAX_WORKSPACE_BYTES) and its git history: both together
# stay under these, counted from lstat before anything is copied.
MAX_COPY_BYTES = 4 * MAX_WORKSPACE_BYTES
MAX_COPY_FILES = 20_000
MAX_UNUSED_LISTED = 200  # warnings past this are one line saying how many more
_SLUG = re.compile(r"[^a-z0-9_-]+")


def workspace_copy_problem(source: str | Path) -> str | None:
    """Why the folder cannot be copied (more than MAX_COPY_FILES entries or MAX_COPY_BYTES,
    .git and all; a symlink inside .git, which would let the copy write into another
    repository), or None. evolution/ is not copied, so not counted. Sizes come from lstat; the
    walk stops as soon as a limit is passed, so a huge folder is refused quickly."""
    root = _root(source)
    files = total = 0
    for top, dirs, names in os.walk(root, followlinks=False):
        rel_top = Path(top).relative_to(root).as_posix()
        if rel_top == ".":
            dirs[:] = [d for d in dirs if d != EXCLUDED_DIR]
        in_git = rel_top == ".git" or rel_top.startswith(".git/")
        for name in (*dirs, *names):
            path = Path(top) / name
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if in_git and stat.S_ISLNK(info.st_mode):
                return (f"{path.relative_to(root).as_posix()} is a symlink inside .git: Crucible copies a "
                        "repository only when all of it is inside the folder")
            files += 1
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
            if files > MAX_COPY_FILES:
                return (f"the folder holds more than {MAX_COPY_FILES:,} files and folders (.git included, "
                        f"evolution/ not), over the limit of {MAX_COPY_FILES:,} for Crucible's copy "
                        "(MAX_COPY_FILES); a workspace holds prompts, skills and memory, not data")
            if total > MAX_COPY_BYTES:
                return (f"the folder's files add up to more than {_mib(MAX_COPY_BYTES)} (.git included, "
                        f"evolution/ not), over the limit of {_mib(MAX_COPY_BYTES)} for Crucible's copy "
                        "(MAX_COPY_BYTES); a workspace holds prompts, skills and memory, not data")
    return None


def workspace_copy(source: str | Path, target: str | Path) -> list[Problem]:
    """Copy the folder `source` into the empty folder `target`: every file (modes kept, symlinks
    as symlinks, for the import to refuse) and its git history when `.git` is a folder of its
    own, so tags such as `evo-3` come along. evolution/ (an earlier run's observations) is left
    out. Returns notes on what was not copied; the source is only read."""
    root, destination = _root(source), Path(target)
    notes: list[Problem] = []
    git = root / ".git"
    if os.path.lexists(git) and not _plain_dir(git):
        notes.append(Problem(".git", None, None, "a link to a repository elsewhere (a git worktree or "
                             "submodule), not copied: Crucible's copy starts its own history at evo-0"))
    if os.path.lexists(root / EXCLUDED_DIR):
        notes.append(Problem(f"{EXCLUDED_DIR}/", None, None, "an earlier run's observations: not copied; "
                             "Crucible's runs write their own evolution/ in its copy"))

    def ignore(folder: str, names: list[str]) -> set[str]:
        if Path(folder) != root:
            return set()
        skipped = {EXCLUDED_DIR} & set(names)
        if ".git" in names and not _plain_dir(git):
            skipped.add(".git")
        return skipped

    shutil.copytree(root, destination, symlinks=True, ignore=ignore, dirs_exist_ok=True)
    config = destination / ".git" / "config"
    if _plain_file(config):
        notes += _config_unbind(config)
    return notes


def _config_unbind(path: Path) -> list[Problem]:
    """Drop the copied repository's `core.worktree` (it would point git at the user's folder)."""
    try:
        config = ConfigFile.from_path(str(path))
        section = config[(b"core",)]
        if b"worktree" not in section:
            return []
        del section[b"worktree"]
        config.write_to_path(str(path))
    except (KeyError, OSError, ValueError):
        return []
    return [Problem(".git/config", None, None, "core.worktree named another folder: the copy's git "
                    "works on the copy only")]


def copy_slug(source: str | Path) -> str:
    """The copy's folder name stem: the source folder's name, lowercased, safe as a path part."""
    slug = _SLUG.sub("-", Path(source).name.lower()).strip("-_")[:40]
    return slug or "agent"


# ----------------------------------------------------------------------------------------- unused

_READ = ("Crucible reads manifest.yaml, prompts/, skills/<name>/ (each with its SKILL.md), "
         "memory/<category>.jsonl, tools/registry.yaml and the tools it names")
_REPORT = re.compile(r"(^|[/_.-])(reports?|results?|logs?|outputs?|metrics|scores?|summary|eval(uation)?s?)"
                     r"([/_.-]|$)", re.IGNORECASE)
_GIT_FILES = {".gitignore", ".gitattributes"}


def _registry_files(root: Path) -> set[str]:
    """The files tools/registry.yaml names (tools/<name>.py, or an A-Evolve entry's `file:`)."""
    path = root / "tools" / "registry.yaml"
    if not _plain_file(path):
        return set()
    try:
        data = yaml.safe_load(path.read_bytes()[: 256 * 1024])
    except (yaml.YAMLError, OSError, ValueError):
        return set()
    named: set[str] = set()
    for entry in (data.get("tools") if isinstance(data, dict) else None) or []:
        if isinstance(entry, dict):
            if isinstance(entry.get("name"), str):
                named.add(f"tools/{entry['name'].strip().removesuffix('.py')}.py")
            if isinstance(entry.get("file"), str):
                named.add(f"tools/{entry['file'].strip()}")
    return named


def _skill_folders(root: Path) -> set[str]:
    skills = root / "skills"
    if not _plain_dir(skills):
        return set()
    return {entry.name for entry in skills.iterdir()
            if not entry.name.startswith("_") and _plain_dir(entry) and _plain_file(entry / "SKILL.md")}


def _used(rel: str, skills: set[str], tools: set[str]) -> bool:
    parts = rel.split("/")
    top = parts[0]
    if rel in ("manifest.yaml", *_GIT_FILES) or top == "prompts":
        return True
    if top == "skills" and len(parts) >= 3:
        return parts[1] in skills or (parts[1] == DRAFTS_DIR and len(parts) == 3 and rel.endswith(".md"))
    if top == "memory":
        return len(parts) == 2 and rel.endswith(".jsonl")
    if top == "tools":
        return rel == "tools/registry.yaml" or rel in tools
    return False


def _reason(rel: str, *, prompt_from: str | None, layers: Sequence[str]) -> str:
    """Why Crucible does not read this file: specific for the kinds A-Evolve's folders ship."""
    parts = rel.split("/")
    name, top = parts[-1], parts[0]
    evolved = top in layers
    kept = ("kept in Crucible's copy, which engines may change" if evolved
            else "kept in Crucible's copy as it is; no engine changes it")
    if rel == prompt_from:
        return ("the system prompt the import copied to prompts/system.md, which is what the agent reads "
                "and engines change; this file stays as it was, unread")
    if top == ".claude" and len(parts) > 2 and parts[1] == "skills":
        return ("a Claude Code skill folder (.claude/skills/): Crucible reads skills/<name>/SKILL.md only, "
                f"so the agent never sees this skill; move its folder to skills/{parts[2]}/ to use it")
    if top in (".claude", ".codex", ".cursor", ".aider") or name in ("CLAUDE.local.md", ".mcp.json"):
        return f"a coding assistant's own settings ({top}/): no part of Crucible reads them; {kept}"
    if rel == "harness.py" or (len(parts) == 1 and name.startswith("harness") and name.endswith(".py")):
        return ("an A-Evolve agent's own harness (the program that ran it under A-Evolve): Crucible runs the "
                "workspace with its own agent and never runs this file; " + kept)
    if top == "tools" and len(parts) == 2 and name.endswith((".yaml", ".yml")):
        return ("a tool role file: A-Evolve's arc-mas seed lists in tools/<role>.yaml the tools each "
                "subagent role (solver, explorer …) may call; Crucible's tool registry reads "
                "tools/registry.yaml only, so these roles and their tools are not offered; " + kept)
    if top == "tools":
        return ("a file tools/registry.yaml does not name: no agent is offered it (add an entry with its "
                "name to offer it); " + kept)
    if top == "skills":
        return ("not inside a skill folder: Crucible reads skills/<name>/SKILL.md and that skill's folder "
                "only (a skill nested deeper, or a folder without SKILL.md, is not read); " + kept)
    if top == "memory":
        return ("memory/ holds <category>.jsonl files (one JSON object a line); the agent never reads this "
                "one; " + kept)
    if _REPORT.search(rel):
        return "a report or results of an earlier run: no part of Crucible reads it; " + kept
    if "__pycache__" in parts or name.endswith((".pyc", ".pyo")):
        return "Python's compiled cache: no part of Crucible reads it; " + kept
    if name.endswith(".py"):
        return ("Python code: Crucible's reference agent runs no program of the workspace except the tools "
                "tools/registry.yaml names; " + kept)
    if name.upper().startswith(("README", "LICENSE", "CHANGELOG", "NOTES")):
        return "documentation for people: no part of Crucible reads it; " + kept
    return f"no part of Crucible reads it ({_READ}); {kept}"


def workspace_unused(path: str | Path, *, layers: Sequence[str], prompt_from: str | None = None
                     ) -> list[Problem]:
    """Each file of the workspace that no reader of Crucible reads, with the reason (the rule:
    manifest.yaml, prompts/, skills/<name>/ holding a SKILL.md, skills/_drafts/*.md,
    memory/*.jsonl, tools/registry.yaml and the files it names, .gitignore/.gitattributes are
    read; every other file is not). `layers` are the manifest's evolvable layers; `prompt_from`
    the file an inferred manifest's import copied to prompts/system.md. Files past
    MAX_UNUSED_LISTED are one last entry saying how many."""
    root = _root(path)
    skills, tools = _skill_folders(root), _registry_files(root)
    unused: list[Problem] = []
    extra = 0
    for top, dirs, names in os.walk(root, followlinks=False):
        rel_top = Path(top).relative_to(root).as_posix()
        prefix = "" if rel_top == "." else rel_top + "/"
        dirs[:] = sorted(d for d in dirs if d != ".git" and not (not prefix and d == EXCLUDED_DIR))
        for name in sorted(names):
            rel = prefix + name
            if name == ".git" or _used(rel, skills, tools):
                continue
            if len(unused) >= MAX_UNUSED_LISTED:
                extra += 1
                continue
            unused.append(Problem(rel, None, None, "not used: " + _reason(rel, prompt_from=prompt_from,
                                                                          layers=layers)))
    if extra:
        unused.append(Problem(".", None, None, f"and {extra:,} more files no part of Crucible reads"))
    return unused
