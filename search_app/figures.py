"""How a figure reads, everywhere it is shown (pages, API, CLI): one pure module, no Django.

A score is a metric (the spec's `score.metric`, with what `score.reported` says it measures) in a
direction (`minimize` or `maximize`). Each value is shown in its unit, scaled to read (s, ms, µs;
B, KiB, MiB, GiB) and rounded to the precision its trials' spread justifies: 0.023405000000000002 s
with a spread of 0.0004 s reads "23.4 ms". A candidate against the baseline reads as one factor
with its confidence interval, in words that fit the metric: "122× faster (113–126×)" for time,
"3.1× smaller" for memory, "1.12× higher" for any other figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from search_app.measurement import figure_text

RUNTIME_PREFIX = "runtime:"
# One unit of each metric in seconds (time) or bytes (memory).
RUNTIME_UNITS = {"runtime:wall_seconds": ("time", 1.0), "runtime:cpu_seconds": ("time", 1.0),
                 "runtime:max_rss_kib": ("memory", 1024.0)}
REPORTED_UNITS = {"time_s": ("time", 1.0), "time_ms": ("time", 1e-3), "time_us": ("time", 1e-6),
                  "time_ns": ("time", 1e-9), "memory_kib": ("memory", 1024.0),
                  "memory_bytes": ("memory", 1.0)}
# A metric named before `score.reported` existed: its unit guessed from how its name ends.
NAME_SUFFIXES = (("_seconds", "time", 1.0), ("_ms", "time", 1e-3), ("_us", "time", 1e-6),
                 ("_ns", "time", 1e-9), ("_s", "time", 1.0), ("_kib", "memory", 1024.0),
                 ("_bytes", "memory", 1.0))
TIME_WORDS = ("second", "time", "latency", "duration", "elapsed")
TIME_SCALES = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))
MEMORY_SCALES = ((1024.0 ** 3, "GiB"), (1024.0 ** 2, "MiB"), (1024.0, "KiB"), (1.0, "B"))
# Words for a factor below and above 1 (the candidate's value over the baseline's).
WORDS = {"time": ("faster", "slower"), "memory": ("smaller", "larger"), "other": ("lower", "higher")}
KIND_WORDS = {"time": "time", "memory": "memory", "other": "value"}
DEFAULT_DIGITS = 3  # significant digits when no spread says more or less
MIN_DIGITS, MAX_DIGITS = 2, 6


@dataclass(frozen=True)
class Metric:
    """What a score measures: its name, kind (time, memory or other), what one unit of it is in
    seconds or bytes (None: unknown, the value is shown as it is) and which way is better."""

    name: str
    kind: str
    scale: float | None
    direction: str

    @property
    def unit(self) -> str:
        """The unit a raw value of the metric is in: "s", "ms", "KiB"… ("" for other figures)."""
        if self.scale is None:
            return ""
        scales = TIME_SCALES if self.kind == "time" else MEMORY_SCALES
        return next((shown for size, shown in scales if math.isclose(size, self.scale)), "")

    @property
    def kind_word(self) -> str:
        return KIND_WORDS[self.kind]

    @property
    def better(self) -> str:
        return "lower is better" if self.direction == "minimize" else "higher is better"

    @property
    def label(self) -> str:
        """`runtime:wall_seconds (time in s, lower is better)`: beside every table of its figures."""
        unit = f" in {self.unit}" if self.unit else ""
        return f"{self.name} ({KIND_WORDS[self.kind]}{unit}, {self.better})"

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "unit": self.unit, "direction": self.direction,
                "better": self.better, "label": self.label}


def metric_of(name: str | None, reported: str | None = None, direction: str | None = None) -> Metric:
    """The metric a spec's `[score]` names (`reported` says what a self-reported figure measures)."""
    name = str(name or "")
    direction = "maximize" if direction == "maximize" else "minimize"
    if name in RUNTIME_UNITS:
        kind, scale = RUNTIME_UNITS[name]
        return Metric(name, kind, scale, direction)
    if reported in REPORTED_UNITS:
        kind, scale = REPORTED_UNITS[reported]
        return Metric(name, kind, scale, direction)
    if reported == "other":
        return Metric(name, "other", None, direction)
    bare = name.lower().removeprefix(RUNTIME_PREFIX)
    for suffix, kind, scale in NAME_SUFFIXES:
        if bare.endswith(suffix):
            return Metric(name, kind, scale, direction)
    if any(word in bare for word in TIME_WORDS):
        return Metric(name, "time", None, direction)
    return Metric(name, "other", None, direction)


def _finite(value: float | None) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


def digits_for(value: float, spread: float | None = None) -> int:
    """Significant digits of `value` its spread justifies: the last one shown is the spread's
    first (0.023405 with a spread of 0.0004: 3, "0.0234"); DEFAULT_DIGITS without a spread."""
    if not _finite(value) or value == 0 or not _finite(spread) or not spread:
        return DEFAULT_DIGITS
    digits = math.floor(math.log10(abs(value))) - math.floor(math.log10(abs(spread))) + 1
    return max(MIN_DIGITS, min(MAX_DIGITS, digits))


def number_text(value: float, digits: int = DEFAULT_DIGITS, *, trim: bool = False) -> str:
    """`value` to `digits` significant digits, never in exponent form, thousands separated:
    23.4, 0.0234, 2,640, 1,582; `trim`: without trailing zeros (digits no spread vouches for)."""
    if not _finite(value):
        return str(value)
    if value == 0:
        return "0"
    exponent = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - exponent)
    rounded = round(value, decimals)
    if rounded and math.floor(math.log10(abs(rounded))) > exponent and decimals:  # 9.96 → 10.0, not 10.00
        decimals -= 1
    text = f"{rounded:,.{decimals}f}"
    if trim and "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text.strip("-0.,") == "" else text


def _scaled(value: float, metric: Metric) -> tuple[float, str]:
    """The factor and unit that make `value` (in the metric's unit) read best."""
    if metric.scale is None or metric.kind == "other":
        return 1.0, ""
    base = abs(value) * metric.scale
    scales = TIME_SCALES if metric.kind == "time" else MEMORY_SCALES
    for size, shown in scales:
        if base >= size:
            return metric.scale / size, shown
    size, shown = scales[-1]
    return metric.scale / size, shown


def quantity(value: float | None, metric: Metric, spread: float | None = None, *,
             reference: float | None = None) -> str:
    """A value of the metric with its unit, scaled and rounded to what `spread` justifies:
    "23.4 ms", "2.64 s", "1.5 MiB", "0.88". `reference` picks the unit (to share one among
    several values). "—" for no value."""
    if value is None:
        return "—"
    if not _finite(value):
        return str(value)
    factor, unit = _scaled(reference if _finite(reference) and reference else value, metric)
    text = number_text(value * factor, digits_for(value, spread), trim=not spread)
    return f"{text} {unit}" if unit else text


def spread_text(spread: float | None, metric: Metric, reference: float | None = None) -> str:
    """A spread (max − min of the trials) in the unit of the value it goes with: "± 0.2 ms" is
    half of it either side; shown to one or two digits, as noise is."""
    if not _finite(spread) or not spread:
        return ""
    assert spread is not None
    factor, unit = _scaled(reference if _finite(reference) and reference else spread, metric)
    scaled = spread * factor
    text = number_text(scaled, 2 if f"{abs(scaled):e}".startswith("1") else 1)  # 0.15, but 0.4
    return f"spread {text} {unit}".rstrip()


def trials_text(values: Sequence[float], metric: Metric) -> str:
    """One round's trials in one unit, each to the precision their spread justifies:
    "21.4, 21.6, 21.8 ms"."""
    numbers = [v for v in values if _finite(v)]
    if not numbers:
        return "—"
    spread = max(numbers) - min(numbers)
    middle = sorted(numbers)[len(numbers) // 2]
    factor, unit = _scaled(middle, metric)
    digits = digits_for(middle, spread)
    texts = [number_text(v * factor, digits, trim=not spread) if _finite(v) else str(v) for v in values]
    return ", ".join(texts) + (f" {unit}" if unit else "")


def factor_text(factor: float) -> str:
    """A factor: "1.05×", "12.3×", "122×", "1,582×"."""
    if not _finite(factor):
        return f"{factor}×"
    return f"{factor:,.0f}×" if factor >= 100 else f"{number_text(factor, 3, trim=True)}×"


@dataclass(frozen=True)
class Change:
    """A value against the baseline's: the factor (≥ 1) in the metric's words, its interval in
    the same words, and whether it is better (None: the interval holds the baseline)."""

    factor: float
    word: str
    low: float | None
    high: float | None
    better: bool | None
    text: str

    def as_dict(self) -> dict[str, object]:
        return {"factor": self.factor, "word": self.word, "low": self.low, "high": self.high,
                "better": self.better, "text": self.text}


def change(ratio: float | None, metric: Metric, low: float | None = None, high: float | None = None
           ) -> Change | None:
    """How a candidate compares with the baseline, from `ratio` (its value over the baseline's,
    with the ratio's interval `low`–`high` when known): "122× faster (113–126×)". None when no
    ratio can be read (missing, zero, negative, not finite)."""
    if not _finite(ratio) or ratio is None or ratio <= 0:
        return None
    down, up = WORDS[metric.kind]
    wanted_lower = metric.direction == "minimize"
    interval = _finite(low) and _finite(high) and low is not None and high is not None and 0 < low <= high
    if ratio == 1 and not interval:
        return Change(1.0, "same as", None, None, None, "same as the baseline")
    lower = ratio < 1
    factor, word = (1 / ratio, down) if lower else (ratio, up)
    text = f"{factor_text(factor)} {word}"
    shown_low = shown_high = None
    better: bool | None = lower == wanted_lower if ratio != 1 else None
    if interval:
        assert low is not None and high is not None
        shown_low, shown_high = (1 / high, 1 / low) if lower else (low, high)
        if low != high:
            text += f" ({factor_text(shown_low).removesuffix('×')}–{factor_text(shown_high)})"
        # an interval that holds the baseline is neither clearly better nor clearly worse
        better = None if low <= 1 <= high else (high < 1) == wanted_lower
    return Change(factor, word, shown_low, shown_high, better, text)


def difference(value: float, baseline: float, metric: Metric) -> str:
    """Where a ratio says nothing (a zero or a sign change): how far apart, "3.2 higher"."""
    gap = value - baseline
    if gap == 0:
        return "same as the baseline"
    down, up = WORDS[metric.kind]
    return f"{quantity(abs(gap), metric)} {down if gap < 0 else up}"


def versus(value: float | None, baseline: float | None, metric: Metric, *, ratio: float | None = None,
           low: float | None = None, high: float | None = None, spread: float | None = None,
           baseline_spread: float | None = None) -> dict[str, object] | None:
    """A candidate (or the best) against the baseline, as one line: "122× faster (113–126×) ·
    21.6 ms vs 2.64 s", with `ratio`/`low`/`high` a paired ratio's interval (else the values'
    own ratio) and the parts apart (`change`, `values`, `better`). None without a value."""
    if value is None and ratio is None:
        return None
    values = ""
    if value is not None:
        values = quantity(value, metric, spread)
        if baseline is not None:
            values += f" vs {quantity(baseline, metric, baseline_spread)}"
    if ratio is None and _finite(value) and _finite(baseline) and baseline and value is not None \
            and baseline is not None and value / baseline > 0:
        ratio = value / baseline
    moved = change(ratio, metric, low, high)
    words = moved.text if moved else ""
    if moved is None and _finite(value) and _finite(baseline) and value is not None and baseline is not None:
        words = difference(value, baseline, metric)
    better = moved.better if moved else None
    if moved is None and value is not None and baseline is not None and value != baseline:
        better = (value < baseline) == (metric.direction == "minimize")
    text = " · ".join(part for part in (words, values) if part)
    return {"text": text, "change": words, "values": values, "better": better,
            "verdict": "same" if better is None else "better" if better else "worse",
            "detail": moved.as_dict() if moved else None}


# --- a candidate's figures (any object with a Candidate's fields, a search with its spec) ----------

def paired_figure(candidate: Any) -> bool:
    """Whether a candidate's figure is a paired ratio to the baseline (not the median value kept
    beside it)."""
    return candidate.score_absolute is not None and candidate.score != candidate.score_absolute


def search_metric(search: Any) -> Metric:
    """The metric a search's scores are in (its frozen `[score]`), read once per search object."""
    metric = getattr(search, "_figures_metric", None)
    if metric is None:
        score = (getattr(search, "spec_normalized", None) or {}).get("score") or {}
        metric = metric_of(score.get("metric"), score.get("reported"), score.get("direction"))
        search._figures_metric = metric
    return metric


def candidate_figures(candidate: Any, search: Any) -> dict[str, Any]:
    """A candidate's figures as every page, the API and the CLI show them: `score` ("122× faster
    (113–126×)" for a paired ratio, else its median "21.6 ms"), `value` (the median in its unit),
    `spread` ("spread 0.4 ms"), `trials` per round, and the change's parts (`change`)."""
    metric = search_metric(search)
    value = candidate.score_absolute if candidate.score_absolute is not None else candidate.score
    shown: dict[str, Any] = {"score": "", "value": quantity(value, metric, candidate.spread)
                             if value is not None else "",
                             "spread": spread_text(candidate.spread, metric, value),
                             "change": None, "better": None,
                             "trials": {str(key): trials_text(values, metric)
                                        for key, values in (candidate.trials or {}).items() if values}}
    if candidate.score is None:
        return shown
    if paired_figure(candidate) and candidate.number:
        moved = change(candidate.score, metric, candidate.score_low, candidate.score_high)
        shown.update(score=moved.text if moved else figure_text(candidate.score, candidate.score_low,
                                                                 candidate.score_high, paired=True),
                     change=moved.as_dict() if moved else None, better=moved.better if moved else None)
    else:
        shown["score"] = shown["value"]
    return shown
