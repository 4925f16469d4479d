"""Fixtures for the git, worktree and patch tests: a real repository and a data dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gitrepo import baseline_repo, git


@pytest.fixture
def data_dir(tmp_path, settings) -> Path:
    settings.DATA_DIR = tmp_path / "data"
    return settings.DATA_DIR


@pytest.fixture
def repo(tmp_path, data_dir) -> Path:
    """The certificate repo: `v1` is the baseline, `main` one commit later."""
    return baseline_repo(tmp_path / "repo")


@pytest.fixture
def v1(repo) -> str:
    return git(repo, "rev-parse", "v1^{commit}")
