"""The search API: the same validation messages and freezing as the pages and the CLI."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from django.test import Client

from runtime_app.services import api_token_create, repository_register
from search_app import services
from search_app.models import Search
from search_app.spec import RESULTS_WARNING, spec_validate
from tests.gitrepo import git, repo_create
from tests.helpers import login

pytestmark = pytest.mark.django_db
SEED = (Path(__file__).parent / "specs" / "seed_example.toml").read_text()




@pytest.fixture
def repo_path(tmp_path) -> Path:
    files = {"code/certificate.py": "print('ok')\n", "certificate.py": "print('ok')\n",
             "scripts/benchmark_candidate.sh": "#!/bin/sh\necho '{}'\n"}
    return repo_create(tmp_path / "roots" / "certificate", files, tags=("v1",),
                       executable=("scripts/benchmark_candidate.sh",))


@pytest.fixture
def api(personas) -> Client:
    _, plain = api_token_create(personas.member, "tests")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {plain}")
    return client


def post(client: Client, url: str, body: dict):
    return client.post(url, body, content_type="application/json")


def test_validate_returns_every_error_with_its_position(api):
    broken = SEED.replace('population = 32', 'populaton = 32').replace("trials = 5", "trials = 50")
    body = post(api, "/api/specs/validate", {"text": broken}).json()
    assert body["valid"] is False
    expected = [str(error) for error in spec_validate(broken).errors]
    assert [error["text"] for error in body["errors"]] == expected
    unknown = next(e for e in body["errors"] if e["path"] == "populaton")
    assert (unknown["line"], unknown["column"], unknown["suggestion"]) == (3, 1, "population")
    assert any(e["path"] == "score.trials" for e in body["errors"])


def test_validate_summarises_a_valid_spec(api):
    body = post(api, "/api/specs/validate", {"text": SEED}).json()
    assert body["valid"] is True and body["errors"] == []
    assert body["summary"]["rounds"] == [32, 8, 3, 1]
    assert body["summary"]["budget_usd"] == 5.0
    assert body["summary"]["metric_source"] == (
        "reported by the score command, checked against the runtime's wall and CPU time")


def test_validate_warns_when_nothing_checks_correctness_while_the_score_runs(api):
    body = post(api, "/api/specs/validate", {"text": SEED}).json()
    assert body["valid"] is True and body["warnings"] == [RESULTS_WARNING]
    checked = SEED.replace('metric = "median_runtime_ms"', 'metric = "median_runtime_ms"\nresults = "stdout"')
    assert post(api, "/api/specs/validate", {"text": checked}).json()["warnings"] == []


def test_validate_says_who_measures_the_score(api):
    runtime = SEED.replace('metric = "median_runtime_ms"\nreported = "time_ms"',
                           'metric = "runtime:cpu_seconds"')
    assert post(api, "/api/specs/validate", {"text": runtime}).json()["summary"]["metric_source"] == "runtime"
    broken = post(api, "/api/specs/validate", {"text": SEED.replace("trials = 5", "trials = 50")}).json()
    assert broken["summary"] is None  # nothing to say about a spec that does not validate


def test_validate_survives_garbage(api):
    for text in ["\x00\x01", "[[[", "a = 'unterminated", "x" * 300_000]:
        response = post(api, "/api/specs/validate", {"text": text})
        assert response.status_code == 200
        assert response.json()["errors"]
    not_json = api.post("/api/specs/validate", b"\xff\xfe", content_type="application/json")
    assert not_json.status_code in {400, 422}


def test_drafts_keep_versions_and_diff(api, personas):
    created = post(api, "/api/specs", {"project_id": personas.alpha.pk, "title": "speed", "text": SEED})
    assert created.status_code == 201
    spec_id = created.json()["id"]
    changed = SEED.replace("trials = 5", "trials = 7")
    assert post(api, f"/api/specs/{spec_id}/versions", {"text": changed}).json()["number"] == 2
    assert post(api, f"/api/specs/{spec_id}/versions", {"text": changed}).json()["number"] == 2
    diff = api.get(f"/api/specs/{spec_id}/diff?old=1&new=2").json()["diff"]
    assert "-trials = 5" in diff and "+trials = 7" in diff
    copy = post(api, f"/api/specs/{spec_id}/duplicate", {}).json()
    assert copy["duplicated_from_id"] == spec_id
    assert copy["versions"][0]["text"] == changed
    assert api.get(f"/api/specs/{spec_id}/diff?old=1&new=9").status_code == 404


def test_an_outsider_cannot_see_or_save_a_teams_spec(api, personas):
    draft = {"project_id": personas.alpha.pk, "title": "s", "text": SEED}
    spec_id = post(api, "/api/specs", draft).json()["id"]
    _, plain = api_token_create(personas.outsider, "x")
    outsider = Client(HTTP_AUTHORIZATION=f"Bearer {plain}")
    assert outsider.get(f"/api/specs/{spec_id}").status_code == 404
    assert post(outsider, f"/api/specs/{spec_id}/versions", {"text": "x"}).status_code == 404
    assert post(outsider, "/api/specs", draft).status_code == 404


def test_registering_a_repository_needs_an_allowed_root(api, personas, repo_path, settings):
    body = {"project_id": personas.alpha.pk, "path": str(repo_path)}
    refused = post(api, "/api/repositories", body)
    assert refused.status_code == 400
    assert "CRUCIBLE_REPO_ROOTS" in refused.json()["detail"]
    settings.CONFIG = dataclasses.replace(settings.CONFIG, repo_roots=[repo_path.parent])
    assert post(api, "/api/repositories", body).status_code == 201
    outside = post(api, "/api/repositories", {"project_id": personas.alpha.pk, "path": "/etc"})
    assert outside.status_code == 400 and "not under an allowed directory" in outside.json()["detail"]
    repository_id = api.get("/api/repositories").json()[0]["id"]
    refs = api.get(f"/api/repositories/{repository_id}/refs").json()
    assert refs == {"branches": ["main"], "tags": ["v1"], "head": "main"}


def test_freezing_through_the_api_records_the_search(api, personas, repo_path):
    repository = repository_register(personas.member, personas.alpha, str(repo_path), trusted=True)
    body = {"project_id": personas.alpha.pk, "repository_id": repository.pk, "ref": "v1", "text": SEED}
    response = post(api, "/api/searches", body)
    assert response.status_code == 201, response.json()
    frozen = response.json()
    assert frozen["baseline_commit"] == git(repo_path, "rev-parse", "v1")
    assert frozen["search_id"] == "search-" + frozen["preregistration_hash"][:16]
    assert frozen["candidate_batches"][0][0] == "cand_001"
    # Frozen all the same: the seed declares no results, and its `git diff` gate guards a file this
    # repository lacks (a pathspec that matches nothing passes, checking nothing).
    assert frozen["warnings"][0] == RESULTS_WARNING
    assert [("expected_result.json is not in the baseline tree, so `git` matches nothing" in warning)
            for warning in frozen["warnings"][1:]] == [True]
    assert len(frozen["candidate_batches"]) == 2
    again = post(api, "/api/searches", body).json()
    assert again["search_id"] == frozen["search_id"]
    assert Search.objects.count() == 1
    assert api.get(f"/api/searches/{frozen['search_id']}").json()["ref"] == "v1"


def test_the_forecast_route_plans_a_frozen_search_for_members_only(api, personas, repo_path):
    repository = repository_register(personas.member, personas.alpha, str(repo_path), trusted=True)
    search = services.search_freeze(personas.member, personas.alpha, SEED, "v1", repository=repository)
    body = api.get(f"/api/searches/{search.search_id}/forecast").json()
    assert (body["search_id"], body["started"], body["writer_kind"]) == (search.search_id, False, "llm")
    assert body["writer_steps"] == {"low": 32, "high": 32}
    # At most: every round's blocks up to the ceiling, and three replays that each run to it too.
    assert body["gate_runs"] == {"low": 36, "high": 72} and body["trial_runs"] == {"low": 252, "high": 810}
    assert [plan["trial_runs"] for plan in body["rounds"]] == [
        {"low": 165, "high": 495}, {"low": 45, "high": 135}, {"low": 20, "high": 60}, {"low": 10, "high": 30}]
    assert body["replay"]["replays"] == {"low": 1, "high": 3}
    # Six blocks decide at 95 %; while a replay cannot, it runs up to the ceiling (15).
    assert body["replay"]["trial_runs"] == {"low": 12, "high": 90}
    assert body["cost_microusd"] == {"low": 1_276_800, "high": 1_276_800}
    assert body["budget"] == {"max_cost_microusd": 5_000_000, "max_tokens": 10_000_000}
    assert body["wall_seconds"] is None and body["wall_ceiling_seconds"] > 0 and body["warnings"] == []
    _, plain = api_token_create(personas.outsider, "x")
    outsider = Client(HTTP_AUTHORIZATION=f"Bearer {plain}")
    assert outsider.get(f"/api/searches/{search.search_id}/forecast").status_code == 404
    assert api.get("/api/searches/search-0000000000000000/forecast").status_code == 404
    schemas = login(personas.member).get("/api/openapi.json").json()["components"]["schemas"]
    assert "SearchForecastOut" in schemas


def test_freeze_errors_name_the_problem(api, personas, repo_path):
    repository = repository_register(personas.member, personas.alpha, str(repo_path), trusted=True)
    body = {"project_id": personas.alpha.pk, "repository_id": repository.pk, "ref": "nope", "text": SEED}
    unknown = post(api, "/api/searches", body)
    assert unknown.status_code == 400
    assert "nope: no branch, tag or commit" in unknown.json()["detail"]
    (repo_path / "code" / "certificate.py").write_text("print('changed')\n")
    dirty = post(api, "/api/searches", {**body, "ref": "main"})
    assert dirty.status_code == 400 and "dirty" in dirty.json()["detail"]
    invalid = post(api, "/api/searches", {**body, "ref": "main", "text": "name = 1"})
    assert invalid.status_code == 400 and "1:1 name" in invalid.json()["detail"]
    assert Search.objects.count() == 0
