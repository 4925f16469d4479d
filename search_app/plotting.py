"""Axes for the server-drawn plots: which scale, where the ticks go, how their labels read.

Pure functions of the values, so the choice is testable without a page: a score axis turns
logarithmic once its positive values span more than `LOG_SPAN` times (one outlier then no
longer squashes the rest into a line), and every axis gets round-numbered ticks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

LOG_SPAN = 10  # highest / lowest above which a score axis is logarithmic
LINEAR_TICKS = 5  # about this many ticks on a linear axis
MAX_LOG_TICKS = 7


@dataclass(frozen=True)
class Axis:
    """Values `low`..`high` drawn from pixel `start` to pixel `end` (end < start for a y axis)."""

    low: float
    high: float
    start: float
    end: float
    log: bool
    ticks: tuple[tuple[float, str], ...]

    def at(self, value: float) -> float:
        """The pixel position of `value` (clamped to the axis, so nothing is drawn off the plot)."""
        if self.log:
            value = max(value, self.low) if value > 0 else self.low
            low, high = math.log10(self.low), math.log10(self.high)
            share = (math.log10(value) - low) / (high - low)
        else:
            share = (value - self.low) / (self.high - self.low)
        share = min(1.0, max(0.0, share))
        return round(self.start + share * (self.end - self.start), 1)

    def tick_positions(self) -> list[dict[str, object]]:
        return [{"value": value, "text": text, "at": self.at(value)} for value, text in self.ticks]


def wants_log(values: Iterable[float]) -> bool:
    """A log scale when every value is positive and the highest is over `LOG_SPAN` times the lowest."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    return bool(values) and min(values) > 0 and max(values) / min(values) > LOG_SPAN


def number_text(value: float, step: float | None = None) -> str:
    """A tick label: as many decimals as the tick step needs (0.25, 1,500, 0.0004); without a
    step (a log axis's 1-2-5 marks), whole numbers with separators and 3 digits below one."""
    if value == 0:
        return "0"
    if step:
        return f"{value:,.{max(0, -math.floor(math.log10(step) + 1e-9))}f}"
    if 1 <= abs(value) < 1e6:
        return f"{value:,.0f}" if value == int(value) else f"{value:,.3g}"
    return f"{value:.3g}".replace("e-0", "e-").replace("e+0", "e").replace("e+", "e")


def dollars_text(value: float, step: float | None = None) -> str:
    """A cost tick label in dollars: $0, $0.0005, $1.25, $1,200."""
    return "$" + number_text(value, step)


def _nice_step(span: float, count: int) -> float:
    raw = span / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * power * (1 + 1e-9):
            return factor * power
    return 10 * power


def linear_axis(values: Iterable[float], start: float, end: float,
                label: Callable[[float, float | None], str] = number_text, *, whole: bool = False) -> Axis:
    """A linear axis over the values, widened to round tick values at both ends (`whole`: counts,
    so ticks fall on whole numbers)."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    if low == high:  # one value: a band around it, so the point sits mid-axis
        spread = 1.0 if whole else abs(low) * 0.1 or 1.0
        low, high = low - spread, high + spread
    else:  # a little room at both ends, so no point sits on the axis line (none below 0 if none was)
        margin = (high - low) * 0.04
        low, high = (low - margin if low < 0 or low - margin >= 0 else 0.0), high + margin
    step = _nice_step(high - low, LINEAR_TICKS)
    if whole and step != int(step):  # below 1, or 2.5
        step = max(1.0, math.floor(step))
    first, last = math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9)
    ticks = tuple((round(i * step, 12), label(round(i * step, 12), step)) for i in range(first, last + 1))
    return Axis(ticks[0][0], ticks[-1][0], start, end, False, ticks)


def log_axis(values: Iterable[float], start: float, end: float,
             label: Callable[[float, float | None], str] = number_text) -> Axis:
    """A log axis from the decade below the lowest value to the decade above the highest;
    ticks at each power of ten (every few when there are many), and at 2 and 5 within a short span."""
    values = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    low_power = math.floor(math.log10(min(values)) + 1e-9)
    high_power = math.ceil(math.log10(max(values)) - 1e-9)
    high_power = max(high_power, low_power + 1)
    decades = high_power - low_power
    every = max(1, math.ceil(decades / (MAX_LOG_TICKS - 1)))
    marks = [10.0 ** p for p in range(low_power, high_power + 1, every)]
    if decades <= 2:
        marks = sorted(m * f for m in marks for f in (1, 2, 5) if m * f <= 10.0 ** high_power)
    ticks = tuple((m, label(m, None)) for m in marks)
    return Axis(10.0 ** low_power, 10.0 ** high_power, start, end, True, ticks)


def score_axis(values: Iterable[float], start: float, end: float) -> Axis:
    """The score axis: logarithmic when the values call for it (`wants_log`), linear otherwise."""
    values = list(values)
    return log_axis(values, start, end) if wants_log(values) else linear_axis(values, start, end)
