"""The one status of an evolution run, in the words searches use (runtime_app/status.py):

running (queued / cycle N of M), awaiting approval (cycle N holds a change for review),
finished (converged / N cycles), failed (why), cancelled (why). `run_status` is pure: give it the
number of cycles recorded when known (`run_statuses` reads them for many runs in one query)."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import Count

from evolve_app.models import Cycle, EvolutionRun
from runtime_app.status import Status, StatusWord, status_make

RunStatus = EvolutionRun.Status


def run_status(run: EvolutionRun, cycles_done: int | None = None) -> Status:
    """An evolution run's status; `cycles_done` is how many cycles it has recorded (None: unknown)."""
    planned = run.cycles_planned
    if run.status == RunStatus.QUEUED:
        detail = "queued" if not cycles_done else f"queued for cycle {cycles_done + 1} of {planned}"
        return status_make(StatusWord.RUNNING, detail)
    if run.status == RunStatus.RUNNING:
        detail = f"cycle {cycles_done + 1} of {planned}" if cycles_done is not None else f"{planned} cycles"
        return status_make(StatusWord.RUNNING, detail)
    if run.status == RunStatus.AWAITING_REVIEW:
        detail = (f"cycle {cycles_done} holds a change for review" if cycles_done
                  else "a cycle holds a change for review")
        return status_make(StatusWord.AWAITING_APPROVAL, detail)
    if run.status == RunStatus.FAILED:
        return status_make(StatusWord.FAILED, run.reason or "no reason recorded")
    if run.status == RunStatus.CANCELLED:
        return status_make(StatusWord.CANCELLED, run.reason)
    if run.converged:
        after = f" after {cycles_done} cycles" if cycles_done else ""
        return status_make(StatusWord.FINISHED, f"converged{after}")
    return status_make(StatusWord.FINISHED, f"{cycles_done} of {planned} cycles" if cycles_done is not None
                       else f"{planned} cycles")


def run_statuses(runs: Iterable[EvolutionRun]) -> dict[int, Status]:
    """{run pk: Status}: one query for the cycle counts of all of them."""
    runs = list(runs)
    counts = dict(Cycle.objects.filter(run__in=runs).values_list("run").annotate(n=Count("pk"))
                  .values_list("run", "n"))
    return {run.pk: run_status(run, counts.get(run.pk, 0)) for run in runs}


def run_status_of(run: EvolutionRun) -> Status:
    return run_statuses([run])[run.pk]


def last_run_statuses(agents: Iterable[object]) -> dict[int, Status]:
    """{run pk: Status} of the agents' last runs (rows annotated with `last_run_id`): two queries."""
    ids = [run_id for run_id in (getattr(agent, "last_run_id", None) for agent in agents) if run_id]
    return run_statuses(EvolutionRun.objects.in_bulk(ids).values()) if ids else {}
