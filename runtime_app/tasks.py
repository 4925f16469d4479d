"""Celery tasks: ids in, services called, nothing else."""

import socket

from celery import shared_task

from runtime_app import notifications, services


@shared_task(name="runtime_app.tasks.worker_heartbeat")
def worker_heartbeat() -> None:
    services.worker_heartbeat_record(socket.gethostname())


@shared_task(name="runtime_app.tasks.project_ping_reply")
def project_ping_reply(ping_event_id: int) -> None:
    services.project_ping_answer(ping_event_id, socket.gethostname())


@shared_task(name="runtime_app.tasks.webhook_deliver")
def webhook_deliver(delivery_id: int) -> None:
    notifications.webhook_delivery_attempt(delivery_id)


@shared_task(name="runtime_app.tasks.webhook_deliveries_reconcile")
def webhook_deliveries_reconcile() -> None:
    """Deliveries whose retry is due, or whose worker died mid-attempt, go out again."""
    for delivery_id in notifications.webhook_deliveries_due():
        webhook_deliver.delay(delivery_id)
