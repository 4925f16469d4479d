"""Every shape A-Evolve ships — its eight seed workspaces and its evolved artifacts, made in tmp
dirs — imports unchanged (a folder without a manifest through the import preview the operator
confirms) and runs a cycle: the agent solves tasks against the loopback fake provider, the engine
evolves, `evo-1` is made in Crucible's copy, the copy's HEAD and tree agree afterwards, and the
user's folder is byte for byte as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from evolve_app import services
from evolve_app.workspace import manifest_warnings, workspace_changes, workspace_git, workspace_preview
from tests.evolve_app import import_shapes
from tests.evolve_app.helpers import files_write
from tests.evolve_app.test_a_evolve_run import (
    ANSWER,
    SHAPES,
    cycle_run,
    keyed,  # noqa: F401
    manifest,
    roots,  # noqa: F401
)

pytestmark = pytest.mark.django_db(transaction=True)

SKILL = "---\nname: {name}\ndescription: How to {name}.\n---\n\n# {name}\n\nCheck before answering.\n"

# The two seeds test_a_evolve_run does not build: a top-level key A-Evolve ignores, several
# prompts beside system.md and role tool files instead of a registry (arc-mas); skills and memory
# (skillbench).
MORE = {
    "arc-mas": {
        "manifest.yaml": ("name: arc-agi-3-mas\n"
                          "description: Multi-Agent System for ARC-AGI-3 with wiki-style knowledge\n\n"
                          "agent:\n  type: reference\n"
                          "  entrypoint: agent_evolve.agents.arc.mas_agent.MASArcAgent\n\n"
                          "evolvable_layers:\n  - prompts\n  - skills\n  - memory\n\nreload_strategy: hot\n"),
        "prompts/system.md": "You orchestrate subagents that play ARC-AGI-3 games.\n",
        "prompts/solver.md": "You solve the level.\n",
        "prompts/explorer.md": "You explore the game.\n",
        "tools/solver.yaml": ("# Tools available to solver subagents\ntools:\n  submit_action:\n"
                              "    description: \"Submit a game action.\"\n  render_frame:\n"
                              "    description: \"Render the current grid as text.\"\n"),
    },
    "skillbench": {
        "manifest.yaml": manifest("agent_evolve.agents.skillbench.agent.SkillBenchAgent",
                                  name="skillbench-agent"),
        "prompts/system.md": "You solve SkillBench tasks with the skills you have.\n",
        "memory/memories.jsonl": '{"lesson": "read the skill list first"}\n',
        "skills/skill-usage/SKILL.md": SKILL.format(name="skill-usage"),
        "skills/data-formats/SKILL.md": SKILL.format(name="data-formats"),
    },
}
ALL = [*SHAPES, *MORE, *import_shapes.SHAPES]


def shape_build(parent, name: str):
    if name in import_shapes.SHAPES:
        return import_shapes.shape_make(parent, name)
    folder = parent / name
    folder.mkdir()
    files_write(folder, {**SHAPES, **MORE}[name])
    return folder


@pytest.mark.parametrize("name", ALL)
def test_every_shape_a_evolve_ships_imports_unchanged_and_runs_a_cycle(
        name, personas, roots, data_dir, keyed, monkeypatch):  # noqa: F811
    folder = shape_build(roots, name)
    before = import_shapes.tree_snapshot(folder)
    preview = workspace_preview(folder)
    assert preview.problems == ()
    confirmed = None if preview.has_manifest else preview.manifest  # the operator confirms it as it is
    agent = services.agent_import(personas.member, personas.alpha, str(folder), manifest=confirmed)
    copy = Path(agent.path)
    assert agent.source_path == str(folder) and copy != folder
    if name == "arc-mas":  # kept, shown, never refused
        assert [(w.line, "description" in w.message) for w in manifest_warnings(copy)] == [(2, True)]
        unused = {entry["path"]: entry["message"] for entry in agent.import_warnings}
        assert "A-Evolve's arc-mas seed lists in tools/<role>.yaml" in unused["tools/solver.yaml"]
    if name == "mcp_mh_opus46":
        unused = {entry["path"]: entry["message"] for entry in agent.import_warnings}
        assert "an A-Evolve agent's own harness" in unused["harness.py"]
    run, fake = cycle_run(personas.member, agent, roots, monkeypatch)
    cycle = run.cycles.get()
    assert cycle.status != "failed", cycle.reason
    outputs = [o.agent_output for o in cycle.observations.all()]
    assert outputs == [ANSWER, ANSWER]
    assert workspace_git(copy, ["tag", "--list", "evo-*"]).split() == [b"evo-0", b"evo-1"]
    assert workspace_changes(copy, "HEAD") == []  # HEAD and the tree agree
    assert fake.requests, "the agent never reached the model"
    assert import_shapes.tree_snapshot(folder) == before  # the user's folder, byte for byte
