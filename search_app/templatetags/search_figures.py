"""How a candidate's figure reads on a page: a paired ratio with its interval, or the value."""

from __future__ import annotations

from typing import Any

from django import template

from runtime_app.metrics import REPORTED_LABEL, RUNTIME_PREFIX
from search_app.measurement import figure_text

register = template.Library()


def _paired(candidate: Any) -> bool:
    # A paired figure is a ratio to the baseline, unlike the median value kept beside it.
    return candidate.score_absolute is not None and candidate.score != candidate.score_absolute


@register.filter
def figure(candidate: Any) -> str:
    """`0.41× [0.38, 0.44]` for a paired ratio, the median value otherwise; "" with no score."""
    if candidate.score is None:
        return ""
    return figure_text(candidate.score, candidate.score_low, candidate.score_high, paired=_paired(candidate))


@register.filter
def measured(candidate: Any) -> str:
    """The median value behind a paired figure ("" when the figure is that value)."""
    return f"{candidate.score_absolute:g}" if _paired(candidate) else ""


@register.filter
def metric_source(metric: str) -> str:
    """Who measures a metric, in the words every page uses."""
    if str(metric).startswith(RUNTIME_PREFIX):
        return "measured by the runtime, from outside the score command"
    return REPORTED_LABEL
