"""Celery tasks of a search: ids in, services called. The DB holds every state."""

from __future__ import annotations

import os
import socket

from celery import shared_task

from search_app import selectors, services

# Steps one step_run task runs back to back before it hands the next one to the broker, so a
# search with work ready cannot keep a worker slot from other searches for long.
CHAIN_STEPS = 16


def _plan(search_pk: int) -> list[int]:
    """Plan the search and mark its ready steps as handed over; their ids."""
    services.search_drive_started(search_pk)
    return services.steps_enqueue_mark(services.search_advance(search_pk))


@shared_task(name="search_app.tasks.search_drive")
def search_drive(search_pk: int) -> None:
    """Decide what the search does next and hand its ready steps to workers."""
    for step_pk in _plan(search_pk):
        step_run.delay(step_pk)


@shared_task(name="search_app.tasks.step_run")
def step_run(step_pk: int) -> None:
    """Run a step, then plan its search here rather than through a queued drive, and run the next
    ready step in this task: a completion costs no broker round trip (two, before)."""
    owner = f"celery@{socket.gethostname()}:{os.getpid()}"
    for _ in range(CHAIN_STEPS):
        services.step_execute(step_pk, owner=owner)
        search_pk = selectors.step_search_pk(step_pk)
        # One planner at a time per search: it plans for every completion committed before it starts.
        if search_pk is None or not services.search_drive_request(search_pk):
            return
        ready = _plan(search_pk)
        if not ready:
            return
        step_pk = ready[0]
        for other in ready[1:]:
            step_run.delay(other)
    step_run.delay(step_pk)  # the chain's turn is over: the next step waits in the queue like others'


@shared_task(name="search_app.tasks.steps_reconcile")
def steps_reconcile() -> None:
    """Beat: take back steps whose worker died, and drive every running search again."""
    for search_pk in services.steps_reconcile():
        search_drive.delay(search_pk)
