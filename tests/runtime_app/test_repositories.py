"""The repositories page: operators register git clones under allowed roots; everyone on the
project sees them with their branches and tags; outsiders see nothing of them."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
from django.test import Client

from runtime_app.models import AuditEntry, ProjectMembership, Repository
from runtime_app.services import repository_register
from tests.gitrepo import repo_create
from tests.helpers import login, make_user, text_of

pytestmark = pytest.mark.django_db




def make_repo(path: Path) -> Path:
    return repo_create(path, {"README": "hello\n"}, branches=("speedup",), tags=("v0.1",))


@pytest.fixture
def root(tmp_path, settings) -> Path:
    allowed = (tmp_path / "allowed").resolve()
    allowed.mkdir()
    settings.CONFIG = dataclasses.replace(settings.CONFIG, repo_roots=[allowed])
    return allowed




def register(client: Client, project, path, name: str = ""):
    return client.post("/repositories/register/", {"project": project.pk, "path": str(path), "name": name})


def test_an_operator_registers_a_repository_under_an_allowed_root(personas, root):
    path = make_repo(root / "certificate")
    client = login(personas.member)
    response = register(client, personas.alpha, path)
    assert response.status_code == 302 and response["Location"] == "/repositories/"
    repository = Repository.objects.get()
    assert (repository.project, repository.name) == (personas.alpha, "certificate")
    assert repository.path == str(path)
    assert AuditEntry.objects.filter(action="repository.register").exists()
    assert "Repository certificate registered for alpha." in text_of(client.get("/repositories/"))

    page = login(personas.owner).get("/repositories/")
    text = text_of(page)
    assert str(path) in text and "speedup" in text and "v0.1" in text
    assert 'title="checked out">main</code>' in page.content.decode()


def test_registering_the_same_path_twice_keeps_one_repository(personas, root):
    path = make_repo(root / "twice")
    client = login(personas.member)
    register(client, personas.alpha, path, "first-name")
    assert register(client, personas.alpha, path, "other-name").status_code == 302
    assert Repository.objects.count() == 1


def test_a_path_outside_the_allowed_roots_is_refused_with_a_message(personas, root, tmp_path):
    path = make_repo(tmp_path / "elsewhere")
    response = register(login(personas.member), personas.alpha, path)
    assert response.status_code == 400
    assert f"{path} is not under an allowed directory ({root})." in text_of(response)
    assert not Repository.objects.exists()


def test_without_any_allowed_root_registration_from_the_web_is_refused(personas, tmp_path, settings):
    settings.CONFIG = dataclasses.replace(settings.CONFIG, repo_roots=[])
    response = register(login(personas.member), personas.alpha, make_repo(tmp_path / "r"))
    assert response.status_code == 400
    assert "administrator sets CRUCIBLE_REPO_ROOTS" in text_of(response)


def test_a_directory_that_is_not_a_git_repository_is_refused(personas, root):
    plain = root / "plain"
    plain.mkdir()
    response = register(login(personas.member), personas.alpha, plain)
    assert response.status_code == 400
    assert "not a git repository" in text_of(response)


def test_a_bare_repository_is_refused(personas, root):
    bare = root / "bare.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    response = register(login(personas.member), personas.alpha, bare)
    assert response.status_code == 400
    assert "a bare repository; register a clone with a working tree" in text_of(response)


@pytest.mark.parametrize("path", [
    "", "relative/path", "~nosuchuser-xyz/repo", "ALLOWED/" + "a" * 900, "ALLOWED/missing", "a\x00b",
])
def test_odd_paths_get_a_message_never_a_500(personas, root, path):
    path = path.replace("ALLOWED", str(root))
    response = login(personas.member).post(
        "/repositories/register/", {"project": personas.alpha.pk, "path": path, "name": ""})
    assert response.status_code == 400
    assert not Repository.objects.exists()


@pytest.mark.parametrize("project", ["", "abc", "99999999999999999999999"])
def test_a_missing_or_malformed_project_is_refused(personas, root, project):
    path = make_repo(root / "r")
    response = login(personas.member).post("/repositories/register/", {"project": project, "path": str(path)})
    assert response.status_code in {400, 404}
    assert not Repository.objects.exists()


def test_a_bad_name_is_refused(personas, root):
    response = register(login(personas.member), personas.alpha, make_repo(root / "r"), name="../etc")
    assert response.status_code == 400
    assert "Use 1–96 letters" in text_of(response)


def test_an_outsider_gets_404_registering_into_another_teams_project_and_sees_none_of_its_repositories(
    personas, root
):
    path = make_repo(root / "secret-repo")
    repository_register(personas.owner, personas.alpha, str(path), "secret-repo")
    client = login(personas.outsider)
    assert register(client, personas.alpha, make_repo(root / "mine")).status_code == 404
    assert Repository.objects.count() == 1
    assert "secret-repo" not in text_of(client.get("/repositories/"))


def test_a_viewer_sees_repositories_but_cannot_register(personas, root):
    viewer = make_user("watcher")
    ProjectMembership.objects.create(project=personas.alpha, user=viewer)
    repository_register(personas.owner, personas.alpha, str(make_repo(root / "seen")), "seen")
    client = login(viewer)
    page = text_of(client.get("/repositories/"))
    assert "seen" in page and "Register a repository" not in page
    assert register(client, personas.alpha, make_repo(root / "sneaky")).status_code == 403
    assert Repository.objects.count() == 1


def test_a_repository_that_moved_away_is_listed_with_its_problem(personas, root):
    path = make_repo(root / "moving")
    repository_register(personas.owner, personas.alpha, str(path), "moving")
    path.rename(root / "moved")
    response = login(personas.owner).get("/repositories/")
    assert response.status_code == 200
    assert f"Cannot read it now: {path}: no such directory" in text_of(response)


def test_registration_posts_need_a_csrf_token(personas, root):
    client = Client(enforce_csrf_checks=True)
    client.force_login(personas.member)
    assert register(client, personas.alpha, make_repo(root / "r")).status_code == 403
    assert not Repository.objects.exists()
