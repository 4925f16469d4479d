"""Queue a Celery task by its registered name.

Services queue work this way so that they never import the tasks modules that call them: tasks
import services, services import nothing back, and no import cycle is needed to send a message.
"""

from __future__ import annotations

from typing import Any

from celery import current_app


def task_send(name: str, *args: Any, countdown: float | None = None) -> None:
    """Send task `name` (e.g. "search_app.tasks.search_drive") with `args`, after `countdown` seconds."""
    task = current_app.tasks.get(name)
    if task is not None:
        task.apply_async(args, countdown=countdown)
    else:  # a process that has not imported the tasks modules still sends the same message
        current_app.send_task(name, args=args, countdown=countdown)
