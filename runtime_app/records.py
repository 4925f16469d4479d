"""The records every part of the runtime writes: events (with their live nudge), audit entries and
receipts. Lower than services (which re-export them), so keys, notifications and the sandbox's
callers write them without importing services."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth.models import User
from django.db import connection, transaction

from runtime_app.models import AuditEntry, Event, Project, Receipt

logger = logging.getLogger(__name__)

# An arbitrary fixed key: PostgreSQL serialises event inserts on it (see event_emit).
EVENT_LOCK_KEY = 7_220_431


def event_group(project_id: int) -> str:
    """The channel-layer group nudged when an event of this project commits."""
    return f"events.project.{project_id}"


def _event_nudge(project_id: int) -> None:
    try:
        async_to_sync(get_channel_layer().group_send)(
            event_group(project_id), {"type": "events.nudge"}
        )
    except Exception:  # live pages still poll the DB, so a lost nudge only delays
        logger.warning("could not nudge %s", event_group(project_id), exc_info=True)


def event_emit(
    project: Project | int,
    subject_type: str,
    subject_id: int,
    kind: str,
    payload: dict[str, Any] | None = None,
) -> Event:
    """Append an event inside the caller's transaction; nudge watchers once it commits.

    Ids must become visible in order, or a watcher that has seen id 10 would skip an id 9
    that commits later. SQLite has one writer at a time; on PostgreSQL a transaction-level
    advisory lock gives the same order, so keep event-emitting transactions short.
    """
    project_id = project if isinstance(project, int) else project.pk
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [EVENT_LOCK_KEY])
        event = Event.objects.create(
            project_id=project_id,
            subject_type=subject_type,
            subject_id=subject_id,
            kind=kind,
            payload=payload or {},
        )
    transaction.on_commit(lambda: _event_nudge(project_id))
    return event


def audit_record(
    actor: User | None,
    action: str,
    *,
    project: Project | None = None,
    target: str = "",
    detail: dict[str, Any] | None = None,
) -> AuditEntry:
    return AuditEntry.objects.create(
        actor=actor if actor is not None and actor.is_authenticated else None,
        actor_name=actor.get_username() if actor is not None else "system",
        action=action,
        project=project,
        target=target[:200],
        detail=detail or {},
    )


def receipt_record(
    receipt: Receipt, *, project: Project | None = None, subject: tuple[str, int] | None = None,
    label: str = "", pending: ReceiptBatch | None = None,
) -> Receipt:
    """Write a receipt once, attached to its project and subject (e.g. ("candidate", 7)); with
    `pending`, attach it now and write it when the batch is (its pk is None until then)."""
    if receipt.pk is not None:
        raise ValueError("this receipt is already written")
    receipt.project = project
    if subject is not None:
        receipt.subject_type, receipt.subject_id = subject
    receipt.label = label[:200]
    if pending is not None:
        pending.add(receipt)
    else:
        receipt.save()
    return receipt


class ReceiptBatch:
    """The receipts of one batch of work (a measurement block's trials; an apply and the gate
    after it), written together in one transaction by `write`, which callers call in a
    `finally` so they are written whatever the step does next. A command's live tail stays
    until its receipt exists, unless `tails_wait` is False: then it goes when the command ends
    (a block's finished trial must not look like it is still running while the next one runs)."""

    def __init__(self, *, tails_wait: bool = True) -> None:
        self.receipts: list[Receipt] = []
        self.tails: list[Any] = []
        self.tails_wait = tails_wait

    def add(self, receipt: Receipt) -> None:
        self.receipts.append(receipt)

    def tail_keep(self, tail: Any) -> None:
        self.tails.append(tail)

    def write(self) -> None:
        """Write every receipt not yet written, in one transaction, then drop their tails."""
        waiting, self.receipts = [receipt for receipt in self.receipts if receipt.pk is None], []
        try:
            if waiting:
                with transaction.atomic():  # one commit for the batch, not one per receipt
                    for receipt in waiting:
                        receipt.save()
        finally:
            tails, self.tails = self.tails, []
            for tail in tails:
                tail.close()
