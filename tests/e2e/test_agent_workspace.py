"""An agent's workspace in a phone's browser: two tags chosen on the agent page give their diff in
the search pages' viewer, and a changed file opens at the tag it changed in."""

from __future__ import annotations

import pytest

from evolve_app.services import demo_agent_create, evolution_run_execute, evolution_run_start
from tests.e2e.test_dashboard_flow import log_in, shot
from tests.e2e.test_layout import page_box
from tests.search_app.fixtures import data_dir  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration


@pytest.fixture
def evolved_agent(personas, data_dir):  # noqa: F811 (a fixture)
    """The demo agent after two cycles: evo-0, pre-evo-1, evo-1, pre-evo-2, evo-2."""
    agent = demo_agent_create(personas.owner, personas.alpha)
    run = evolution_run_execute(evolution_run_start(personas.owner, agent, cycles=2, enqueue=False).pk)
    assert run.status == "finished", run.reason
    return agent


def test_a_phone_compares_two_chosen_tags_and_opens_a_changed_file(evolved_agent, browser_page):
    page = browser_page
    log_in(page, "member")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"/agents/{evolved_agent.pk}/")
    page.select_option("#compare_base", "evo-0")
    page.select_option("#compare_head", "evo-2")
    page.click("#compare button[type=submit]")
    page.wait_for_selector(".diff-rendered .d2h-file-wrapper")
    assert page.url.endswith("/compare/?base=evo-0&head=evo-2#diff")
    names = page.locator(".diff-rendered .d2h-file-name").all_text_contents()
    assert any("skills/string-transforms/SKILL.md" in name for name in names), names
    assert page.locator(".diff-rendered .d2h-ins").count() > 0
    box = page_box(page)
    wide = page.evaluate("""() => [...document.querySelectorAll('body *')]
        .filter(e => !e.closest('.d2h-files-diff, .d2h-file-diff') && e.getBoundingClientRect().right > 391)
        .map(e => e.tagName + '.' + e.className)""")  # what sticks out, outside the diff's own scroll
    assert box["scrollWidth"] <= box["innerWidth"], (box, wide)
    shot(page, "agent-compare-phone")
    page.click(".compare-files a:has-text('skills/string-transforms/SKILL.md')")
    page.wait_for_selector("table.file-text")
    assert "ref=evo-2" in page.url and page.locator("h1").text_content().strip() == "Files at evo-2"
    assert page.locator("table.file-text td.line-text").first.text_content() == "---"
    box = page_box(page)
    assert box["scrollWidth"] <= box["innerWidth"], box
    shot(page, "agent-file-phone")
