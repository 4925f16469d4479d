"""A workspace's checks: the manifest, skills, memory, the tool registry, names and size limits,
each problem with its file and line; and the manifest inferred for a folder without one."""

from __future__ import annotations

import difflib
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

CONTRACT_VERSION: Final = "1"
LAYERS = ("prompts", "skills", "memory", "tools")
DEFAULT_AUTHOR = "Crucible <crucible@localhost>"
EXCLUDED_DIR = "evolution"  # observation batches etc.: on disk, never in the workspace's history
DRAFTS_DIR = "_drafts"

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_CONTRACT_SPELLINGS = {"1", "1.0"}  # A-Evolve's seeds write "1.0"
_OPTIONAL_KEYS = ("name", "version", "contract_version")
_MAX_YAML_BYTES = 256 * 1024
_MAX_YAML_NODES = 20_000  # an alias "billion laughs" stops here instead of exhausting memory
_GITLINK = 0o160000
# Size limits (import, engines and pages): a workspace is prompts, skills and memory, not data.
MAX_FILE_BYTES = 4 * 1024 * 1024  # any one file
MAX_WORKSPACE_BYTES = 64 * 1024 * 1024  # all files outside evolution/
MAX_MEMORY_LINES = 100_000  # one memory/<category>.jsonl
PAGE_FILE_CHARS = 200_000  # what a page shows of a file before it offers the download


class WorkspaceError(ValueError):
    """A workspace, name or git problem, with a message a person can act on."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a workspace: the file (relative, '/'-separated), 1-based line and
    column when known, and what to do about it."""

    path: str
    line: int | None
    column: int | None
    message: str

    def __str__(self) -> str:
        where = self.path + "".join(f":{n}" for n in (self.line, self.column) if n is not None)
        return f"{where}: {self.message}"


class WorkspaceInvalid(WorkspaceError):
    """The workspace has problems; `problems` lists every one of them."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        shown = "; ".join(str(problem) for problem in self.problems[:5])
        more = f" (and {len(self.problems) - 5} more)" if len(self.problems) > 5 else ""
        super().__init__(f"the workspace has {len(self.problems)} problem(s): {shown}{more}")


# ------------------------------------------------------------------------------------------ manifest


class AgentSection(BaseModel):
    """`agent:` names the agent (`type`, `entrypoint`) and carries its own settings: a command
    agent's `command` or program path, a reference agent's `preset`, `model` and `effort`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    type: str = Field(default="reference", min_length=1)
    entrypoint: str | None = Field(default=None, min_length=1, max_length=500)
    command: str | None = Field(default=None, max_length=2000)
    preset: str | None = Field(default=None, max_length=40)
    model: str | None = Field(default=None, max_length=200)
    effort: Literal["off", "low", "medium", "high", "max"] | None = None
    timeout_seconds: int | float | None = Field(default=None, gt=0, le=3600)

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, value: str | None, info: ValidationInfo) -> str | None:
        # A command agent may name a program in the workspace; every other type a Python class.
        if value is not None and info.data.get("type") != "command" and not _DOTTED.fullmatch(value):
            raise ValueError(f"{value!r} is not a dotted Python path such as package.module.AgentClass")
        return value


class Manifest(BaseModel):
    """manifest.yaml, parsed. `absent` names the optional keys the file leaves out (their
    defaults apply): name (the folder's name), version ("0.0.0"), contract_version ("1").
    `extra` keeps the keys Crucible does not know, as written (`description`, `agent.foo`):
    A-Evolve ignores them, so they are warnings, never errors."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: str = Field(min_length=1, max_length=200)
    version: str = Field(default="0.0.0", min_length=1, max_length=100)
    contract_version: Literal["1"] = CONTRACT_VERSION
    agent: AgentSection
    evolvable_layers: list[Literal["prompts", "skills", "memory", "tools"]]
    reload_strategy: Literal["hot", "cold"]
    absent: tuple[str, ...] = ()
    extra: dict[str, Any] = Field(default_factory=dict)


# The keys a manifest may hold: the models' own fields (not what parsing adds).
_MANIFEST_KEYS = tuple(name for name in Manifest.model_fields if name not in ("absent", "extra"))
_AGENT_KEYS = tuple(AgentSection.model_fields)


def workspace_manifest(path: str | Path) -> Manifest:
    """The parsed manifest; WorkspaceInvalid lists every manifest problem."""
    root = _root(path)
    manifest, problems, _ = _manifest_check(root)
    if problems or manifest is None:
        raise WorkspaceInvalid(problems)
    return manifest


def manifest_warnings(path: str | Path) -> list[Problem]:
    """What in manifest.yaml Crucible keeps but does not use (unknown keys), each at its line,
    with a "did you mean" when a known key is close. Never a reason to refuse the workspace."""
    return _sorted(_manifest_check(_root(path))[2])


def _manifest_check(root: Path, text: str | None = None
                    ) -> tuple[Manifest | None, list[Problem], list[Problem]]:
    """(manifest, problems, warnings) of root/manifest.yaml, or of `text` as that file."""
    rel = "manifest.yaml"
    problems: list[Problem] = []
    warnings: list[Problem] = []
    if text is None:
        if not _safe_file(root, rel):
            return None, [Problem(rel, None, None, "missing: every workspace has a manifest.yaml with agent "
                                  "(type, entrypoint), evolvable_layers and reload_strategy")], []
        text = _text_read(root, rel, problems, limit=_MAX_YAML_BYTES)
        if text is None:
            return None, problems, []
    elif len(text.encode("utf-8", "surrogatepass")) > _MAX_YAML_BYTES:
        return None, [Problem(rel, None, None, f"larger than {_MAX_YAML_BYTES // 1024} KiB")], []
    parsed = _yaml_parse(text.removeprefix("\ufeff"), rel, problems)
    if parsed is None:
        if not problems:
            problems.append(Problem(rel, 1, None, "empty: give agent, evolvable_layers and reload_strategy"))
        return None, problems, []
    node, data, marks = parsed
    if not isinstance(node, MappingNode) or not isinstance(data, dict):
        problems.append(Problem(rel, node.start_mark.line + 1, node.start_mark.column + 1,
                                "the manifest must be a mapping of keys (agent:, evolvable_layers: ...)"))
        return None, problems, []

    def line_of(loc: _KeyPath, *, key: bool = False) -> tuple[int | None, int | None]:
        mark = marks.get(loc)
        if mark is None:
            return (1, None) if not loc else line_of(loc[:-1], key=True)
        chosen = mark[0] if key else mark[1]
        return chosen.line + 1, chosen.column + 1

    data = dict(data)
    extra: dict[str, Any] = {}
    near_misses: _NearMisses = {}  # a known key left out -> (line, column, the key that may mean it)
    for parent, known in (((), _MANIFEST_KEYS), (("agent",), _AGENT_KEYS)):
        section = data if not parent else data.get("agent")
        if not isinstance(section, dict):
            continue
        section = dict(section) if parent else data
        for key in list(section):
            if key in known:
                continue
            line, column = line_of((*parent, key), key=True)
            where = ".".join(str(part) for part in parent) or "the manifest"
            hint = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            suggestion = f"; did you mean '{hint[0]}'?" if hint else f" (known keys: {', '.join(known)})"
            warnings.append(Problem(rel, line, column, f"unknown key '{key}' in {where}, kept but not used "
                                    f"by Crucible{suggestion}"))
            if hint and hint[0] not in section:
                near_misses[".".join(map(str, (*parent, hint[0])))] = (line, column, key)
            extra[".".join(map(str, (*parent, key)))] = section.pop(key)
        if parent:
            data["agent"] = section

    for key in ("name", "version", "contract_version"):  # `version: 1.10` is text, not the float 1.1
        node_value = _mapping_value(node, key)
        if isinstance(node_value, ScalarNode) and isinstance(data.get(key), int | float) \
                and not isinstance(data.get(key), bool):
            data[key] = node_value.value
    if "contract_version" in data:
        value = data["contract_version"]
        if isinstance(value, str) and value.strip() in _CONTRACT_SPELLINGS:
            data["contract_version"] = CONTRACT_VERSION
        elif isinstance(value, str) and re.fullmatch(r"1\.\d+", value.strip()):
            # A later minor version of contract 1 (A-Evolve does not check it): read as 1, said.
            line, column = line_of(("contract_version",))
            warnings.append(Problem(rel, line, column, f"contract_version {value!r} is read as contract "
                                    "version 1, the one this Crucible knows"))
            data["contract_version"] = CONTRACT_VERSION
        else:
            line, column = line_of(("contract_version",))
            problems.append(Problem(rel, line, column, f"contract_version {value!r} is not supported; this "
                                    "Crucible reads contract version 1 (write \"1\")"))
            del data["contract_version"]
    absent = tuple(key for key in _OPTIONAL_KEYS if key not in data)
    absent += _a_evolve_defaults(data, rel, line_of, near_misses, warnings)
    data.setdefault("name", root.name)
    data["absent"] = absent
    data["extra"] = extra

    layers = data.get("evolvable_layers")
    if isinstance(layers, list):
        seen: set[str | None] = set()
        for index, layer in enumerate(layers):
            if isinstance(layer, str) and layer in seen:
                line, column = line_of(("evolvable_layers", index))
                problems.append(Problem(rel, line, column, f"evolvable_layers: '{layer}' is listed twice"))
            seen.add(layer if isinstance(layer, str) else None)

    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as error:
        for detail in error.errors(include_url=False):
            loc = tuple(detail["loc"])
            line, column = line_of(loc, key=detail["type"] == "missing")
            message = _pydantic_message(detail)
            missed = near_misses.get(".".join(map(str, loc)))
            if detail["type"] == "missing" and missed:  # reported where the misspelling is
                line, column, key = missed
                message += f"; '{key}' on line {line} looks like a misspelling of it"
            problems.append(Problem(rel, line, column, message))
        manifest = None
    return (manifest if not problems else None), problems, warnings


# What A-Evolve's Manifest.from_yaml assumes when a key is left out; Crucible does the same and says so.
A_EVOLVE_DEFAULTS = {"evolvable_layers": ["prompts", "skills", "memory"], "reload_strategy": "hot"}


def _a_evolve_defaults(data: dict[str, Any], rel: str, line_of: Any, near_misses: _NearMisses,
                       warnings: list[Problem]) -> tuple[str, ...]:
    """Fill in, with a warning each, what A-Evolve defaults: `agent` and `agent.type` (reference),
    evolvable_layers and reload_strategy; drop (with a warning) layers Crucible does not evolve.
    A key a near-miss spelling may mean stays missing, so the misspelling is reported instead.
    Returns the keys filled in."""
    filled: list[str] = []
    for key, value in A_EVOLVE_DEFAULTS.items():
        if key not in data and key not in near_misses:
            data[key] = list(value) if isinstance(value, list) else value
            shown = ", ".join(value) if isinstance(value, list) else value
            warnings.append(Problem(rel, 1, None, f"no {key}: A-Evolve's default applies ({shown})"))
            filled.append(key)
    if "agent" not in data and "agent" not in near_misses:
        data["agent"] = {"type": "reference"}
        warnings.append(Problem(rel, 1, None, "no agent: A-Evolve's default applies (type reference: "
                                "Crucible's reference agent over the workspace's files)"))
        filled.append("agent")
    elif isinstance(data.get("agent"), dict) and "type" not in data["agent"] \
            and "agent.type" not in near_misses:
        line, column = line_of(("agent",), key=True)
        warnings.append(Problem(rel, line, column, "no agent.type: A-Evolve's default applies (reference)"))
        filled.append("agent.type")
    layers = data.get("evolvable_layers")
    if isinstance(layers, list):
        kept = []
        for index, layer in enumerate(layers):
            # A near miss of a layer is a typo, refused with its suggestion; another name is
            # a folder of the workspace's own that A-Evolve would list without evolving it.
            if isinstance(layer, str) and layer not in LAYERS \
                    and not difflib.get_close_matches(layer, LAYERS, n=1, cutoff=0.6):
                line, column = line_of(("evolvable_layers", index))
                warnings.append(Problem(rel, line, column, f"evolvable_layers: '{layer}' is not a layer "
                                        f"Crucible evolves ({', '.join(LAYERS)}); no engine may change it"))
            else:
                kept.append(layer)
        data["evolvable_layers"] = kept
    return tuple(filled)


def _pydantic_message(detail: ErrorDetails) -> str:
    loc = tuple(detail["loc"])
    dotted = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
    kind, value = detail["type"], detail.get("input")
    if kind == "missing":
        parent = ".".join(str(part) for part in loc[:-1])
        hints = {"entrypoint": " (the dotted Python path of the agent class)",
                 "type": " (e.g. reference)", "evolvable_layers": f" (a list from {', '.join(LAYERS)})",
                 "reload_strategy": " (hot or cold)", "agent": " (a mapping with type and entrypoint)"}
        return (f"missing required key '{loc[-1]}'" + (f" under '{parent}'" if parent else "")
                + hints.get(str(loc[-1]), ""))
    if kind == "literal_error":
        choices = LAYERS if loc[0] == "evolvable_layers" else ("hot", "cold")
        hint = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
        return (f"{dotted}: {value!r} is not allowed; use one of {', '.join(choices)}"
                + (f" (did you mean '{hint[0]}'?)" if hint else ""))
    expected = {"string_type": "a string", "list_type": "a list", "model_type": "a mapping",
                "model_attributes_type": "a mapping", "dict_type": "a mapping"}.get(kind)
    if expected:
        return f"{dotted}: expected {expected}, got {_kind_of(value)}"
    if kind == "value_error":
        return f"{dotted}: {str(detail['msg']).removeprefix('Value error, ')}"
    return f"{dotted}: {detail['msg']}"


def _kind_of(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({value!r})"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


# ------------------------------------------------------------------------------------------ YAML


def _yaml_parse(text: str, rel: str, problems: list[Problem], line_offset: int = 0
                ) -> tuple[Node, Any, _Marks] | None:
    """Compose and construct one YAML document. Returns (root node, data, marks) where marks maps
    a key path to (key mark, value mark); None when empty or on error (problems get the reason)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        marks: _Marks = {}
        if not _nodes_index(node, (), marks, [0], rel, problems, line_offset):
            return None
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as error:
        mark, reason = _yaml_error_where(error, line_offset)
        problems.append(Problem(rel, mark.line + 1 + line_offset if mark else None,
                                mark.column + 1 if mark else None, f"YAML syntax error: {reason}"))
        return None
    except yaml.YAMLError as error:
        problems.append(Problem(rel, None, None, f"YAML error: {error}"))
        return None
    except RecursionError:
        problems.append(Problem(rel, None, None, "YAML is nested too deeply"))
        return None
    finally:
        loader.dispose()
    return node, data, marks


# The constructs whose error PyYAML reports where it gave up (often the next line) although
# the problem starts where they open: an unclosed `[`, `{` or quote, a key without its `:` ...
_OPENING_CONTEXTS = {"while parsing a flow sequence": "in the '[' … ']' list that starts here",
                     "while parsing a flow mapping": "in the '{' … '}' mapping that starts here",
                     "while scanning a quoted scalar": "in the quoted text that starts here",
                     "while scanning a block scalar": "in the block text that starts here",
                     "while scanning a simple key": "in the key that starts here",
                     "while scanning an anchor": "in the anchor that starts here",
                     "while scanning an alias": "in the alias that starts here",
                     "while scanning a tag": "in the tag that starts here",
                     "while parsing a tag": "in the tag that starts here",
                     "while scanning a directive": "in the directive that starts here"}


def _yaml_error_where(error: yaml.MarkedYAMLError, line_offset: int) -> tuple[Any, str]:
    """(the mark to report, the reason) of a YAML error: where the construct that failed opens
    when it is one of _OPENING_CONTEXTS (the reason then says where PyYAML gave up), else where
    PyYAML found the problem."""
    problem, context = error.problem_mark, error.context_mark
    opening = _OPENING_CONTEXTS.get(str(error.context or ""))
    if opening and context is not None and (problem is None or context.line <= problem.line):
        found = (f" at line {problem.line + 1 + line_offset}, column {problem.column + 1}"
                 if problem is not None else "")
        return context, f"{opening}: {error.problem or 'invalid YAML'}{found}"
    reason = " ".join(part for part in (error.context, error.problem) if part) or "invalid YAML"
    return problem or context, reason


def _nodes_index(node: Node, prefix: _KeyPath, marks: _Marks, count: list[int], rel: str,
                 problems: list[Problem], line_offset: int) -> bool:
    count[0] += 1
    if count[0] > _MAX_YAML_NODES:
        problems.append(Problem(rel, None, None, f"more than {_MAX_YAML_NODES} YAML nodes (counting "
                                "aliases); refusing to read it"))
        return False
    if isinstance(node, MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, ScalarNode) else None
            if key is not None and key in seen:
                problems.append(Problem(rel, key_node.start_mark.line + 1 + line_offset,
                                        key_node.start_mark.column + 1,
                                        f"key '{key}' appears twice (first on line {seen[key]})"))
            elif key is not None:
                seen[key] = key_node.start_mark.line + 1 + line_offset
            loc = (*prefix, key)
            marks.setdefault(loc, (_shift(key_node.start_mark, line_offset),
                                   _shift(value_node.start_mark, line_offset)))
            if not _nodes_index(value_node, loc, marks, count, rel, problems, line_offset):
                return False
    elif isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            mark = _shift(item.start_mark, line_offset)
            marks.setdefault((*prefix, index), (mark, mark))
            if not _nodes_index(item, (*prefix, index), marks, count, rel, problems, line_offset):
                return False
    return True


@dataclass(frozen=True)
class _Mark:
    line: int  # 0-based, as yaml's marks
    column: int


_KeyPath = tuple[str | int | None, ...]  # keys and list indexes from the document's root
_Marks = dict[_KeyPath, tuple[_Mark, _Mark]]  # a key path -> (its key's mark, its value's mark)
_NearMisses = dict[str, tuple[int | None, int | None, str]]  # a key left out -> (line, column, lookalike)


def _shift(mark: Any, line_offset: int) -> _Mark:
    return _Mark(mark.line + line_offset, mark.column)


def _mapping_value(node: Node, key: str) -> Node | None:
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode) and key_node.value == key:
                found: Node = value_node
                return found
    return None


# -------------------------------------------------------------------------------------- front matter


def skill_front_matter(text: str, folder: str | None = None
                       ) -> tuple[dict[str, Any] | None, list[tuple[int | None, int | None, str]]]:
    """A SKILL.md's front matter and its problems as (line, column, message).

    The file starts with a `---` line, then YAML with `name` (the skill folder's name) and a
    non-empty `description`, then a `---` line. Other keys are kept as they are.
    """
    issues: list[tuple[int | None, int | None, str]] = []
    lines = text.removeprefix("\ufeff").split("\n")
    if not lines or lines[0].rstrip() != "---":
        return None, [(1, 1, "no front matter: start SKILL.md with a '---' line, then 'name:' and "
                       "'description:', then another '---' line")]
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() in ("---", "...")), None)
    if end is None:
        return None, [(1, 1, "the front matter is not closed: add a '---' line after it")]
    block = "\n".join(lines[1:end])
    problems: list[Problem] = []
    parsed = _yaml_parse(block, "", problems, line_offset=1)
    issues.extend((p.line, p.column, p.message) for p in problems)
    if parsed is None:
        if not problems:
            issues.append((1, 1, "the front matter is empty: give 'name:' and 'description:'"))
        return None, issues
    _, data, marks = parsed
    if not isinstance(data, dict):
        return None, [*issues, (2, 1, "the front matter must be a mapping with 'name:' and 'description:'")]

    def at(key: str) -> tuple[int, int]:
        mark = marks.get((key,))
        return (mark[1].line + 1, mark[1].column + 1) if mark else (1, 1)

    name = data.get("name")
    if "name" not in data:
        issues.append((1, 1, "the front matter has no 'name:'"))
    elif not isinstance(name, str) or not _NAME.fullmatch(name):
        issues.append((*at("name"), f"name {name!r}: use 1-64 lowercase letters, digits, '-' or '_', "
                       "starting with a letter or digit"))
    elif folder is not None and name != folder:
        issues.append((*at("name"), f"name '{name}' differs from its folder skills/{folder}/; "
                       "they must be the same"))
    description = data.get("description")
    if "description" not in data:
        issues.append((1, 1, "the front matter has no 'description:'"))
    elif not isinstance(description, str) or not description.strip():
        issues.append((*at("description"), "description: give one line saying when to use the skill"))
    return data, issues


# ---------------------------------------------------------------------------------------- validation


def workspace_validate(path: str | Path) -> list[Problem]:
    """Every problem of the workspace at `path`, each with its file and (when known) line.

    An empty list means the workspace can be imported. Absent optional manifest keys (name,
    version, contract_version) are not problems: `Manifest.absent` records them; unknown keys
    are warnings (`workspace_check`).
    """
    return workspace_check(path)[0]


def workspace_check(path: str | Path, *, manifest_text: str | None = None
                    ) -> tuple[list[Problem], list[Problem]]:
    """(problems, warnings) of the workspace at `path`: problems refuse an import, warnings
    (unknown manifest keys) do not.

    With `manifest_text`, the folder is checked as a confirmed import preview would leave it
    (`workspace_preview`): that text as manifest.yaml, and its prompt copied to (or a short one
    written as) prompts/system.md; nothing is written. The folder must then have no manifest."""
    root = _root(path)
    overlay: dict[str, bytes] = {}
    problems: list[Problem] = []
    if manifest_text is not None:
        if os.path.lexists(root / "manifest.yaml"):
            return [Problem("manifest.yaml", None, None, "the folder has its own manifest.yaml; import it "
                            "as it is (edit that file to change it)")], []
        preview = _infer(root)
        problems.extend(preview.problems)
        overlay["manifest.yaml"] = manifest_text.encode("utf-8", "surrogateescape")
        if preview.prompt is not None:
            overlay["prompts/system.md"] = preview.prompt
    found, warnings = _validate(root, overlay, manifest_text)
    return _sorted(problems + found), warnings


def _sorted(problems: list[Problem]) -> list[Problem]:
    unique = dict.fromkeys(problems)  # a file too big is found by the size walk and by its reader
    return sorted(unique, key=lambda p: (p.path, p.line or 0, p.column or 0, p.message))


def _validate(root: Path, overlay: dict[str, bytes], manifest_text: str | None
              ) -> tuple[list[Problem], list[Problem]]:
    _, problems, warnings = _manifest_check(root, manifest_text)
    warnings = _sorted(warnings)
    problems.extend(_size_problems(root, sum(len(data) for data in overlay.values())))
    if "prompts/system.md" in overlay:
        if os.path.lexists(root / "prompts") and not _plain_dir(root / "prompts"):
            problems.append(Problem("prompts", None, None, "not a folder, so prompts/system.md cannot be "
                                    "written"))
    elif not _safe_file(root, "prompts/system.md"):
        problems.append(Problem("prompts/system.md", None, None, "missing: the system prompt is required"))
    else:
        _text_read(root, "prompts/system.md", problems)
    for rel in _dir_files(root, "prompts/fragments"):
        if name_problem := _file_name_problem(Path(rel).name, ".md"):
            problems.append(Problem(rel, None, None, name_problem))
        else:
            _text_read(root, rel, problems)
    _skills_check(root, problems)
    _memory_check(root, problems)
    _tools_check(root, problems)
    return _sorted(problems), warnings


# ------------------------------------------------------------------------------------------ sizes


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 1024:.1f} KiB" if size >= 1024 \
        else f"{size} bytes"


def _too_big(size: int) -> str:
    return (f"{_mib(size)}, over the limit of {_mib(MAX_FILE_BYTES)} per file (MAX_FILE_BYTES); a "
            "workspace holds prompts, skills and memory, not data")


def _file_problem(info: os.stat_result) -> str | None:
    if stat.S_ISLNK(info.st_mode):
        return "a symlink; a workspace holds plain files only"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file (a fifo, socket or device); a workspace holds plain files only"
    if info.st_size > MAX_FILE_BYTES:
        return _too_big(info.st_size)
    return None


def _lines_count(path: Path) -> int:
    """Lines in a file (a last line without a newline counts), read in chunks."""
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


def _memory_lines_problem(lines: int) -> str | None:
    if lines > MAX_MEMORY_LINES:
        return (f"{lines:,} lines, over the limit of {MAX_MEMORY_LINES:,} lines per memory file "
                "(MAX_MEMORY_LINES); summarise or split it")
    return None


def layer_file_problem(root: str | Path, rel: str) -> str | None:
    """Why the file at `rel` (relative, '/'-separated) may not be in the workspace at `root`, or
    None when it may (or when nothing is there: a deletion is not this check's business).

    Refused: a path that leaves the workspace, names .git, or runs through a symlink; a symlink;
    anything but a regular file (fifo, socket, device, folder); a file over MAX_FILE_BYTES; a
    memory/*.jsonl over MAX_MEMORY_LINES lines. Sizes come from lstat before anything is read;
    only a memory file (then at most MAX_FILE_BYTES) is read, to count its lines. The loop
    calls it for each path an engine's step changed, and reverts the ones it refuses."""
    base = _root(root)
    parts = rel.split("/") if isinstance(rel, str) else [""]
    if any(part in ("", ".", "..") or part.lower() == ".git" or "\0" in part for part in parts):
        return "not a relative path inside the workspace"
    path = base
    for index, part in enumerate(parts):
        path = path / part
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as error:
            return f"cannot be read ({error.strerror})"
        if index < len(parts) - 1:
            if stat.S_ISLNK(info.st_mode):
                return f"{'/'.join(parts[:index + 1])} is a symlink; a workspace holds plain files only"
            if not stat.S_ISDIR(info.st_mode):
                return None
    problem = _file_problem(info)
    if problem is None and parts[0] == "memory" and rel.endswith(".jsonl"):
        problem = _memory_lines_problem(_lines_count(path))
    return problem


def workspace_size_problem(root: str | Path) -> str | None:
    """Why the workspace is too big as a whole (its files outside evolution/ and .git over
    MAX_WORKSPACE_BYTES, the largest named), or None. Sizes from lstat; nothing is read."""
    problems = [p for p in _size_problems(_root(root)) if p.path == "."]
    return problems[0].message if problems else None


def _size_problems(root: Path, extra_bytes: int = 0) -> list[Problem]:
    """Each symlink, special file and file over MAX_FILE_BYTES, and the whole workspace (path
    ".") when its files (not evolution/, not .git) add up to more than MAX_WORKSPACE_BYTES."""
    problems: list[Problem] = []
    total, sizes = extra_bytes, []
    for rel in _tree_files(root):
        try:
            info = os.lstat(root / rel)
        except OSError:
            continue
        problem = _file_problem(info)
        if problem:
            problems.append(Problem(rel, None, None, problem))
        if stat.S_ISREG(info.st_mode):
            total += info.st_size
            sizes.append((info.st_size, rel))
    if total > MAX_WORKSPACE_BYTES:
        largest = ", ".join(f"{rel} ({_mib(size)})" for size, rel in sorted(sizes, reverse=True)[:3])
        problems.append(Problem(".", None, None, f"the workspace's files add up to {_mib(total)} (evolution/ "
                                f"and .git not counted), over the limit of {_mib(MAX_WORKSPACE_BYTES)} "
                                f"(MAX_WORKSPACE_BYTES); the largest: {largest}"))
    return problems


def _skills_check(root: Path, problems: list[Problem]) -> None:
    skills = root / "skills"
    if not skills.is_dir() or skills.is_symlink():
        return
    for folder in sorted(skills.iterdir()):
        if folder.name.startswith("_") or not folder.is_dir() or folder.is_symlink():
            continue
        skill = folder / "SKILL.md"
        rel = f"skills/{folder.name}/SKILL.md"
        if not _plain_file(skill):
            continue  # upstream skips folders without SKILL.md (e.g. grouping folders)
        if not _NAME.fullmatch(folder.name):
            problems.append(Problem(rel, None, None, f"skill folder '{folder.name}': use 1-64 lowercase "
                                    "letters, digits, '-' or '_', starting with a letter or digit"))
        text = _text_read(root, rel, problems)
        if text is None:
            continue
        _, issues = skill_front_matter(text, folder.name)
        problems.extend(Problem(rel, line, column, message) for line, column, message in issues)
    for rel in _dir_files(root, f"skills/{DRAFTS_DIR}"):
        problem = _file_name_problem(Path(rel).name, ".md")
        if problem:
            problems.append(Problem(rel, None, None, problem))
        else:
            _text_read(root, rel, problems)


def _memory_check(root: Path, problems: list[Problem]) -> None:
    for rel in _dir_files(root, "memory"):
        if not rel.endswith(".jsonl"):
            continue
        stem = Path(rel).stem
        if not _NAME.fullmatch(stem):
            problems.append(Problem(rel, None, None, f"memory category '{stem}': use 1-64 lowercase letters, "
                                    "digits, '-' or '_', starting with a letter or digit"))
        text = _text_read(root, rel, problems)
        if text is None:
            continue
        too_many = _memory_lines_problem(text.count("\n") + (not text.endswith("\n") and bool(text)))
        if too_many:
            problems.append(Problem(rel, None, None, too_many))
            continue
        for number, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as error:
                problems.append(Problem(rel, number, error.colno, f"not valid JSON: {error.msg}"))
                continue
            if not isinstance(entry, dict):
                problems.append(Problem(rel, number, 1, f"each line must be a JSON object, not "
                                        f"{_kind_of(entry).split(' (')[0]}"))


def _tools_check(root: Path, problems: list[Problem]) -> None:
    for rel in _dir_files(root, "tools"):
        if not rel.endswith(".py"):
            continue
        problem = _file_name_problem(Path(rel).name, ".py")
        if problem:
            problems.append(Problem(rel, None, None, problem))
            continue
        text = _text_read(root, rel, problems)
        if text is not None:
            try:
                compile(text, rel, "exec", dont_inherit=True)  # parsed, never run
            except SyntaxError as error:
                problems.append(Problem(rel, error.lineno, error.offset, f"Python syntax error: {error.msg}"))
            except ValueError as error:  # e.g. a NUL byte
                problems.append(Problem(rel, None, None, f"not Python source: {error}"))
    rel = "tools/registry.yaml"
    if not _safe_file(root, rel):
        return
    text = _text_read(root, rel, problems, limit=_MAX_YAML_BYTES)
    if text is None:
        return
    parsed = _yaml_parse(text, rel, problems)
    if parsed is None:
        return
    _, data, marks = parsed

    def at(loc: _KeyPath) -> tuple[int | None, int | None]:
        mark = marks.get(loc)
        return (mark[1].line + 1, mark[1].column + 1) if mark else (1, 1)

    if not isinstance(data, dict) or not isinstance(data.get("tools", []), list | None):
        problems.append(Problem(rel, *at(("tools",)), "the registry is a mapping 'tools:' holding a list of "
                                "entries, each with a 'name:' (the file tools/<name>.py)"))
        return
    seen: dict[str, int] = {}
    for index, entry in enumerate(data.get("tools") or []):
        line, column = at(("tools", index))
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            problems.append(Problem(rel, line, column, "each registry entry needs 'name:' (a string)"))
            continue
        name = entry["name"].removesuffix(".py")
        problem = _file_name_problem(f"{name}.py", ".py")
        line, column = at(("tools", index, "name"))
        if problem:
            problems.append(Problem(rel, line, column, f"registry entry {entry['name']!r}: {problem}"))
        elif not _safe_file(root, f"tools/{name}.py"):
            problems.append(Problem(rel, line, column, f"registry entry '{name}' points at tools/{name}.py, "
                                    "which is missing"))
        if name in seen:
            problems.append(Problem(rel, line, column, f"registry entry '{name}' appears twice (first on "
                                    f"line {seen[name]})"))
        seen.setdefault(name, line or 0)


def _text_read(root: Path, rel: str, problems: list[Problem], limit: int | None = None) -> str | None:
    """A file's text, or None with a problem when it cannot be read, is too big or is not UTF-8."""
    try:
        with open(root / rel, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > MAX_FILE_BYTES:  # known before a byte is read
                problems.append(Problem(rel, None, None, _too_big(size)))
                return None
            data = handle.read(limit + 1 if limit else MAX_FILE_BYTES + 1)
    except OSError as error:
        problems.append(Problem(rel, None, None, f"cannot be read ({error.strerror})"))
        return None
    if limit and len(data) > limit:
        problems.append(Problem(rel, None, None, f"larger than {limit // 1024} KiB"))
        return None
    if len(data) > MAX_FILE_BYTES:  # it grew while read
        problems.append(Problem(rel, None, None, _too_big(len(data))))
        return None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        problems.append(Problem(rel, line, column, f"not UTF-8 text (byte 0x{data[error.start]:02x} at "
                                f"offset {error.start}); save the file as UTF-8"))
        return None


def _file_name_problem(name: str, suffix: str) -> str | None:
    stem = name.removesuffix(suffix)
    if not name.endswith(suffix) or not _NAME.fullmatch(stem):
        return (f"file name {name!r}: use <name>{suffix}, the name being 1-64 lowercase letters, digits, "
                "'-' or '_', starting with a letter or digit")
    return None


def _plain_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _plain_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _safe_file(root: Path, rel: str) -> bool:
    """root/rel is a regular file reached without going through any symlink."""
    path = root
    for part in rel.split("/"):
        path = path / part
        if path.is_symlink():
            return False
    return path.is_file()


def _dir_files(root: Path, rel_dir: str) -> list[str]:
    """Plain files directly in root/rel_dir (no symlinks), as sorted relative paths."""
    folder = root / rel_dir
    if any(p.is_symlink() for p in (folder, *folder.parents) if p != root and root in p.parents) \
            or not folder.is_dir():
        return []
    return sorted(f"{rel_dir}/{entry.name}" for entry in folder.iterdir() if _plain_file(entry))


def _tree_files(root: Path) -> Iterator[str]:
    """Every file and symlink under root (symlinks not followed), skipping .git directories and
    the top-level evolution/ folder, as '/'-separated relative paths."""
    for top, dirs, files in os.walk(root, followlinks=False):
        rel_top = Path(top).relative_to(root).as_posix()
        prefix = "" if rel_top == "." else rel_top + "/"
        kept = []
        for name in sorted(dirs):
            full = Path(top) / name
            if name == ".git" or (not prefix and name == EXCLUDED_DIR):
                continue
            if full.is_symlink():
                yield prefix + name
            else:
                kept.append(name)
        dirs[:] = kept
        for name in sorted(files):
            if name == ".git":
                continue
            yield prefix + name


def _root(path: str | Path) -> Path:
    root = Path(path).expanduser()
    if not root.is_absolute():
        raise WorkspaceError(f"{path}: give the workspace as an absolute path")
    root = root.resolve()
    if not root.is_dir():
        raise WorkspaceError(f"{root}: no such directory")
    return root


# ------------------------------------------------------------------------------------- import preview

# Where a manifest-less folder keeps its system prompt, in the order they are looked for: the
# contract's place, then A-Evolve artifacts' and coding agents' usual files.
PROMPT_CANDIDATES = ("prompts/system.md", "prompt.md", "system.md", "CLAUDE.md", "AGENTS.md")
INFERRED_ENTRYPOINT = "evolve_app.agents.ReferenceLLMAgent"
GENERATED_PROMPT = ("You are an agent whose knowledge lives in this workspace's skills (skills/) and "
                    "memory (memory/).\nThe workspace was imported without a system prompt: before each "
                    "task, read the skill that fits it and follow it.\n")


@dataclass(frozen=True)
class ImportPreview:
    """What importing a folder would do. For a folder without manifest.yaml, `manifest` is the
    one Crucible infers (for the operator to confirm or edit) and `writes` the files a confirmed
    import adds to Crucible's copy of the folder, never to the folder itself (manifest.yaml, and
    prompts/system.md when the prompt is elsewhere or missing);
    `problems` would refuse the import even with that manifest, `warnings` would not. A folder
    with a manifest gets its own text, no writes, and its problems and warnings."""

    path: str
    has_manifest: bool
    manifest: str
    prompt_from: str | None  # the file copied to prompts/system.md; None when none is copied
    writes: tuple[str, ...]
    notes: tuple[str, ...]
    problems: tuple[Problem, ...]
    warnings: tuple[Problem, ...]
    unused: tuple[Problem, ...] = ()  # files Crucible will not use, with the reason (selectors fill it)


@dataclass(frozen=True)
class _Inferred:
    manifest: str
    prompt: bytes | None  # what a confirmed import writes as prompts/system.md; None: nothing
    prompt_from: str | None
    notes: tuple[str, ...]
    problems: tuple[Problem, ...]


def workspace_preview(path: str | Path) -> ImportPreview:
    """The import preview of the folder at `path`; reads only, writes nothing."""
    root = _root(path)
    if os.path.lexists(root / "manifest.yaml"):
        problems, warnings = workspace_check(root)
        text = ""
        if _safe_file(root, "manifest.yaml") and (root / "manifest.yaml").stat().st_size <= _MAX_YAML_BYTES:
            text = (root / "manifest.yaml").read_bytes().decode("utf-8", "replace")
        return ImportPreview(str(root), True, text, None, (), ("the folder has its own manifest.yaml; it is "
                             "imported as it is",), tuple(problems), tuple(warnings))
    inferred = _infer(root)
    problems, warnings = workspace_check(root, manifest_text=inferred.manifest)
    writes = ("manifest.yaml",) + (("prompts/system.md",) if inferred.prompt is not None else ())
    return ImportPreview(str(root), False, inferred.manifest, inferred.prompt_from, writes, inferred.notes,
                         tuple(problems), tuple(warnings))


def _infer(root: Path) -> _Inferred:
    """The manifest and prompt a folder without manifest.yaml gets: Crucible's reference agent
    over its own prompt, skills and memory; layers prompts, skills, memory (and tools when the
    folder has tools/); reloaded hot; named after the folder."""
    notes, problems = [], []
    prompt: bytes | None = None
    prompt_from = next((rel for rel in PROMPT_CANDIDATES if _safe_file(root, rel)), None)
    if prompt_from == "prompts/system.md":
        notes.append("The system prompt is prompts/system.md, where the workspace contract keeps it.")
    elif prompt_from is not None:
        found: list[Problem] = []
        if _text_read(root, prompt_from, found) is None:
            problems.extend(found)
        else:
            prompt = (root / prompt_from).read_bytes()
        notes.append(f"The system prompt is {prompt_from}: the import copies it to prompts/system.md in "
                     f"Crucible's copy (where the workspace contract keeps it); {prompt_from} stays as it "
                     "is.")
    else:
        prompt = GENERATED_PROMPT.encode()
        notes.append(f"No system prompt ({', '.join(PROMPT_CANDIDATES)}): the import writes a short "
                     "prompts/system.md into Crucible's copy saying the agent works from its skills and "
                     "memory; edit it afterwards.")
    layers = ["prompts", "skills", "memory"] + (["tools"] if _plain_dir(root / "tools") else [])
    present = [layer for layer in LAYERS if _plain_dir(root / layer)]
    has = ", ".join(f"{layer}/" for layer in present) or "none of prompts/, skills/, memory/, tools/"
    notes.append(f"Evolvable layers: {', '.join(layers)} (the folder has {has}); engines may change "
                 "only these.")
    others = sorted(entry.name for entry in root.iterdir()
                    if entry.name not in (*LAYERS, ".git", EXCLUDED_DIR) and entry.name != prompt_from)
    if others:
        shown = ", ".join(others[:8]) + (f" and {len(others) - 8} more" if len(others) > 8 else "")
        notes.append(f"Other files ({shown}) are copied as they are; no engine may change them.")
    notes.append(f"Agent type reference: Crucible's reference LLM agent ({INFERRED_ENTRYPOINT}) over the "
                 "workspace's prompt, skills and memory; reload_strategy hot.")
    manifest = ("# Inferred by Crucible's import from the folder's files: check it, edit it if need be.\n"
                + yaml.safe_dump({"name": root.name[:200] or "agent", "contract_version": "1.0"},
                                 sort_keys=False, allow_unicode=True)
                + f"agent:\n  type: reference\n  entrypoint: {INFERRED_ENTRYPOINT}\n"
                + "evolvable_layers:\n" + "".join(f"  - {layer}\n" for layer in layers)
                + "reload_strategy: hot\n")
    return _Inferred(manifest, prompt, prompt_from if prompt is not None else None, tuple(notes),
                     tuple(problems))
