"""Import never writes into the user's folder: it copies the folder (its git history too) into
the data dir and imports the copy; every later write (evo-0, an inferred manifest, snapshots,
rollbacks) lands in the copy. Importing the same folder again is its agent; a folder too big to
copy is refused before anything is copied. Every file Crucible will not use is a warning with the
reason, kept with the agent."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from evolve_app import services
from evolve_app import workspace as ws
from evolve_app.demo import SEED_WORKSPACE
from evolve_app.models import Agent
from evolve_app.workspace import workspace_rollback, workspace_snapshot, workspace_unused
from tests.evolve_app.helpers import SEED_MANIFEST, git
from tests.evolve_app.import_shapes import SKILL, shape_make, tree_snapshot

pytestmark = pytest.mark.django_db


def seed_folder(parent: Path, name: str = "seed") -> Path:
    root = parent / name
    for rel, text in {"manifest.yaml": SEED_MANIFEST, "prompts/system.md": "Be careful.\n",
                      "skills/code-search/SKILL.md": SKILL.format(name="code-search")}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def a_repo_with_history(parent: Path) -> Path:
    """A seed already under git with two commits, evo-0 and evo-1 tags, and an uncommitted edit."""
    root = seed_folder(parent, "evolved")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qm", "first")
    git(root, "tag", "evo-0")
    (root / "skills/code-search/SKILL.md").write_text(SKILL.format(name="code-search") + "More.\n")
    git(root, "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qam", "second")
    git(root, "tag", "-a", "evo-1", "-m", "cycle 1")
    (root / "prompts/system.md").write_text("Be very careful.\n")  # not committed
    return root


SHAPES = {"with a manifest": seed_folder, "a git repo with history and evo tags": a_repo_with_history,
          "without a manifest (osworld)": lambda parent: shape_make(parent, "osworld"),
          "without a manifest (mcp_mh)": lambda parent: shape_make(parent, "mcp_mh_opus46"),
          "without a manifest (clawcode)": lambda parent: shape_make(parent, "tb2_clawcode_opus46")}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_users_folder_is_byte_for_byte_unchanged_by_import_snapshots_and_rollback(
        shape, personas, data_dir, tmp_path):
    root = SHAPES[shape](tmp_path / "user")
    before = tree_snapshot(root)
    agent = services.agent_import(personas.member, personas.alpha, str(root), infer=True, trusted=True)
    copy = Path(agent.path)
    assert agent.source_path == str(root) and copy.parent == data_dir / "agents"
    assert copy.name == f"{root.name.lower()}-1"
    assert tree_snapshot(root) == before
    assert (copy / "manifest.yaml").is_file() and (copy / "prompts/system.md").is_file()
    assert git(copy, "status", "--porcelain") == ""  # everything committed in the copy
    (copy / "prompts/system.md").write_text("Changed by a cycle.\n")
    workspace_snapshot(copy, "evo-90", "a cycle")
    workspace_rollback(copy, "evo-0")
    assert tree_snapshot(root) == before


def test_a_git_repo_keeps_its_history_and_tags_in_the_copy(personas, data_dir, tmp_path):
    root = a_repo_with_history(tmp_path)
    commits = git(root, "rev-list", "HEAD").split()
    agent = services.agent_import(personas.member, personas.alpha, str(root), trusted=True)
    copy = Path(agent.path)
    assert git(copy, "rev-list", "HEAD").split()[1:] == commits  # its uncommitted edit is one more commit
    assert git(copy, "tag").split() == ["evo-0", "evo-1"]
    assert git(copy, "rev-parse", "evo-1^{commit}") == git(root, "rev-parse", "evo-1^{commit}")
    assert (copy / "prompts/system.md").read_text() == "Be very careful.\n"
    assert git(root, "status", "--porcelain") == "M prompts/system.md"  # still uncommitted there


def test_a_copied_repository_never_points_back_at_the_users_folder(personas, data_dir, tmp_path):
    root = a_repo_with_history(tmp_path)
    git(root, "config", "core.worktree", str(root))
    before = tree_snapshot(root)
    agent = services.agent_import(personas.member, personas.alpha, str(root), trusted=True)
    assert "worktree" not in (Path(agent.path) / ".git/config").read_text()
    (Path(agent.path) / "prompts/system.md").write_text("Changed by a cycle.\n")
    workspace_snapshot(agent.path, "evo-90", "a cycle")
    assert tree_snapshot(root) == before
    assert any(entry["path"] == ".git/config" for entry in agent.import_warnings)


def test_importing_the_same_folder_again_is_its_agent_with_a_note(personas, data_dir, tmp_path):
    root = seed_folder(tmp_path)
    first = services.agent_import(personas.member, personas.alpha, str(root), trusted=True)
    assert first.import_note == ""
    again = services.agent_import(personas.member, personas.alpha, str(root), name="other", trusted=True)
    assert again.pk == first.pk and again.name == first.name
    assert again.import_note == (f"{root} is already imported into alpha as agent {first.name} (its copy "
                                 f"{first.path}); nothing was copied again, and changes made to the folder "
                                 "since are not in the copy.")
    assert services.agent_import(personas.member, personas.alpha, first.path, trusted=True).pk == first.pk
    assert sorted(path.name for path in (data_dir / "agents").iterdir()) == ["seed-1"]
    other = services.agent_import(personas.outsider, personas.beta, str(root), trusted=True)
    assert other.pk != first.pk and Path(other.path).name == "seed-2"  # another project: its own copy
    with pytest.raises(ValidationError, match="belongs to another project"):
        services.agent_import(personas.outsider, personas.beta, first.path, trusted=True)


def test_a_folder_too_big_to_copy_is_refused_before_anything_is_copied(personas, data_dir, tmp_path,
                                                                        monkeypatch):
    root = seed_folder(tmp_path)
    git(root, "init", "-q")
    for index in range(5):
        (root / ".git" / f"pack-{index}").write_bytes(b"x" * 1000)  # history counts too
    monkeypatch.setattr(ws.copies, "MAX_COPY_BYTES", 4000)
    with pytest.raises(ValidationError, match=r"over the limit of 3.9 KiB for Crucible's copy "
                                              r"\(MAX_COPY_BYTES\).*Nothing was copied"):
        services.agent_import(personas.member, personas.alpha, str(root), trusted=True)
    monkeypatch.setattr(ws.copies, "MAX_COPY_BYTES", 10**9)
    monkeypatch.setattr(ws.copies, "MAX_COPY_FILES", 10)
    with pytest.raises(ValidationError, match=r"more than 10 files and folders .*\(MAX_COPY_FILES\)"):
        services.agent_import(personas.member, personas.alpha, str(root), trusted=True)
    assert not (data_dir / "agents").exists() or not any((data_dir / "agents").iterdir())
    assert not Agent.objects.exists()


def test_a_symlink_inside_git_is_refused_so_the_copy_cannot_write_into_another_repository(
        personas, data_dir, tmp_path):
    root = seed_folder(tmp_path)
    git(root, "init", "-q")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / ".git/objects/pack").rmdir()
    (root / ".git/objects/pack").symlink_to(elsewhere)
    with pytest.raises(ValidationError, match=r"\.git/objects/pack is a symlink inside \.git"):
        services.agent_import(personas.member, personas.alpha, str(root), trusted=True)


def test_a_git_link_is_not_copied_and_the_copy_starts_its_own_history(personas, data_dir, tmp_path):
    root = seed_folder(tmp_path)
    (root / ".git").write_text("gitdir: /somewhere/else/.git/worktrees/seed\n")
    before = tree_snapshot(root)
    agent = services.agent_import(personas.member, personas.alpha, str(root), trusted=True)
    assert git(agent.path, "tag") == "evo-0" and tree_snapshot(root) == before
    assert any(entry["path"] == ".git" and "starts its own history" in entry["message"]
               for entry in agent.import_warnings)


def test_a_failed_import_leaves_no_copy_behind(personas, data_dir, tmp_path, monkeypatch):
    root = shape_make(tmp_path, "osworld")

    def broken(*args, **kwargs):
        raise ws.WorkspaceError("the disk is full")

    monkeypatch.setattr(ws.snapshots, "_commit", broken)
    with pytest.raises(ValidationError, match="disk is full"):
        services.agent_import(personas.member, personas.alpha, str(root), infer=True, trusted=True)
    assert list((data_dir / "agents").iterdir()) == [] and not Agent.objects.exists()


def test_a_folder_without_a_manifest_needs_infer_or_a_manifest(personas, data_dir, tmp_path):
    root = shape_make(tmp_path, "osworld")
    with pytest.raises(services.ManifestMissing):
        services.agent_import(personas.member, personas.alpha, str(root), trusted=True)
    assert not Agent.objects.exists()


def test_the_demo_agent_is_a_copy_made_the_same_way_each_time_a_new_one(personas, data_dir):
    first = services.demo_agent_create(personas.owner, personas.alpha)
    second = services.demo_agent_create(personas.owner, personas.alpha)
    assert (first.name, second.name) == ("demo agent 1", "demo agent 2")
    assert [Path(first.path).name, Path(second.path).name] == ["demo-1", "demo-2"]
    assert first.source_path == str(SEED_WORKSPACE) and git(first.path, "tag") == "evo-0"
    assert not (SEED_WORKSPACE / ".git").exists()


# ---------------------------------------------------------------------------- files not used


def test_every_file_crucible_will_not_use_is_a_warning_with_its_reason(personas, data_dir, tmp_path):
    root = tmp_path / "arc"
    files = {
        "manifest.yaml": ("name: arc\nagent:\n  type: reference\n"
                          "  entrypoint: agent_evolve.agents.arc.mas_agent.MASArcAgent\n"
                          "evolvable_layers: [prompts, skills, memory, tools]\nreload_strategy: hot\n"),
        "prompts/system.md": "Orchestrate.\n", "prompts/solver.md": "Solve.\n",
        "skills/grid/SKILL.md": SKILL.format(name="grid"), "skills/grid/scripts/rotate.py": "pass\n",
        "skills/README.md": "# Skills\n", "skills/group/nested/SKILL.md": SKILL.format(name="nested"),
        "skills/_drafts/idea.md": "an idea\n",
        "memory/episodic.jsonl": "{}\n", "memory/notes.txt": "loose notes\n",
        "tools/registry.yaml": "tools:\n  - name: grep\n  - name: helper\n    file: helper_tool.py\n",
        "tools/grep.py": "print(1)\n", "tools/helper.py": "pass\n", "tools/helper_tool.py": "pass\n",
        "tools/unlisted.py": "pass\n",
        "tools/solver.yaml": "tools:\n  submit_action: {}\n",
        "harness.py": "print('harness')\n", ".claude/skills/review/SKILL.md": SKILL.format(name="review"),
        ".claude/settings.json": "{}\n", "reports/run-3.md": "# run 3\n", "data.csv": "a,b\n",
        ".gitignore": "*.tmp\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    agent = services.agent_import(personas.member, personas.alpha, str(root), trusted=True)
    reasons = {entry["path"]: entry["message"] for entry in agent.import_warnings
               if entry["kind"] == "unused"}
    assert sorted(reasons) == [".claude/settings.json", ".claude/skills/review/SKILL.md", "data.csv",
                               "harness.py", "memory/notes.txt", "reports/run-3.md", "skills/README.md",
                               "skills/group/nested/SKILL.md", "tools/solver.yaml", "tools/unlisted.py"]
    assert "A-Evolve's arc-mas seed lists in tools/<role>.yaml the tools each subagent role" in \
        reasons["tools/solver.yaml"]
    assert "Crucible's tool registry reads tools/registry.yaml only" in reasons["tools/solver.yaml"]
    assert "an A-Evolve agent's own harness" in reasons["harness.py"]
    assert "never runs this file" in reasons["harness.py"]
    assert "Claude Code skill folder" in reasons[".claude/skills/review/SKILL.md"]
    assert "move its folder to skills/review/" in reasons[".claude/skills/review/SKILL.md"]
    assert "a report or results of an earlier run" in reasons["reports/run-3.md"]
    assert reasons["data.csv"].startswith("not used: no part of Crucible reads it (Crucible reads "
                                          "manifest.yaml")
    assert "no engine changes it" in reasons["data.csv"]
    assert "engines may change" in reasons["tools/unlisted.py"]
    # What the page shows later is what was stored, whatever happens to the copy.
    (Path(agent.path) / "harness.py").unlink()
    assert Agent.objects.get(pk=agent.pk).import_warnings == agent.import_warnings


def test_a_command_agent_may_read_any_file_so_none_is_listed(personas, data_dir, tmp_path):
    root = seed_folder(tmp_path)
    (root / "manifest.yaml").write_text("agent:\n  type: command\n  command: python3 run.py\n"
                                        "evolvable_layers: [prompts, skills]\nreload_strategy: hot\n")
    (root / "run.py").write_text("print(open('data.csv').read())\n")
    (root / "data.csv").write_text("a,b\n")
    agent = services.agent_import(personas.member, personas.alpha, str(root), trusted=True)
    assert [entry["path"] for entry in agent.import_warnings] == ["."]
    assert agent.import_warnings[0]["message"].endswith("runs its own program (Crucible command agent), "
                                                        "which may read any file of the workspace; no other "
                                                        "part of Crucible reads these: data.csv, run.py")
    demo = services.demo_agent_create(personas.owner, personas.alpha)
    assert demo.import_warnings == []  # every file of the demo is read


def test_the_unused_files_past_the_cap_are_one_line(tmp_path, monkeypatch):
    root = seed_folder(tmp_path)
    for index in range(5):
        (root / f"extra-{index}.txt").write_text("x\n")
    monkeypatch.setattr(ws.copies, "MAX_UNUSED_LISTED", 3)
    found = workspace_unused(root, layers=["prompts"])
    assert [entry.path for entry in found] == ["extra-0.txt", "extra-1.txt", "extra-2.txt", "."]
    assert found[-1].message == "and 2 more files no part of Crucible reads"
