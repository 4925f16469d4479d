"""The evolution API: import, runs, cycles, observations, review decisions and rollback through the
same services as the pages; 404 for outsiders, 403 for a missing role, 400/422 for bad input."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
from django.test import Client

from evolve_app import services
from evolve_app.demo import SEED_WORKSPACE
from evolve_app.models import Agent, EvolutionRun
from runtime_app.models import ProjectMembership
from runtime_app.services import api_token_create
from tests.evolve_app.helpers import git
from tests.helpers import login, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def bearer(user) -> Client:
    _, plain = api_token_create(user, "tests")
    return Client(HTTP_AUTHORIZATION=f"Bearer {plain}")


def post(client: Client, url: str, body: dict | None = None):
    return client.post(url, body or {}, content_type="application/json")




@pytest.fixture
def roots(tmp_path, settings):
    """CRUCIBLE_REPO_ROOTS = tmp_path/roots, holding a copy of the demo seed at roots/seed."""
    folder = tmp_path / "roots"
    shutil.copytree(SEED_WORKSPACE, folder / "seed", ignore=shutil.ignore_patterns("__pycache__"))
    settings.CONFIG = dataclasses.replace(settings.CONFIG, repo_roots=[folder])
    return folder


def finished_run(user, agent, cycles: int, **config) -> EvolutionRun:
    run = services.evolution_run_start(user, agent, cycles=cycles, config=config, enqueue=False)
    return services.evolution_run_execute(run.pk)


def test_an_operator_imports_a_workspace_under_an_allowed_root_and_sees_it_listed(personas, roots):
    member = bearer(personas.member)
    created = post(member, "/api/agents/import",
                   {"project": personas.alpha.pk, "path": str(roots / "seed"), "name": "mine"})
    assert created.status_code == 201, created.json()
    agent = created.json()
    assert (agent["name"], agent["project"], agent["agent_type"]) == ("mine", "alpha", "command")
    assert git(agent["path"], "tag") == "evo-0"  # in Crucible's copy
    assert agent["source_path"] == str(roots / "seed") and not (roots / "seed/.git").exists()
    listed = member.get("/api/agents").json()
    assert [(a["id"], a["run_count"], a["latest_score"]) for a in listed] == [(agent["id"], 0, None)]
    assert bearer(personas.outsider).get("/api/agents").json() == []
    # A project may be named; importing the same folder again gives the same agent.
    again = post(member, "/api/agents/import", {"project": "alpha", "path": str(roots / "seed")})
    assert again.status_code == 201 and again.json()["id"] == agent["id"]
    assert again.json()["note"].startswith(f"{roots / 'seed'} is already imported into alpha as agent mine")
    assert Agent.objects.count() == 1


def test_an_import_outside_the_roots_or_of_a_broken_workspace_is_a_400_with_every_problem(
        personas, roots, tmp_path):
    member = bearer(personas.member)
    outside = post(member, "/api/agents/import", {"project": personas.alpha.pk, "path": str(tmp_path)})
    assert outside.status_code == 400 and "not under an allowed directory" in outside.json()["detail"]
    broken = roots / "broken"
    (broken / "prompts").mkdir(parents=True)
    (broken / "manifest.yaml").write_text("agent:\n  type: command\nevolvable_layer: [skills]\n"
                                          "reload_strategy: warm\n")
    refused = post(member, "/api/agents/import", {"project": personas.alpha.pk, "path": str(broken)})
    assert refused.status_code == 400
    problems = refused.json()["errors"]["path"]
    assert any(p.startswith("manifest.yaml:3:1: missing required key 'evolvable_layers'")
               and "'evolvable_layer' on line 3 looks like a misspelling of it" in p for p in problems)
    assert any(p.startswith("manifest.yaml:4:") and "warm" in p for p in problems)
    assert any(p.startswith("prompts/system.md") for p in problems)
    missing = post(member, "/api/agents/import", {"project": personas.alpha.pk, "path": str(roots / "nope")})
    assert missing.status_code == 400 and "no such folder" in missing.json()["detail"]
    assert post(member, "/api/agents/import", {"project": personas.alpha.pk}).status_code == 422
    assert not Agent.objects.exists()


def test_an_outsider_cannot_import_into_a_project_they_are_not_in(personas, roots):
    body = {"project": personas.alpha.pk, "path": str(roots / "seed")}
    outsider = bearer(personas.outsider)
    assert post(outsider, "/api/agents/import", body).status_code == 404
    assert post(outsider, "/api/agents/import", {**body, "project": "alpha"}).status_code == 404
    assert not Agent.objects.exists()


def test_a_run_started_through_the_api_is_followed_cycle_by_cycle_with_its_observations(
        personas, demo_agent):
    member = bearer(personas.member)
    started = post(member, f"/api/agents/{demo_agent.pk}/runs", {"cycles": 2, "config": {"egl_window": 2}})
    assert started.status_code == 202, started.json()
    run = started.json()
    assert (run["status"], run["cycles_planned"], run["cycles"]) == ("queued", 2, [])
    assert run["config"]["egl_window"] == 2 and run["started_by"] == "member"
    services.evolution_run_execute(run["id"])  # stands in for the worker the start enqueued

    report = member.get(f"/api/runs/{run['id']}").json()
    assert report["status"] == "finished"
    assert [(c["number"], c["score"], c["status"]) for c in report["cycles"]] == [
        (1, 0.25, "accepted"), (2, 0.5, "accepted")]
    assert report["cycles"][0]["skills_added"] == ["date-arithmetic"]
    assert (report["cycles"][0]["train_count"], report["cycles"][0]["train_successes"]) == (12, 3)
    assert report["score_curve"] == [[1, 0.25], [2, 0.5]]

    failures = member.get(f"/api/runs/{run['id']}/cycles/1/observations?failures=true").json()
    assert failures["counts"] == {"all": 12, "failures": 9} and failures["failures_only"] is True
    assert len(failures["observations"]) == 9
    assert not any(o["success"] for o in failures["observations"])
    assert all(o["split"] == "train" and o["feedback_detail"] for o in failures["observations"])
    every = member.get(f"/api/runs/{run['id']}/cycles/1/observations").json()["observations"]
    assert sum(o["success"] for o in every) == 3
    assert {o["task_id"].split("-")[0] for o in every if o["success"]} == {"units"}
    assert member.get(f"/api/runs/{run['id']}/cycles/9/observations").status_code == 404
    assert member.get(f"/api/runs/{run['id']}/cycles/1/observations?split=nope").status_code == 422

    detail = member.get(f"/api/agents/{demo_agent.pk}").json()
    assert [v["tag"] for v in detail["versions"]] == ["evo-0", "pre-evo-1", "evo-1", "pre-evo-2", "evo-2"]
    assert detail["versions_error"] == ""
    assert [(p["run"], p["cycle"], p["score"]) for p in detail["score_curve"]] == [
        (run["id"], 1, 0.25), (run["id"], 2, 0.5)]
    assert [(r["id"], r["cycle_count"], r["last_score"]) for r in detail["runs"]] == [(run["id"], 2, 0.5)]
    listed = member.get("/api/agents").json()[0]
    assert (listed["run_count"], listed["last_run_status"], listed["latest_score"]) == (1, "finished", 0.5)


def test_bad_run_settings_are_a_400_naming_each_problem_and_malformed_bodies_a_422(personas, demo_agent):
    member = bearer(personas.member)
    url = f"/api/agents/{demo_agent.pk}/runs"
    refused = post(member, url, {"benchmark": "nope", "engine": "nope", "cycles": 0,
                                 "config": {"egl_window": 1, "bogus": 2}})
    assert refused.status_code == 400
    assert set(refused.json()["errors"]) == {"benchmark", "engine", "cycles", "config"}
    assert "Give 1 to 200 cycles." in refused.json()["detail"]
    assert post(member, url, {"cycles": "many"}).status_code == 422
    assert member.post(url, "{not json", content_type="application/json").status_code in {400, 422}
    assert member.get("/api/agents/abc").status_code == 422
    assert member.get("/api/runs/999999").status_code == 404
    assert not EvolutionRun.objects.exists()
    # One run at a time per agent.
    assert post(member, url, {"cycles": 1}).status_code == 202
    second = post(member, url, {"cycles": 1})
    assert second.status_code == 400 and "already has a run in progress" in second.json()["detail"]


def test_cancelling_a_run_stops_it_once_and_then_says_there_is_nothing_to_cancel(personas, demo_agent):
    member = bearer(personas.member)
    run = post(member, f"/api/agents/{demo_agent.pk}/runs", {"cycles": 3}).json()
    cancelled = post(member, f"/api/runs/{run['id']}/cancel")
    assert cancelled.status_code == 200
    assert (cancelled.json()["status"], cancelled.json()["reason"]) == ("cancelled", "cancelled by member")
    again = post(member, f"/api/runs/{run['id']}/cancel")
    assert again.status_code == 400 and "nothing to cancel" in again.json()["detail"]
    assert services.evolution_run_execute(run["id"]).cycles.count() == 0


def test_a_waiting_mutation_is_decided_by_an_approver_and_not_by_an_operator(personas, demo_agent):
    run = finished_run(personas.owner, demo_agent, cycles=2, review_mode=True)
    assert run.status == "awaiting_review"
    waiting = bearer(personas.owner).get(f"/api/runs/{run.pk}").json()["cycles"][0]
    assert waiting["status"] == "awaiting_review" and waiting["mutated"]
    url = f"/api/cycles/{waiting['id']}/decide"
    refused = post(bearer(personas.member), url, {"approve": True})
    assert refused.status_code == 403
    assert refused.json()["detail"] == "This needs the approver role in alpha (yours is operator)."
    assert post(bearer(personas.owner), url, {}).status_code == 422
    decided = post(bearer(personas.owner), url, {"approve": True})
    assert decided.status_code == 200, decided.json()
    body = decided.json()
    assert (body["status"], body["decided_by"], body["skills_added"]) == ("accepted", "owner",
                                                                          ["date-arithmetic"])
    assert "evo-1" in git(demo_agent.path, "tag").split()
    twice = post(bearer(personas.owner), url, {"approve": False})
    assert twice.status_code == 400 and "not awaiting review" in twice.json()["detail"]
    assert bearer(personas.owner).get(f"/api/runs/{run.pk}").json()["status"] == "queued"


def test_a_rollback_needs_an_approver_and_a_snapshot_tag(personas, demo_agent):
    finished_run(personas.owner, demo_agent, cycles=2)
    url = f"/api/agents/{demo_agent.pk}/rollback"
    refused = post(bearer(personas.member), url, {"tag": "evo-1"})
    assert refused.status_code == 403
    owner = bearer(personas.owner)
    bad = post(owner, url, {"tag": "HEAD~1"})
    assert bad.status_code == 400 and "evo-3" in bad.json()["detail"]
    unknown = post(owner, url, {"tag": "evo-9"})
    assert unknown.status_code == 400 and "Cannot roll back to evo-9" in unknown.json()["detail"]
    assert post(owner, url, {"tag": "x" * 100}).status_code == 422
    done = post(owner, url, {"tag": "evo-1"})
    assert done.status_code == 200, done.json()
    sha = done.json()["commit"]
    assert git(demo_agent.path, "rev-parse", f"{sha}^{{tree}}") == git(demo_agent.path, "rev-parse",
                                                                         "evo-1^{tree}")
    assert "evo-2" in git(demo_agent.path, "tag").split()


def test_outsiders_get_404_on_every_route_and_anonymous_callers_401(personas, demo_agent):
    run = finished_run(personas.owner, demo_agent, cycles=1)
    cycle = run.cycles.get()
    gets = [f"/api/agents/{demo_agent.pk}", f"/api/runs/{run.pk}",
            f"/api/runs/{run.pk}/cycles/1/observations"]
    posts = [(f"/api/agents/{demo_agent.pk}/runs", {"cycles": 1}), (f"/api/runs/{run.pk}/cancel", {}),
             (f"/api/cycles/{cycle.pk}/decide", {"approve": True}),
             (f"/api/agents/{demo_agent.pk}/rollback", {"tag": "evo-0"})]
    outsider, anonymous = bearer(personas.outsider), Client()
    for url in gets:
        assert outsider.get(url).status_code == 404, url
        assert anonymous.get(url).status_code == 401, url
    for url, body in posts:
        assert post(outsider, url, body).status_code == 404, url
        assert post(anonymous, url, body).status_code == 401, url
    assert anonymous.get("/api/agents").status_code == 401
    assert EvolutionRun.objects.count() == 1 and git(demo_agent.path, "log", "-1", "--format=%s") != \
        "Roll back to evo-0"


def test_a_viewer_member_reads_but_cannot_start_runs(personas, demo_agent):
    viewer = make_user("viewer-only")
    ProjectMembership.objects.create(project=personas.alpha, user=viewer)
    client = bearer(viewer)
    assert client.get(f"/api/agents/{demo_agent.pk}").status_code == 200
    refused = post(client, f"/api/agents/{demo_agent.pk}/runs", {"cycles": 1})
    assert refused.status_code == 403
    assert refused.json()["detail"] == "This needs the operator role in alpha (yours is viewer)."
    assert not EvolutionRun.objects.exists()


def test_session_posts_need_the_csrf_token_and_token_posts_do_not(personas, demo_agent):
    url = f"/api/agents/{demo_agent.pk}/runs"
    session = Client(enforce_csrf_checks=True)
    session.force_login(personas.member)
    assert session.get(f"/api/agents/{demo_agent.pk}").status_code == 200
    refused = session.post(url, {"cycles": 1}, content_type="application/json")
    assert refused.status_code in {401, 403}
    assert not EvolutionRun.objects.exists()
    session.get("/")  # sets the csrftoken cookie
    token = session.cookies["csrftoken"].value
    ok = session.post(url, {"cycles": 1}, content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert ok.status_code == 202
    run_id = ok.json()["id"]
    assert post(bearer(personas.member), f"/api/runs/{run_id}/cancel").status_code == 200
    assert login(personas.member).get(f"/api/runs/{run_id}").json()["status"] == "cancelled"


def test_the_api_refuses_unregistered_engines_and_benchmarks_as_the_form_does(personas, demo_agent):
    member = bearer(personas.member)
    refused = post(member, f"/api/agents/{demo_agent.pk}/runs", {"engine": "no-such-engine",
                                                                 "benchmark": "no-such-benchmark"})
    assert refused.status_code == 400, refused.json()
    text = str(refused.json())
    assert "unknown engine 'no-such-engine': use one of textbook" in text
    assert ("unknown benchmark 'no-such-benchmark'; registered: arc, arc-agi-3, arc-agi3, demo, hle, jsonl, "
            "mcp-atlas, skill-bench, swe-verified, task-folder, terminal-bench, terminal2") in text
    assert not EvolutionRun.objects.exists()
