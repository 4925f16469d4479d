"""Figures read at a glance: each value in its metric's unit, scaled and rounded to what its
trials' spread justifies; a candidate against the baseline as one factor in the metric's words
("122× faster (113–126×)") with its interval, the same on the list, the search, candidate and
compare pages, the API and the CLI; columns no row has a value in are left out; the rounds'
bars count every candidate that fell."""

from __future__ import annotations

import html
import re

import pytest

from search_app import figures, services
from search_app.figures import change, digits_for, metric_of, number_text, quantity, spread_text, trials_text
from search_app.models import Candidate, SearchRun
from tests.helpers import login
from tests.search_app.runs import spec_text
from tests.search_app.test_cli import outcome_table
from tests.search_app.test_search_list import repository  # noqa: F401 (a fixture)

WALL = metric_of("runtime:wall_seconds")
RSS = metric_of("runtime:max_rss_kib")
ACCURACY = metric_of("accuracy", "other", "maximize")


# --- pure: precision, units, words -------------------------------------------------------------

def test_a_value_is_rounded_to_the_digit_its_spread_reaches():
    assert digits_for(0.023405000000000002, 0.0004) == 3
    assert quantity(0.023405000000000002, WALL, 0.0004) == "23.4 ms"
    assert quantity(0.023405000000000002, WALL, 0.000004) == "23.405 ms"  # a tighter spread says more
    assert quantity(0.023405000000000002, WALL, 0.004) == "23 ms"  # a wider one less (never under 2)


def test_without_a_spread_a_value_keeps_three_digits_and_no_trailing_zeros():
    assert quantity(2.64, WALL) == "2.64 s"
    assert quantity(1.5, WALL) == "1.5 s"
    assert number_text(1582.3) == "1,582" and number_text(9.996) == "10.0"


def test_time_scales_from_seconds_to_nanoseconds_and_reported_units_convert():
    assert [quantity(v, WALL) for v in (3.2, 0.0032, 0.0000032, 0.0000000032)] == \
        ["3.2 s", "3.2 ms", "3.2 µs", "3.2 ns"]
    assert quantity(2500, metric_of("median_ms", "time_ms")) == "2.5 s"
    assert quantity(740, metric_of("t", "time_us")) == "740 µs"


def test_memory_scales_in_binary_units():
    assert quantity(512, RSS) == "512 KiB"
    assert quantity(1536, RSS) == "1.5 MiB"
    assert quantity(3 * 1024 * 1024, RSS) == "3 GiB"
    assert quantity(800, metric_of("peak", "memory_bytes")) == "800 B"


def test_a_figure_of_another_kind_has_no_unit_and_its_own_precision():
    assert quantity(0.87654, ACCURACY, 0.01) == "0.88"
    assert quantity(12345.6, ACCURACY) == "12,346"


def test_trials_share_one_unit_and_the_precision_of_their_spread():
    assert trials_text([0.023405000000000002, 0.0231, 0.0235], WALL) == "23.4, 23.1, 23.5 ms"
    assert spread_text(0.0004, WALL, 0.0234) == "spread 0.4 ms"
    assert spread_text(None, WALL) == "" and spread_text(0, WALL) == ""


def test_a_faster_candidate_reads_as_n_times_faster_with_its_interval():
    moved = change(0.00818, WALL, 0.00791, 0.00887)
    assert moved is not None and moved.text == "122× faster (113–126×)" and moved.better is True


def test_a_slower_candidate_reads_as_n_times_slower_with_its_interval():
    moved = change(3.5, WALL, 3.2, 3.9)
    assert moved is not None and moved.text == "3.5× slower (3.2–3.9×)" and moved.better is False


def test_an_interval_that_holds_the_baseline_is_neither_better_nor_worse():
    moved = change(0.98, WALL, 0.95, 1.02)
    assert moved is not None and moved.text == "1.02× faster (0.98–1.05×)" and moved.better is None


def test_memory_reads_smaller_or_larger_and_other_figures_higher_or_lower():
    assert change(0.3, RSS).text == "3.33× smaller"  # type: ignore[union-attr]
    assert change(2.5, RSS).text == "2.5× larger"  # type: ignore[union-attr]
    higher = change(1.125, ACCURACY)
    assert higher is not None and higher.text == "1.12× higher" and higher.better is True  # maximize
    lower = change(0.5, ACCURACY)
    assert lower is not None and lower.text == "2× lower" and lower.better is False


def test_a_large_factor_is_a_whole_number_with_thousands_separated():
    assert change(0.0002, WALL).text == "5,000× faster"  # type: ignore[union-attr]


def test_the_best_against_the_baseline_is_one_line_with_both_values():
    line = figures.versus(0.0216, 2.64, WALL, ratio=0.00818, low=0.00791, high=0.00887)
    assert line is not None and line["text"] == "122× faster (113–126×) · 21.6 ms vs 2.64 s"
    assert line["verdict"] == "better"


def test_a_zero_or_a_sign_change_reads_as_a_difference_not_a_factor():
    line = figures.versus(-1, 2, ACCURACY)
    assert line is not None and line["text"] == "3 lower · -1 vs 2" and line["verdict"] == "worse"
    assert change(None, WALL) is None and change(0, WALL) is None and change(float("inf"), WALL) is None


def test_the_metric_says_its_unit_and_direction():
    assert WALL.label == "runtime:wall_seconds (time in s, lower is better)"
    assert metric_of("runtime:max_rss_kib").label == "runtime:max_rss_kib (memory in KiB, lower is better)"
    assert metric_of("median_runtime_ms").unit == "ms"  # a spec frozen before `reported`: by its name
    assert ACCURACY.label == "accuracy (value, higher is better)"


# --- the pages, the API and the CLI ------------------------------------------------------------

def test_the_cli_outcome_table_prints_the_pages_words_and_units():
    shown = {"score": "122× faster (113–126×)", "value": "21.6 ms", "spread": "spread 0.4 ms", "trials": {}}
    text = outcome_table("runtime:wall_seconds", figures=shown)
    assert "122× faster (113–126×)" in text and "21.6 ms · spread 0.4 ms" in text
    assert "0.41× [0.38, 0.44]" not in text  # the bare figure only for a report without `figures`


def timed_search(personas, repository, population: int = 2, rounds: list[int] | None = None):  # noqa: F811
    text = spec_text(population=population, rounds=rounds or [2, 1], name="timed")
    text = text.replace('direction = "maximize"', 'direction = "minimize"')
    text = text.replace('metric = "value"', 'metric = "runtime:wall_seconds"')
    text = text.replace('reported = "other"\n', "")
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository=repository)
    services.search_start(personas.owner, search, enqueue=False)
    return search


def page_text(client, url: str) -> str:
    return html.unescape(client.get(url).content.decode())


@pytest.mark.django_db(transaction=True)
def test_list_search_candidate_compare_api_and_cli_say_the_same_factor_with_units(
        personas, repository):  # noqa: F811
    search = timed_search(personas, repository)
    Candidate.objects.filter(search=search, number=0).update(score=1.0, score_absolute=2.64, spread=0.01,
                                                             state=Candidate.State.ALIVE)
    Candidate.objects.filter(search=search, number=1).update(
        score=0.00818, score_low=0.00791, score_high=0.00887, score_absolute=0.0216, spread=0.0004,
        trials={"0": [0.023405000000000002, 0.0231, 0.0235]}, state=Candidate.State.ALIVE, round_reached=0)
    words = "122× faster (113–126×)"
    client = login(personas.member)
    assert f"{words} · 21.6 ms vs 2.64 s" in page_text(client, "/searches/")
    page = page_text(client, f"/searches/{search.search_id}/")
    assert words in page and "21.6 ms" in page and "spread 0.4 ms" in page
    assert "runtime:wall_seconds</code>, time in s, lower is better" in page
    candidate = page_text(client, f"/searches/{search.search_id}/candidates/cand_001/")
    assert words in candidate and "21.6 ms vs 2.64 s" in candidate and "23.4, 23.1, 23.5 ms" in candidate
    assert "0.023405000000000002" not in re.sub(r'title="[^"]*"', "", candidate)  # only in the hover
    compare = page_text(client, f"/searches/{search.search_id}/compare/?c=baseline&c=cand_001")
    assert words in compare and "23.4, 23.1, 23.5 ms" in compare
    report = client.get(f"/api/searches/{search.search_id}/run").json()
    shown = next(c for c in report["candidates"] if c["candidate_id"] == "cand_001")
    assert shown["figures"]["score"] == words and shown["figures"]["value"] == "21.6 ms"
    assert shown["figure"] == "0.00818× [0.00791, 0.00887]"  # the old field stays
    assert report["metric_unit"]["unit"] == "s" and report["metric_unit"]["direction"] == "minimize"
    assert report["best"]["text"] == f"{words} · 21.6 ms vs 2.64 s"


@pytest.mark.django_db(transaction=True)
def test_cost_and_tokens_columns_show_only_once_a_command_writer_spent_something(
        personas, repository):  # noqa: F811
    search = timed_search(personas, repository)
    client = login(personas.member)
    page = page_text(client, f"/searches/{search.search_id}/")
    head = re.search(r"<thead>.*?</thead>", page, re.S).group(0)
    assert "Cost" not in head and "Tokens" not in head and "Score" in head
    rows = re.findall(r'<tr id="candidate-row-[^"]*".*?</tr>', page, re.S)
    columns = len(re.findall(r"<th[ >]", head))
    assert rows and all(row.count("<td") == columns for row in rows)  # the rows match the header
    compare = page_text(client, f"/searches/{search.search_id}/compare/?c=cand_001&c=cand_002")
    assert ">Cost<" not in compare and ">Tokens<" not in compare
    Candidate.objects.filter(search=search, number=1).update(cost_microusd=1200, tokens=340)
    page = page_text(client, f"/searches/{search.search_id}/")
    head = re.search(r"<thead>.*?</thead>", page, re.S).group(0)
    assert "Cost" in head and "Tokens" in head
    rows = re.findall(r'<tr id="candidate-row-[^"]*".*?</tr>', page, re.S)
    assert all(row.count("<td") == len(re.findall(r"<th[ >]", head)) for row in rows)


def funnel_counts(client, search) -> list[str]:
    page = page_text(client, f"/searches/{search.search_id}/")
    return re.findall(r'<span class="funnel-count">([^<]*)</span>', page)


def fates(search, fates_by_number: dict[int, tuple[str, int]]) -> None:
    for number, (state, reached) in fates_by_number.items():
        Candidate.objects.filter(search=search, number=number).update(state=state, round_reached=reached)


@pytest.mark.django_db(transaction=True)
def test_the_round_bars_count_every_candidate_that_fell_in_each_round(personas, repository):  # noqa: F811
    search = timed_search(personas, repository, population=12, rounds=[12, 5, 1])
    client = login(personas.member)
    # Round 0: 5 writers failed and 1 patch was not admitted (before any gate), 1 failed its gates;
    # 5 went on to round 1, which runs.
    eliminated, not_admitted = Candidate.State.ELIMINATED, Candidate.State.NOT_ADMITTED
    alive = Candidate.State.ALIVE
    fates(search, {**{n: (eliminated, -1) for n in range(1, 6)}, 6: (not_admitted, -1), 7: (eliminated, 0),
                   **{n: (alive, 1) for n in range(8, 13)}})
    SearchRun.objects.filter(search=search).update(round_index=1)
    assert funnel_counts(client, search) == ["12 → 5 · 7 fell", "5 → …", "planned 1"]
    # Round 1 closes with one going on; it wins the last round.
    fates(search, {**{n: (eliminated, 1) for n in range(8, 12)}, 12: (Candidate.State.WINNER, 2)})
    SearchRun.objects.filter(search=search).update(
        round_index=2, phase=SearchRun.Phase.DONE, status=SearchRun.Status.FINISHED, outcome=SearchRun.WINNER,
        winner=Candidate.objects.get(search=search, number=12))
    assert funnel_counts(client, search) == ["12 → 5 · 7 fell", "5 → 1 · 4 fell", "1 → 1 winner"]
    # NONE: the last one fell too (its replay, say).
    fates(search, {12: (eliminated, 2)})
    SearchRun.objects.filter(search=search).update(outcome=SearchRun.NONE, winner=None)
    assert funnel_counts(client, search) == ["12 → 5 · 7 fell", "5 → 1 · 4 fell", "1 → 0 · 1 fell"]
    # NONE in round 0: the later rounds were never reached.
    fates(search, {n: (eliminated, 0) for n in range(8, 13)})
    SearchRun.objects.filter(search=search).update(round_index=0)
    assert funnel_counts(client, search) == ["12 → 0 · 12 fell", "not reached", "not reached"]
