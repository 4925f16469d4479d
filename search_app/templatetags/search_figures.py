"""How a candidate's figure reads on a page: a paired ratio in the metric's words with its
interval ("122× faster (113–126×)"), or its value in its unit ("23.4 ms"); see search_app/figures.py."""

from __future__ import annotations

from typing import Any

from django import template

from runtime_app.metrics import RUNTIME_PREFIX
from runtime_app.metrics import metric_source as source_words
from search_app import figures
from search_app.figures import candidate_figures, paired_figure, search_metric
from search_app.measurement import figure_text

register = template.Library()


@register.filter
def figure(candidate: Any, search: Any = None) -> str:
    """"122× faster (113–126×)" for a paired ratio, the median in its unit otherwise ("23.4 ms");
    "" with no score. Without the search (its metric), the bare figure: `0.41× [0.38, 0.44]`."""
    if candidate.score is None:
        return ""
    if search is None:
        return figure_text(candidate.score, candidate.score_low, candidate.score_high,
                           paired=paired_figure(candidate))
    return str(candidate_figures(candidate, search)["score"])


@register.filter
def measured(candidate: Any, search: Any = None) -> str:
    """The median value behind a paired figure, in its unit ("" when the figure is that value)."""
    if not paired_figure(candidate):
        return ""
    if search is None:
        return f"{candidate.score_absolute:g}"
    return figures.quantity(candidate.score_absolute, search_metric(search), candidate.spread)


@register.filter
def spread(candidate: Any, search: Any) -> str:
    """"spread 0.4 ms": max − min of its latest round's trials, in the unit of its median."""
    value = candidate.score_absolute if candidate.score_absolute is not None else candidate.score
    return figures.spread_text(candidate.spread, search_metric(search), value)


@register.filter
def trials(candidate: Any, search: Any) -> list[tuple[str, str]]:
    """Its trials per round (round, text), each round in one unit at the precision its spread
    justifies: ("0", "21.4, 21.6, 21.8 ms")."""
    return list(candidate_figures(candidate, search)["trials"].items())


@register.filter
def metric_label(search: Any) -> str:
    """`runtime:wall_seconds (time in s, lower is better)`."""
    return search_metric(search).label


@register.filter
def metric_source(score: Any) -> str:
    """Who measures a score (a `[score]` section, as a mapping or a ScoreSpec, or only its metric),
    in the words every page uses."""
    if isinstance(score, str):
        metric, reported = score, None
    elif isinstance(score, dict):
        metric, reported = score.get("metric", ""), score.get("reported")
    else:
        metric, reported = getattr(score, "metric", ""), getattr(score, "reported", None)
    if str(metric).startswith(RUNTIME_PREFIX):
        return "measured by the runtime, from outside the score command"
    return source_words(str(metric), reported)
