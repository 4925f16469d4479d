"""Plain helpers of the evolve_app tests: the seed agent's files, writing files, asking real git."""

from __future__ import annotations

import subprocess
from pathlib import Path

SEED_MANIFEST = """\
agent:
  type: reference
  entrypoint: agent_evolve.agents.swe.agent.SweAgent

evolvable_layers:
  - prompts
  - skills
  - memory

reload_strategy: hot
"""

SEED_FILES = {
    "manifest.yaml": SEED_MANIFEST,
    "prompts/system.md": "You are a careful software engineer.\n",
    "prompts/fragments/reasoning.md": "Think step by step.\n",
    "skills/code-search/SKILL.md": "---\nname: code-search\ndescription: Find code fast.\n---\n\n"
                                   "# Code search\n",
    "memory/episodic.jsonl": '{"lesson": "read the failing test first"}\n',
    "tools/registry.yaml": "tools:\n  - name: bash\n    description: run a command\n",
    "tools/bash.py": "def run(command):\n    return command\n",
}


def files_write(root: Path, files: dict[str, str | bytes]) -> None:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def git(path, *args: str) -> str:
    """The real git CLI's answer, stripped: how tests check tags, trees and history."""
    return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


FAKE_KEY = "sk-ant-evolve-secret-0123456789"  # the key the fake model sees; never in a receipt
