"""Importing workspaces as A-Evolve ships them: a preview that infers the manifest of a folder
without one, confirmed or edited, never half-imported; and the size limits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from evolve_app import workspace as ws
from evolve_app.workspace import (
    INFERRED_ENTRYPOINT,
    MAX_FILE_BYTES,
    MAX_MEMORY_LINES,
    MAX_WORKSPACE_BYTES,
    WorkspaceError,
    WorkspaceInvalid,
    layer_file_problem,
    workspace_check,
    workspace_import,
    workspace_manifest,
    workspace_preview,
    workspace_size_problem,
    workspace_validate,
)
from tests.evolve_app.helpers import git
from tests.evolve_app.import_shapes import shape_make, tree_snapshot

# ------------------------------------------------------------------------------ the preview


def test_an_artifact_with_prompt_md_gets_a_manifest_and_its_prompt_copied_on_confirm(tmp_path):
    root = shape_make(tmp_path, "tb2_clawcode_opus46")
    before = tree_snapshot(root)
    preview = workspace_preview(root)
    assert tree_snapshot(root) == before  # a preview writes nothing
    assert not preview.has_manifest and preview.problems == () and preview.warnings == ()
    assert preview.prompt_from == "prompt.md" and preview.writes == ("manifest.yaml", "prompts/system.md")
    assert any("prompt.md: the import copies it to prompts/system.md" in note for note in preview.notes)
    data = yaml.safe_load(preview.manifest)
    assert data == {"name": "tb2_clawcode_opus46", "contract_version": "1.0",
                    "agent": {"type": "reference", "entrypoint": INFERRED_ENTRYPOINT},
                    "evolvable_layers": ["prompts", "skills", "memory"], "reload_strategy": "hot"}

    workspace_import(root, manifest_text=preview.manifest)
    assert (root / "manifest.yaml").read_text() == preview.manifest
    assert (root / "prompts/system.md").read_bytes() == (root / "prompt.md").read_bytes()
    assert git(root, "tag") == "evo-0"
    assert "prompts/system.md" in git(root, "ls-files").split() and workspace_validate(root) == []


def test_an_artifact_with_memory_tools_and_reports_keeps_its_prompt_and_adds_the_tools_layer(tmp_path):
    root = shape_make(tmp_path, "mcp_mh_opus46")
    preview = workspace_preview(root)
    assert preview.problems == () and preview.prompt_from is None and preview.writes == ("manifest.yaml",)
    assert yaml.safe_load(preview.manifest)["evolvable_layers"] == ["prompts", "skills", "memory", "tools"]
    assert any("REPORT.md, harness.py, results.json" in note for note in preview.notes)
    workspace_import(root, manifest_text=preview.manifest)
    assert workspace_manifest(root).name == "mcp_mh_opus46"
    assert sorted(git(root, "ls-files").split()) == [
        "REPORT.md", "harness.py", "manifest.yaml", "memory/memories.jsonl", "prompts/system.md",
        "results.json", "tools/registry.yaml"]


def test_a_skills_only_seed_gets_a_short_generated_prompt_that_says_so(tmp_path):
    root = shape_make(tmp_path, "osworld")
    preview = workspace_preview(root)
    assert preview.problems == () and preview.prompt_from is None
    assert preview.writes == ("manifest.yaml", "prompts/system.md")
    assert any(note.startswith("No system prompt") for note in preview.notes)
    workspace_import(root, manifest_text=preview.manifest)
    assert "imported without a system prompt" in (root / "prompts/system.md").read_text()


def test_an_edited_manifest_with_errors_leaves_the_folder_exactly_as_it_was(tmp_path):
    root = shape_make(tmp_path, "tb2_clawcode_opus46")
    before = tree_snapshot(root)
    edited = workspace_preview(root).manifest.replace("reload_strategy: hot", "reload_strategy: warm") \
        .replace("type: reference", "type: [reference")
    with pytest.raises(WorkspaceInvalid) as refused:
        workspace_import(root, manifest_text=edited)
    assert [(p.path, p.line) for p in refused.value.problems] == [("manifest.yaml", 5)]
    assert "starts here" in refused.value.problems[0].message
    warm = workspace_preview(root).manifest.replace("reload_strategy: hot", "reload_strategy: warm")
    with pytest.raises(WorkspaceInvalid, match=r"manifest.yaml:\d+:18: reload_strategy: 'warm'"):
        workspace_import(root, manifest_text=warm)
    assert tree_snapshot(root) == before and not (root / ".git").exists()


def test_a_failure_after_the_files_are_written_takes_them_back(tmp_path, monkeypatch):
    root = shape_make(tmp_path, "osworld")
    before = tree_snapshot(root)
    manifest = workspace_preview(root).manifest

    def broken(*args, **kwargs):
        raise WorkspaceError("the disk is full")

    monkeypatch.setattr(ws.snapshots, "_commit", broken)
    with pytest.raises(WorkspaceError, match="disk is full"):
        workspace_import(root, manifest_text=manifest)
    assert tree_snapshot(root) == before


def test_a_manifest_text_for_a_folder_that_has_one_is_refused(workspace):
    problems, _ = workspace_check(workspace, manifest_text="agent: {}\n")
    assert [p.message for p in problems] == [
        "the folder has its own manifest.yaml; import it as it is (edit that file to change it)"]
    preview = workspace_preview(workspace)
    assert preview.has_manifest and preview.writes == () and "reload_strategy: hot" in preview.manifest


def test_the_preview_shows_what_would_refuse_the_import_besides_the_manifest(tmp_path):
    root = shape_make(tmp_path, "mcp_mh_opus46")
    (root / "memory/memories.jsonl").write_text("not json\n")
    preview = workspace_preview(root)
    assert [str(p) for p in preview.problems] == [
        "memory/memories.jsonl:1:1: not valid JSON: Expecting value"]


# ------------------------------------------------------------------------------ size limits


def sparse(path: Path, size: int) -> Path:
    """A file of `size` bytes that takes no disk space."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    os.truncate(path, size)
    return path


def test_a_file_over_the_limit_is_refused_naming_the_limit_and_never_read(make_workspace, monkeypatch):
    root = make_workspace()
    sparse(root / "skills/code-search/SKILL.md", 100 * 2**20)
    sparse(root / "data/blob.bin", 300 * 2**20)
    reads = []
    real_open = open

    def watched(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if "b" in mode and str(file).endswith(("SKILL.md", "blob.bin")):
            real_read = handle.read
            handle = _Reads(handle, real_read, reads)
        return handle

    monkeypatch.setattr("builtins.open", watched)
    problems = workspace_validate(root)
    monkeypatch.undo()
    by_path = {p.path: p.message for p in problems}
    assert by_path["skills/code-search/SKILL.md"].startswith("100.0 MiB, over the limit of 4.0 MiB per file "
                                                              "(MAX_FILE_BYTES)")
    assert by_path["data/blob.bin"].startswith("300.0 MiB, over the limit of 4.0 MiB per file")
    assert by_path["."].startswith("the workspace's files add up to 400.0 MiB")
    assert "(MAX_WORKSPACE_BYTES); the largest: data/blob.bin (300.0 MiB)" in by_path["."]
    assert all(size is not None and size <= MAX_FILE_BYTES + 1 for size in reads)
    with pytest.raises(WorkspaceInvalid):
        workspace_import(root)
    assert not (root / ".git").exists()


class _Reads:
    def __init__(self, handle, read, log):
        self._handle, self._read, self._log = handle, read, log

    def read(self, size=-1):
        self._log.append(None if size is None or size < 0 else size)
        return self._read(size)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc)


def test_a_workspace_over_the_total_limit_is_refused_though_each_file_fits(make_workspace):
    root = make_workspace()
    count = MAX_WORKSPACE_BYTES // MAX_FILE_BYTES + 1
    for index in range(count):
        sparse(root / f"data/part{index}.bin", MAX_FILE_BYTES)
    sparse(root / "evolution/observations/huge.jsonl", MAX_WORKSPACE_BYTES)  # not counted
    problems = workspace_validate(root)
    assert [p.path for p in problems] == ["."]
    assert workspace_size_problem(root) == problems[0].message
    (root / "data/part0.bin").unlink()  # the seed's own files take the rest
    (root / "data/part1.bin").unlink()
    assert workspace_validate(root) == [] and workspace_size_problem(root) is None


def test_a_memory_file_over_the_line_limit_is_refused(make_workspace):
    root = make_workspace(extra={"memory/episodic.jsonl": "{}\n" * (MAX_MEMORY_LINES + 1)})
    problems = workspace_validate(root)
    assert [str(p) for p in problems] == [
        f"memory/episodic.jsonl: {MAX_MEMORY_LINES + 1:,} lines, over the limit of {MAX_MEMORY_LINES:,} "
        "lines per memory file (MAX_MEMORY_LINES); summarise or split it"]
    assert layer_file_problem(root, "memory/episodic.jsonl") == problems[0].message
    (root / "memory/episodic.jsonl").write_text("{}\n" * MAX_MEMORY_LINES)
    assert workspace_validate(root) == [] and layer_file_problem(root, "memory/episodic.jsonl") is None


def test_layer_file_problem_names_symlinks_special_files_and_oversized_files(workspace, tmp_path):
    root = workspace
    assert layer_file_problem(root, "skills/code-search/SKILL.md") is None
    assert layer_file_problem(root, "skills/gone/SKILL.md") is None  # a deletion
    (root / "memory/link.jsonl").symlink_to("/etc/hostname")
    assert layer_file_problem(root, "memory/link.jsonl") == "a symlink; a workspace holds plain files only"
    (tmp_path / "elsewhere").mkdir()
    (root / "skills/linked").symlink_to(tmp_path / "elsewhere")
    assert layer_file_problem(root, "skills/linked/SKILL.md") == (
        "skills/linked is a symlink; a workspace holds plain files only")
    os.mkfifo(root / "memory/pipe.jsonl")
    assert layer_file_problem(root, "memory/pipe.jsonl").startswith("not a regular file")
    sparse(root / "skills/big/SKILL.md", MAX_FILE_BYTES + 1)
    assert "(MAX_FILE_BYTES)" in layer_file_problem(root, "skills/big/SKILL.md")
    assert layer_file_problem(root, "../outside") == "not a relative path inside the workspace"
    assert layer_file_problem(root, ".git/config") == "not a relative path inside the workspace"
    problems = {p.path: p.message for p in workspace_validate(root)}
    assert problems["memory/pipe.jsonl"].startswith("not a regular file")


# ------------------------------------------------------------------- A-Evolve's own defaults


def test_what_a_evolve_defaults_is_filled_in_with_a_warning_not_refused(make_workspace):
    root = make_workspace(extra={"manifest.yaml": "name: bare\n"})
    problems, warnings = workspace_check(root)
    assert problems == []
    manifest = workspace_manifest(root)
    assert manifest.agent.type == "reference" and manifest.agent.entrypoint is None
    assert manifest.evolvable_layers == ["prompts", "skills", "memory"] and manifest.reload_strategy == "hot"
    assert {"agent", "evolvable_layers", "reload_strategy"} <= set(manifest.absent)
    assert [w.message.split(":")[0] for w in warnings] == [
        "no agent", "no evolvable_layers", "no reload_strategy"]


def test_a_custom_agent_a_later_contract_and_a_layer_crucible_does_not_evolve_are_warnings(make_workspace):
    root = make_workspace(extra={"manifest.yaml": (
        "agent:\n  entrypoint: agent_evolve.agents.terminal.agent.TerminalAgent\n"
        "evolvable_layers: [prompts, harness]\nreload_strategy: cold\ncontract_version: \"1.1\"\n")})
    problems, warnings = workspace_check(root)
    assert problems == []
    manifest = workspace_manifest(root)
    assert manifest.evolvable_layers == ["prompts"] and manifest.agent.type == "reference"
    by_line = {(w.line, w.column): w.message for w in warnings}
    assert "'harness' is not a layer Crucible evolves" in by_line[(3, 29)]
    assert "read as contract version 1" in by_line[(5, 19)]
    assert "no agent.type" in by_line[(1, 1)]
    # A later major version is refused.
    refused, _ = workspace_check(make_workspace(name="major", extra={
        "manifest.yaml": "contract_version: \"2\"\n"}))
    assert [p.message for p in refused] == ["contract_version '2' is not supported; this Crucible reads "
                                            "contract version 1 (write \"1\")"]


def test_a_misspelt_required_key_is_still_reported_where_it_is_written(make_workspace):
    root = make_workspace(extra={"manifest.yaml": (
        "agent:\n  type: reference\n  entrypoint: evolve_app.agents.ReferenceLLMAgent\n"
        "evolvable_layer: [prompts]\nreload_strategy: hot\n")})
    problems, _ = workspace_check(root)
    assert [(p.line, "evolvable_layer' on line 4" in p.message) for p in problems] == [(4, True)]
