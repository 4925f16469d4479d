"""The evolution pages count cycles one way, follow a rollback, mark HEAD, and show a running
run's elapsed time and time left."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from evolve_app import presenters, selectors, services
from evolve_app.models import Cycle, EvolutionRun
from tests.evolve_app.helpers import git
from tests.helpers import login, text_of

pytestmark = pytest.mark.django_db(transaction=True)


def run_inline(user, agent, cycles: int = 2, **config) -> EvolutionRun:
    run = services.evolution_run_start(user, agent, cycles=cycles, config=config, enqueue=False)
    return services.evolution_run_execute(run.pk)


def run_url(run) -> str:
    return f"/agents/{run.agent_id}/runs/{run.number}/"


def test_a_run_resumed_after_each_review_says_it_did_every_cycle(personas, demo_agent):
    run = run_inline(personas.owner, demo_agent, cycles=2, review_mode=True)
    for number in (1, 2):
        services.cycle_decide(personas.owner, Cycle.objects.get(run=run, number=number), True)
        run = services.evolution_run_execute(run.pk)
    assert (run.status, run.reason) == ("finished", "2 cycles done")
    page = text_of(login(personas.member).get(run_url(run)))
    assert re.search(r'id="run-cycles-done">2 of 2<', page) and "2 cycles done" in page


def test_the_agent_list_score_follows_a_rollback_to_the_score_measured_on_those_files(personas, demo_agent):
    run = run_inline(personas.owner, demo_agent, cycles=3)
    scores = dict(Cycle.objects.filter(run=run).values_list("number", "score"))
    assert scores == {1: 0.25, 2: 0.5, 3: 0.75}
    [row] = selectors.agent_list_rows(personas.member)
    assert (row.latest_score, row.rolled_back_to) == (0.75, "")
    services.agent_rollback(personas.owner, demo_agent, "evo-1")
    [row] = selectors.agent_list_rows(personas.member)
    assert (row.latest_score, row.rolled_back_to) == (0.5, "evo-1")  # cycle 2 solved with evo-1's files
    page = text_of(login(personas.member).get("/agents/"))
    assert "0.500" in page and "rolled back to evo-1" in page
    listed = login(personas.member).get("/api/agents").json()
    assert listed[0]["latest_score"] == 0.5
    run_inline(personas.owner, demo_agent, cycles=1)  # a new measurement wins again
    [row] = selectors.agent_list_rows(personas.member)
    assert row.rolled_back_to == "" and row.latest_score == Cycle.objects.order_by("-id").first().score


def version_log(client, agent):
    return re.search(r'<ol class="version-log">.*?</ol>', text_of(client.get(f"/agents/{agent.pk}/")), re.S)


def test_the_version_log_marks_head_and_after_a_rollback_the_files_it_restored(personas, demo_agent):
    run_inline(personas.owner, demo_agent, cycles=2)
    client = login(personas.member)
    log = version_log(client, demo_agent)
    head = re.search(r'<li [^>]*id="version-head".*?</li>', log.group(0), re.S).group(0)
    assert "evo-2" in head and ">HEAD<" in head
    services.agent_rollback(personas.owner, demo_agent, "evo-1")
    log = version_log(client, demo_agent)
    head = re.search(r'<li [^>]*id="version-head".*?</li>', log.group(0), re.S).group(0)
    assert git(demo_agent.path, "rev-parse", "HEAD")[:10] in head and "the files of evo-1" in head
    restored = re.search(r'<li class="version-post version-at-head">.*?</li>', log.group(0), re.S).group(0)
    assert "evo-1" in restored and "HEAD's files" in restored
    versions = client.get(f"/api/agents/{demo_agent.pk}").json()["versions"]
    assert [v["tag"] for v in versions if v["head_files"]] == ["evo-1"]


def test_a_running_run_shows_elapsed_time_and_time_left_from_its_cycles_so_far(personas, demo_agent):
    run = run_inline(personas.owner, demo_agent, cycles=2)
    cycles = selectors.run_cycles(run)
    run.status, run.finished_at, run.cycles_planned = "running", None, 4
    now = run.created_at + timedelta(minutes=10)
    for number, cycle in enumerate(cycles, start=1):
        cycle.created_at = run.created_at + timedelta(minutes=3 * number)  # a cycle every 3 minutes
    progress = presenters.run_progress(run, cycles, now=now)
    assert (progress["done"], progress["planned"], progress["elapsed"]) == (2, 4, "10 min 0 s")
    assert progress["eta"] == "6 min 0 s" and "at 3 min 0 s a cycle" in progress["eta_note"]
    EvolutionRun.objects.filter(pk=run.pk).update(status="running", finished_at=None, cycles_planned=4)
    partial = text_of(login(personas.member).get(run_url(run) + "progress/"))
    assert 'id="run-elapsed"' in partial and 'id="run-eta">about ' in partial


def test_a_queued_run_waits_for_its_first_cycle_before_any_estimate(personas, demo_agent):
    run = services.evolution_run_start(personas.owner, demo_agent, cycles=3, enqueue=False)
    progress = presenters.run_progress(run, [])
    assert (progress["done"], progress["eta"], progress["eta_note"]) == (0, "", "after the first cycle")


def test_the_score_curve_has_room_and_levels_to_read_a_score_from(personas, demo_agent):
    run = run_inline(personas.owner, demo_agent, cycles=2)
    curve = presenters.score_curve(selectors.run_cycles(run))
    assert (curve["width"], curve["height"]) == (960, 380)
    assert [level["value"] for level in curve["levels"]] == [0.0, 0.25, 0.5, 0.75, 1.0]
    page = text_of(login(personas.member).get(run_url(run)))
    assert page.count('class="grid-line"') == 5 and 'viewBox="0 0 960 380"' in page
