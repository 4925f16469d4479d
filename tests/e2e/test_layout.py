"""Every main page fits a phone (390 px) and a desktop (1,400 px): nothing overflows the document
sideways, and no column squeezed to a sliver stretches a page to tens of thousands of pixels.

Screenshots of each page at both widths land in var/screenshots/layout-*.png.
"""

from __future__ import annotations

import pytest

from evolve_app.services import agent_import, demo_agent_create, evolution_run_execute, evolution_run_start
from runtime_app import access
from runtime_app.invitations import invitation_create, invitation_revoke
from runtime_app.models import ProjectMembership, Receipt
from runtime_app.services import repository_register
from search_app.services import comment_add, search_start, spec_create
from tests.e2e.test_dashboard_flow import SCREENSHOTS, log_in, shot
from tests.evolve_app.helpers import files_write
from tests.evolve_app.import_shapes import shape_make
from tests.helpers import make_user
from tests.search_app.fixtures import data_dir, finished  # noqa: F401 (fixtures)
from tests.search_app.runs import frozen, spec_text

pytestmark = pytest.mark.integration
WIDTHS = {"phone": (390, 844), "desktop": (1400, 900)}
# The home page was 34,499 px tall at 390 px when the event log wrapped a letter a line; the longest
# page here (a candidate with its receipts) stays well under this at either width.
MAX_HEIGHT = 12_000


@pytest.fixture
def layout_pages(personas, finished, data_dir, tmp_path):  # noqa: F811 (fixtures)
    """Every page of a project with a finished search, a saved spec and an agent that evolved
    three cycles (the login page is seen signed out, the others signed in as its owner). A search
    that runs and a run that waits for a worker have cancel confirmations to show."""
    search, winner, repo = finished
    repository = repository_register(personas.owner, personas.alpha, str(repo), trusted=True)
    spec = spec_create(personas.owner, personas.alpha, "Make answer() bigger",
                       spec_text(population=2, rounds=[2, 1]))
    agent = demo_agent_create(personas.owner, personas.alpha)
    run = evolution_run_start(personas.owner, agent, cycles=3, enqueue=False)
    run = evolution_run_execute(run.pk)
    assert run.status == "finished", run.reason
    waiting = evolution_run_start(personas.owner, agent, cycles=2, enqueue=False)
    # An A-Evolve artifact without a manifest, with files Crucible will not use and long names.
    artifact = shape_make(tmp_path / "a_very_long_folder_name_of_an_a_evolve_artifact_for_a_phone",
                          "mcp_mh_opus46")
    files_write(artifact, {".claude/skills/a-rather-long-claude-code-skill-name/references/notes.md": "x\n"})
    imported = agent_import(personas.owner, personas.alpha, str(artifact), infer=True, trusted=True)
    running = frozen(personas, tmp_path, {"cand_001": 3}, repo_name="running", population=2, rounds=[2, 1])
    search_start(personas.owner, running, enqueue=False)
    # The home page's "Waiting for you" lists a thread that mentions its owner, with a long line.
    comment_add(personas.member, winner, "@owner " + "does_this_identifier_fit_a_phone_screen_" * 4)
    receipt = Receipt.objects.filter(subject_type="candidate", subject_id=winner.pk).order_by("id").first()
    search_url, run_url = f"/searches/{search.search_id}/", f"/agents/{agent.pk}/runs/{run.number}/"
    return {
        "home": "/",
        "project": f"/projects/{personas.alpha.pk}/",
        "members": f"/projects/{personas.alpha.pk}/members/",
        "search-list": "/searches/",
        "search": f"/searches/{search.search_id}/",
        "candidate": f"/searches/{search.search_id}/candidates/{winner.candidate_id}/",
        "agent-list": "/agents/",
        "agent": f"/agents/{agent.pk}/",
        "agent-imported": f"/agents/{imported.pk}/",
        "spec-editor": f"/searches/specs/{spec.pk}/",
        "account": "/account/",
        "password-change": "/account/password/",
        "repositories": "/repositories/",
        "repository": f"/repositories/{repository.pk}/",
        "receipt": f"/receipts/{receipt.pk}/",
        "audit-log": "/audit/",
        "evolution-run": run_url,
        "cycle": f"{run_url}cycles/1/",
        "compare": f"{search_url}compare/?c=cand_002&c=cand_001",
        "decide": f"{search_url}candidates/{winner.candidate_id}/decide/?decision=approve",
        "search-cancel": f"/searches/{running.search_id}/cancel/",
        "evolution-run-cancel": f"/agents/{agent.pk}/runs/{waiting.number}/cancel/",
        "agent-compare": f"/agents/{agent.pk}/compare/?base=evo-0&head=evo-3",
        "agent-files": f"/agents/{agent.pk}/files/?ref=evo-3",
        "agent-file": f"/agents/{agent.pk}/files/?ref=evo-3&path=skills/date-arithmetic/SKILL.md",
        "new-spec": "/searches/specs/new/",
        "api-docs": "/api/docs",
    }


SIGNED_OUT_PAGES = {"login": "/login/", "password-reset": "/password/reset/",
                    "password-reset-sent": "/password/reset/sent/", "password-reset-done": "/reset/done/"}
# What a page shows once drawn (the API docs draw by script after load): its screenshot waits for it.
SHOWN = {"api-docs": "#swagger-ui .opblock", "search-cancel": "#confirm-cancel",
         "evolution-run-cancel": "#confirm-cancel", "evolution-run": ".evo-curve svg",
         "agent-compare": ".diff-rendered .d2h-file-wrapper"}


def page_box(page) -> dict[str, int]:
    return page.evaluate("""() => ({
        scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth,
        height: document.documentElement.scrollHeight})""")


def layout_problems(page, pages: dict[str, str]) -> list[str]:
    """Each page at each width, screenshotted: what overflows sideways or stretches too tall."""
    problems = []
    for width_name, (width, height) in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": height})
        for name, url in pages.items():
            response = page.goto(url)
            assert response is not None and response.ok, f"{name} {url}: {response and response.status}"
            page.wait_for_load_state("load")
            if name in SHOWN:
                page.wait_for_selector(SHOWN[name])
            shot(page, f"layout-{width_name}-{name}")
            box = page_box(page)
            if box["scrollWidth"] > box["innerWidth"]:
                problems.append(f"{name} at {width} px: {box['scrollWidth']} px wide")
            if box["height"] > MAX_HEIGHT:
                problems.append(f"{name} at {width} px: {box['height']} px tall")
    return problems


def test_every_page_fits_a_phone_and_a_desktop_without_sideways_scrolling(layout_pages, browser_page):
    page = browser_page
    problems = layout_problems(page, SIGNED_OUT_PAGES)
    log_in(page, "owner")
    assert problems + layout_problems(page, layout_pages) == []


def test_the_score_curve_s_labels_stay_readable_from_a_phone_to_a_desktop(layout_pages, browser_page):
    page = browser_page
    log_in(page, "owner")
    for width in (390, 800, 1400):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(layout_pages["evolution-run"])
        # Each label's size as drawn: its font size in the SVG's units times the SVG's scale.
        labels = page.evaluate("""() => {
            const svg = document.querySelector('.evo-curve svg'), frame = svg.getBoundingClientRect();
            const scale = svg.getScreenCTM().a;
            return [...svg.querySelectorAll('text.tick')].map(text => {
                const box = text.getBoundingClientRect();
                return {text: text.textContent, px: parseFloat(getComputedStyle(text).fontSize) * scale,
                        inside: box.left >= frame.left - 1 && box.right <= frame.right + 1
                                && box.top >= frame.top - 1 && box.bottom <= frame.bottom + 1};
            });
        }""")
        assert {label["text"] for label in labels} >= {"0", "1", "2", "3", "score", "cycle"}, labels
        small = [label for label in labels if label["px"] < 10 or not label["inside"]]
        assert small == [], f"at {width} px: {small}"
        # A curve wider than the phone scrolls in its own box; the page itself does not.
        box = page_box(page)
        assert box["scrollWidth"] <= box["innerWidth"], f"at {width} px: {box}"
    shot(page, "layout-desktop-score-curve")
    page.set_viewport_size({"width": 390, "height": 844})
    page.locator(".evo-curve").scroll_into_view_if_needed()
    page.locator(".evo-curve").screenshot(path=str(SCREENSHOTS / "layout-phone-score-curve.png"))


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


LONG_EMAIL = "a.very.long.name.of.a.new.teammate.from.the.research.department@example-laboratories.org"


@pytest.fixture
def onboarding(personas, daphne_server):
    """The members page of a project with a member and a pending invitation whose addresses are
    long, and the pages of an invitation link: one that works, one that was revoked."""
    long_named = make_user("long-named-member-of-the-team")
    long_named.email = "another.very.long.address.of.a.member@example-laboratories.org"
    long_named.save()
    ProjectMembership.objects.create(project=personas.alpha, user=long_named, role=access.APPROVER)
    _, token = invitation_create(personas.owner, personas.alpha, LONG_EMAIL, access.OPERATOR,
                                 link_for=lambda token: f"{daphne_server}/invitations/{token}/")
    revoked, revoked_token = invitation_create(personas.owner, personas.alpha, "gone@example.org",
                                               access.VIEWER, link_for=lambda token: token)
    invitation_revoke(personas.owner, revoked)
    return {"members": f"/projects/{personas.alpha.pk}/members/",
            "invitation": f"/invitations/{token}/", "invitation-revoked": f"/invitations/{revoked_token}/",
            "invitation-unknown": "/invitations/made-up/", "password-link-invalid": "/reset/MQ/made-up/"}


def test_the_members_page_and_the_password_pages_fit_a_phone_with_every_control_on_screen(
        onboarding, browser_page):
    """At 390 px the role select, Set role and Remove of every member, and Resend and Revoke of
    every invitation, are on screen (the rows stack); the invitation and password pages, the
    refusing ones too, do not scroll sideways."""
    page = browser_page
    page.set_viewport_size({"width": 390, "height": 844})
    problems = []
    for name in ("invitation", "invitation-revoked", "invitation-unknown", "password-link-invalid"):
        page.goto(onboarding[name])
        shot(page, f"layout-phone-{name}")
        box = page_box(page)
        if box["scrollWidth"] > box["innerWidth"]:
            problems.append(f"{name}: {box['scrollWidth']} px wide")
    log_in(page, "owner")
    page.goto(onboarding["members"])
    shot(page, "layout-phone-members-with-invitations")
    box = page_box(page)
    if box["scrollWidth"] > box["innerWidth"]:
        problems.append(f"members: {box['scrollWidth']} px wide")
    controls = page.evaluate("""() => [...document.querySelectorAll(
            '#members select, #members button, #invitations button')].map(el => {
        const r = el.getBoundingClientRect();
        return {what: el.getAttribute('aria-label') || el.textContent.trim(), left: r.left, right: r.right,
                width: r.width, clipped: el.closest('.table-scroll') !== null};
    })""")
    # Three members (a select, Set role and Remove each) and one invitation (Resend and Revoke).
    assert len(controls) == 3 * 3 + 2, controls
    problems += [f"members: {control['what']} at {control['left']:.0f}–{control['right']:.0f} px"
                 for control in controls
                 if control["left"] < 0 or control["right"] > 390 or control["width"] == 0]
    assert problems == []
