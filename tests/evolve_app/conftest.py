"""Fixtures for evolve_app: real agent workspaces (the A-Evolve layout) in tmp dirs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from evolve_app.workspace import workspace_import
from tests.evolve_app.fixtures import demo_agent  # noqa: F401 (a fixture, shared with tests/test_project_page.py)
from tests.evolve_app.helpers import FAKE_KEY, SEED_FILES, files_write
from tests.fakes.anthropic_server import FakeAnthropic


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
def data_dir(settings, tmp_path) -> Path:
    """An empty data dir of this test's own (agents are copied into DATA_DIR/agents/)."""
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    return settings.DATA_DIR


@pytest.fixture
def roots(tmp_path, settings) -> Path:
    """A folder the server may import workspaces from (CRUCIBLE_REPO_ROOTS)."""
    folder = tmp_path / "roots"
    folder.mkdir()
    settings.CONFIG = dataclasses.replace(settings.CONFIG, repo_roots=[folder])
    return folder
