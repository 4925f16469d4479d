"""The read-only git endpoint workers fetch baselines from, and the per-worker mirrors it feeds.

The endpoint answers only upload-pack with the search's own fetch token, and advertises only the
baseline; a worker without the repository on its disk fetches the baseline into one mirror, once,
with the token only in git's environment.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import subprocess
import threading
from pathlib import Path

import pytest
from django.test import Client

from runtime_app import mirrors
from runtime_app import services as runtime_services
from runtime_app.mirrors import MirrorError, fetch_token, mirror_path, repository_local
from runtime_app.models import Receipt
from search_app import execution, git_http
from tests.gitrepo import git
from tests.search_app.runs import frozen, run_inline

pytestmark = pytest.mark.django_db(transaction=True)


def basic(token: str, user: str = "crucible") -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()}


def refs_url(search) -> str:
    return f"/git/searches/{search.search_id}.git/info/refs?service=git-upload-pack"


def advertised(body: bytes) -> list[bytes]:
    """The ref names of an upload-pack advertisement."""
    names = []
    for line in body.split(b"\n"):
        if b" refs/" in line or b" HEAD" in line:
            names.append(line.split(b" ", 1)[1].split(b"\x00")[0])
    return names


@pytest.fixture
def two_searches(personas, tmp_path, data_dir):
    first = frozen(personas, tmp_path, {"cand_001": 4}, repo_name="repo", population=2, rounds=[2, 1])
    second = frozen(personas, tmp_path, {"cand_001": 5}, repo_name="other", population=2, rounds=[2, 1])
    return first, second


def test_the_endpoint_refuses_a_missing_wrong_or_other_searchs_token(two_searches):
    first, second = two_searches
    client = Client()
    for headers in ({}, basic("nope"), basic(fetch_token(second.pk)),
                    {"HTTP_AUTHORIZATION": f"Bearer {fetch_token(second.pk)}"},
                    {"HTTP_AUTHORIZATION": "Basic !!!"}):
        response = client.get(refs_url(first), **headers)
        assert response.status_code == 401, headers
        assert first.baseline_commit.encode() not in response.content
        assert response["WWW-Authenticate"].startswith("Basic")
    unknown = client.get("/git/searches/nosuch.git/info/refs?service=git-upload-pack", **basic("x"))
    assert unknown.status_code == 401
    line = f"want {first.baseline_commit} side-band-64k thin-pack ofs-delta\n".encode()
    want = f"{len(line) + 4:04x}".encode() + line + b"00000009done\n"
    for headers in ({}, basic(fetch_token(second.pk))):
        pack = client.post(f"/git/searches/{first.search_id}.git/git-upload-pack", want,
                           content_type="application/x-git-upload-pack-request", **headers)
        assert pack.status_code == 401 and b"PACK" not in pack.content
    pack = client.post(f"/git/searches/{first.search_id}.git/git-upload-pack", want,
                       content_type="application/x-git-upload-pack-request", **basic(fetch_token(first.pk)))
    assert pack.status_code == 200 and b"PACK" in pack.content, pack.content  # the same, with its token
    garbled = client.post(f"/git/searches/{first.search_id}.git/git-upload-pack", b"0010want nothing",
                          content_type="application/x-git-upload-pack-request",
                          **basic(fetch_token(first.pk)))
    assert garbled.status_code == 400


def test_the_endpoint_advertises_only_the_baseline(two_searches):
    first, _ = two_searches
    repo = Path(first.repository_path)
    git(repo, "branch", "secret-branch")
    git(repo, "tag", "v1")
    for headers in (basic(fetch_token(first.pk)), {"HTTP_AUTHORIZATION": f"Bearer {fetch_token(first.pk)}"}):
        response = Client().get(refs_url(first), **headers)
        assert response.status_code == 200
        assert response["Content-Type"] == "application/x-git-upload-pack-advertisement"
        assert advertised(response.content) == [b"refs/crucible/baseline"]
        assert first.baseline_commit.encode() in response.content


def test_the_endpoint_refuses_receive_pack_and_dumb_http(two_searches):
    first, _ = two_searches
    client, auth = Client(), basic(fetch_token(first.pk))
    base = f"/git/searches/{first.search_id}.git"
    assert client.get(f"{base}/info/refs?service=git-receive-pack", **auth).status_code == 403
    assert client.get(f"{base}/info/refs", **auth).status_code == 403  # dumb HTTP
    assert client.post(f"{base}/git-receive-pack", b"0000",
                       content_type="application/x-git-receive-pack-request", **auth).status_code == 403
    assert client.get(f"{base}/HEAD", **auth).status_code == 404
    assert client.get(f"{base}/objects/info/packs", **auth).status_code == 404
    assert client.get(f"{base}/git-upload-pack", **auth).status_code == 405


def test_git_clones_only_the_baseline_from_a_live_server(two_searches, live_server, tmp_path):
    first, _ = two_searches
    repo = Path(first.repository_path)
    git(repo, "checkout", "-q", "-b", "later")
    (repo / "later.txt").write_text("not in the baseline\n")
    git(repo, "add", "later.txt")
    git(repo, "commit", "-q", "-m", "later")
    later = git(repo, "rev-parse", "HEAD").strip()
    url = f"{live_server.url}/git/searches/{first.search_id}.git"
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_COUNT": "1",
           "GIT_CONFIG_KEY_0": "http.extraHeader",
           "GIT_CONFIG_VALUE_0": "Authorization: " + basic(fetch_token(first.pk))["HTTP_AUTHORIZATION"]}
    target = tmp_path / "clone"
    subprocess.run(["git", "init", "-q", str(target)], check=True)
    subprocess.run(["git", "-C", str(target), "fetch", "-q", url, "refs/crucible/baseline:refs/heads/b"],
                   check=True, env=env)
    assert git(target, "rev-parse", "refs/heads/b").strip() == first.baseline_commit
    # A want for anything not advertised is refused.
    refused = subprocess.run(["git", "-C", str(target), "fetch", "-q", url, later], env=env,
                             capture_output=True, text=True)
    assert refused.returncode != 0
    assert subprocess.run(["git", "-C", str(target), "cat-file", "-e", later]).returncode != 0
    no_token = subprocess.run(["git", "-C", str(target), "fetch", "-q", url, "refs/crucible/baseline"],
                              env={**os.environ, "GIT_TERMINAL_PROMPT": "0"}, capture_output=True)
    assert no_token.returncode != 0


def test_the_registered_path_is_used_when_it_holds_the_baseline(two_searches, settings):
    first, _ = two_searches
    settings.CONFIG = dataclasses.replace(settings.CONFIG, git_url="")
    assert repository_local(first.repository_path, first.baseline_commit, search_pk=first.pk,
                            search_id=first.search_id) == first.repository_path


def test_without_the_path_or_a_git_url_the_step_says_both(two_searches, settings):
    first, _ = two_searches
    settings.CONFIG = dataclasses.replace(settings.CONFIG, git_url="")
    with pytest.raises(MirrorError, match="CRUCIBLE_GIT_URL is not set") as raised:
        repository_local("/nowhere/repo", first.baseline_commit, search_pk=first.pk,
                         search_id=first.search_id)
    assert "/nowhere/repo does not exist on this host" in str(raised.value)


def test_a_worker_without_the_repository_fetches_once_and_runs_from_its_mirror(
        personas, tmp_path, data_dir, live_server, settings, monkeypatch):
    """Concurrent lookups fetch once; the search then runs from the mirror and the token is nowhere."""
    search = frozen(personas, tmp_path, {"cand_001": 4, "cand_002": 7}, repo_name="repo",
                    population=2, rounds=[2, 1])
    settings.CONFIG = dataclasses.replace(settings.CONFIG, git_url=live_server.url)
    fetches, argvs = [], []
    real_fetch, real_git_run = mirrors._fetch, mirrors.git_run

    def counting_fetch(*args, **kwargs):
        fetches.append(args)
        return real_fetch(*args, **kwargs)

    def recording_git_run(args, **kwargs):
        argvs.append(list(args))
        return real_git_run(args, **kwargs)

    monkeypatch.setattr(mirrors, "_fetch", counting_fetch)
    used: list[str] = []

    def recorder(real):
        def recording(repo, *args, **kwargs):
            used.append(str(repo))
            return real(repo, *args, **kwargs)
        return recording

    for module, name in ((execution, "worktree_create"), (runtime_services, "patch_admit")):
        monkeypatch.setattr(module, name, recorder(getattr(module, name)))
    monkeypatch.setattr(mirrors, "git_run", recording_git_run)
    # The worker's view: the registered path is not on this host.
    monkeypatch.setattr(mirrors, "holds", lambda path, commit, real=mirrors.holds:
                        False if str(path) == search.repository_path else real(path, commit))
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(repository_local(
        search.repository_path, search.baseline_commit, search_pk=search.pk, search_id=search.search_id)))
        for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    mirror = mirror_path(search.repository_path)
    assert results == [str(mirror)] * 6
    assert len(fetches) == 1
    assert git(mirror, "rev-parse", f"refs/crucible/searches/{search.pk}").strip() == search.baseline_commit
    run = run_inline(personas, search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002"
    assert len(fetches) == 1  # every step found the baseline already there
    token = fetch_token(search.pk)
    assert not any(token in " ".join(argv) for argv in argvs)
    assert token not in (mirror / ".git" / "config").read_text()
    for receipt in Receipt.objects.all():
        assert token not in " ".join(map(str, [receipt.argv, receipt.stdout_excerpt, receipt.stderr_excerpt,
                                               receipt.error, receipt.detail]))
    assert used and set(used) == {str(mirror)}  # every worktree was made from the mirror


def test_a_refused_fetch_fails_at_once_with_the_reason(two_searches, live_server, settings, monkeypatch):
    first, second = two_searches
    settings.CONFIG = dataclasses.replace(settings.CONFIG, git_url=live_server.url)
    # The worker shows another search's token (the web node's own binding stays the real one).
    monkeypatch.setattr(mirrors, "fetch_token", lambda pk: fetch_token(second.pk))
    assert git_http.fetch_token is fetch_token
    monkeypatch.setattr(mirrors, "FETCH_RETRY_SECONDS", 60.0)  # a retry would time the test out
    with pytest.raises(MirrorError, match="refused this worker's fetch token: is CRUCIBLE_SECRET") as raised:
        repository_local("/nowhere/repo", first.baseline_commit, search_pk=first.pk,
                         search_id=first.search_id)
    assert fetch_token(second.pk) not in str(raised.value)


def test_a_step_without_the_repository_or_a_git_url_fails_saying_so(two_searches, settings):
    from search_app import services

    first, _ = two_searches
    settings.CONFIG = dataclasses.replace(settings.CONFIG, git_url="")
    services.search_start(first.created_by, first, enqueue=False)
    Path(first.repository_path).rename(Path(first.repository_path).with_name("moved"))
    run = services.search_run_inline(first)
    assert run.outcome != "winner"
    reasons = {candidate.reason for candidate in first.candidates.exclude(number=0)}
    assert reasons and all("CRUCIBLE_GIT_URL is not set" in reason for reason in reasons), reasons
