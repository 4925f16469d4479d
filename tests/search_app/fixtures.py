"""search_app fixtures that tests outside tests/search_app use too (they import them from here;
tests/search_app/conftest.py re-exports them)."""

from __future__ import annotations

import pytest

from runtime_app import access
from runtime_app.models import Project, ProjectMembership
from tests.helpers import make_user
from tests.search_app.helpers import patch_write
from tests.search_app.runs import fates, frozen, run_inline


@pytest.fixture
def data_dir(tmp_path, settings):
    settings.DATA_DIR = tmp_path / "data"
    return settings.DATA_DIR


@pytest.fixture
def demo(transactional_db):
    """The `demo` project the CLI uses by default, with `admin` as its operator."""
    admin = make_user("admin")
    project = Project.objects.create(name="demo", created_by=admin)
    ProjectMembership.objects.create(project=project, user=admin, role=access.OPERATOR)
    return project


@pytest.fixture
def finished(personas, tmp_path, data_dir):
    """A finished search of project alpha whose winner, cand_002, returns 9."""
    search = frozen(personas, tmp_path, {"cand_001": 4, "cand_002": 9}, repo_name="repo",
                    population=2, rounds=[2, 1])
    run = run_inline(personas, search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002", fates(search)
    return search, run.winner, tmp_path / "repo"


@pytest.fixture
def reviewing(personas, tmp_path, data_dir):
    """A started search of project alpha (nothing run: quick) whose cand_002 has a real patch
    making answer() return 9; its page, comments and threads work as for a winner."""
    from search_app import services

    search = frozen(personas, tmp_path, {"cand_001": 4, "cand_002": 9}, repo_name="repo",
                    population=2, rounds=[2, 1])
    services.search_start(personas.owner, search, enqueue=False)
    candidate = search.candidates.get(candidate_id="cand_002")
    patch_write(tmp_path / "repo", candidate, "def answer():\n    return 9\n")
    return search, candidate, tmp_path / "repo"
