"""Fixtures shared by the search tests: the demo project and a small planned search."""

from __future__ import annotations

import pytest
from django.test import Client

from runtime_app import roles
from runtime_app.models import Project, ProjectMembership
from tests.conftest import make_user
from tests.search_app.runs import plan_repo, spec_text


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


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client
