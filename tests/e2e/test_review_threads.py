"""Review threads in the real candidate page (Daphne, Chromium): markdown that tries to run script
stays inert, a click on a line of the drawn diff starts a thread there, and threads on current
lines show under their line with replies and resolve buttons."""

from __future__ import annotations

import pytest

from search_app import services
from search_app.models import Comment
from tests.e2e.helpers import in_worker_thread
from tests.e2e.test_dashboard_flow import log_in, shot
from tests.search_app.fixtures import data_dir, reviewing  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration

ATTACK = ('<img src=x onerror="window.pwned = 1">\n\n<script>window.pwned = 2</script>\n\n'
          "[click me](javascript:window.pwned=3) and [also](JaVaScRiPt:alert(4))\n\n"
          "<iframe src=\"javascript:window.parent.pwned=5\"></iframe> **bold** stays")


@pytest.fixture
def attacked(personas, reviewing):  # noqa: F811 (fixtures)
    search, candidate, _ = reviewing
    thread = services.comment_add(personas.member, candidate, ATTACK, "code/answer.py", 2)
    services.comment_add(personas.owner, candidate, ATTACK, reply_to=thread.pk)
    return search, thread


def test_markdown_that_tries_to_run_script_stays_inert_in_the_real_page(attacked, browser_page):
    search, thread = attacked
    page = browser_page
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    log_in(page, "member")
    page.goto(f"/searches/{search.search_id}/candidates/cand_002/")
    page.wait_for_selector(".diff-rendered .d2h-file-wrapper")
    listed = page.locator(f"#comment-{thread.pk}")
    assert "bold" in listed.locator(".markdown").first.inner_text()
    assert listed.locator(".markdown strong").first.inner_text() == "bold"
    assert page.locator("#comments .markdown img, #comments .markdown iframe, #comments .markdown script") \
        .count() == 0
    for link in page.locator("#comments .markdown a, #timeline .markdown a").all():
        assert link.get_attribute("href") is None
        link.click()
    # The copy under the line in the diff is the same markup.
    assert page.locator(".diff-rendered li.thread .markdown strong").count() >= 1
    page.wait_for_timeout(300)  # let any handler that slipped through run
    assert page.evaluate("window.pwned") is None
    assert dialogs == []


def test_clicking_a_line_of_the_diff_starts_a_thread_there_that_shows_under_it_and_resolves(
        personas, reviewing, browser_page):  # noqa: F811 (fixtures)
    search, _, _ = reviewing
    page = browser_page
    log_in(page, "member")
    page.goto(f"/searches/{search.search_id}/candidates/cand_002/")
    page.wait_for_selector(".diff-rendered .d2h-file-wrapper")
    # Only the lines the server lists may start a thread: 1 and 2 of code/answer.py on each side.
    # Unified has one button a row (the deleted line 2 is old-side, line 1 is context: new side);
    # side by side, both halves of each row.
    for format_name, buttons in (("line-by-line", 3), ("side-by-side", 4)):
        page.click(f"[data-diff-format={format_name}]")
        assert page.locator(".diff-rendered .thread-add").count() == buttons
    page.click(".diff-rendered .thread-add[aria-label='Start a thread on code/answer.py:2']")
    form = page.locator(".diff-rendered form.thread-new-form")
    form.locator("textarea").fill("Why **9**?")
    with page.expect_navigation():
        form.locator("button[type=submit]").click()
    thread = in_worker_thread(lambda: Comment.objects.get())
    assert (thread.path, thread.line, thread.line_text) == ("code/answer.py", 2, "    return 9")
    inline = page.locator(".diff-rendered li.thread")
    inline.wait_for()
    assert inline.locator(".markdown strong").inner_text() == "9"
    inline.locator("textarea[name=body]").fill("Because it is *bigger*.")
    with page.expect_navigation():
        inline.locator(".reply-form button[type=submit]").click()
    page.locator(".diff-rendered li.thread .reply .markdown em").wait_for()
    page.locator("#diff").scroll_into_view_if_needed()
    shot(page, "review-thread-in-diff")
    with page.expect_navigation():
        page.locator(".diff-rendered li.thread button", has_text="Resolve").click()
    assert page.locator(f"#comment-{thread.pk} .badge.ok").inner_text() == "resolved"
    assert in_worker_thread(lambda: Comment.objects.get(pk=thread.pk).state) == "resolved"
    assert page.locator("#timeline").inner_text().count("resolved thread") == 1
