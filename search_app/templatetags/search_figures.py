"""How a candidate's figure reads on a page: a paired ratio with its interval, or the value; and
how far the best candidate moved from the baseline: a percentage, or a factor once it is large."""

from __future__ import annotations

import math
from typing import Any

from django import template

from runtime_app.metrics import RUNTIME_PREFIX
from runtime_app.metrics import metric_source as source_words
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


# Between these ratios (best / baseline) a change reads as a percentage, outside as a factor:
# "−99.98%" says less than "5,000x faster".
FACTOR_BELOW, FACTOR_ABOVE = 0.5, 2.0
# Metrics that measure time, once the runtime's prefix is off: lower is faster.
TIME_WORDS = ("second", "time", "latency", "duration", "elapsed")
TIME_SUFFIXES = ("_ms", "_us", "_ns", "_s")


def _times(metric: str) -> bool:
    name = str(metric or "").lower().removeprefix(RUNTIME_PREFIX)
    return any(word in name for word in TIME_WORDS) or name.endswith(TIME_SUFFIXES)


def _factor_text(factor: float) -> str:
    return f"{factor:,.0f}x" if factor >= 100 else f"{factor:.3g}x"


def change_text(value: float, baseline: float, metric: str = "") -> str:
    """How `value` compares with `baseline`: "+10.0%" or "−25.0%" while the ratio stays within
    0.5–2, else a factor: "5,000x faster" / "3.5x slower" for a time metric, "… lower" / "… higher"
    otherwise. "" when there is nothing to compare (no baseline, zero, not finite)."""
    if not (baseline and math.isfinite(baseline) and math.isfinite(value)):
        return ""
    ratio = value / baseline
    if value > 0 and baseline > 0 and not FACTOR_BELOW <= ratio <= FACTOR_ABOVE:
        lower = ratio < 1
        word = ("faster" if lower else "slower") if _times(metric) else ("lower" if lower else "higher")
        return f"{_factor_text(1 / ratio if lower else ratio)} {word}"
    change = (value - baseline) / abs(baseline) * 100
    return f"{'+' if change > 0 else '−' if change < 0 else '±'}{abs(change):.1f}%"

