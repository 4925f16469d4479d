"""Onboarding a teammate in real browsers (Daphne, Chromium), each person in their own context:
the owner invites an address and sees its link once, with a copy button that fills the clipboard,
and the pending list shows it with its expiry; the invitee opens the link, sets a password on
Crucible's own page and lands signed in in the project; the pending list no longer shows them;
a revoked link refuses with a page that says so.

Screenshots land in var/screenshots/invitation-<n>-<step>.png.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.test_dashboard_flow import log_in, shot

pytestmark = pytest.mark.integration

LOADED_MS = 30_000  # the machine may be loaded (and the real password hasher is slow): nothing is timed
TEAMMATE = "grace.hopper@example.org"
PASSWORD = "a-Long-new-pass-42"


def prepare(page: Any) -> Any:
    page.context.set_default_timeout(LOADED_MS)
    page.context.set_default_navigation_timeout(LOADED_MS)
    page.set_viewport_size({"width": 1400, "height": 900})
    return page


@pytest.fixture
def second_page(browser_page: Any, daphne_server: str) -> Iterator[Any]:
    """The invitee's page: a second context (own cookies, signed out) of the same Chromium."""
    context = browser_page.context.browser.new_context(base_url=daphne_server)
    try:
        yield prepare(context.new_page())
    finally:
        context.close()


def invite(page: Any, email: str, role: str) -> str:
    """Invite `email` from the members page; the link it shows once."""
    page.fill("#id_who", email)
    page.select_option("#id_role", role)
    page.get_by_role("button", name="Add member").click()
    expect(page.locator("#invitation-link")).to_contain_text(email)
    return page.locator("#invitation-url").inner_text().strip()


def test_an_invited_teammate_sets_a_password_on_crucibles_page_and_lands_in_the_project(
        personas, browser_page, second_page, daphne_server):
    owner, invitee = prepare(browser_page), second_page
    members = f"/projects/{personas.alpha.pk}/members/"
    owner.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=daphne_server)
    log_in(owner, "owner")
    owner.goto(members)
    link = invite(owner, TEAMMATE, "operator")
    assert "/invitations/" in link
    copy = owner.locator("#invitation-link button[data-copy]")
    expect(copy).to_have_text("Copy link")
    copy.click()
    expect(copy).to_have_text("Copied")
    assert owner.evaluate("navigator.clipboard.readText()") == link
    row = owner.locator("#invitations tr", has_text=TEAMMATE)
    expect(row).to_contain_text("operator")
    # Its expiry: a date a week ahead, and how long is left.
    expect(row.locator("time")).to_have_text(re.compile(r"^\d{4}-\d{2}-\d{2} "))
    expect(row).to_contain_text(re.compile(r"\(in 6\xa0days"))
    shot(owner, "invitation-1-link-shown-once")
    # Shown once: a reload lists the invitation but no longer shows its link.
    owner.reload()
    expect(owner.locator("#invitation-link")).to_have_count(0)
    expect(owner.locator("#invitations")).to_contain_text(TEAMMATE)

    invitee.goto(link)
    expect(invitee.locator("h1")).to_have_text("Join alpha on Crucible")
    expect(invitee.locator("body")).not_to_contain_text("Django")
    expect(invitee.locator("#invitation-username")).to_have_text("grace.hopper")
    shot(invitee, "invitation-2-set-password")
    invitee.fill("#id_new_password1", PASSWORD)
    invitee.fill("#id_new_password2", PASSWORD)
    invitee.get_by_role("button", name="Set password and join").click()
    invitee.wait_for_url(f"**/projects/{personas.alpha.pk}/")
    expect(invitee.locator(".messages")).to_contain_text("Welcome to alpha, grace.hopper")
    expect(invitee.locator(".topbar .account")).to_contain_text("grace.hopper")
    shot(invitee, "invitation-3-landed-in-the-project")

    owner.reload()
    expect(owner.locator("#pending-invitations")).to_contain_text("No pending invitations.")
    expect(owner.locator("#members")).to_contain_text("grace.hopper")

    # A revoked link refuses, in words.
    revoked = invite(owner, "ada@example.org", "viewer")
    owner.get_by_role("button", name="Revoke the invitation of ada@example.org").click()
    expect(owner.locator(".messages")).to_contain_text("Revoked the invitation of ada@example.org")
    response = invitee.goto(revoked)
    assert response is not None and response.status == 410
    expect(invitee.locator("h1")).to_have_text("This invitation link cannot be used")
    expect(invitee.locator("[role=alert]")).to_contain_text("was revoked")
    shot(invitee, "invitation-4-revoked-link")
