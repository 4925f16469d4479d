"""Celery tasks of a search: ids in, services called. The DB holds every state."""

from __future__ import annotations

import os
import socket

from celery import shared_task

from search_app import selectors, services


@shared_task(name="search_app.tasks.search_drive")
def search_drive(search_pk: int) -> None:
    """Decide what the search does next and hand its ready steps to workers."""
    services.search_drive_started(search_pk)
    for step_pk in services.steps_enqueue_mark(services.search_advance(search_pk)):
        step_run.delay(step_pk)


@shared_task(name="search_app.tasks.step_run")
def step_run(step_pk: int) -> None:
    services.step_execute(step_pk, owner=f"celery@{socket.gethostname()}:{os.getpid()}")
    search_pk = selectors.step_search_pk(step_pk)
    # One pending drive per search: it plans for every completion committed before it starts.
    if search_pk is not None and services.search_drive_request(search_pk):
        search_drive.delay(search_pk)


@shared_task(name="search_app.tasks.steps_reconcile")
def steps_reconcile() -> None:
    """Beat: take back steps whose worker died, and drive every running search again."""
    for search_pk in services.steps_reconcile():
        search_drive.delay(search_pk)
