"""Celery tasks of evolve_app: they only call services."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="evolve_app.tasks.evolution_run")
def evolution_run(run_pk: int) -> None:
    from evolve_app.services import evolution_run_execute

    evolution_run_execute(run_pk)
