"""A repository's page: its refs, the latest commits of a chosen branch or tag read with dulwich,
and the searches that target it; only for its project's members, and never a 500 when the
repository cannot be read."""

from __future__ import annotations

import html
import shutil
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runtime_app.models import ProjectMembership, Repository
from search_app.models import Search, SearchRun
from tests.gitrepo import git, repo_create, write_files
from tests.helpers import login, make_user, text_of

pytestmark = pytest.mark.django_db




def subjects(response) -> list[str]:
    """The commit subjects in the history table, newest first."""
    table = response.content.decode().split('<table class="table commits">')[1].split("</table>")[0]
    return [html.unescape(row.split("<td>")[2].split("</td>")[0]) for row in table.split("<tr>")[2:]]


@pytest.fixture
def repo_path(tmp_path) -> Path:
    """main: baseline (tagged v0.1), then "closed form"; speedup: baseline, then "speed it up"."""
    path = repo_create(tmp_path / "certificate", {"README": "hello\n"}, tags=("v0.1",))
    git(path, "checkout", "-q", "-b", "speedup")
    write_files(path, {"fast.py": "x = 1\n"})
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "speed it up\n\nThe long body is not the subject.",
        date="2026-01-04T03:04:05+00:00")
    git(path, "checkout", "-q", "main")
    write_files(path, {"README": "hello again\n"})
    git(path, "commit", "-q", "-am", "closed form", date="2026-01-03T03:04:05+00:00")
    return path


@pytest.fixture
def repository(personas, repo_path) -> Repository:
    return Repository.objects.create(project=personas.alpha, name="certificate", path=str(repo_path),
                                     created_by=personas.owner)


def make_search(repository: Repository, search_id: str, *, run: dict | None = None) -> Search:
    search = Search.objects.create(
        project=repository.project, search_id=search_id, preregistration_hash="0" * 64,
        repository=repository, repository_path=repository.path, ref="main", name=f"plan-{search_id}",
        objective="faster", baseline_commit="a" * 40, requested_model_id="m", resolved_model_id="m",
        model_resolution="exact", public_evidence_hash="1" * 64, evaluator_hash="2" * 64, spec_text="",
        spec_normalized={}, hashed_inputs={}, candidate_batches=[], created_by=repository.created_by,
    )
    if run is not None:
        SearchRun.objects.create(search=search, **run)
    return search


def test_a_member_sees_the_repository_its_refs_and_the_checked_out_branchs_commits(personas, repository):
    response = login(personas.member).get(f"/repositories/{repository.pk}/")
    assert response.status_code == 200
    text = text_of(response)
    assert "certificate" in text and repository.path in text and "alpha" in text
    assert ">speedup</code>" in text and ">v0.1</code>" in text
    assert 'title="checked out">main</code>' in response.content.decode()
    assert subjects(response) == ["closed form", "baseline"]
    assert "Crucible Tests <tests@crucible.invalid>" in text
    assert ">2026-01-03 03:04 UTC</time>" in text
    sha = git(Path(repository.path), "rev-parse", "main")
    assert f'title="{sha}">{sha[:12]}</code>' in response.content.decode()


def test_choosing_a_branch_or_a_tag_shows_its_history(personas, repository):
    client = login(personas.member)
    speedup = client.get(f"/repositories/{repository.pk}/?ref=speedup")
    assert subjects(speedup) == ["speed it up", "baseline"]
    assert "The long body" not in text_of(speedup)
    assert '<option value="speedup" selected>' in speedup.content.decode()
    assert subjects(client.get(f"/repositories/{repository.pk}/?ref=v0.1")) == ["baseline"]
    assert 'href="?ref=speedup"' in speedup.content.decode()


@pytest.mark.parametrize(("ref", "reported"), [
    *[(ref, True) for ref in ["nope", "../../etc/passwd", "<script>alert(1)</script>", "HEAD~1",
                              "refs/heads/main", "a" * 5000, "main\x00"]],
    ("", False),  # no ref chosen: the checked-out branch, and nothing to report
])
def test_a_bad_ref_is_harmless(personas, repository, ref, reported):
    response = login(personas.member).get(f"/repositories/{repository.pk}/", {"ref": ref})
    assert response.status_code == 200
    assert subjects(response) == ["closed form", "baseline"]  # the checked-out branch instead
    assert '<option value="main" selected>' in response.content.decode()
    assert ("is not one of the available choices" in text_of(response)) == reported
    assert "<script>alert" not in response.content.decode()


def test_only_the_latest_20_commits_are_shown(personas, repository):
    path = Path(repository.path)
    for n in range(25):
        date = f"2026-02-{n + 1:02d}T00:00:00+00:00"
        git(path, "commit", "-q", "--allow-empty", "-m", f"step {n}", date=date)
    shown = subjects(login(personas.member).get(f"/repositories/{repository.pk}/?ref=main"))
    assert shown == [f"step {n}" for n in range(24, 4, -1)]


def test_an_outsider_or_a_stranger_gets_404(personas, repository):
    assert login(personas.outsider).get(f"/repositories/{repository.pk}/").status_code == 404
    assert login(personas.outsider).get(f"/repositories/{repository.pk}/?ref=main").status_code == 404
    assert login(personas.member).get("/repositories/999999/").status_code == 404


def test_the_page_needs_a_login(repository):
    response = Client().get(f"/repositories/{repository.pk}/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_an_unreadable_repository_shows_why_never_a_500(personas, repository, repo_path):
    make_search(repository, "S-kept")
    shutil.rmtree(repo_path)
    response = login(personas.member).get(f"/repositories/{repository.pk}/?ref=main")
    assert response.status_code == 200
    assert f"{repo_path}: no such directory" in text_of(response)
    assert "Cannot read this repository now" in text_of(response)
    assert "S-kept" in text_of(response)  # its searches are still listed


def test_a_directory_that_is_no_longer_a_repository_shows_why(personas, repository, repo_path):
    shutil.rmtree(repo_path / ".git")
    response = login(personas.member).get(f"/repositories/{repository.pk}/")
    assert response.status_code == 200
    assert "not a git repository" in text_of(response)


def test_a_repository_without_commits_says_so(personas, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q", "-b", "main")
    repository = Repository.objects.create(project=personas.alpha, name="empty", path=str(empty))
    response = login(personas.member).get(f"/repositories/{repository.pk}/?ref=main")
    assert response.status_code == 200
    assert "No commits yet" in text_of(response)


def test_the_searches_on_the_repository_are_listed_without_n_plus_1(personas, repository):
    make_search(repository, "S-one", run={"status": "finished", "outcome": "NONE"})
    other = Repository.objects.create(project=personas.alpha, name="other", path=repository.path + "-other")
    make_search(other, "S-elsewhere")
    client = login(personas.member)
    url = f"/repositories/{repository.pk}/"
    with CaptureQueriesContext(connection) as one:
        response = client.get(url)
    text = text_of(response)
    assert 'href="/searches/S-one/"' in response.content.decode()
    assert "plan-S-one" in text and "finished · NONE" in text and "S-elsewhere" not in text
    make_search(repository, "S-two", run={"status": "running"})
    make_search(repository, "S-three")
    with CaptureQueriesContext(connection) as three:
        response = client.get(url)
    text = text_of(response)
    assert "S-two" in text and "running" in text and "frozen, not started" in text
    assert text.index("S-three") < text.index("S-two") < text.index("S-one")
    assert len(three.captured_queries) == len(one.captured_queries)


def test_operators_get_a_new_search_link_viewers_do_not(personas, repository):
    link = f'href="/searches/specs/new/?repository={repository.pk}"'
    assert link in login(personas.member).get(f"/repositories/{repository.pk}/").content.decode()
    viewer = make_user("reader")
    ProjectMembership.objects.create(project=personas.alpha, user=viewer)
    page = login(viewer).get(f"/repositories/{repository.pk}/")
    assert page.status_code == 200 and link not in page.content.decode()


def test_the_repositories_page_links_each_name_to_its_page(personas, repository):
    page = login(personas.member).get("/repositories/").content.decode()
    assert f'<a href="/repositories/{repository.pk}/">certificate</a>' in page
