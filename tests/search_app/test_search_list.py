"""The searches list: a run table with filters, search, sorting, live refresh and a fixed query count."""

from __future__ import annotations

import html
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runtime_app.services import repository_register
from search_app import selectors, services
from search_app.models import Candidate, Search, SearchRun, Step
from tests.helpers import login
from tests.search_app.runs import plan_repo, spec_text

pytestmark = pytest.mark.django_db(transaction=True)

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def repository(personas, tmp_path, settings):
    """alpha's registered repository; cand_001 scores 4 at a cost of 300 µUSD, cand_002 scores 1."""
    settings.DATA_DIR = tmp_path / "data"
    path = plan_repo(tmp_path / "repo", {"cand_001": {"value": 4, "cost": 300}, "cand_002": 1})
    return repository_register(personas.owner, personas.alpha, str(path), "answer-repo", trusted=True)


def freeze(personas, repository, name: str, *, objective: str = "", direction: str = "maximize",
           budget: str = "", project=None):
    text = spec_text(population=2, rounds=[2, 1], name=name, budget=budget)
    if objective:
        text = text.replace("Make answer() return the largest number you can", objective)
    text = text.replace('direction = "maximize"', f'direction = "{direction}"')
    if project is None:
        return services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository=repository)
    # Another project's search: the same repository, registered there too.
    other = repository_register(project.created_by, project, repository.path, "beta-repo", trusted=True)
    return services.search_freeze(project.created_by, project, text, "HEAD", repository=other)


def started(personas, search, *, baseline: float | None = None, scores: tuple = (), running: bool = False):
    """Start a search without running anything; optionally give it scores and a step that began."""
    services.search_start(personas.owner, search, enqueue=False)
    if baseline is not None:
        Candidate.objects.filter(search=search, number=0).update(score=baseline)
    for number, score in enumerate(scores, start=1):
        Candidate.objects.filter(search=search, number=number).update(score=score)
    if running:  # the planner admits the first writers; one of them began
        services.search_advance(search.pk)
        Step.objects.filter(search=search).update(state="running", started_at=timezone.now())
    return search


def page(client: Client, query: str = "", **extra) -> str:
    response = client.get(f"/searches/{query}", **extra)
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def listed(text: str) -> list[str]:
    """The names of the searches in the table, top to bottom."""
    return re.findall(r'<tr id="row-search-[0-9a-f]{16}"[^>]*>\s*<td><a href="[^"]+">([^<]+)</a>', text)


def test_a_finished_search_shows_its_status_outcome_best_score_vs_baseline_spend_and_times(
    personas, repository
):
    search = freeze(personas, repository, "finished-one", budget="[budget]\nmax_cost_microusd = 5000000\n")
    services.search_start(personas.owner, search, enqueue=False)
    services.search_run_inline(search)
    text = page(login(personas.member))
    row = text[text.index(f'id="row-{search.search_id}"'):]
    row = row[:row.index("</tr>")]
    # One status, as every page says it: a winner nobody approved yet awaits approval.
    assert ('<span class="status-word">awaiting approval</span> <span class="status-detail">(0 of 1 approval)'
            '</span>') in row
    assert "answer-repo" in row and search.baseline_commit[:12] in row and ">owner<" in row
    assert "2 <span class=\"muted\">· 2 → 1</span>" in row
    assert '<span class="versus better"' in row and "2× higher · 4 vs 2" in row
    assert "$0.0003<br>" in row and "of $5.00 (0%)" in row
    assert row.count("<time") == 3  # started → finished, and created
    assert "every 5s" not in text  # nothing is live: no refreshing


def test_each_status_gets_its_badge_and_the_rows_refresh_only_while_one_is_live(personas, repository):
    freeze(personas, repository, "never-started")
    started(personas, freeze(personas, repository, "waiting"))
    started(personas, freeze(personas, repository, "busy"), running=True)
    client = login(personas.member)
    text = page(client)
    for name, label in (("never-started", "frozen (not started)"), ("waiting", "running (queued)"),
                        ("busy", "running (round 1 of 2)")):
        row = text[text.index(f">{name}</a>"):]
        cell = re.search(r'<td class="status-cell">(.*?)</td>', row[:row.index("</tr>")], re.S).group(1)
        assert " ".join(re.sub(r"<[^>]+>", "", cell).split()) == label
    assert 'hx-get="/searches/" hx-trigger="every 5s"' in text
    rows = page(client, "?q=never&sort=name", **HTMX)
    assert "every 5s" not in rows and listed(rows) == ["never-started"]
    rows = page(client, "?status=running&sort=name", **HTMX)
    assert 'hx-get="/searches/?status=running&sort=name" hx-trigger="every 5s"' in rows  # keeps the filters


def test_a_minimized_score_counts_lower_as_better_and_says_so(personas, repository):
    started(personas, freeze(personas, repository, "faster", direction="minimize"),
            baseline=712.0, scores=(0.45, 3.0))
    started(personas, freeze(personas, repository, "slower", direction="minimize"),
            baseline=10.0, scores=(12.5, 11.0))
    text = page(login(personas.member), "?sort=name")
    assert '<span class="versus better"' in text and "1,582× lower · 0.45 vs 712" in text
    assert '<span class="versus worse"' in text and "1.1× higher · 11 vs 10" in text


def test_the_list_filters_by_status_outcome_and_project(personas, repository):
    freeze(personas, repository, "idle")
    started(personas, freeze(personas, repository, "waiting"))
    won = started(personas, freeze(personas, repository, "won"))
    lost = started(personas, freeze(personas, repository, "lost"))
    SearchRun.objects.filter(search=won).update(status="finished", outcome="winner")
    SearchRun.objects.filter(search=lost).update(status="finished", outcome="NONE")
    personas.beta.memberships.create(user=personas.member)
    freeze(personas, repository, "elsewhere", project=personas.beta)
    client = login(personas.member)
    assert listed(page(client, "?sort=name")) == ["elsewhere", "idle", "lost", "waiting", "won"]
    assert listed(page(client, "?status=not-started&sort=name")) == ["elsewhere", "idle"]
    assert listed(page(client, "?status=queued")) == ["waiting"]
    assert listed(page(client, "?status=finished&sort=name")) == ["lost", "won"]
    assert listed(page(client, "?outcome=winner")) == ["won"]
    assert listed(page(client, "?outcome=none")) == ["lost"]
    assert listed(page(client, "?outcome=undecided&sort=name")) == ["elsewhere", "idle", "waiting"]
    assert listed(page(client, f"?project={personas.beta.pk}")) == ["elsewhere"]
    assert listed(page(client, f"?project={personas.alpha.pk}&status=not-started")) == ["idle"]
    text = page(client, "?status=running")
    assert listed(text) == [] and "No searches match these filters." in text


def test_the_free_text_search_matches_the_name_the_objective_and_the_search_id(personas, repository):
    first = freeze(personas, repository, "alpha-speed", objective="Make the parser faster")
    second = freeze(personas, repository, "beta-size", objective="Shrink the binary")
    client = login(personas.member)
    assert listed(page(client, "?q=PARSER")) == ["alpha-speed"]
    assert listed(page(client, "?q=beta")) == ["beta-size"]
    assert listed(page(client, f"?q={second.search_id}")) == ["beta-size"]
    assert listed(page(client, f"?q={first.search_id[7:15]}")) == ["alpha-speed"]  # part of the id
    assert listed(page(client, "?q=the+binary")) == ["beta-size"]  # every word must match
    assert listed(page(client, "?q=nothing-like-this")) == []


def test_sorting_goes_both_ways_and_the_heading_links_keep_the_other_parameters(personas, repository):
    started(personas, freeze(personas, repository, "b-middle"), baseline=2.0, scores=(5.0, 1.0))
    started(personas, freeze(personas, repository, "c-high"), baseline=2.0, scores=(9.0,))
    freeze(personas, repository, "a-unscored")
    client = login(personas.member)
    assert listed(page(client)) == ["a-unscored", "c-high", "b-middle"]  # newest first
    assert listed(page(client, "?sort=created")) == ["b-middle", "c-high", "a-unscored"]
    assert listed(page(client, "?sort=name")) == ["a-unscored", "b-middle", "c-high"]
    assert listed(page(client, "?sort=-name")) == ["c-high", "b-middle", "a-unscored"]
    assert listed(page(client, "?sort=-best")) == ["c-high", "b-middle", "a-unscored"]  # unscored last
    assert listed(page(client, "?sort=best")) == ["b-middle", "c-high", "a-unscored"]
    assert listed(page(client, "?sort=-spend"))[-1] == "a-unscored"  # not started: no spend, last
    text = page(client, "?status=queued&q=i&sort=name")
    assert 'aria-sort="ascending"' in text
    assert 'href="/searches/?status=queued&q=i&sort=-name"' in text  # the current column reverses
    assert 'href="/searches/?status=queued&q=i&sort=-best"' in text
    assert 'href="/searches/?status=queued&q=i"' in text  # created, newest first: the default
    assert '<input type="hidden" name="sort" value="name" form="search-filters">' in text


def test_bad_parameters_are_ignored_and_the_defaults_used(personas, repository):
    freeze(personas, repository, "older")
    freeze(personas, repository, "newer")
    client = login(personas.member)
    for query in ("?status=exploded", "?outcome=maybe", "?project=abc", "?project=-1",
                  "?project=99999999999999999999999999", f"?project={personas.beta.pk}", "?sort=evil",
                  "?sort=-pk", "?sort=", "?q=" + "x" * 500, "?q=%00", "?status=running&status=",
                  "?page=7&unknown=1"):
        assert listed(page(client, query)) == ["newer", "older"], query
    text = page(client, "?status=exploded&sort=evil&q=newer")
    assert listed(text) == ["newer"]  # the valid filter stands, the invalid ones do not
    assert 'value="exploded"' not in text and 'value="evil"' not in text


def test_an_outsider_does_not_see_another_project_s_searches(personas, repository):
    search = freeze(personas, repository, "alpha-only")
    client = login(personas.outsider)
    for query in ("", f"?project={personas.alpha.pk}", f"?q={search.search_id}"):
        rows = page(client, query, **HTMX)
        assert search.search_id not in rows and "alpha-only" not in rows and listed(rows) == []
    assert "alpha" not in re.findall(r"<option[^>]*>([^<]+)</option>", page(client))


def test_an_htmx_request_gets_only_the_rows_partial(personas, repository):
    freeze(personas, repository, "partial")
    client = login(personas.member)
    response = client.get("/searches/?q=part", **HTMX)
    rows = response.content.decode()
    assert rows.strip().startswith('<div id="search-rows"')
    assert rows.strip().endswith("</div>") and "<html" not in rows and "Spec drafts" not in rows
    assert listed(rows) == ["partial"] and "HX-Request" in response["Vary"]
    full = page(client, "?q=part")
    assert "<html" in full and "Spec drafts" in full and 'id="search-filters"' in full
    assert 'hx-get="/searches/"' in full and 'hx-target="#search-rows"' in full
    assert 'hx-push-url="true"' in full
    assert 'keyup changed delay:400ms from:#search-q' in full and 'value="part"' in full
    form = client.get("/searches/?q=part&status=&outcome=&project=&sort=-created",
                      HTTP_HX_TRIGGER="search-filters", **HTMX)
    assert form["HX-Push-Url"] == "/searches/?q=part"  # the address bar gets the tidy URL
    restore = page(client, "?q=part", HTTP_HX_REQUEST="true", HTTP_HX_HISTORY_RESTORE_REQUEST="true")
    assert "<html" in restore  # htmx restoring history needs the whole page


def test_the_list_takes_the_same_number_of_queries_for_3_and_12_searches(personas, repository):
    def fill(upto: int) -> None:
        for number in range(Search.objects.count() + 1, upto + 1):
            search = freeze(personas, repository, f"many-{number:02d}")
            if number % 3:  # two of three started, with scores; the rest not started
                started(personas, search, baseline=2.0, scores=(float(number), 1.0), running=number % 2 == 0)

    client = login(personas.member)
    counts = []
    for size in (3, 12):
        fill(size)
        for extra in ({}, HTMX):
            with CaptureQueriesContext(connection) as queries:
                text = page(client, "?sort=-best", **extra)
            counts.append(len(queries))
        assert len(listed(text)) == size
    assert counts[0] == counts[2] and counts[1] == counts[3], counts
    print(f"queries: page {counts[0]}, rows partial {counts[1]}")


def test_more_than_the_cap_shows_the_first_ones_and_says_more_match(personas, repository, monkeypatch):
    for name in ("one", "two", "three"):
        freeze(personas, repository, name)
    monkeypatch.setattr(selectors, "SEARCH_LIST_LIMIT", 2)
    text = page(login(personas.member))
    assert listed(text) == ["three", "two"] and "Showing the first 2 searches; more match." in text
    assert "more match" not in page(login(personas.member), "?q=one")


def test_the_list_needs_a_login(personas, repository):
    freeze(personas, repository, "private")
    response = Client().get("/searches/?q=private")
    assert response.status_code == 302 and "/login/?next=/searches/" in response["Location"]
    assert Client().get("/searches/", **HTMX).status_code == 302
