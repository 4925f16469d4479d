"""The Celery app: broker and options come from Django settings (CELERY_*)."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from celery import Celery
from celery.exceptions import SecurityWarning

from crucible.config import load_or_exit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crucible.settings")
# Workers started directly (`celery -A crucible worker`) report bad settings in one line too.
load_or_exit()

# Celery warns about every worker that runs as root. Crucible's worker may be root on purpose:
# it runs candidate code only through the sandbox, which drops to CRUCIBLE_SANDBOX_UID; so the
# worker checks that itself when it is ready (runtime_app.hooks.root_worker_check) and warns only if
# it does not hold.
warnings.filterwarnings("ignore", message="You're running the worker with superuser privileges",
                        category=SecurityWarning)

app = Celery("crucible")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

logger = logging.getLogger(__name__)


class RoutineTaskFilter(logging.Filter):
    """Moves Celery's "sending due task", "received" and "succeeded" lines of routine periodic
    tasks (heartbeat, reconcile) from INFO to DEBUG, so an idle server's log stays quiet;
    their warnings and errors pass as they are."""

    def __init__(self, tasks: Iterable[str] = ()) -> None:
        super().__init__()
        self.tasks = frozenset(tasks)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not self._routine(record.args):
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)

    def _routine(self, args: Any) -> bool:
        if isinstance(args, Mapping):  # the worker's lines: {"name": task name, "id": …}
            return args.get("name") in self.tasks
        # beat's line: ("Sending due task %s (%s)", entry name, task name)
        return isinstance(args, tuple) and any(arg in self.tasks for arg in args if isinstance(arg, str))
