"""Browser fixtures: Debian's Chromium driven by Playwright against a Daphne subprocess."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection

from tests.conftest import CHROMIUM, service_missing

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


@pytest.fixture
def browser_page(daphne_server: str) -> Iterator[Any]:
    """A fresh Chromium page (own context, so no cookies) aimed at the Daphne server.

    Function-scoped on purpose: Playwright's sync API leaves its event loop set on this
    thread while it lives, and Django refuses ORM calls from a thread with a running loop.
    Ask for data fixtures (personas) before this one, so they are made first; later ORM
    calls go through in_worker_thread.
    """
    if not CHROMIUM.exists():
        service_missing(f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            context = browser.new_context(base_url=daphne_server)
            context.set_default_timeout(WAIT_MS)
            page = context.new_page()
            yield page
            context.close()
        finally:
            browser.close()


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
