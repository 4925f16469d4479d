"""The Celery app: broker and options come from Django settings (CELERY_*)."""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from celery import Celery
from celery.exceptions import SecurityWarning
from celery.signals import worker_ready

from crucible.config import load_or_exit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crucible.settings")
# Workers started directly (`celery -A crucible worker`) report bad settings in one line too.
load_or_exit()

# Celery warns about every worker that runs as root. Crucible's worker may be root on purpose:
# it runs candidate code only through the sandbox, which drops to CRUCIBLE_SANDBOX_UID; so the
# worker checks that itself when it is ready (root_worker_check) and warns only if it does not hold.
warnings.filterwarnings("ignore", message="You're running the worker with superuser privileges",
                        category=SecurityWarning)

app = Celery("crucible")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

logger = logging.getLogger(__name__)


@worker_ready.connect
def root_worker_check(**kwargs: Any) -> None:
    """A root worker is fine while commands run in bubblewrap as the unprivileged uid; say
    plainly when they would not."""
    if os.geteuid() != 0:
        return
    from runtime_app import sandbox  # here, not at the top: Django is set up only once the worker starts

    try:
        isolation = sandbox.isolation_choose()
    except sandbox.SandboxError as error:
        logger.warning("The worker runs as root and %s", error)
        return
    if isolation != sandbox.BUBBLEWRAP:
        _, reason = sandbox.bubblewrap_probe()
        logger.warning("The worker runs as root and commands run without bubblewrap (CRUCIBLE_SANDBOX=%s, "
                       "%s): candidate code would run as root. Install bubblewrap or run Crucible as "
                       "an unprivileged user (docs/sandbox.md).", sandbox.sandbox_mode(), reason)


# How often a worker host removes the evaluation trees it parked that no trial will take.
PARKED_TREES_SWEEP_SECONDS = 10.0


@worker_ready.connect
def parked_trees_sweeper_start(**kwargs: Any) -> None:
    """Each worker host sweeps its own parked evaluation trees (search_app.execution): the trials
    of a tree it parked may run on another host, and then nothing else would remove it."""
    threading.Thread(target=_parked_trees_sweep_forever, name="crucible-parked-trees", daemon=True).start()


def _parked_trees_sweep_forever() -> None:
    from django.db import connection

    from search_app.execution import parked_trees_sweep  # Django is set up once the worker starts

    while True:
        time.sleep(PARKED_TREES_SWEEP_SECONDS)
        try:
            parked_trees_sweep()
        except Exception:  # a sweep that fails leaves trees for the next one; the worker goes on
            logger.exception("could not sweep the parked evaluation trees")
        finally:
            connection.close()  # no database connection held between sweeps


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
