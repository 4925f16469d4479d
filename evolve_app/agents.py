"""Agents: what solves a benchmark's tasks from the files of a workspace (the A-Evolve seed's
`BaseAgent` contract).

- `BaseAgent(workspace_path)` loads the workspace's prompt, fragments, skills, recent memories
  and tool registry; `reload_from_fs()` reads them again after an engine changed the files;
  `remember()` buffers memory entries and `export_to_fs()` appends them through the workspace.
- `CommandAgent` runs a program the workspace ships, in the runtime sandbox, on a fresh copy of
  the workspace bound read-only: the task's input on stdin, its answer on stdout.
- `ReferenceLLMAgent` sends one completion: the workspace (prompt, fragments, skills, recent
  memories) as the system prompt and the task's input as the user message, through
  `runtime_app.llm.ToolChat` with a fleet preset (anthropic, bedrock or openai-compatible).
- `agent_check(workspace_path, trusted=...)` says whether the class manifest.yaml's `agent`
  section asks for may be used, importing nothing; `agent_for(workspace_path, trusted=...)`
  checks the same and makes the agent (in a worker or the CLI).

The `agent` settings read here (manifest.yaml, read leniently so that keys a stricter manifest
schema does not know yet still work):

    type: command | reference | <an entry point of crucible.agents> | <package.module.AgentClass>
    entrypoint: <package.module.AgentClass> | a path in the workspace (tools/solve.py) | a command line

A dotted class path (in `type` or `entrypoint`) other than a built-in's own
(evolve_app.agents.CommandAgent, evolve_app.agents.ReferenceLLMAgent) is honoured only from the
trusted CLI or when CRUCIBLE_ALLOWED_EXTENSIONS lists it; anything else is refused before a run
starts, never imported.

An A-Evolve agent (`entrypoint: agent_evolve.<...>.<Class>` with `type: reference` or none, or
`type: agent_evolve.<...>`) runs as ReferenceLLMAgent over the workspace's own files, importing
nothing from agent_evolve; the tools its registry lists are mapped by name to sandboxed
equivalents (A_EVOLVE_TOOLS: bash → a shell, python/python_exec → python, text_editor → a file
editor on the task's scratch copy, submit → the final answer, sequentialthinking/think → a note).
`agent_mapping(workspace_path)` says which agent and which tools a run gets (and which are not
available); `agent_run_problems(workspace_path)` says what would keep it from running.
    command: a path in the workspace or a command line (for type command; else `entrypoint`
             when it is not a dotted path, else the tools/registry.yaml entry with
             `entrypoint: true`, whose `timeout_seconds` also applies)
    timeout_seconds: the command's wall-clock limit (default 60)
    preset: a fleet preset (default anthropic); model: the model id; effort: off|low|...
             (with neither preset nor model, CRUCIBLE_AGENT_MODEL=preset:model when set)

Agents never raise for a task that goes wrong: the Trajectory carries the error. No API key
reaches a sandbox, a step, an output or an error text (known secret values are redacted).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeGuard
from urllib.parse import urlparse

import yaml
from django.conf import settings

from evolve_app.extensions import AGENT_GROUP, SETTING, dotted_allowed, dotted_load, installed
from evolve_app.types import SkillMeta, Task, Trajectory
from evolve_app.workspace import AgentWorkspace, WorkspaceError
from runtime_app import sandbox
from runtime_app.fleet import EFFORTS, host_is_local, preset_get
from runtime_app.keys import provider_key
from runtime_app.llm import LLMError, ToolChat
from runtime_app.sandbox import redact, secret_values

COMMAND_TIMEOUT_SECONDS = 60.0
MAX_COMMAND_TIMEOUT_SECONDS = 3600.0
OUTPUT_BYTES = 1 << 20  # what a command agent's stdout may be; beyond it the answer is cut
STEP_TEXT_CHARS = 2000
MEMORY_LIMIT = 20  # recent memories an agent loads (and a reference agent shows the model)
SKILL_CHARS = 20_000
SYSTEM_PROMPT_CHARS = 200_000
MAX_TOOL_TURNS = 8  # a reference agent's tool calls per task before it must answer
_MANIFEST_BYTES = 256 * 1024
_CATEGORY = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?")
_COPY_IGNORED = (".git", "evolution")


def _is_dotted(value: Any) -> TypeGuard[str]:
    """A dotted Python path (package.module.Name), not a file name such as solve.py."""
    return isinstance(value, str) and bool(_DOTTED.fullmatch(value.strip())) and \
        not value.strip().endswith((".py", ".sh"))


class AgentError(Exception):
    """A workspace whose agent cannot be made (unknown type, bad entrypoint ...)."""


def agent_settings(workspace_path: str | Path) -> dict[str, Any]:
    """manifest.yaml's `agent` mapping as written ({} when there is none)."""
    path = Path(workspace_path) / "manifest.yaml"
    if path.is_symlink() or not path.is_file():
        raise AgentError(f"{workspace_path}: no manifest.yaml")
    data = path.read_bytes()
    if len(data) > _MANIFEST_BYTES:
        raise AgentError(f"{path}: larger than {_MANIFEST_BYTES // 1024} KiB")
    try:
        manifest = yaml.safe_load(data.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise AgentError(f"{path}: not readable YAML ({error})") from None
    agent = manifest.get("agent") if isinstance(manifest, dict) else None
    if agent is not None and not isinstance(agent, dict):
        raise AgentError(f"{path}: `agent` must be a mapping")
    return dict(agent or {})


def _redact(text: str) -> str:
    return redact(text, secret_values())


def _tail(text: str, limit: int = STEP_TEXT_CHARS) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


class BaseAgent:
    """The seed's agent: state loaded from a workspace, `solve(task) -> Trajectory` to override.

    `record`, if set, receives every receipt the agent makes (a sandbox run, a model call) and
    returns it (e.g. `runtime_app.services.receipt_record` bound to an evolution run); unset,
    receipts stay unsaved and only their figures reach the trajectory's steps.
    """

    memory_limit = MEMORY_LIMIT

    def __init__(self, workspace_path: str | Path) -> None:
        self.workspace_path = Path(workspace_path).expanduser().resolve()
        self.workspace = AgentWorkspace(self.workspace_path)
        self.record: Callable[[Any], Any] | None = None
        self.system_prompt = ""
        self.fragments: dict[str, str] = {}
        self.skills: list[SkillMeta] = []
        self.memories: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []
        self.settings: dict[str, Any] = {}
        self._pending: list[tuple[dict[str, Any], str]] = []
        self.reload_from_fs()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.workspace_path)!r})"

    def solve(self, task: Task) -> Trajectory:
        raise NotImplementedError(f"{type(self).__name__} must implement solve(task)")

    def reload_from_fs(self) -> None:
        """Read the prompt, fragments, skills, recent memories, tools and settings again."""
        try:
            self.system_prompt = self.workspace.read_prompt()
        except WorkspaceError:
            self.system_prompt = ""
        self.fragments = {name: self.workspace.read_fragment(name)
                          for name in self.workspace.list_fragments()}
        self.skills = self.workspace.list_skills()
        self.memories = self.workspace.read_all_memories(limit=self.memory_limit)
        try:
            self.tools = self.workspace.read_tool_registry()
        except WorkspaceError:
            self.tools = []
        self.settings = agent_settings(self.workspace_path)

    def remember(self, content: Any, category: str = "episodic") -> None:
        """Buffer a memory entry (a dict, or text kept as {"content": text}) until export_to_fs()."""
        if not isinstance(category, str) or not _CATEGORY.fullmatch(category):
            raise ValueError(f"memory category {category!r}: use 1-64 lowercase letters, digits, '-' or '_'")
        entry = dict(content) if isinstance(content, dict) else {"content": str(content)}
        self._pending.append((entry, category))

    @property
    def pending_memories(self) -> list[tuple[dict[str, Any], str]]:
        return list(self._pending)

    def export_to_fs(self) -> int:
        """Append the buffered memories to memory/<category>.jsonl; returns how many were written."""
        written = 0
        while self._pending:
            entry, category = self._pending[0]
            self.workspace.add_memory(entry, category)
            self._pending.pop(0)
            written += 1
        return written

    def get_skill_content(self, name: str) -> str:
        return self.workspace.read_skill(name)


# ---------------------------------------------------------------------------------------- command


def _scratch_path(task: Task) -> Path:
    return Path(settings.DATA_DIR) / "evolve" / "agents" / (
        f"{re.sub(r'[^A-Za-z0-9._-]', '_', task.task_id)[:80]}-{uuid.uuid4().hex[:12]}")


def _scratch_copy(top: Path, scratch: Path) -> None:
    """A throwaway copy of the workspace (no .git, no evolution/) for a program to read."""
    shutil.copytree(top, scratch, symlinks=True, ignore=lambda folder, names: [
        name for name in names if Path(folder) == top and name in _COPY_IGNORED])


class CommandAgent(BaseAgent):
    """Runs the workspace's own program in the sandbox; its stdout is the answer.

    Each solve copies the workspace (without .git and evolution/) to a scratch folder under the
    data dir and binds that copy read-only, so the program can neither change the workspace nor
    see its history, whatever isolation the host gives. Environment: CRUCIBLE_TASK_ID,
    CRUCIBLE_TASK_CATEGORY and CRUCIBLE_WORKSPACE (the copy); nothing secret.
    """

    def __init__(self, workspace_path: str | Path, *, isolation: str | None = None,
                 limits: Any = None) -> None:
        self.isolation, self.limits = isolation, limits
        super().__init__(workspace_path)

    def _program(self) -> tuple[str, float]:
        """(the command as written, its timeout) from the settings or the tool registry."""
        timeout = self.settings.get("timeout_seconds")
        command = self.settings.get("command")
        entrypoint = self.settings.get("entrypoint")
        if not command and isinstance(entrypoint, str) and entrypoint.strip() and not _is_dotted(entrypoint):
            command = entrypoint
        if not command:
            for tool in self.tools:
                if tool.get("entrypoint") is True and isinstance(tool.get("name"), str):
                    command = f"tools/{tool['name'].removesuffix('.py')}.py"
                    timeout = timeout if timeout is not None else tool.get("timeout_seconds")
                    break
        if not isinstance(command, str) or not command.strip():
            raise AgentError("no command: set agent.command (or a non-dotted agent.entrypoint) in "
                             "manifest.yaml, or mark a tools/registry.yaml entry with `entrypoint: true`")
        if timeout is None:
            timeout = COMMAND_TIMEOUT_SECONDS
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
                not 0 < timeout <= MAX_COMMAND_TIMEOUT_SECONDS:
            raise AgentError(f"timeout_seconds {timeout!r}: give seconds between 0 and "
                             f"{MAX_COMMAND_TIMEOUT_SECONDS:g}")
        return command.strip(), float(timeout)

    @staticmethod
    def _argv(command: str, root: Path) -> list[str] | str:
        """A workspace path becomes an argv (python for .py, sh for .sh); else a shell line."""
        looks_like_path = not any(c.isspace() for c in command) and ("/" in command or
                                                                      command.endswith((".py", ".sh")))
        if not looks_like_path:
            return command
        relative = Path(command)
        target = (root / relative).resolve()
        if relative.is_absolute() or not target.is_relative_to(root):
            raise AgentError(f"the command {command!r} must be a path inside the workspace")
        if not target.is_file():
            raise AgentError(f"the command {command!r} does not exist in the workspace")
        rel = str(target.relative_to(root))
        if rel.endswith(".py"):
            return [sys.executable, rel]
        if rel.endswith(".sh"):
            return ["/bin/sh", rel]
        return [f"./{rel}"]

    def solve(self, task: Task) -> Trajectory:


        trajectory = Trajectory(task_id=task.task_id)
        scratch = _scratch_path(task)
        try:
            command, timeout = self._program()
            _scratch_copy(self.workspace_path, scratch)
            argv = self._argv(command, scratch)
            limits = self.limits or sandbox.Limits(output_bytes=2 * OUTPUT_BYTES)
            receipt = sandbox.run(
                argv, cwd=scratch, timeout=timeout, stdin=task.input.encode(), writable=False,
                isolation=self.isolation, limits=limits, kind="agent",
                env={"CRUCIBLE_TASK_ID": task.task_id, "CRUCIBLE_TASK_CATEGORY": task.category,
                     "CRUCIBLE_WORKSPACE": str(scratch)},
            )
        except (AgentError, sandbox.SandboxError, OSError) as error:
            trajectory.error = _redact(f"the agent could not run: {error}")
            trajectory.steps.append({"tool": "command", "action": "run", "error": trajectory.error})
            return trajectory
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if self.record is not None:
            receipt = self.record(receipt)
        shown = argv if isinstance(argv, str) else [
            Path(argv[0]).name if argv[0] == sys.executable else argv[0], *argv[1:]]
        trajectory.steps.append({
            "tool": "command", "action": "run", "command": shown, "exit_code": receipt.exit_code,
            "outcome": receipt.outcome, "timed_out": receipt.timed_out,
            "duration_seconds": receipt.duration_seconds, "isolation": receipt.isolation,
            "stderr": _tail(receipt.stderr_excerpt), "receipt_id": receipt.pk,
        })
        trajectory.output = receipt.stdout_excerpt
        if receipt.stdout_bytes > limits.output_bytes:
            trajectory.output = ""
            trajectory.error = f"the agent wrote {receipt.stdout_bytes:,} bytes; answers are limited to " \
                               f"{limits.output_bytes:,}"
        elif receipt.timed_out:
            trajectory.error = f"the agent timed out after {timeout:g} s"
        elif not receipt.succeeded:
            said = receipt.stderr_excerpt.strip()
            said = f": {_tail(said, 500)}" if said else ""
            trajectory.error = f"the agent's command failed ({receipt.outcome}){said}"
        return trajectory


# ------------------------------------------------------------------------------- A-Evolve tools

A_EVOLVE_PREFIX = "agent_evolve."
# A-Evolve's tool names (its seeds' registries) → the sandboxed equivalent that stands in for them.
A_EVOLVE_TOOLS = {
    "bash": "shell", "shell": "shell", "bash_exec": "shell", "execute_bash": "shell",
    "python": "python", "python_exec": "python",
    "text_editor": "editor", "str_replace_editor": "editor", "str_replace_based_edit_tool": "editor",
    "submit": "submit", "final_answer": "submit",
    "sequentialthinking": "think", "sequential_thinking": "think", "think": "think",
}
TOOL_KINDS = {
    "shell": "sandboxed shell", "python": "sandboxed python", "editor": "sandboxed file editor",
    "submit": "final answer", "think": "note (no-op)", "program": "workspace program (sandboxed)",
}
_STRING = {"type": "string"}
_DEFAULT_SCHEMAS: dict[str, dict[str, Any]] = {
    "shell": {"type": "object", "required": ["command"], "properties": {
        "command": {**_STRING, "description": "the shell command to run in the task's workspace copy"}}},
    "python": {"type": "object", "required": ["code"], "properties": {
        "code": {**_STRING, "description": "Python code to run; print() what you want to see"}}},
    "editor": {"type": "object", "required": ["command", "path"], "properties": {
        "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert"]},
        "path": {**_STRING, "description": "a file path relative to the task's workspace copy"},
        "file_text": {**_STRING, "description": "create: the file's content"},
        "old_str": {**_STRING, "description": "str_replace: the text to replace (exactly one match)"},
        "new_str": {**_STRING, "description": "str_replace/insert: the new text"},
        "insert_line": {"type": "integer", "description": "insert: after this line (0: at the top)"},
        "view_range": {**_STRING, "description": "view: lines as 'first-last'"}}},
    "submit": {"type": "object", "required": ["answer"], "properties": {
        "answer": {**_STRING, "description": "the final answer; it ends the task"}}},
    "think": {"type": "object", "required": ["thought"], "properties": {"thought": _STRING}},
}
_ANSWER_KEYS = ("answer", "confirmation", "result", "output")
# The file editor, run by the sandbox's Python on the task's scratch copy (its cwd): a JSON
# request on stdin, the result on stdout, a refusal on stderr with exit 1.
_EDITOR_PROGRAM = r"""
import json, os, sys
request = json.load(sys.stdin)
root = os.path.realpath(os.getcwd())
def fail(message):
    sys.stderr.write(message)
    sys.exit(1)
command, given = request.get("command"), request.get("path")
if not isinstance(given, str) or not given.strip():
    fail("give a path")
target = os.path.realpath(os.path.join(root, given))
if target != root and not target.startswith(root + os.sep):
    fail(f"{given}: outside the task's workspace copy (give a path relative to it)")
if command == "create":
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w") as handle:
        handle.write(str(request.get("file_text", "")))
    print(f"created {given}")
    sys.exit(0)
if not os.path.isfile(target):
    fail(f"{given}: no such file")
text = open(target, errors="replace").read()
if command == "view":
    lines = text.splitlines()
    first, last = 1, len(lines)
    span = request.get("view_range")
    if isinstance(span, list) and len(span) == 2:
        first, last = int(span[0]), int(span[1])
    elif isinstance(span, str) and "-" in span:
        first, last = (int(part) for part in span.split("-", 1))
    last = len(lines) if last < 0 else last
    print("\n".join(f"{n:6}\t{lines[n - 1]}" for n in range(max(first, 1), min(last, len(lines)) + 1)))
elif command == "str_replace":
    old = str(request.get("old_str", ""))
    count = text.count(old) if old else 0
    if count != 1:
        fail(f"old_str occurs {count} times in {given}; it must occur exactly once")
    open(target, "w").write(text.replace(old, str(request.get("new_str", "")), 1))
    print(f"edited {given}")
elif command == "insert":
    lines = text.splitlines(keepends=True)
    at = int(request.get("insert_line", 0))
    if not 0 <= at <= len(lines):
        fail(f"insert_line {at}: {given} has {len(lines)} lines")
    new = str(request.get("new_str", ""))
    lines.insert(at, new if new.endswith("\n") else new + "\n")
    open(target, "w").write("".join(lines))
    print(f"inserted into {given} after line {at}")
else:
    fail(f"command {command!r}: use view, create, str_replace or insert")
"""


def a_evolve_entrypoint(settings: dict[str, Any]) -> str | None:
    """The A-Evolve agent class the manifest's `agent` settings name (`agent_evolve.…`), or None."""
    kind, entrypoint = settings.get("type"), settings.get("entrypoint")
    if _is_dotted(kind) and kind.strip().startswith(A_EVOLVE_PREFIX):
        return kind.strip()
    if kind in (None, "", "reference", "custom") and _is_dotted(entrypoint) and \
            entrypoint.strip().startswith(A_EVOLVE_PREFIX):
        return entrypoint.strip()
    return None


def _registry_schema(entry: dict[str, Any]) -> dict[str, Any] | None:
    """A tool's input schema from its registry entry: `parameters` as a JSON schema object, or
    (A-Evolve's terminal shape) as {argument: {type, description}} with `required` beside it."""
    parameters = entry.get("parameters", entry.get("input_schema"))
    if not isinstance(parameters, dict) or not parameters:
        return None
    if parameters.get("type") == "object" and isinstance(parameters.get("properties"), dict):
        schema = dict(parameters)
    elif all(isinstance(key, str) and isinstance(value, dict) for key, value in parameters.items()):
        schema = {"type": "object", "properties": parameters}
    else:
        return None
    required = entry.get("required", schema.get("required"))
    schema.pop("required", None)
    if isinstance(required, list) and all(isinstance(name, str) and name in schema["properties"]
                                          for name in required):
        schema["required"] = list(required)
    plain: dict[str, Any] = json.loads(json.dumps(schema, default=str))
    return plain


def tool_plan(workspace_path: str | Path, registry: list[dict[str, Any]],
              a_evolve: bool) -> tuple[dict[str, dict[str, Any]], list[dict[str, str]]]:
    """(the tools a reference agent offers the model, by model name: name, registry_name, kind,
    description, input_schema; the registry's tools it cannot offer, each {name, why}).

    Every workspace's registry entry with a program tools/<name>.py is a `tool_<name>` program
    (the task's text on stdin). In an A-Evolve workspace a name in A_EVOLVE_TOOLS is its sandboxed
    equivalent, under its own name, with the registry's schema (or a default); an entry with
    `file:` (an A-Evolve tool module, which imports A-Evolve's runtime) is never run."""
    root = Path(workspace_path)
    offered: dict[str, dict[str, Any]] = {}
    unavailable: list[dict[str, str]] = []
    for entry in registry:
        name = entry.get("name")
        if not isinstance(name, str) or not name.strip():
            unavailable.append({"name": str(name), "why": "a registry entry without a name"})
            continue
        name = name.strip()
        description = str(entry.get("description") or "").strip()
        kind = A_EVOLVE_TOOLS.get(name) if a_evolve else None
        program = _CATEGORY.fullmatch(name) and "file" not in entry and \
            (root / "tools" / f"{name}.py").is_file()
        if kind:
            spec_name, schema = name, _registry_schema(entry) or _DEFAULT_SCHEMAS[kind]
        elif program:
            spec_name, kind = f"tool_{name}", "program"
            description = description or f"the workspace's {name} tool"
            schema = {"type": "object", "required": ["input"], "properties": {
                "input": {"type": "string", "description": "the text the tool reads on stdin"}}}
        else:
            if "file" in entry:
                why = f"tools/{entry['file']} is an A-Evolve tool module, which Crucible does not run, " \
                      "and the name has no sandboxed equivalent"
            elif a_evolve:
                why = f"no sandboxed equivalent and no program tools/{name}.py"
            else:
                why = f"no program tools/{name}.py"
            unavailable.append({"name": name, "why": why})
            continue
        if spec_name in offered:
            unavailable.append({"name": name, "why": "listed twice in tools/registry.yaml"})
            continue
        offered[spec_name] = {"name": spec_name, "registry_name": name, "kind": kind,
                              "description": (description or TOOL_KINDS[kind])[:1000], "input_schema": schema}
    return offered, unavailable


def _text_argument(tool_input: Any, names: tuple[str, ...]) -> str | None:
    """The first of `names` the model gave as text, else its only text argument."""
    if not isinstance(tool_input, dict):
        return None
    for name in names:
        if isinstance(text := tool_input.get(name), str):
            return text
    texts = [value for value in tool_input.values() if isinstance(value, str)]
    return texts[0] if len(texts) == 1 else None


# -------------------------------------------------------------------------------------- reference


def _server_agent_model() -> tuple[str, str] | None:
    """CRUCIBLE_AGENT_MODEL as (preset, model), if the server sets it."""
    value = getattr(getattr(settings, "CONFIG", None), "agent_model", "") or ""
    preset, _, model = value.partition(":")
    return (preset.strip(), model.strip()) if preset.strip() and model.strip() else None


def model_choice(settings: dict[str, Any], overrides: dict[str, Any] | None = None) -> tuple[str, str, str]:
    """(preset name, model id or "", effort) a reference agent uses: the overrides, then the
    manifest's `agent` settings; with neither a preset nor a model there, CRUCIBLE_AGENT_MODEL;
    the preset defaults to anthropic and the model to the preset's default model."""
    def given(name: str) -> str:
        value = (overrides or {}).get(name) or settings.get(name)
        return str(value).strip() if value not in (None, "") else ""

    preset_name, model = given("preset"), given("model")
    if not preset_name and not model and (default := _server_agent_model()):
        preset_name, model = default
    preset_name = preset_name or "anthropic"
    if not model:
        preset = preset_get(preset_name)
        model = preset.default_model if preset else ""
    return preset_name, model, given("effort") or "off"


def _has_credentials(preset: Any) -> bool:
    """A key for the preset here (environment or stored), AWS credentials for bedrock, or a
    model server on this machine or network (whose key is optional)."""
    if preset.key_variable and provider_key(preset.key_variable):
        return True
    if preset.kind == "bedrock" and (any(os.environ.get(name) for name in (
            "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"))
            or (Path.home() / ".aws" / "credentials").exists()):
        return True
    return host_is_local(urlparse(preset.base_url() or "").hostname or "")


def reference_problems(settings: dict[str, Any], overrides: dict[str, Any] | None = None, *,
                       credentials: bool = True) -> list[str]:
    """Why a reference agent with these settings could not call its model (empty when nothing is
    known wrong): a preset that is not a model provider, no model, a bad effort, no key."""
    preset_name, model, effort = model_choice(settings, overrides)
    preset = preset_get(preset_name)
    if preset is None or preset.kind in ("command", "agent-cli"):  # this agent runs its own tool loop
        return [f"preset {preset_name!r} is not a model provider (use anthropic, bedrock, openai, ...)"]
    problems = []
    if not model:
        problems.append(f"no model: set agent.model in manifest.yaml (preset {preset_name} has no default "
                        "model), or CRUCIBLE_AGENT_MODEL=preset:model on the server")
    if effort not in EFFORTS:
        problems.append(f"effort {effort!r}: use one of {', '.join(EFFORTS)}")
    if credentials and not _has_credentials(preset):
        variable = preset.key_variable or "its API key"
        problems.append(f"preset {preset_name} has no key here: set {variable} in the workers' environment "
                        "or have an administrator store it (Admin → Provider keys)")
    return problems


class ReferenceLLMAgent(BaseAgent):
    """One model completion per task: the workspace as the system prompt, the task as the user
    message. `preset`/`model`/`effort` given here override the manifest's agent settings.

    The model may call the registry's tools (tool_plan): each call runs in the sandbox on a
    scratch copy of the workspace made for the task (a shell, Python and the file editor may
    write to it; it is thrown away after the task); `submit` ends the task with its answer."""

    def __init__(self, workspace_path: str | Path, *, preset: str | None = None, model: str | None = None,
                 effort: str | None = None) -> None:
        self._overrides = {"preset": preset, "model": model, "effort": effort}
        super().__init__(workspace_path)

    @property
    def a_evolve(self) -> str | None:
        """The A-Evolve agent class this workspace names, which this agent stands in for."""
        return a_evolve_entrypoint(self.settings)

    def system_text(self) -> str:
        """The system prompt: prompts/system.md, the fragments, every skill in full, and the
        most recent memories (oldest first)."""
        parts = [self.system_prompt.strip()]
        if self.fragments:
            parts.append("# Prompt fragments")
            parts += [f"## {name}\n\n{text.strip()}" for name, text in sorted(self.fragments.items())]
        if self.skills:
            parts.append("# Skills")
            for skill in self.skills:
                try:
                    content = self.get_skill_content(skill.name)
                except WorkspaceError:
                    continue
                cut = "\n… (cut)" if len(content) > SKILL_CHARS else ""
                body = content[:SKILL_CHARS].strip()
                parts.append(f"## Skill {skill.name}: {skill.description}\n\n{body}{cut}")
        if self.memories:
            parts.append("# Memories (most recent last)")
            parts.append("\n".join("- " + json.dumps(entry, ensure_ascii=False, default=str)
                                   for entry in self.memories))
        text = "\n\n".join(part for part in parts if part)
        return text[:SYSTEM_PROMPT_CHARS]

    def solve(self, task: Task) -> Trajectory:
        trajectory = Trajectory(task_id=task.task_id)
        problems = reference_problems(self.settings, self._overrides, credentials=False)
        if problems:
            trajectory.error = f"the agent could not run: {problems[0]}"
            return trajectory
        preset_name, model, effort = model_choice(self.settings, self._overrides)
        preset = preset_get(preset_name)
        assert preset is not None  # reference_problems found it
        tools = self._tool_specs()
        scratch = _scratch_path(task)
        try:
            chat = ToolChat(preset.kind, model, self.system_text(), task.input,
                            [{key: spec[key] for key in ("name", "description", "input_schema")}
                             for spec in tools.values()], effort,
                            base_url=preset.base_url(), key_variable=preset.key_variable or None,
                            account=preset.name, account_limit=preset.concurrency,
                            price_model=preset.price_model)
            for _turn in range(MAX_TOOL_TURNS):
                step: dict[str, Any] = {"tool": "llm", "action": "complete", "preset": preset.name,
                                        "model": model}
                trajectory.steps.append(step)
                reply, uses = chat.turn(self.record or (lambda receipt: receipt), None)
                step.update(self._receipt_figures(reply.receipt))
                if not uses:
                    break
                if tools and not scratch.exists():
                    _scratch_copy(self.workspace_path, scratch)
                results = []
                for use in uses:
                    spec = tools.get(use.name)
                    if spec is not None and spec["kind"] == "submit":
                        answer = _text_argument(use.input, _ANSWER_KEYS)
                        trajectory.steps.append({"tool": use.name, "action": "submit", "as": "final answer"})
                        trajectory.output = _redact(answer or "")
                        return trajectory
                    results.append((use.id, *self._tool_run(use.name, use.input, tools, scratch, trajectory)))
                chat.results(results)
            else:
                trajectory.error = f"the agent used tools for {MAX_TOOL_TURNS} turns without answering"
                return trajectory
        except LLMError as error:
            if error.receipt is not None:
                trajectory.steps.append({"tool": "llm", "action": "complete",
                                         **self._receipt_figures(error.receipt)})
            trajectory.error = _redact(str(error))
            trajectory.steps[-1]["error"] = trajectory.error
            return trajectory
        except Exception as error:  # an SDK or configuration failure must not end the cycle
            trajectory.error = _redact(f"the agent could not run: {type(error).__name__}: {error}")
            trajectory.steps.append({"tool": "llm", "action": "complete", "error": trajectory.error})
            return trajectory
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        content = chat.messages[-1]["content"]
        if not isinstance(content, str):
            content = "".join(block.get("text", "") for block in content
                              if isinstance(block, dict) and block.get("type", "text") == "text")
        trajectory.output = _redact(content)
        return trajectory

    def _tool_specs(self) -> dict[str, dict[str, Any]]:
        """The tools offered to the model, by name (tool_plan over the registry)."""
        return tool_plan(self.workspace_path, self.tools, a_evolve=bool(self.a_evolve))[0]

    def _tool_run(self, name: str, tool_input: Any, tools: dict[str, dict[str, Any]], scratch: Path,
                  trajectory: Trajectory) -> tuple[str, bool]:
        """Run one offered tool in the sandbox on the task's scratch copy; (output, is_error)."""
        spec = tools.get(name)
        if spec is None:
            return f"unknown tool {name!r}: use {', '.join(tools) or 'none'}", True
        kind = spec["kind"]
        if kind == "think":
            trajectory.steps.append({"tool": name, "action": "note", "as": TOOL_KINDS[kind]})
            return "noted", False
        env = {"CRUCIBLE_TASK_ID": trajectory.task_id, "CRUCIBLE_WORKSPACE": str(scratch)}
        if kind == "program":
            text = _text_argument(tool_input, ("input",))
            argv: list[str] | str = [sys.executable, f"tools/{spec['registry_name']}.py"]
            writable = False
        elif kind == "shell":
            text = _text_argument(tool_input, ("command", "cmd", "script"))
            argv, writable = [], True  # the command itself, below
        elif kind == "python":
            text = _text_argument(tool_input, ("code", "source"))
            argv, writable = [sys.executable, "-"], True
        else:  # editor
            text = json.dumps(tool_input) if isinstance(tool_input, dict) else None
            argv, writable = [sys.executable, "-c", _EDITOR_PROGRAM], True
        if text is None:
            schema = spec["input_schema"]
            wanted = ", ".join(schema.get("required") or schema.get("properties", {}))
            return f"{name}: give {wanted or 'its argument'} as text", True
        stdin = "" if kind == "shell" else text  # a shell's text is its command, the others' their input
        if kind == "shell":  # A-Evolve's tools run bash
            argv = ["/bin/bash", "-c", text] if Path("/bin/bash").is_file() else text
        try:
            receipt = sandbox.run(argv, cwd=scratch, timeout=COMMAND_TIMEOUT_SECONDS, stdin=stdin.encode(),
                                  writable=writable, kind="tool", env=env)
        except sandbox.SandboxError as error:
            return _redact(f"{name} could not run: {error}"), True
        if self.record is not None:
            receipt = self.record(receipt)
        trajectory.steps.append({"tool": name, "action": "run", "as": TOOL_KINDS[kind],
                                 "exit_code": receipt.exit_code, "outcome": receipt.outcome,
                                 "stdout": _tail(receipt.stdout_excerpt), "receipt_id": receipt.pk})
        if kind == "program":
            if receipt.succeeded:
                return receipt.stdout_excerpt, False
            return f"{receipt.outcome}: {_tail(receipt.stderr_excerpt, 500)}", True
        if receipt.timed_out:
            return f"{name} timed out after {COMMAND_TIMEOUT_SECONDS:g} s", True
        output = receipt.stdout_excerpt + receipt.stderr_excerpt
        if kind == "editor":
            return (receipt.stdout_excerpt, False) if receipt.succeeded else (receipt.stderr_excerpt, True)
        if receipt.exit_code not in (0, None):  # as A-Evolve's tools say it: the output, then the code
            output += f"\n[exit code: {receipt.exit_code}]"
        return output or "(no output)", False

    @staticmethod
    def _receipt_figures(receipt: Any) -> dict[str, Any]:
        return {
            "resolved_model": receipt.resolved_model, "request_id": receipt.request_id,
            "input_tokens": receipt.input_tokens, "output_tokens": receipt.output_tokens,
            "cache_read_tokens": receipt.cache_read_tokens, "cache_write_tokens": receipt.cache_write_tokens,
            "cost_microusd": receipt.cost_microusd, "stop_reason": (receipt.detail or {}).get("stop_reason"),
            "receipt_id": receipt.pk,
        }


# ------------------------------------------------------------------------------------------ choice

AGENT_TYPES: dict[str, type[BaseAgent]] = {"command": CommandAgent, "reference": ReferenceLLMAgent}
# A built-in named by its dotted path is the built-in: found by lookup, not imported.
_BUILTIN_PATHS = {f"{cls.__module__}{sep}{cls.__name__}": cls for cls in AGENT_TYPES.values()
                  for sep in (".", ":")}


def agent_names() -> list[str]:
    """The agent types a manifest may name for the web and API: built-ins, then entry points."""
    return [*AGENT_TYPES, *sorted(name for name in installed(AGENT_GROUP) if name not in AGENT_TYPES)]


def _class_named(path: str, key: str, trusted: bool) -> type[BaseAgent] | str:
    """A built-in class by its path, else the path itself if this caller may name it."""
    path = path.strip()
    if path in _BUILTIN_PATHS:
        return _BUILTIN_PATHS[path]
    if not dotted_allowed(path, trusted=trusted):
        raise AgentError(
            f"manifest.yaml's agent.{key} {path!r} names a Python class, which runs started from the web "
            f"or API do not import (nothing was). An administrator allows it by adding {path} to {SETTING}; "
            f"or start the run with `manage.py evolve run`, or use agent.type "
            f"{' or '.join(agent_names())} without a class in agent.{key}.")
    return path


def _agent_choice(settings: dict[str, Any], trusted: bool) -> tuple[type[BaseAgent], type[BaseAgent] | str]:
    """(the class the agent must be, the class or the entry point/dotted path to load), from the
    manifest's `agent` settings by lookup only; AgentError when it may not be used."""
    kind, entrypoint = settings.get("type"), settings.get("entrypoint")
    if a_evolve_entrypoint(settings):  # stood in for, never imported
        return ReferenceLLMAgent, ReferenceLLMAgent
    if kind in (None, "") and entrypoint in (None, ""):  # A-Evolve's default: a reference agent
        return ReferenceLLMAgent, ReferenceLLMAgent
    if isinstance(kind, str) and kind in AGENT_TYPES:
        base = AGENT_TYPES[kind]
        chosen = _class_named(entrypoint, "entrypoint", trusted) if _is_dotted(entrypoint) else base
        if isinstance(chosen, type) and not issubclass(chosen, base):
            raise AgentError(f"agent.entrypoint {entrypoint!r} is not a {base.__name__} "
                             f"(agent.type is {kind})")
        return base, chosen
    if isinstance(kind, str) and kind in installed(AGENT_GROUP):
        return BaseAgent, f"entry point {kind}"
    if _is_dotted(kind):
        return BaseAgent, _class_named(kind, "type", trusted)
    if _is_dotted(entrypoint):
        return BaseAgent, _class_named(entrypoint, "entrypoint", trusted)
    raise AgentError(f"agent.type {kind!r}: use {', '.join(agent_names())}, or a dotted path to a BaseAgent "
                     f"subclass (in agent.type or agent.entrypoint) that the CLI names or {SETTING} lists")


def agent_check(workspace_path: str | Path, *, trusted: bool = False) -> None:
    """Raise AgentError unless the agent manifest.yaml asks for may be used by this caller:
    a built-in type, an installed entry point of `crucible.agents`, or a dotted path from the
    CLI (`trusted`) or listed in CRUCIBLE_ALLOWED_EXTENSIONS. Reads the manifest; imports nothing."""
    _agent_choice(agent_settings(workspace_path), trusted)


def _agent_class(target: str) -> type[BaseAgent]:
    """Load a class already allowed: an entry point (`entry point NAME`) or a dotted path."""
    if target.startswith("entry point "):
        name = target.removeprefix("entry point ")
        try:
            value = installed(AGENT_GROUP)[name].load()
        except Exception as error:  # an installed package's own failure to load
            raise AgentError(f"agent type {name!r} cannot be loaded: {type(error).__name__}: "
                             f"{error}") from None
    else:
        try:
            value = dotted_load(target, AgentError)
        except AgentError as error:
            raise AgentError(f"agent class {target!r} cannot be loaded: {error}") from None
    if not (isinstance(value, type) and issubclass(value, BaseAgent)):
        raise AgentError(f"{target!r} is not a BaseAgent subclass")
    return value


def agent_for(workspace_path: str | Path, *, trusted: bool = False, **options: Any) -> BaseAgent:
    """The agent manifest.yaml asks for: `type: command` → CommandAgent, `type: reference` →
    ReferenceLLMAgent (either refined by a subclass named in `entrypoint`), an entry point of
    `crucible.agents`, else a dotted path (in `type`, or in `entrypoint`) to a BaseAgent
    subclass. It is checked first (agent_check, with the same trust), so a manifest changed
    after the run was checked cannot make a worker import a class nobody allowed. `options` go
    to the class (e.g. model= for ReferenceLLMAgent)."""
    settings = agent_settings(workspace_path)
    base, chosen = _agent_choice(settings, trusted)
    cls = chosen if isinstance(chosen, type) else _agent_class(chosen)
    if not issubclass(cls, base):
        raise AgentError(f"agent.entrypoint {settings.get('entrypoint')!r} is not a {base.__name__} "
                         f"(agent.type is {settings.get('type')})")
    return cls(workspace_path, **options)


# ----------------------------------------------------------------------------- what a run gets


def _registry(workspace_path: Path) -> tuple[list[dict[str, Any]], str]:
    """The tool registry's entries and, if it cannot be read, why."""
    try:
        return AgentWorkspace(workspace_path).read_tool_registry(), ""
    except (WorkspaceError, OSError) as error:
        return [], str(error)


def agent_mapping(workspace_path: str | Path) -> dict[str, Any]:
    """What a run of this workspace gets, read from its files (nothing imported or called):
    {"agent": what manifest.yaml names, "a_evolve": whether it is an A-Evolve agent stood in
    for, "runs_as", for a reference agent "preset"/"model", "tools": [{name, as}],
    "unavailable": [{name, why}], "summary": one line saying it all}."""
    root = Path(workspace_path)
    try:
        settings = agent_settings(root)
    except AgentError as error:
        return {"agent": "", "a_evolve": False, "runs_as": "", "tools": [], "unavailable": [],
                "summary": str(error)}
    kind, entrypoint = settings.get("type"), settings.get("entrypoint")
    a_evolve = a_evolve_entrypoint(settings)
    named = a_evolve or (entrypoint if _is_dotted(entrypoint) else None) or str(kind or "")
    mapping: dict[str, Any] = {"agent": named, "a_evolve": bool(a_evolve), "tools": [], "unavailable": []}
    try:
        base = _agent_choice(settings, trusted=True)[0]
    except AgentError:
        base = None
    if base is ReferenceLLMAgent:
        preset, model, _effort = model_choice(settings)
        registry, unreadable = _registry(root)
        offered, unavailable = tool_plan(root, registry, a_evolve=bool(a_evolve))
        if unreadable:
            unavailable.append({"name": "tools/registry.yaml", "why": unreadable})
        mapping.update(runs_as="Crucible reference agent", preset=preset, model=model,
                       tools=[{"name": spec["registry_name"], "tool": name, "as": TOOL_KINDS[spec["kind"]]}
                              for name, spec in offered.items()],
                       unavailable=unavailable)
    elif base is CommandAgent:
        mapping["runs_as"] = "Crucible command agent"
    else:
        mapping["runs_as"] = f"agent class {named}" if named else "none"
    head = f"A-Evolve agent {a_evolve} → {mapping['runs_as']}" if a_evolve else mapping["runs_as"]
    if "model" in mapping:
        head += f" ({mapping['preset']}:{mapping['model'] or 'no model'})"
    parts = [head]
    if "preset" in mapping:
        parts.append("tools: " + (", ".join(f"{tool['name']} → {tool['as']}" for tool in mapping["tools"])
                                  or "none"))
    if mapping["unavailable"]:
        parts.append("not available: " + ", ".join(
            f"{entry['name']} ({entry['why']})" for entry in mapping["unavailable"]))
    mapping["summary"] = "; ".join(parts)
    return mapping


def agent_run_problems(workspace_path: str | Path) -> list[str]:
    """What would keep a run of this workspace's agent from working, known before it starts
    (agent_check has allowed its class): a reference agent's provider (a model provider, a
    model, a key here), and an A-Evolve agent whose registry lists tools none of which can run."""
    root = Path(workspace_path)
    settings = agent_settings(root)
    base, _chosen = _agent_choice(settings, trusted=True)
    if base is not ReferenceLLMAgent:
        return []
    problems = reference_problems(settings)
    a_evolve = a_evolve_entrypoint(settings)
    if a_evolve:
        registry, unreadable = _registry(root)
        if unreadable:
            problems.append(unreadable)
        offered, unavailable = tool_plan(root, registry, a_evolve=True)
        if unavailable and not offered:
            problems.append(f"A-Evolve agent {a_evolve} acts through the tools its tools/registry.yaml "
                            "lists, and Crucible can run none of them: " + "; ".join(
                                f"{entry['name']}: {entry['why']}" for entry in unavailable))
    return problems
