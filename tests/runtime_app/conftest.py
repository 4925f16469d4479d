"""Fixtures for the git, worktree and patch tests: a real repository and a data dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime_app import sandbox
from runtime_app.sandbox import BUBBLEWRAP, RLIMITS_ONLY
from tests.gitrepo import baseline_repo, git
from tests.helpers import service_missing


@pytest.fixture
def data_dir(tmp_path, settings) -> Path:
    settings.DATA_DIR = tmp_path / "data"
    return settings.DATA_DIR


@pytest.fixture
def tree(data_dir) -> Path:
    """A writable tree under the data dir, where worktrees live (the sandbox tests' cwd)."""
    path = data_dir / "worktrees" / "cand_001"
    path.mkdir(parents=True)
    (path / "README").write_text("hello\n")
    return path


@pytest.fixture
def repo(tmp_path, data_dir) -> Path:
    """The certificate repo: `v1` is the baseline, `main` one commit later."""
    return baseline_repo(tmp_path / "repo")


@pytest.fixture
def v1(repo) -> str:
    return git(repo, "rev-parse", "v1^{commit}")


@pytest.fixture(params=[BUBBLEWRAP, RLIMITS_ONLY])
def mode(request) -> str:
    """The CRUCIBLE_SANDBOX value that gives the parametrised isolation: bubblewrap (a skip
    locally when it cannot start, a failure in CI) and rlimits only."""
    if request.param == BUBBLEWRAP:
        available, reason = sandbox.bubblewrap_probe()
        if not available:
            service_missing(reason)
        return "required"
    return "off"
