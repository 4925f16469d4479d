"""Every main page fits a phone (390 px) and a desktop (1,400 px): nothing overflows the document
sideways, and no column squeezed to a sliver stretches a page to tens of thousands of pixels.

Screenshots of each page at both widths land in var/screenshots/layout-*.png.
"""

from __future__ import annotations

import pytest

from evolve_app.services import demo_agent_create
from search_app.services import spec_create
from tests.e2e.test_dashboard_flow import log_in, shot
from tests.search_app.conftest import data_dir, finished  # noqa: F401 (fixtures)
from tests.search_app.runs import spec_text

pytestmark = pytest.mark.integration
WIDTHS = {"phone": (390, 844), "desktop": (1400, 900)}
# The home page was 34,499 px tall at 390 px when the event log wrapped a letter a line; the longest
# page here (a candidate with its receipts) stays well under this at either width.
MAX_HEIGHT = 12_000


@pytest.fixture
def layout_pages(personas, finished, data_dir):  # noqa: F811 (fixtures)
    """The main pages of a project with a finished search, a saved spec and an agent."""
    search, winner, _ = finished
    spec = spec_create(personas.owner, personas.alpha, "Make answer() bigger",
                       spec_text(population=2, rounds=[2, 1]))
    agent = demo_agent_create(personas.owner, personas.alpha)
    return {
        "home": "/",
        "project": f"/projects/{personas.alpha.pk}/",
        "search-list": "/searches/",
        "search": f"/searches/{search.search_id}/",
        "candidate": f"/searches/{search.search_id}/candidates/{winner.candidate_id}/",
        "agent-list": "/agents/",
        "agent": f"/agents/{agent.pk}/",
        "spec-editor": f"/searches/specs/{spec.pk}/",
        "account": "/account/",
    }


def page_box(page) -> dict[str, int]:
    return page.evaluate("""() => ({
        scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth,
        height: document.documentElement.scrollHeight})""")


def test_every_main_page_fits_a_phone_and_a_desktop_without_sideways_scrolling(layout_pages, browser_page):
    page = browser_page
    log_in(page, "owner")
    problems = []
    for width_name, (width, height) in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": height})
        for name, url in layout_pages.items():
            response = page.goto(url)
            assert response is not None and response.ok, f"{name} {url}: {response and response.status}"
            page.wait_for_load_state("load")
            shot(page, f"layout-{width_name}-{name}")
            box = page_box(page)
            if box["scrollWidth"] > box["innerWidth"]:
                problems.append(f"{name} at {width} px: {box['scrollWidth']} px wide")
            if box["height"] > MAX_HEIGHT:
                problems.append(f"{name} at {width} px: {box['height']} px tall")
    assert problems == []


def test_the_navigation_stays_inside_a_phone_screen(layout_pages, browser_page):
    page = browser_page
    log_in(page, "owner")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(layout_pages["home"])
    # Every link of the top bar is on screen, none cut off past the right edge.
    edges = page.evaluate("""() => [...document.querySelectorAll('.topbar a, .topbar button')]
        .map(el => el.getBoundingClientRect()).map(r => [r.left, r.right])""")
    assert edges and all(left >= 0 and right <= 390 for left, right in edges), edges


def test_the_browser_finds_the_favicon_from_the_link_and_at_favicon_ico(layout_pages, browser_page):
    page = browser_page
    log_in(page, "owner")
    icon = page.locator("link[rel=icon]").get_attribute("href")
    for url in (icon, "/favicon.ico"):
        response = page.request.get(url)
        assert response.ok and response.headers["content-type"].startswith("image/svg+xml"), url
