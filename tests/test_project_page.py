"""The project page is the team's hub: repositories, specs, searches and agents, and first what
needs someone (awaiting approval, failed, running). runtime_app draws it from the sections the
other apps register; it imports neither."""

from __future__ import annotations

import re

import pytest

from evolve_app import services as evolve_services
from evolve_app.models import EvolutionRun
from runtime_app.services import repository_register
from search_app import services as search_services
from tests.evolve_app.fixtures import demo_agent  # noqa: F401
from tests.helpers import login, text_of
from tests.search_app.fixtures import data_dir, finished  # noqa: F401
from tests.search_app.runs import frozen

pytestmark = pytest.mark.django_db(transaction=True)


def attention(page: str) -> list[tuple[str, str]]:
    card = re.search(r'<section class="card attention" id="attention">.*?</section>', page, re.S).group(0)
    return re.findall(r'<li class="attention-[a-z-]+"><span class="badge attention-badge">([^<]+)</span> '
                      r'<a href="[^"]+">([^<]+)</a>', card)


def test_a_quiet_project_says_nothing_needs_attention_and_lists_its_parts(personas):
    page = text_of(login(personas.member).get(f"/projects/{personas.alpha.pk}/"))
    assert "Nothing awaits approval, nothing failed and nothing is running." in page
    for card in ('id="project-repositories"', 'id="project-searches"', 'id="project-agents"'):
        assert card in page


def test_what_needs_the_reader_comes_first_awaiting_approval_then_failed_then_running(
        personas, finished, demo_agent, tmp_path):  # noqa: F811
    search, winner, _ = finished
    running = frozen(personas, tmp_path / "second", {"cand_001": 4, "cand_002": 5}, repo_name="repo2",
                     population=2, rounds=[2, 1])
    repository_register(personas.owner, personas.alpha, running.repository_path, "checkout", trusted=True)
    search_services.search_start(personas.owner, running, enqueue=False)
    waiting = evolve_services.evolution_run_start(personas.owner, demo_agent, cycles=2,
                                                  config={"review_mode": True}, enqueue=False)
    waiting = evolve_services.evolution_run_execute(waiting.pk)
    assert waiting.status == "awaiting_review"

    page = text_of(login(personas.member).get(f"/projects/{personas.alpha.pk}/"))
    items = attention(page)
    assert [level for level, _ in items] == ["awaiting approval", "awaiting approval", "running"]
    labels = [label for _, label in items]
    assert f"{search.name}: {winner.candidate_id} awaits approval" in labels
    assert f"{demo_agent.name}: run {waiting.number} a mutation awaits an approver" in labels
    assert labels[-1] == f"{running.name} is queued"
    assert search.search_id in page and running.search_id in page and demo_agent.name in page
    assert "checkout" in page  # its repositories

    EvolutionRun.objects.filter(pk=waiting.pk).update(status="failed", reason="the engine crashed")
    items = attention(text_of(login(personas.member).get(f"/projects/{personas.alpha.pk}/")))
    assert [level for level, _ in items] == ["awaiting approval", "failed", "running"]
    assert items[1][1] == f"{demo_agent.name}: run {waiting.number} failed: the engine crashed"


def test_an_outsider_sees_neither_the_page_nor_its_sections(personas, finished):  # noqa: F811
    assert login(personas.outsider).get(f"/projects/{personas.alpha.pk}/").status_code == 404
    beta = text_of(login(personas.outsider).get(f"/projects/{personas.beta.pk}/"))
    assert finished[0].search_id not in beta and "Nothing awaits approval" in beta
