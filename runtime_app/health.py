"""Health of the parts Crucible needs: database, broker, channel layer, workers."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.utils import timezone

from crucible.celery import app as celery_app
from runtime_app.models import WorkerHeartbeat

# A worker whose beat (every 10 s) is older than this is reported as missing.
WORKER_STALE_AFTER = timedelta(seconds=45)


def _check(probe) -> dict[str, Any]:
    try:
        return {"ok": True, **(probe() or {})}
    except Exception as error:  # health reports every failure, it never raises
        return {"ok": False, "error": f"{type(error).__name__}: {error}"[:300]}


def _database() -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {"vendor": connection.vendor}


def _broker() -> dict[str, Any]:
    with celery_app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)
        transport = conn.transport_cls
    return {"transport": str(transport)}


def _channel_layer() -> dict[str, Any]:
    layer = get_channel_layer()

    async def round_trip() -> None:
        channel = await layer.new_channel(prefix="health")
        await layer.send(channel, {"type": "health.ping"})
        await asyncio.wait_for(layer.receive(channel), timeout=2)

    async_to_sync(round_trip)()
    return {"backend": type(layer).__name__}


def _workers() -> dict[str, Any]:
    cutoff = timezone.now() - WORKER_STALE_AFTER
    alive = list(
        WorkerHeartbeat.objects.filter(last_seen_at__gte=cutoff).values_list("hostname", flat=True)
    )
    if not alive:
        raise RuntimeError("no worker has reported in the last 45 seconds")
    return {"alive": alive}


def health_status() -> dict[str, Any]:
    checks = {
        "database": _check(_database),
        "broker": _check(_broker),
        "channel_layer": _check(_channel_layer),
        "workers": _check(_workers),
    }
    return {
        "ok": all(check["ok"] for check in checks.values()),
        "mode": "distributed" if getattr(settings, "CELERY_BROKER_URL", "").startswith("redis")
        else "embedded",
        "checks": checks,
    }
