"""The run routes: start, cancel, follow; only operators of the project may start or cancel."""

from __future__ import annotations

import pytest
from django.test import Client

from runtime_app.metrics import DESCRIPTOR_LABEL
from runtime_app.models import ProjectMembership
from search_app import services
from search_app.models import SearchRun
from tests.helpers import login, make_user
from tests.search_app.runs import plan_repo, spec_text

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_starts_a_search_and_follows_it_to_its_outcome(personas, small_search):
    client = login(personas.member)
    started = client.post(f"/api/searches/{small_search.search_id}/start")
    assert started.status_code == 202 and started.json()["status"] == "running"
    assert client.post(f"/api/searches/{small_search.search_id}/start").status_code == 202  # harmless again
    services.search_run_inline(small_search)  # stands in for the workers the start enqueued
    report = client.get(f"/api/searches/{small_search.search_id}/run").json()
    assert (report["outcome"], report["winner"]) == ("winner", "cand_001")
    candidates = client.get(f"/api/searches/{small_search.search_id}/candidates").json()
    assert [c["candidate_id"] for c in candidates] == ["baseline", "cand_001", "cand_002"]
    # Its score command prints the metric: the run and every candidate say who measured it.
    assert (report["metric"], report["metric_source"]) == ("value", DESCRIPTOR_LABEL)
    assert [c["metric_source"] for c in candidates] == [DESCRIPTOR_LABEL] * 3
    assert [c["metric_source"] for c in report["candidates"]] == [DESCRIPTOR_LABEL] * 3
    # Each figure as the pages show it: a paired ratio to the baseline with its interval.
    winner = next(c for c in candidates if c["candidate_id"] == "cand_001")
    assert winner["figure"].startswith(f"{winner['score']:.3g}×") and winner["score_absolute"] is not None
    receipts = client.get(f"/api/searches/{small_search.search_id}/receipts").json()
    assert {r["id"] for r in receipts} == {pk for c in candidates for pk in c["receipts"]}


def test_a_runtime_metric_is_said_to_be_measured_by_the_runtime(personas, tmp_path, data_dir):
    text = spec_text(population=2, rounds=[2, 1]).replace('"value"', '"runtime:wall_seconds"').replace(
        'reported = "other"\n', "")
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD",
                                    repository_path=str(plan_repo(tmp_path / "repo", {"cand_001": 4})))
    report = login(personas.member).get(f"/api/searches/{search.search_id}/run").json()
    assert (report["metric"], report["metric_source"]) == ("runtime:wall_seconds", "runtime")


def test_cancel_through_the_api_marks_the_run_cancelling(personas, small_search):
    client = login(personas.member)
    client.post(f"/api/searches/{small_search.search_id}/start")
    cancelled = client.post(f"/api/searches/{small_search.search_id}/cancel")
    assert cancelled.status_code == 202 and cancelled.json()["status"] == "cancelling"
    services.search_advance(small_search.pk)
    assert SearchRun.objects.get(search=small_search).status == "cancelled"


def test_cancelling_a_search_that_never_started_is_a_400(personas, small_search):
    response = login(personas.member).post(f"/api/searches/{small_search.search_id}/cancel")
    assert response.status_code == 400 and "has not started" in str(response.json())


def test_a_viewer_cannot_start_or_cancel(personas, small_search):
    viewer = make_user("viewer-only")
    ProjectMembership.objects.create(project=personas.alpha, user=viewer)
    client = login(viewer)
    assert client.post(f"/api/searches/{small_search.search_id}/start").status_code == 403
    assert client.post(f"/api/searches/{small_search.search_id}/cancel").status_code == 403
    assert not SearchRun.objects.exists()
    assert client.get(f"/api/searches/{small_search.search_id}/run").json()["status"] == "not started"


@pytest.mark.parametrize("route", ["start", "cancel"])
def test_an_outsider_gets_404_and_anonymous_users_401(personas, small_search, route):
    assert login(personas.outsider).post(f"/api/searches/{small_search.search_id}/{route}").status_code == 404
    assert Client().post(f"/api/searches/{small_search.search_id}/{route}").status_code == 401
    assert login(personas.outsider).get(f"/api/searches/{small_search.search_id}/run").status_code == 404


def test_the_search_list_carries_status_and_outcome_and_filters_by_them(personas, small_search):
    client = login(personas.member)
    listed = client.get("/api/searches").json()
    assert [(s["search_id"], s["status"], s["outcome"]) for s in listed] == [
        (small_search.search_id, "not started", "")]
    assert client.get("/api/searches?status=not-started").json()[0]["search_id"] == small_search.search_id
    assert client.get("/api/searches?status=running").json() == []
    client.post(f"/api/searches/{small_search.search_id}/start")
    services.search_run_inline(small_search)
    finished = client.get("/api/searches?status=finished&outcome=winner").json()
    assert [(s["search_id"], s["status"], s["outcome"]) for s in finished] == [
        (small_search.search_id, "finished", "winner")]
    assert client.get("/api/searches?status=not-started").json() == []
    assert client.get("/api/searches?outcome=none").json() == []


def test_an_unknown_status_filter_is_a_422_naming_the_statuses_there_are(personas, small_search):
    response = login(personas.member).get("/api/searches?status=done")
    assert response.status_code == 422
    message = str(response.json()["detail"])
    assert "status" in message and "'not-started'" in message and "'finished'" in message
