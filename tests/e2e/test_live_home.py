"""The home page's activity log updates live in a real browser, without a reload."""

from __future__ import annotations

import re

import pytest

from runtime_app.services import event_emit
from tests.e2e.helpers import WAIT_MS, in_worker_thread

pytestmark = pytest.mark.integration
HOME_URL = re.compile(r"^http://127\.0\.0\.1:\d+/$")


def log_in_as_owner(page, personas) -> None:
    """Open /, follow the redirect to the login form, log in, and land on home."""
    page.goto("/")
    page.wait_for_url("**/login/?next=/")
    page.fill("#id_username", personas.owner.get_username())
    page.fill("#id_password", "pw-owner")
    page.click("form button[type=submit]")
    page.wait_for_url(HOME_URL)
    page.wait_for_selector("h1:has-text('Welcome, owner')")
    # crucible.js marks the log connected once the socket is open and resume is sent.
    page.wait_for_selector("section.live.connected")


def watch_for_navigation(page) -> list[str]:
    """Record every main-frame navigation and mark the live document, so a reload shows."""
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: frame == page.main_frame and navigations.append(frame.url))
    page.evaluate("window.crucibleSameDocument = true")
    return navigations


def test_a_logged_in_user_sees_a_live_event_appear_on_the_home_page_without_reload(
    personas, browser_page
):
    page = browser_page
    log_in_as_owner(page, personas)
    home_url = page.url
    navigations = watch_for_navigation(page)

    in_worker_thread(
        event_emit, personas.alpha, "project", personas.alpha.pk, "test.live",
        {"message": "hello from the test"},
    )

    page.wait_for_selector("#event-log .event-message:text-is('hello from the test')", timeout=WAIT_MS)
    assert page.evaluate("window.crucibleSameDocument") is True
    assert navigations == []
    assert page.url == home_url
    assert "connected" in page.locator("section.live").get_attribute("class").split()


def test_an_event_from_another_users_project_never_reaches_the_home_page(personas, browser_page):
    page = browser_page
    log_in_as_owner(page, personas)

    in_worker_thread(
        event_emit, personas.beta, "project", personas.beta.pk, "test.live",
        {"message": "beta secret"},
    )
    # Events stream in id order, so once a later alpha event is shown the beta one has had
    # its chance to arrive: it must not be there.
    in_worker_thread(
        event_emit, personas.alpha, "project", personas.alpha.pk, "test.live",
        {"message": "alpha after beta"},
    )

    page.wait_for_selector("#event-log .event-message:text-is('alpha after beta')", timeout=WAIT_MS)
    assert "beta secret" not in page.locator("#event-log").inner_text()
    assert "beta secret" not in page.content()


def test_a_live_event_payload_is_shown_as_text_and_never_runs_as_script(personas, browser_page):
    page = browser_page
    log_in_as_owner(page, personas)
    hostile = '<script>window.pwned=1</script><img src="x" onerror="window.pwned=2">'

    in_worker_thread(
        event_emit, personas.alpha, "project", personas.alpha.pk, "test.live", {"message": hostile},
    )

    message = page.locator("#event-log .event-message", has_text="window.pwned=1")
    message.wait_for(timeout=WAIT_MS)
    assert message.inner_text() == hostile
    assert page.locator("#event-log script, #event-log img").count() == 0
    assert page.evaluate("typeof window.pwned") == "undefined"
