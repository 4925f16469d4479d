"""Celery tasks: ids in, services called, nothing else."""

import socket

from celery import shared_task

from runtime_app import services


@shared_task(name="runtime_app.tasks.worker_heartbeat")
def worker_heartbeat() -> None:
    services.worker_heartbeat_record(socket.gethostname())


@shared_task(name="runtime_app.tasks.project_ping_reply")
def project_ping_reply(ping_event_id: int) -> None:
    services.project_ping_answer(ping_event_id, socket.gethostname())
