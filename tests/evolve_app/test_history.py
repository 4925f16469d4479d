"""EvolutionHistory: diffs, files at a ref, the snapshot log, per-layer changes and rollback."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from evolve_app.history import EvolutionHistory
from evolve_app.workspace import AgentWorkspace, WorkspaceError, workspace_snapshot
from tests.gitrepo import git


def cycle(root: Path, number: int, mutate) -> None:
    """One cycle's snapshots: pre-evo-N, the engine's mutation, evo-N."""
    workspace_snapshot(root, f"pre-evo-{number}", f"Before cycle {number}", {"Crucible-Cycle": str(number)})
    mutate(AgentWorkspace(root))
    workspace_snapshot(root, f"evo-{number}", f"Cycle {number}", {"Crucible-Cycle": str(number)})


@pytest.fixture
def evolved(imported_workspace: Path) -> Path:
    """Two cycles: the first rewrites the prompt and adds a skill, the second edits and deletes."""

    def first(ws: AgentWorkspace) -> None:
        ws.write_prompt("You are a careful software engineer. Run the tests.\n")
        ws.write_skill("verify", "---\nname: verify\ndescription: Run the tests.\n---\nRun them.\n")

    def second(ws: AgentWorkspace) -> None:
        ws.write_skill("verify", "---\nname: verify\ndescription: Run the tests.\n---\nRun them twice.\n")
        ws.delete_skill("code-search")
        ws.write_draft("retry", "Retry once.\n")
        ws.add_memory({"lesson": "tests flake"})

    cycle(imported_workspace, 1, first)
    cycle(imported_workspace, 2, second)
    return imported_workspace


def test_the_diff_between_two_snapshots_is_the_unified_git_diff(evolved):
    history = EvolutionHistory(evolved)
    diff = history.get_workspace_diff("evo-0", "evo-1")
    assert diff == git(evolved, "diff", "--no-renames", "evo-0", "evo-1") + "\n"
    assert "+You are a careful software engineer. Run the tests." in diff
    assert "diff --git a/skills/verify/SKILL.md b/skills/verify/SKILL.md" in diff
    only_skills = history.get_workspace_diff("evo-1", "evo-2", paths=["skills/verify"])
    assert "+Run them twice." in only_skills and "code-search" not in only_skills
    assert history.get_workspace_diff("pre-evo-1", "evo-0") == ""


def test_read_file_at_returns_the_file_at_a_ref_or_none(evolved):
    history = EvolutionHistory(evolved)
    assert history.read_file_at("evo-0", "prompts/system.md") == "You are a careful software engineer.\n"
    assert history.read_file_at("evo-1", "prompts/system.md").endswith("Run the tests.\n")
    assert history.read_file_at("evo-0", "skills/verify/SKILL.md") is None
    assert history.read_file_at("evo-1", "skills") is None  # a folder is not a file
    with pytest.raises(WorkspaceError, match="relative path inside the workspace"):
        history.read_file_at("evo-1", "../etc/passwd")
    with pytest.raises(WorkspaceError, match="no branch, tag or commit"):
        history.read_file_at("evo-9", "prompts/system.md")


def test_version_log_lists_the_snapshot_tags_in_cycle_order(evolved):
    git(evolved, "tag", "unrelated")
    git(evolved, "tag", "evo-10", "evo-2")  # lightweight: the commit's message and date
    log = EvolutionHistory(evolved).version_log()
    assert [(v["tag"], v["cycle"], v["kind"]) for v in log] == [
        ("evo-0", 0, "post"), ("pre-evo-1", 1, "pre"), ("evo-1", 1, "post"),
        ("pre-evo-2", 2, "pre"), ("evo-2", 2, "post"), ("evo-10", 10, "post"),
    ]
    for version in log:
        assert version["sha"] == git(evolved, "rev-parse", f"{version['tag']}^{{commit}}")
        assert isinstance(version["date"], datetime) and version["date"].tzinfo is not None
    assert [v["message"] for v in log[:3]] == [
        "Workspace imported into Crucible", "Before cycle 1", "Cycle 1"]
    assert log[-1]["message"] == "Cycle 2"


def test_layer_changes_name_the_skills_added_modified_and_deleted_and_the_prompt_size_change(evolved):
    history = EvolutionHistory(evolved)
    first = history.layer_changes("pre-evo-1", "evo-1")
    assert first["skills_added"] == ["verify"]
    assert first["skills_modified"] == [] and first["skills_deleted"] == []
    assert (first["prompt_chars_before"], first["prompt_chars_after"]) == (37, 52)
    assert first["prompt_chars_delta"] == first["prompt_size_change"] == len(" Run the tests.")
    assert first["files_changed"] == {"prompts": 1, "skills": 1, "memory": 0, "tools": 0, "other": 0}

    second = history.layer_changes("pre-evo-2", "evo-2")
    assert (second["skills_added"], second["skills_modified"], second["skills_deleted"]) == (
        [], ["verify"], ["code-search"])
    assert second["drafts_changed"] == 1 and second["prompt_chars_delta"] == 0
    assert second["files_changed"] == {"prompts": 0, "skills": 3, "memory": 1, "tools": 0, "other": 0}


def test_rollback_adds_a_commit_whose_tree_equals_the_target_and_keeps_history(evolved):
    before = git(evolved, "log", "--oneline").splitlines()
    sha = EvolutionHistory(evolved).rollback("evo-1", author="Ada <ada@example.com>")

    after = git(evolved, "log", "--oneline").splitlines()
    assert len(after) == len(before) + 1 and after[1:] == before
    assert git(evolved, "rev-parse", "HEAD") == sha == git(evolved, "rev-parse", "main")
    assert git(evolved, "rev-parse", "HEAD^{tree}") == git(evolved, "rev-parse", "evo-1^{tree}")
    assert git(evolved, "rev-parse", "HEAD^") == git(evolved, "rev-parse", "evo-2^{commit}")
    assert git(evolved, "log", "-1", "--format=%s%n%(trailers:key=Crucible-Rollback-To,valueonly)%n%an") \
        .splitlines() == ["Roll back to evo-1", "evo-1", "", "Ada"]
    assert git(evolved, "status", "--porcelain") == ""  # the files followed
    assert (evolved / "skills/code-search/SKILL.md").exists()
    assert not (evolved / "skills/_drafts/retry.md").exists()
    assert git(evolved, "rev-parse", "evo-2^{commit}")  # tags untouched


def test_rollback_refuses_uncommitted_changes_unless_forced(evolved):
    head = git(evolved, "rev-parse", "HEAD")
    AgentWorkspace(evolved).write_prompt("Unsaved work.\n")
    history = EvolutionHistory(evolved)
    with pytest.raises(WorkspaceError, match="uncommitted changes"):
        history.rollback("evo-0")
    assert git(evolved, "rev-parse", "HEAD") == head
    assert (evolved / "prompts/system.md").read_text() == "Unsaved work.\n"

    history.rollback("evo-0", force=True)
    assert git(evolved, "rev-parse", "HEAD^{tree}") == git(evolved, "rev-parse", "evo-0^{tree}")
    assert (evolved / "prompts/system.md").read_text() == "You are a careful software engineer.\n"


def test_refs_that_look_like_options_are_refused(evolved):
    history = EvolutionHistory(evolved)
    with pytest.raises(WorkspaceError):
        history.get_workspace_diff("--output=/tmp/leak", "evo-1")
    with pytest.raises(WorkspaceError):
        history.get_workspace_diff("evo-0", "evo-1", paths=["--output=/tmp/leak"])
    assert not Path("/tmp/leak").exists()


def test_score_curve_shapes_records_the_caller_loaded(evolved):
    records = [{"number": 2, "score": 0.5}, {"cycle": 1, "score": 0.25}, {"number": 3, "score": None}]
    assert EvolutionHistory.score_curve(records) == [(1, 0.25), (2, 0.5)]
