"""Fixtures shared by the search tests: the demo project and a small planned search."""

from __future__ import annotations

import pytest

from runtime_app import roles
from runtime_app.models import Project, ProjectMembership
from tests.conftest import make_user
from tests.search_app.runs import plan_repo, spec_text


@pytest.fixture
def data_dir(tmp_path, settings):
    settings.DATA_DIR = tmp_path / "data"
    return settings.DATA_DIR


@pytest.fixture
def demo(transactional_db):
    """The `demo` project the CLI uses by default, with `admin` as its operator."""
    admin = make_user("admin", roles.VIEWER, roles.OPERATOR)
    project = Project.objects.create(name="demo", created_by=admin)
    ProjectMembership.objects.create(project=project, user=admin)
    return project


@pytest.fixture
def small_search(personas, tmp_path, settings):
    """A frozen two-candidate search of project alpha: cand_001 scores 4, cand_002 edits the tests."""
    from search_app import services

    settings.DATA_DIR = tmp_path / "data"
    repo = plan_repo(tmp_path / "repo", {"cand_001": 4, "cand_002": "tests"})
    return services.search_freeze(personas.owner, personas.alpha, spec_text(population=2, rounds=[2, 1]),
                                  "HEAD", repository_path=str(repo))


@pytest.fixture
def approver(personas):
    user = make_user("approver", roles.VIEWER, roles.APPROVER)
    ProjectMembership.objects.create(project=personas.alpha, user=user)
    return user


@pytest.fixture
def finished(personas, tmp_path, settings):
    """A finished search of project alpha whose winner, cand_002, returns 9."""
    from search_app import services

    settings.DATA_DIR = tmp_path / "data"
    repo = plan_repo(tmp_path / "repo", {"cand_001": 4, "cand_002": 9})
    search = services.search_freeze(personas.owner, personas.alpha, spec_text(population=2, rounds=[2, 1]),
                                    "HEAD", repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    run = services.search_run_inline(search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002"
    return search, run.winner, repo

