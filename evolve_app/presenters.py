"""How evolve_app's pages show what the selectors read: a run's progress, its score curve as SVG
geometry, and run states as people read them. No queries here: the callers hand in the rows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

from django.utils import timezone

from evolve_app.models import Cycle, EvolutionRun
from runtime_app.clock import clock_text
from runtime_app.status import Status


class LastRunRow(Protocol):
    """An agent row annotated with its last run's status (selectors.agent_list_rows), to be labelled."""

    last_run_status: str | None
    last_run_label: str
    last_run_tone: str


def last_run_labels_set(agents: Iterable[LastRunRow], statuses: Mapping[int, Status] | None = None) -> None:
    """Each agent's `last_run_label`: its last run's status as people read it, from `statuses`
    ({run pk: Status}, evolve_app/status.py) when given ("awaiting approval (cycle 2 holds …)")."""
    labels: dict[str | None, str] = dict(EvolutionRun.Status.choices)
    for agent in agents:
        found = (statuses or {}).get(getattr(agent, "last_run_id", None) or 0)
        agent.last_run_label = found.label if found is not None else labels.get(
            agent.last_run_status, agent.last_run_status or "")
        agent.last_run_tone = found.tone if found is not None else ""


def run_progress(run: EvolutionRun, cycles: list[Cycle], now: datetime | None = None) -> dict[str, Any]:
    """How far the run is, counted one way everywhere: `done` cycles recorded of `planned`;
    `elapsed` since it was queued (till it finished); for an active run an `eta` from the mean
    time per recorded cycle (an upper bound: a run may converge sooner), or why there is none."""
    now = now or timezone.now()
    done, planned = len(cycles), run.cycles_planned
    remaining = max(planned - done, 0)
    elapsed = ((run.finished_at or now) - run.created_at).total_seconds()
    progress = {"done": done, "planned": planned, "remaining": remaining,
                "elapsed": clock_text(elapsed), "elapsed_seconds": elapsed, "eta": "", "eta_note": ""}
    if run.status == EvolutionRun.Status.AWAITING_REVIEW:
        progress["eta_note"] = "paused until an approver decides"
    elif run.status in (EvolutionRun.Status.QUEUED, EvolutionRun.Status.RUNNING) and remaining:
        if done:
            # Cycles are recorded as they end, so the last one's time covers every cycle so far.
            per_cycle = (cycles[-1].created_at - run.created_at).total_seconds() / done
            progress["eta"] = clock_text(per_cycle * remaining)
            progress["eta_note"] = f"at most, at {clock_text(per_cycle)} a cycle"
        else:
            progress["eta_note"] = "after the first cycle"
    return progress


def score_curve(cycles: list[Cycle], width: int = 960, height: int = 380) -> dict[str, Any]:
    """Train and holdout scores over the run's cycles as SVG coordinates: `train` and `holdout`
    (the holdout score going into each cycle) as polylines, `after` as the mutations' holdout
    scores. Scores in [0, 1] keep that range, so runs look alike."""
    pad = 48
    series: dict[str, list[tuple[int, float]]] = {"train": [], "holdout": [], "after": []}
    for cycle in cycles:
        for key, value in (("train", cycle.score), ("holdout", cycle.holdout_score),
                           ("after", cycle.holdout_after)):
            if value is not None:
                series[key].append((cycle.number, float(value)))
    values = [v for points in series.values() for _, v in points]
    if not values:
        return {"empty": True, "width": width, "height": height}
    numbers = [cycle.number for cycle in cycles]
    x_low, x_high = min(numbers), max(numbers)
    y_low, y_high = (0.0, 1.0) if min(values) >= 0 and max(values) <= 1 else (min(values), max(values))
    x_span, y_span = (x_high - x_low) or 1, (y_high - y_low) or 1

    def sx(number: int) -> float:
        if x_high == x_low:
            return round(width / 2, 1)
        return round(pad + (number - x_low) / x_span * (width - 2 * pad), 1)

    def sy(value: float) -> float:
        return round(height - pad - (value - y_low) / y_span * (height - 2 * pad), 1)

    shaped = {key: [{"number": n, "value": v, "x": sx(n), "y": sy(v)} for n, v in points]
              for key, points in series.items()}
    return {
        "empty": False, "width": width, "height": height, "pad": pad,
        "x_low": x_low, "x_high": x_high, "y_low": y_low, "y_high": y_high,
        "axis_y": height - pad, "axis_x_end": width - pad,
        # Five levels with grid lines, so a score can be read off the curve.
        "levels": [{"value": level, "y": sy(level)}
                   for level in (y_low + y_span * step / 4 for step in range(5))],
        # At most about 15 cycle numbers on the axis, the last always among them.
        "ticks": [{"number": n, "x": sx(n)}
                  for index, n in enumerate(numbers)
                  if index % -(-len(numbers) // 15) == 0 or index == len(numbers) - 1],
        **{f"{key}_points": points for key, points in shaped.items()},
        **{f"{key}_line": " ".join(f"{p['x']},{p['y']}" for p in points) for key, points in shaped.items()},
    }
