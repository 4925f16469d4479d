"""An evolution run's one status (evolve_app/status.py), in the words searches use."""

from __future__ import annotations

import pytest

from evolve_app.models import Agent, Cycle, EvolutionRun
from evolve_app.status import run_status, run_statuses
from runtime_app.status import StatusWord
from tests.helpers import login

Status = EvolutionRun.Status


def a_run(status: str, **fields) -> EvolutionRun:
    return EvolutionRun(status=status, cycles_planned=5, **{"converged": False, "reason": "", **fields})


@pytest.mark.parametrize(("run", "cycles", "label"), [
    (a_run(Status.QUEUED), 0, "running (queued)"),
    (a_run(Status.QUEUED), 2, "running (queued for cycle 3 of 5)"),
    (a_run(Status.RUNNING), 1, "running (cycle 2 of 5)"),
    (a_run(Status.AWAITING_REVIEW), 2, "awaiting approval (cycle 2 holds a change for review)"),
    (a_run(Status.FINISHED), 5, "finished (5 of 5 cycles)"),
    (a_run(Status.FINISHED, converged=True), 3, "finished (converged after 3 cycles)"),
    (a_run(Status.FAILED, reason="the engine raised KeyError"), 1, "failed (the engine raised KeyError)"),
    (a_run(Status.CANCELLED, reason="cancelled by owner"), 1, "cancelled (cancelled by owner)"),
])
def test_an_evolution_run_has_one_status_for_each_of_its_states(run, cycles, label):
    assert run_status(run, cycles).label == label


def test_every_run_state_maps_to_a_word_of_the_shared_vocabulary():
    words = {run_status(a_run(status), 1).word for status in Status.values}
    assert words <= set(StatusWord) and StatusWord.AWAITING_APPROVAL in words


def test_the_run_page_the_agent_page_and_the_api_show_the_same_status(personas, tmp_path):
    agent = Agent.objects.create(project=personas.alpha, name="helper", path=str(tmp_path / "agent"))
    run = EvolutionRun.objects.create(agent=agent, number=1, benchmark="demo", engine="textbook",
                                      cycles_planned=4, status=Status.AWAITING_REVIEW)
    Cycle.objects.create(run=run, number=1, status=Cycle.Status.AWAITING_REVIEW)
    label = "awaiting approval (cycle 1 holds a change for review)"
    assert run_statuses([run])[run.pk].label == label
    client = login(personas.member)
    assert client.get(f"/api/runs/{run.pk}").json()["status_info"]["label"] == label
    assert client.get(f"/api/agents/{agent.pk}").json()["runs"][0]["status_info"]["label"] == label
    page = client.get(f"/agents/{agent.pk}/runs/{run.pk}/progress/").content.decode()
    assert ('awaiting approval</span> <span class="status-detail">(cycle 1 holds a change for review)'
            in page)
    agents = client.get("/agents/").content.decode()
    assert label in agents
