"""Fixtures for evolve_app: real agent workspaces (the A-Evolve layout) in tmp dirs."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from evolve_app.workspace import workspace_import
from tests.fakes.anthropic_server import FakeAnthropic

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


@pytest.fixture
def make_workspace(tmp_path: Path) -> Callable[..., Path]:
    """make_workspace(files=None, *, extra=None, name="agent"): a workspace folder holding the seed
    files (or `files`), with `extra` adding or replacing some; a None value leaves that file out."""

    def make(files: dict | None = None, *, extra: dict | None = None, name: str = "agent") -> Path:
        root = tmp_path / name
        root.mkdir()
        contents = dict(SEED_FILES if files is None else files)
        contents.update(extra or {})
        files_write(root, {path: text for path, text in contents.items() if text is not None})
        return root

    return make


@pytest.fixture
def workspace(make_workspace) -> Path:
    """A valid, seed-style workspace, not yet under git."""
    return make_workspace()


@pytest.fixture
def imported_workspace(workspace: Path) -> Path:
    """The seed-style workspace imported: a git repo with one commit tagged evo-0."""
    workspace_import(workspace)
    return workspace


def git(path, *args: str) -> str:
    """The real git CLI's answer, stripped: how tests check tags, trees and history."""
    return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def demo_agent(personas, tmp_path, settings):
    """A fresh copy of the offline demo agent in project alpha (its workspace tagged evo-0)."""
    from evolve_app import services

    settings.DATA_DIR = tmp_path
    return services.demo_agent_create(personas.owner, personas.alpha)


FAKE_KEY = "sk-ant-evolve-secret-0123456789"  # the key the fake model sees; never in a receipt


@pytest.fixture
def fake_llm(monkeypatch):
    """fake_llm(script): the Anthropic fake started with `script`, the environment pointed at it
    with FAKE_KEY."""
    started = []

    def start(script):
        fake = FakeAnthropic(script=script).__enter__()
        started.append(fake)
        monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        return fake

    yield start
    for fake in started:
        fake.__exit__(None, None, None)


@pytest.fixture
def roots(tmp_path, settings) -> Path:
    """A folder the server may import workspaces from (CRUCIBLE_REPO_ROOTS)."""
    folder = tmp_path / "roots"
    folder.mkdir()
    settings.CONFIG = dataclasses.replace(settings.CONFIG, repo_roots=[folder])
    return folder
