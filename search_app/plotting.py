"""Axes for the server-drawn plots: which scale, where the ticks go, how their labels read.

Pure functions of the values, so the choice is testable without a page: a score axis turns
logarithmic once its positive values span more than `LOG_SPAN` times (one outlier then no
longer squashes the rest into a line), and every axis gets round-numbered ticks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from runtime_app.prices import usd_text
from search_app import figures
from search_app.measurement import figure_text, is_paired

LOG_SPAN = 10  # highest / lowest above which a score axis is logarithmic
LINEAR_TICKS = 5  # about this many ticks on a linear axis
MAX_LOG_TICKS = 7
PLOT_MAX_POINTS = 250
# The plot's frame inside its SVG: the y title above, its tick labels on the left, the x tick
# labels and title below.
PLOT_MARGIN = {"left": 66, "right": 30, "top": 30, "bottom": 52}
# One scored candidate as `selectors.score_points` reads it: candidate_id, number, score,
# cost_microusd, diff_lines, state, spread, score_low, score_high, score_absolute.
ScorePoint = tuple[str, int, float, int, int | None, str, float | None, float | None, float | None,
                   float | None]


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


def score_plot(points: Sequence[ScorePoint], score_spec: dict[str, Any], contract: int,
               width: int = 640, height: int = 300) -> dict[str, Any]:
    """Scored candidates as points of score against cost in dollars (or diff lines when nothing was
    spent), with the Pareto front (better score, lower cost) and the baseline's score; SVG
    coordinates, axes with round ticks, a log score axis when scores span over 10x. `score_spec`
    is the spec's `score` table, `contract` the search's."""
    baseline = next((p for p in points if p[1] == 0), None)
    scored = [p for p in points if p[1] > 0]
    if not scored:
        return {"points": [], "front": "", "width": width, "height": height}
    maximize = score_spec.get("direction", "minimize") == "maximize"
    paired = is_paired(contract, score_spec.get("comparison", "paired"), baseline[5] if baseline else "")
    by_cost = any(p[3] for p in scored)
    xs = [(p[3] / 1_000_000 if by_cost else (p[4] or 0)) for p in scored]
    ys = [p[2] for p in scored] + ([baseline[2]] if baseline else [])
    left, right = PLOT_MARGIN["left"], width - PLOT_MARGIN["right"]
    top, bottom = PLOT_MARGIN["top"], height - PLOT_MARGIN["bottom"]
    if by_cost:
        x_axis = linear_axis(xs, left, right, dollars_text)
    else:
        x_axis = linear_axis(xs, left, right, whole=True)
    y_axis = score_axis(ys, bottom, top)

    unit = figures.metric_of(score_spec.get("metric"), score_spec.get("reported"),
                             score_spec.get("direction"))

    def words(score: float, low: float | None, high: float | None, ratio: bool,
              spread: float | None) -> str:
        # as the candidate table says it: "122× faster (113–126×)", or the value in its unit
        moved = figures.change(score, unit, low, high) if ratio else None
        if moved is not None:
            return moved.text
        return figure_text(score, low, high, paired=True) if ratio else figures.quantity(score, unit, spread)

    shown: list[dict[str, Any]] = []
    for (candidate_id, _, score, cost, diff_lines, state, spread, low, high, absolute), x in zip(
            scored, xs, strict=True):
        # as the candidate table reads it: a ratio when it differs from the median value kept beside it
        ratio = absolute is not None and score != absolute
        shown.append({"id": candidate_id, "score": score, "ratio": ratio,
                      "figure": words(score, low, high, ratio, spread), "cost": cost,
                      "cost_text": usd_text(cost), "diff_lines": diff_lines, "state": state, "spread": spread,
                      "x": x, "cx": x_axis.at(x), "cy": y_axis.at(score)})
    # The front: walking from the cheapest, each point whose score beats every cheaper one.
    front: list[dict[str, Any]] = []
    best: float | None = None
    for point in sorted(shown, key=lambda p: (p["x"], -p["score"] if maximize else p["score"])):
        if best is None or (point["score"] > best if maximize else point["score"] < best):
            front.append(point)
            best = point["score"]
            point["on_front"] = True
    # A plot keeps its cost flat at any population: the front plus the best-scored, up to a cap.
    if len(shown) > PLOT_MAX_POINTS:
        rest = sorted((p for p in shown if not p.get("on_front")), key=lambda p: p["score"], reverse=maximize)
        shown = front + rest[:max(0, PLOT_MAX_POINTS - len(front))]
    metric = str(score_spec.get("metric") or "score")
    y_label = "score (× baseline)" if paired else f"score ({metric})"
    return {
        "points": shown, "total": len(scored), "front": " ".join(f"{p['cx']},{p['cy']}" for p in front),
        "baseline_y": y_axis.at(baseline[2]) if baseline else None,
        "baseline_score": baseline[2] if baseline else None,
        "baseline_text": (figure_text(baseline[2], None, None, paired=True) if paired
                          else figures.quantity(baseline[2], unit, baseline[6])) if baseline else "",
        "x_label": "cost (USD)" if by_cost else "diff lines",
        "x_title": "cost in dollars" if by_cost else "diff lines (nothing was spent)",
        "y_title": y_label + (", log scale" if y_axis.log else ""), "log": y_axis.log,
        "x_ticks": x_axis.tick_positions(), "y_ticks": y_axis.tick_positions(),
        "width": width, "height": height, "left": left, "right": right, "top": top, "bottom": bottom,
        "x_title_x": round((left + right) / 2), "x_title_y": height - 8,
        "direction": "higher is better" if maximize else "lower is better",
    }
