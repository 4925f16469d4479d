"""Repositories registered by git URL: only from the remotes an administrator allows, cloned on the
web node over real HTTP, fetched again before each freeze, and an approved merge pushed back."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ValidationError
from dulwich.repo import Repo
from dulwich.server import DictBackend
from dulwich.web import make_server, make_wsgi_chain

from runtime_app.models import Receipt, Repository
from runtime_app.remotes import RemoteError, clones_root, remote_url_check
from runtime_app.services import api_token_create, repository_register
from search_app import services
from search_app.models import Merge
from tests.gitrepo import git
from tests.helpers import login, make_user, text_of
from tests.search_app.runs import plan_repo, spec_text

pytestmark = pytest.mark.django_db(transaction=True)

PREFIX = "https://git.example.com/acme"


@pytest.fixture
def allowed(settings, tmp_path):
    """Let the tests choose CRUCIBLE_REPO_URLS, with the data dir (and its clones) in tmp."""
    settings.DATA_DIR = tmp_path / "data"

    def allow(*prefixes: str) -> None:
        settings.CONFIG = dataclasses.replace(django_settings.CONFIG, repo_urls=tuple(prefixes))
    allow(PREFIX)
    return allow


@pytest.fixture
def remote(tmp_path) -> Iterator[tuple[str, Path]]:
    """A real smart-HTTP git server (dulwich's) on loopback serving one plan repository."""
    repo = plan_repo(tmp_path / "remote", {"cand_001": 4, "cand_002": 9})
    server = make_server("127.0.0.1", 0, make_wsgi_chain(DictBackend({"/acme/plan.git": Repo(str(repo))})))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/acme/plan.git", repo
    finally:
        server.shutdown()
        server.server_close()


def headers(user) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {api_token_create(user, 'tests')[1]}"}


@pytest.mark.parametrize("url", [
    "https://git.example.com/acme-evil/app.git",  # a longer name is not a path under the prefix
    "https://git.example.com/acmeapp.git",
    "https://git.example.com/acme/../root/app.git",
    "https://git.example.com/acme/%2e%2e/root/app.git",
    "https://user:secret@git.example.com/acme/app.git",
    "https://git.example.com@evil.example.net/acme/app.git",
    "https://git.example.com/acme/app.git?upload-pack=sh",
    "https://git.example.com/acme/app.git#main",
    "http://git.example.com/acme/app.git",
    "https://git.example.com:8443/acme/app.git",
    "https://evil.example.net/acme/app.git",
    "file:///etc",
    "ext::sh -c touch% /tmp/pwned",
    "--upload-pack=touch /tmp/pwned",
    "https://git.example.com/acme/app.git\n--upload-pack=x",
    "",
])
def test_a_url_outside_the_allowed_remotes_is_refused_and_nothing_is_cloned(personas, allowed, url):
    response = login(personas.member).post(
        "/api/repositories", json.dumps({"project_id": personas.alpha.pk, "url": url}),
        content_type="application/json")
    assert response.status_code in (400, 422), response.content
    assert not Repository.objects.exists() and not clones_root().exists()


def test_no_url_is_allowed_until_an_administrator_lists_remotes(personas, allowed):
    allowed()
    with pytest.raises(ValidationError, match="CRUCIBLE_REPO_URLS"):
        repository_register(personas.member, personas.alpha, url=f"{PREFIX}/app.git")


def test_urls_under_an_allowed_remote_match_by_whole_segments_whatever_the_hosts_case():
    assert remote_url_check("https://GIT.example.com/acme/app.git", allowed=[PREFIX + "/"])
    assert remote_url_check(PREFIX + "/team/app", allowed=[PREFIX])
    with pytest.raises(RemoteError, match="not under an allowed remote"):
        remote_url_check("https://git.example.com/acm/app", allowed=[PREFIX])


def test_a_path_and_a_url_together_are_refused(personas, allowed, tmp_path):
    with pytest.raises(ValidationError, match="not both"):
        repository_register(personas.member, personas.alpha, str(tmp_path), url=f"{PREFIX}/app.git")


def test_a_viewer_may_not_register_a_url(personas, allowed, remote):
    from runtime_app.models import ProjectMembership

    viewer = make_user("viewer")
    ProjectMembership.objects.create(project=personas.alpha, user=viewer, role="viewer")
    url, _ = remote
    allowed(url.rsplit("/", 2)[0])
    body = json.dumps({"project_id": personas.alpha.pk, "url": url})
    response = login(viewer).post("/api/repositories", body, content_type="application/json")
    assert response.status_code == 403
    assert not clones_root().exists()


def test_an_operator_registers_a_url_and_the_server_clones_it(personas, allowed, remote):
    url, origin = remote
    allowed(url.rsplit("/", 2)[0] + "/acme/")
    client = login(personas.member)
    response = client.post("/repositories/register/", {"project": personas.alpha.pk, "url": url, "path": "",
                                                       "name": ""})
    assert response.status_code == 302, text_of(response)
    repository = Repository.objects.get()
    assert (repository.name, repository.remote_url) == ("plan", url)
    clone = Path(repository.path)
    assert clones_root() in clone.parents and (clone / "plan.json").is_file()
    assert git(clone, "rev-parse", "HEAD") == git(origin, "rev-parse", "HEAD")
    assert url in text_of(client.get("/repositories/"))
    # The same URL again is the same repository; through the API, the URL is shown.
    again = client.post("/api/repositories", json.dumps({"project_id": personas.alpha.pk, "url": url}),
                        content_type="application/json")
    assert again.status_code == 201 and again.json()["id"] == repository.pk
    assert again.json()["remote_url"] == url


def test_a_redirect_is_not_followed(personas, allowed, remote):
    url, _ = remote

    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(301)
            self.send_header("Location", url + self.path.split(".git", 1)[-1])
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        moved = f"http://127.0.0.1:{server.server_port}/acme/moved.git"
        allowed(f"http://127.0.0.1:{server.server_port}/acme")
        with pytest.raises(ValidationError, match="Could not clone"):
            repository_register(personas.member, personas.alpha, url=moved)
    finally:
        server.shutdown()
        server.server_close()
    assert not Repository.objects.exists() and not list(clones_root().glob("*/*"))


def test_a_freeze_fetches_the_remote_first_and_a_merge_is_pushed_back(personas, allowed, remote, approver):
    url, origin = remote
    allowed(url.rsplit("/", 1)[0])
    repository = repository_register(personas.member, personas.alpha, url=url)
    # The remote moves on after registration: the freeze must see it.
    (origin / "README.md").write_text("moved on\n")
    git(origin, "add", "README.md")
    git(origin, "commit", "-q", "-m", "moved on")
    spec = spec_text(population=2, rounds=[2, 1])
    search = services.search_freeze(personas.owner, personas.alpha, spec, "main", repository=repository)
    assert search.baseline_commit == git(origin, "rev-parse", "main")
    services.search_start(personas.owner, search, enqueue=False)
    run = services.search_run_inline(search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002"
    services.approval_record(approver, run.winner, "approve", run.winner.patch_sha256)
    merge = services.merge_create(approver, search)
    assert git(origin, "rev-parse", merge.branch) == merge.commit_sha
    assert git(origin, "show", f"{merge.branch}:code/answer.py") == "def answer():\n    return 9"
    assert Receipt.objects.get(kind="merge").detail["pushed_to"] == url


def test_a_merge_that_cannot_be_pushed_is_refused_then_adopted_and_pushed_when_merged_again(
        personas, allowed, tmp_path, approver):
    origin = plan_repo(tmp_path / "origin", {"cand_001": 4, "cand_002": 9})
    url = f"file://{origin}"
    allowed(f"file://{tmp_path}")
    repository = repository_register(personas.member, personas.alpha, url=url)
    spec = spec_text(population=2, rounds=[2, 1])
    search = services.search_freeze(personas.owner, personas.alpha, spec, "main", repository=repository)
    services.search_start(personas.owner, search, enqueue=False)
    run = services.search_run_inline(search)
    services.approval_record(approver, run.winner, "approve", run.winner.patch_sha256)
    branch = f"crucible/{search.search_id}"
    git(origin, "commit", "-q", "--allow-empty", "-m", "theirs")
    git(origin, "branch", branch, "main")  # the remote has a branch of that name, not ours to move
    with pytest.raises(ValidationError, match="not pushed"):
        services.merge_create(approver, search)
    assert not Merge.objects.exists()
    git(origin, "branch", "-D", branch)
    merge = services.merge_create(approver, search)
    assert git(origin, "rev-parse", branch) == merge.commit_sha
    assert Receipt.objects.get(kind="merge").detail["adopted"] is True
