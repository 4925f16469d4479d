"""One writer of the SQLite concurrency test: writes like the web server or the worker does.

Run as `python sqlite_writer.py ROLE PROJECT_ID SECONDS START_AT` with the environment
from tests.helpers.subprocess_env(); ROLE is "web" or "worker". It writes until SECONDS
after the wall-clock time START_AT (so both writers begin together), keeps going after an
error, and prints one JSON line: {"role", "events", "errors"}. It exits 1 if any write
failed.
"""

from __future__ import annotations

import json
import os
import sys
import time

import django


def main(role: str, project_id: int, seconds: float, start_at: float) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crucible.settings")
    django.setup()
    from django.db import transaction

    from runtime_app import services
    from runtime_app.models import AuditEntry, Event, WorkerHeartbeat

    time.sleep(max(0.0, start_at - time.time()))
    deadline = time.monotonic() + seconds
    events, errors, round_number = 0, [], 0
    while time.monotonic() < deadline:
        round_number += 1
        try:
            with transaction.atomic():
                # Read then write in one transaction, as services do.
                last = Event.objects.filter(project_id=project_id).order_by("-id").first()
                services.event_emit(
                    project_id, "project", project_id, f"test.{role}",
                    {"round": round_number, "after": last.pk if last else None},
                )
                if role == "web":
                    services.audit_record(
                        None, "test.write", target=f"{role} round {round_number}"
                    )
            events += 1
            if role == "worker":
                services.worker_heartbeat_record(f"sqlite-writer-{os.getpid()}")
            # Reads between writes, as pages and the driver do.
            Event.objects.filter(project_id=project_id, id__gt=max(0, events - 20)).count()
            list(AuditEntry.objects.order_by("-id")[:5])
            WorkerHeartbeat.objects.count()
        except Exception as error:  # counted and reported: the test asserts there are none
            errors.append(f"{type(error).__name__}: {error}")
    print(json.dumps({"role": role, "events": events, "errors": errors[:50],
                      "error_count": len(errors)}))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])))
