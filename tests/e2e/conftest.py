"""Browser fixtures: Debian's Chromium driven by Playwright against a Daphne subprocess."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.helpers import CHROMIUM_ARGS, WAIT_MS
from tests.helpers import CHROMIUM, service_missing


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
