"""How the best candidate's change from the baseline reads: a percentage while it is modest, a
factor ("5,000x faster") once the ratio leaves 0.5–2."""

from __future__ import annotations

import html

import pytest

from search_app import services
from search_app.models import Candidate
from search_app.templatetags.search_figures import change_text
from tests.helpers import login
from tests.search_app.runs import spec_text
from tests.search_app.test_search_list import repository  # noqa: F401 (a fixture)


def test_a_modest_change_reads_as_a_percentage():
    assert change_text(11, 10) == "+10.0%"
    assert change_text(7.5, 10) == "−25.0%"
    assert change_text(10, 10) == "±0.0%"


def test_the_percentage_holds_from_half_to_twice_the_baseline():
    assert change_text(4, 2) == "+100.0%"
    assert change_text(1, 2) == "−50.0%"


def test_a_time_metric_a_five_thousandth_of_the_baseline_reads_as_five_thousand_times_faster():
    assert change_text(0.0002, 1.0, "runtime:wall_seconds") == "5,000x faster"
    assert change_text(0.45, 712, "latency_ms") == "1,582x faster"
    assert change_text(3.5, 1.0, "runtime:cpu_seconds") == "3.5x slower"


def test_other_metrics_read_as_lower_or_higher():
    assert change_text(0.0002, 1.0, "value") == "5,000x lower"
    assert change_text(25, 10, "tests_passed") == "2.5x higher"
    assert change_text(0.01, 4.0, "runtime:max_rss_kib") == "400x lower"  # memory, not time


def test_no_baseline_zero_or_a_sign_change_reads_as_a_percentage_or_nothing():
    assert change_text(5, 0) == ""
    assert change_text(float("inf"), 2) == ""
    assert change_text(-30, 10) == "−400.0%"  # no factor across zero


@pytest.mark.django_db(transaction=True)
def test_the_searches_list_says_how_many_times_faster_the_best_candidate_is(personas, repository):  # noqa: F811
    text = spec_text(population=2, rounds=[2, 1], name="timed")
    text = text.replace('direction = "maximize"', 'direction = "minimize"')
    text = text.replace('metric = "value"', 'metric = "wall_seconds"')
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository=repository)
    services.search_start(personas.owner, search, enqueue=False)
    Candidate.objects.filter(search=search, number=0).update(score=1.0)
    Candidate.objects.filter(search=search, number=1).update(score=0.0002)
    page = html.unescape(login(personas.member).get("/searches/").content.decode())
    assert "0.0002 vs 1 (5,000x faster)" in page and "−100.0%" not in page
