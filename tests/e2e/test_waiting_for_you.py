""""Waiting for you" in two real browsers: two approvers of a project see the same winner to
approve on their home page; one approves it from their list, and the other's list drops it without
a reload (the home page's socket, runtime_app/waiting.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from runtime_app import access
from runtime_app.models import ProjectMembership
from tests.e2e.helpers import WAIT_MS
from tests.e2e.test_dashboard_flow import log_in
from tests.helpers import make_user
from tests.search_app.fixtures import data_dir  # noqa: F401 (fixture)
from tests.search_app.test_waiting import winner_in

pytestmark = pytest.mark.integration
LOADED_MS = 30_000


@pytest.fixture
def second_page(browser_page: Any, daphne_server: str) -> Iterator[Any]:
    """Another person's page: a second context (own cookies) of the same Chromium."""
    context = browser_page.context.browser.new_context(base_url=daphne_server)
    try:
        page = context.new_page()
        page.set_default_timeout(LOADED_MS)
        yield page
    finally:
        context.close()


@pytest.fixture
def awaiting(personas, approver, tmp_path, data_dir):  # noqa: F811 (fixture)
    """A winner of project alpha awaiting approval, and a second approver, bea."""
    bea = make_user("bea")
    ProjectMembership.objects.create(project=personas.alpha, user=bea, role=access.APPROVER)
    search, winner = winner_in(personas.alpha, personas.owner, tmp_path, "repo")
    return search, winner


def test_an_approval_given_by_one_approver_leaves_the_others_list_live(awaiting, browser_page, second_page):
    search, winner = awaiting
    a, b = browser_page, second_page
    a.set_default_timeout(LOADED_MS)
    approve = f"Approve cand_002 of {search.name}"
    for page, username in ((a, "approver"), (b, "bea")):
        log_in(page, username)
        page.goto("/")
        expect(page.locator("#waiting-for-you .waiting-approve")).to_contain_text(approve)
    a.wait_for_selector("section.live.connected")
    a.evaluate("window.crucibleSameDocument = true")

    # B acts from their own list: the item opens the decision, bound to the patch it shows.
    b.click(f"#waiting-for-you a:text('{approve}')")
    expect(b.locator("#confirm-patch-hash")).to_have_text(winner.patch_sha256)
    b.check("input[name=decision][value=approve]")
    with b.expect_navigation():
        b.click("#confirm-decision")
    expect(b.locator("#winner-status")).to_have_text("approved")

    # A's home page, never reloaded, drops the approval and offers the merge instead.
    expect(a.locator("#waiting-for-you .waiting-approve")).to_have_count(0, timeout=WAIT_MS * 3)
    expect(a.locator("#waiting-for-you .waiting-merge")).to_contain_text(f"Merge cand_002 of {search.name}")
    expect(a.locator("#waiting-for-you .waiting-merge")).to_contain_text("approved (1 of 1 approval")
    assert a.evaluate("window.crucibleSameDocument") is True
