"""An agent workspace: a folder of plain files under git, read and written through one contract.

The layout is the A-Evolve seed's, unchanged, so existing A-Evolve workspaces open as they are:

    manifest.yaml                  name, version, contract_version, agent, evolvable_layers, reload_strategy
    prompts/system.md              the system prompt (required)
    prompts/fragments/<name>.md    modular prompt pieces
    skills/<name>/SKILL.md         YAML front matter (`name`, `description`), then the skill
    skills/_drafts/<name>.md       skill proposals an agent made during a cycle
    memory/<category>.jsonl        one JSON object per line
    tools/registry.yaml            `tools: [{name: ..., ...}]`, each entry naming tools/<name>.py
    evolution/                     observation batches; excluded from the workspace's git history

What Crucible adds to upstream:

* `workspace_validate` reports every problem at once, each with its file and line (YAML syntax,
  missing or ill-typed manifest keys, skills, memory lines, the tool registry, encodings, size
  limits), instead of failing on the first one at run time; `workspace_check` adds the warnings:
  unknown manifest keys, kept (`Manifest.extra`) and never refused, as A-Evolve ignores them.
* A folder without manifest.yaml (an A-Evolve artifact) gets `workspace_preview`: the manifest
  Crucible infers and where its prompt is; `workspace_import(manifest_text=...)` confirms it.
* Size limits (MAX_FILE_BYTES, MAX_WORKSPACE_BYTES, MAX_MEMORY_LINES), checked with stat before
  anything is read; `layer_file_problem` says why one file may not be in a workspace.
* Every name a caller passes (skill, category, fragment, tool, draft) is checked, so no call can
  reach outside the workspace; reads and writes refuse symlinks; writes are atomic.
* Git is handled here, with dulwich and the sealed git CLI (`runtime_app.worktrees.git_run`):
  `workspace_import` (init, commit, tag `evo-0`), `workspace_snapshot` (commit + annotated tag
  that is never moved), `workspace_changed_paths`, `workspace_restore` (working tree back to a
  ref, history untouched) and `workspace_rollback` (a new commit whose tree is an old one).
  Staging and restoring read and write raw bytes with dulwich's index primitives: no hook, no
  clean/smudge filter and no user or system git config ever runs or applies.

* Import never writes into the user's folder: `workspace_copy` copies it (git history included)
  into Crucible's data dir after `workspace_copy_problem` checked its size from lstat, and
  `workspace_unused` lists every file no reader of Crucible reads, with the reason.

The package: `validation` (the checks, and the manifest inferred for a folder without one), `files`
(AgentWorkspace), `snapshots` (git) and `copies` (Crucible's copy, unused files). The names
below are its public face.
"""

from __future__ import annotations

from evolve_app.workspace.copies import (
    MAX_COPY_BYTES,
    MAX_COPY_FILES,
    copy_slug,
    workspace_copy,
    workspace_copy_problem,
    workspace_unused,
)
from evolve_app.workspace.files import AgentWorkspace, _name
from evolve_app.workspace.snapshots import (
    workspace_changed_paths,
    workspace_changes,
    workspace_git,
    workspace_import,
    workspace_ref_and_tree,
    workspace_restore,
    workspace_rollback,
    workspace_snapshot,
)
from evolve_app.workspace.validation import (
    A_EVOLVE_DEFAULTS,
    CONTRACT_VERSION,
    DEFAULT_AUTHOR,
    DRAFTS_DIR,
    EXCLUDED_DIR,
    GENERATED_PROMPT,
    INFERRED_ENTRYPOINT,
    LAYERS,
    MAX_FILE_BYTES,
    MAX_MEMORY_LINES,
    MAX_WORKSPACE_BYTES,
    PAGE_FILE_CHARS,
    PROMPT_CANDIDATES,
    AgentSection,
    ImportPreview,
    Manifest,
    Problem,
    WorkspaceError,
    WorkspaceInvalid,
    layer_file_problem,
    manifest_warnings,
    skill_front_matter,
    workspace_check,
    workspace_manifest,
    workspace_preview,
    workspace_size_problem,
    workspace_validate,
)

__all__ = [
    "A_EVOLVE_DEFAULTS",
    "CONTRACT_VERSION",
    "DEFAULT_AUTHOR",
    "DRAFTS_DIR",
    "EXCLUDED_DIR",
    "GENERATED_PROMPT",
    "INFERRED_ENTRYPOINT",
    "LAYERS",
    "MAX_COPY_BYTES",
    "MAX_COPY_FILES",
    "MAX_FILE_BYTES",
    "MAX_MEMORY_LINES",
    "MAX_WORKSPACE_BYTES",
    "PAGE_FILE_CHARS",
    "PROMPT_CANDIDATES",
    "AgentSection",
    "AgentWorkspace",
    "ImportPreview",
    "Manifest",
    "Problem",
    "WorkspaceError",
    "WorkspaceInvalid",
    "_name",
    "copy_slug",
    "layer_file_problem",
    "manifest_warnings",
    "skill_front_matter",
    "workspace_changed_paths",
    "workspace_changes",
    "workspace_check",
    "workspace_copy",
    "workspace_copy_problem",
    "workspace_git",
    "workspace_import",
    "workspace_manifest",
    "workspace_preview",
    "workspace_ref_and_tree",
    "workspace_restore",
    "workspace_rollback",
    "workspace_size_problem",
    "workspace_snapshot",
    "workspace_unused",
    "workspace_validate",
]
