"""The score-vs-cost plot: when its score axis turns logarithmic, its ticks and their labels, the
hover details and the funnel beside it."""

from __future__ import annotations

import html
import re

import pytest

from search_app import plotting
from search_app.models import Candidate
from search_app.presenters import score_plot
from search_app.selectors import search_funnel
from tests.helpers import login


def test_scores_within_ten_times_of_each_other_stay_on_a_linear_axis():
    assert not plotting.wants_log([1, 4.5])
    assert not plotting.wants_log([0.5, 5])  # exactly 10x is not over it
    assert not plotting.score_axis([1, 4.5], 250, 10).log


def test_scores_spanning_over_ten_times_get_a_log_axis_with_powers_of_ten():
    axis = plotting.score_axis([0.41, 0.62, 712], 250, 10)
    assert axis.log
    assert [text for _, text in axis.ticks] == ["0.1", "1", "10", "100", "1,000"]


def test_one_outlier_no_longer_squashes_the_other_scores_into_a_line():
    scores = [0.41, 0.62, 712]
    linear = plotting.linear_axis(scores, 250, 10)
    log = plotting.score_axis(scores, 250, 10)
    squashed, apart = abs(linear.at(0.41) - linear.at(0.62)), abs(log.at(0.41) - log.at(0.62))
    assert squashed < 1  # the bug: under a pixel apart
    assert apart > 10 and apart > 100 * squashed


def test_zero_or_negative_scores_never_get_a_log_axis():
    assert not plotting.wants_log([0, 5, 500])
    assert not plotting.wants_log([-3, 50])
    assert not plotting.score_axis([0, 5, 500], 250, 10).log


def test_a_short_log_span_has_ticks_at_one_two_and_five():
    axis = plotting.log_axis([0.3, 8], 250, 10)
    assert [value for value, _ in axis.ticks] == [0.1, 0.2, 0.5, 1, 2, 5, 10]


def test_a_linear_axis_has_round_ticks_around_every_value():
    axis = plotting.linear_axis([1, 4.5], 250, 10)
    assert [text for _, text in axis.ticks] == ["0", "1", "2", "3", "4", "5"]
    assert axis.at(axis.low) == 250 and axis.at(axis.high) == 10


def test_costs_are_labelled_in_dollars_with_the_digits_their_step_needs():
    axis = plotting.linear_axis([0.00015, 0.0018, 0.0052], 66, 610, plotting.dollars_text)
    assert [text for _, text in axis.ticks] == ["$0", "$0.002", "$0.004", "$0.006"]
    axis = plotting.linear_axis([12, 1250], 66, 610, plotting.dollars_text)
    assert [text for _, text in axis.ticks] == ["$0", "$500", "$1,000", "$1,500"]


def test_diff_lines_are_ticked_on_whole_numbers():
    axis = plotting.linear_axis([2, 2], 66, 610, whole=True)
    assert [value for value, _ in axis.ticks] == [1, 2, 3]
    axis = plotting.linear_axis([1, 9], 66, 610, whole=True)
    assert all(value == int(value) for value, _ in axis.ticks)


@pytest.mark.django_db(transaction=True)
def test_the_search_page_plots_costs_in_dollars_on_a_log_axis_with_hover_details(finished, personas):
    search, winner, _ = finished
    Candidate.objects.filter(search=search, number__gt=0).update(cost_microusd=1800)
    for number, (score, cost) in enumerate([(0.41, 1200), (0.62, 400), (712, 300)], start=3):
        Candidate.objects.create(search=search, candidate_id=f"cand_{number:03d}", number=number, batch=0,
                                 state="eliminated", round_reached=0, score=score, cost_microusd=cost,
                                 diff_lines=4)

    plot = score_plot(search)
    assert plot["log"] and plot["y_title"].endswith("log scale") and plot["x_title"] == "cost in dollars"
    assert [tick["text"] for tick in plot["x_ticks"]][:2] == ["$0", "$0.0005"]
    page = html.unescape(login(personas.member).get(f"/searches/{search.search_id}/").content.decode())
    figure = re.search(r'<figure class="score-plot" id="score-plot".*?</figure>', page, re.S).group(0)
    assert "log scale: the scores span over 10x" in figure
    assert f"<title>{winner.candidate_id} (winner): 4.5× higher, cost $0.0018, 2 diff lines</title>" in figure
    assert "<title>cand_005 (eliminated): 712, cost $0.0003, 4 diff lines</title>" in figure
    assert ">$0.0010</text>" in figure and ">1,000</text>" in figure


@pytest.mark.django_db(transaction=True)
def test_the_funnel_puts_each_count_beside_its_bar_and_fills_what_was_evaluated(finished, personas):
    search, _, _ = finished
    funnel = search_funnel(search)
    assert [(s["round"], s["planned"], s["evaluated"], s["done"]) for s in funnel["rounds"]] == [
        (0, 2, 2, 100), (1, 1, 1, 100)]
    page = login(personas.member).get(f"/searches/{search.search_id}/").content.decode()
    row = re.search(r'<ol class="funnel">.*?</li>', page, re.S).group(0)
    assert '<span class="funnel-count">2 → 1 · 1 fell</span>' in row and "funnel-bar" in row
    assert re.search(r'class="funnel-bar"[^>]*><span class="funnel-fill"[^>]*></span></span>', row)
