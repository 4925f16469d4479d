"""Plain helpers of the browser tests: Chromium flags, how long to wait, ORM calls off Playwright's thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Generous: a loaded CI machine may take a few seconds; passing tests never wait this long.
WAIT_MS = 10_000


def in_worker_thread(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run Django code on its own thread and connection, as a worker process would.

    The test thread cannot make ORM calls while Playwright's loop is set on it; a fresh
    thread has no loop, and its committed writes are what Daphne reads.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = function(*args, **kwargs)
        except BaseException as error:
            outcome["error"] = error
        finally:
            connection.close()

    thread = threading.Thread(target=run, name="crucible-test-worker")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
