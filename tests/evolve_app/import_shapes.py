"""Folders in the shapes A-Evolve ships without a manifest (made in tmp dirs by the tests)."""

from __future__ import annotations

from pathlib import Path

from tests.evolve_app.helpers import files_write

SKILL = "---\nname: {name}\ndescription: When to use {name}.\n---\n\n# {name}\n"

# An evolved artifact whose prompt is a top-level prompt.md (tb2_clawcode_opus46).
CLAWCODE = {
    "prompt.md": "You are Claw, a terminal coding agent.\n",
    "skills/tmux-driving/SKILL.md": SKILL.format(name="tmux-driving"),
    "skills/test-first/SKILL.md": SKILL.format(name="test-first"),
}
# An evolved artifact with the contract's prompt, memory, a comments-only tool registry and
# its own harness and reports (mcp_mh_opus46).
MCP = {
    "prompts/system.md": "You answer with the MCP tools you are given.\n",
    "memory/memories.jsonl": '{"lesson": "list the tools first"}\n{"lesson": "cite the server"}\n',
    "tools/registry.yaml": "# Tools come from the MCP servers at run time.\n# (none registered here)\n",
    "harness.py": "print('harness')\n",
    "REPORT.md": "# Report\n",
    "results.json": '{"score": 0.61}\n',
}
# A seed that is only skills (osworld).
OSWORLD = {
    "skills/click-precisely/SKILL.md": SKILL.format(name="click-precisely"),
}
SHAPES = {"tb2_clawcode_opus46": CLAWCODE, "mcp_mh_opus46": MCP, "osworld": OSWORLD}


def shape_make(parent: Path, name: str) -> Path:
    """The folder `name` of SHAPES under `parent`."""
    root = parent / name
    root.mkdir(parents=True)
    files_write(root, SHAPES[name])
    return root


def tree_snapshot(root: Path) -> dict[str, bytes | str]:
    """Every path under root with its bytes (folders as "dir"): to show a folder is untouched."""
    return {path.relative_to(root).as_posix(): "dir" if path.is_dir() else path.read_bytes()
            for path in sorted(root.rglob("*"))}
