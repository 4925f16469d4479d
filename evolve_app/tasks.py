"""Celery tasks of evolve_app: they only call services."""

from __future__ import annotations

from celery import shared_task

from evolve_app import services


@shared_task(name="evolve_app.tasks.evolution_run")
def evolution_run(run_pk: int) -> None:
    services.evolution_run_execute(run_pk)


@shared_task(name="evolve_app.tasks.evolution_runs_reconcile")
def evolution_runs_reconcile() -> None:
    """Beat: hand runs whose worker died, or whose message was lost, to a worker again."""
    for run_pk in services.evolution_runs_reconcile():
        evolution_run.delay(run_pk)
