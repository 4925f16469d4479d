"""A two-person review in a real browser (Daphne, Chromium, a real Celery worker), each person in
their own browser context: an operator starts a thread on a line of the winner's diff; an approver
replies, resolves it and requests changes; the operator sends the winner back to its writer, whose
revision marks the thread outdated; the approver approves the revised patch and merges it; the
timeline tells it all in order and git shows the commit. A second, short test shows a thread marked
outdated once the candidate's patch changes.

Screenshots land in var/screenshots/two-person-review-<n>-<step>.png (1400 px wide, and the
final page at 390 px).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from search_app.models import Comment, Merge, SearchRun
from tests.e2e.helpers import in_worker_thread
from tests.e2e.test_dashboard_flow import SEARCH_PAGE, git, log_in, shot, worker  # noqa: F401 (fixture)
from tests.search_app.fixtures import data_dir, reviewing  # noqa: F401 (fixtures)
from tests.search_app.helpers import patch_write
from tests.search_app.runs import fates, frozen, run_inline

pytestmark = pytest.mark.integration

# The machine running this may be loaded: every wait is generous, and nothing is timed.
LOADED_MS = 30_000
WIDE = {"width": 1400, "height": 900}
NARROW = {"width": 390, "height": 844}

THREAD = "Is this **bounded**?"
REPLY = "Yes: it returns a *constant*, so nothing grows."
CHANGES = "Please add a **test** that pins the bound."
APPROVAL = "Pinned by the gate; _fine_ to merge."
SENT_BACK = "Return **11**: the reviewers asked for more."
REVISION_MS = 180_000  # a writer, its gates, blocks beside the baseline and a review, on a loaded machine


def prepare(page: Any) -> Any:
    page.context.set_default_timeout(LOADED_MS)
    page.context.set_default_navigation_timeout(LOADED_MS)
    page.set_viewport_size(WIDE)
    return page


@pytest.fixture
def second_page(browser_page: Any, daphne_server: str) -> Iterator[Any]:
    """Another person's page: a second context (own cookies) of the same Chromium."""
    context = browser_page.context.browser.new_context(base_url=daphne_server)
    try:
        yield prepare(context.new_page())
    finally:
        context.close()


@pytest.fixture
def revisable(personas, tmp_path, data_dir):  # noqa: F811 (fixture)
    """A finished search of project alpha whose winner, cand_002, returns 9; sent back to its
    writer, it returns 11."""
    search = frozen(personas, tmp_path, {"cand_001": 4, "cand_002": {"value": 9, "revised": 11}},
                    repo_name="repo", population=2, rounds=[2, 1])
    run = run_inline(personas, search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002", fates(search)
    return search, run.winner, tmp_path / "repo"


def top_shot(page: Any, name: str) -> None:
    """A full-page shot from the top: scrolled, diff2html's sticky file header would be drawn
    over the diff's lines in the capture."""
    page.evaluate("window.scrollTo(0, 0)")
    shot(page, name)


def step_shot(page: Any, number: int, step: str) -> None:
    top_shot(page, f"two-person-review-{number}-{step}")


def diff_drawn(page: Any, url: str) -> None:
    page.goto(url)
    expect(page.locator(".diff-rendered .d2h-file-wrapper").first).to_be_visible(timeout=LOADED_MS)


def test_an_operator_and_an_approver_review_request_changes_revise_approve_and_merge_the_winner(
        personas, approver, revisable, worker, browser_page, second_page):  # noqa: F811 (fixtures)
    search, winner, repo = revisable
    first_sha = winner.patch_sha256
    url = f"/searches/{search.search_id}/candidates/{winner.candidate_id}/"
    a = prepare(browser_page)  # member: an operator of alpha
    b = second_page            # approver: the approver of alpha (the owner froze the search)
    log_in(a, "member")
    log_in(b, "approver")

    # 1. A clicks line 2 of the drawn diff and starts a thread there, in markdown.
    diff_drawn(a, url)
    a.click(".diff-rendered .thread-add[aria-label='Start a thread on code/answer.py:2']")
    form = a.locator(".diff-rendered form.thread-new-form")
    expect(form.locator(".thread-new-place")).to_have_text("code/answer.py:2")
    form.locator("textarea").fill(THREAD)
    with a.expect_navigation():
        form.locator("button[type=submit]").click()
    thread = in_worker_thread(lambda: Comment.objects.get(reply_to=None))
    assert (thread.path, thread.line, thread.line_text) == ("code/answer.py", 2, "    return 9")
    assert thread.author_name == "member" and thread.patch_sha256 == winner.patch_sha256
    listed_a = a.locator(f"#comment-{thread.pk}")
    expect(listed_a.locator(".markdown strong").first).to_have_text("bounded")
    step_shot(a, 1, "thread-started")

    # 2. B opens the page and sees the thread under line 2 of the diff, replies and resolves it.
    diff_drawn(b, url)
    inline = b.locator(".diff-rendered li.thread")
    expect(inline).to_have_count(1)
    expect(inline).to_have_attribute("data-line", "2")
    expect(inline.locator(".markdown strong").first).to_have_text("bounded")
    line_above = inline.evaluate("el => el.closest('tr.thread-inline-row').previousElementSibling.innerText")
    assert "return 9" in line_above and "2" in line_above
    expect(b.locator(f"#comment-{thread.pk} .thread-head")).to_contain_text("code/answer.py:2")
    step_shot(b, 2, "approver-sees-thread")
    inline.locator("textarea[name=body]").fill(REPLY)
    with b.expect_navigation():
        inline.locator(".reply-form button[type=submit]").click()
    expect(b.locator(".diff-rendered li.thread .reply .markdown em")).to_have_text("constant")
    with b.expect_navigation():
        b.locator(".diff-rendered li.thread button", has_text="Resolve").click()
    expect(b.locator(f"#comment-{thread.pk} .badge.ok")).to_have_text("resolved")
    step_shot(b, 3, "reply-and-resolved")
    assert in_worker_thread(lambda: Comment.objects.get(pk=thread.pk).state) == "resolved"

    # ... and A, reloading, sees it resolved by B, with B's reply rendered (no raw markdown).
    a.reload()
    expect(listed_a.locator(".thread-head .badge.ok")).to_have_text("resolved")
    expect(listed_a.locator(".thread-head")).to_contain_text("by approver")
    reply = listed_a.locator(".comment.reply")
    expect(reply).to_have_count(1)
    expect(reply.locator(".comment-by strong")).to_have_text("approver")
    expect(reply.locator(".markdown em")).to_have_text("constant")
    assert "*" not in reply.locator(".markdown").inner_text()
    assert "**" not in listed_a.locator(".comment .markdown").first.inner_text()
    step_shot(a, 4, "member-sees-resolved")

    # 3. B requests changes with a note, on the decide page bound to the patch hash.
    b.goto(url)
    b.click("#request-changes-button")
    expect(b.locator("#decide h1")).to_contain_text("Request changes to")
    expect(b.locator("#confirm-patch-hash")).to_have_text(winner.patch_sha256)
    expect(b.locator("input[name=decision][value=request_changes]")).to_be_checked()
    assert b.locator("input[name=patch_sha256]").input_value() == winner.patch_sha256
    b.fill("#id_note", CHANGES)
    step_shot(b, 5, "request-changes-confirm")
    with b.expect_navigation():
        b.click("#confirm-decision")
    expect(b.locator("#winner-status")).to_have_text("changes requested")
    expect(b.locator("#approval")).to_contain_text("approver requested changes.")
    expect(b.locator("#approval ol.decisions .markdown strong")).to_have_text("test")
    expect(b.locator("#approval a", has_text="Merge…")).to_have_count(0)
    step_shot(b, 6, "changes-requested")
    # The merge page says why it is blocked and offers no merge.
    b.goto(f"/searches/{search.search_id}/merge/")
    expect(b.locator("#merge .errors")).to_contain_text("approver requested changes.")
    expect(b.locator("#confirm-merge")).to_have_count(0)
    step_shot(b, 7, "merge-blocked")

    # 4. A sends the winner back to its writer with a note; a real worker runs the revision.
    a.goto(url)
    expect(a.locator("#revise-unavailable")).to_have_count(0)
    a.fill("#id_revise_note", SENT_BACK)
    step_shot(a, 8, "send-back")
    with a.expect_navigation():
        a.click("#revise-button")
    expect(a.locator(".messages")).to_contain_text("revision 1: its writer answers the changes requested")
    step_shot(a, 9, "revising")
    a.wait_for_selector("#run-summary .badge.state-finished", timeout=REVISION_MS)
    run = in_worker_thread(lambda: SearchRun.objects.select_related("winner").get(search=search))
    revised = run.winner
    assert (run.outcome, revised.candidate_id) == ("winner", "cand_002"), \
        in_worker_thread(lambda: fates(search))
    assert revised.patch_sha256 != first_sha and b"return 11" in bytes(revised.patch)

    # The revision rewrote line 2: the thread started there is outdated, kept with the line as it
    # read; B's request for changes was on the old patch, so it is stale and no longer blocks.
    b.goto(url)
    expect(b.locator("#winner-status")).to_have_text("awaiting approval")
    listed_b = b.locator(f"#comment-{thread.pk}")
    expect(listed_b.locator(".thread-head .badge.warn")).to_have_text("outdated")
    expect(listed_b.locator(".thread-line")).to_contain_text("return 9")
    expect(b.locator(".diff-rendered")).to_contain_text("return 11")
    expect(b.locator(".diff-rendered li.thread")).to_have_count(0)
    expect(b.locator("#approval ol.decisions > li").nth(0)).to_contain_text("stale: the patch changed")
    expect(b.locator("#timeline li.timeline-revised .badge.ok")).to_have_text("revised")
    step_shot(b, 10, "revised-thread-outdated")

    # 5. B approves the revised patch with a note, then merges.
    b.click("#approve-button")
    expect(b.locator("#confirm-patch-hash")).to_have_text(revised.patch_sha256)
    expect(b.locator("input[name=decision][value=approve]")).to_be_checked()
    b.fill("#id_note", APPROVAL)
    step_shot(b, 11, "approve-confirm")
    with b.expect_navigation():
        b.click("#confirm-decision")
    expect(b.locator("#winner-status")).to_have_text("approved")
    expect(b.locator("#approval")).not_to_contain_text("requested changes.")
    decisions = b.locator("#approval ol.decisions > li")
    expect(decisions).to_have_count(2)
    expect(decisions.nth(0)).to_contain_text("approver requested changes on")
    expect(decisions.nth(0)).to_contain_text("stale: the patch changed")
    expect(decisions.nth(1)).to_contain_text("approver approved on")
    expect(decisions.nth(1).locator(".markdown em")).to_have_text("fine")
    merge_link = b.locator("#approval a", has_text="Merge…")
    expect(merge_link).to_be_visible()
    step_shot(b, 12, "approved-mergeable")
    merge_link.click()
    expect(b.locator("#confirm-merge")).to_be_visible()
    expect(b.locator("input[name=target][value=new_branch]")).to_be_checked()
    step_shot(b, 13, "merge-confirm")
    b.click("#confirm-merge")
    b.wait_for_url(SEARCH_PAGE)
    expect(b.locator("#run-status[data-status='merged']")).to_be_visible()
    b.goto(url)
    expect(b.locator("#winner-status")).to_have_text("merged")
    expect(b.locator("#approval .badge.ok")).to_have_text("merged")
    expect(b.locator("#approval a", has_text="Merge…")).to_have_count(0)
    step_shot(b, 14, "merged")

    # The commit is in the repository: a new branch on the baseline with the revised patch.
    merge = in_worker_thread(lambda: Merge.objects.get(search_id=search.pk))
    branch = f"crucible/{search.search_id}"
    assert (merge.branch, merge.merged_by_name) == (branch, "approver")
    assert merge.patch_sha256 == revised.patch_sha256
    expect(b.locator("#approval")).to_contain_text(merge.commit_sha)
    assert git(repo, "rev-parse", branch) == merge.commit_sha
    assert git(repo, "rev-parse", f"{branch}^") == search.baseline_commit
    assert "Approved-by: approver" in git(repo, "log", "-1", "--format=%(trailers:only,unfold)", branch)
    assert git(repo, "show", f"{branch}:code/answer.py") == "def answer():\n    return 11"

    # 6. The timeline: the thread (with its reply), its resolution, the request for changes, the
    # sending back, the writer's revision and its outcome, the approval and the merge, in that
    # order (replays and reviews come between).
    timeline = b.locator("#timeline ol.timeline > li")
    kinds = [kind for kind in timeline.evaluate_all("items => items.map(item => item.className)")
             if kind not in ("timeline-replay", "timeline-review")]
    assert kinds == ["timeline-thread", "timeline-resolved", "timeline-decision", "timeline-revision",
                     "timeline-refinement", "timeline-revised", "timeline-decision", "timeline-merge"], kinds
    reviewed = b.locator("#timeline ol.timeline > li:not(.timeline-replay):not(.timeline-review)")
    entry = reviewed.nth(0)
    expect(entry).to_contain_text("member commented on code/answer.py:2")
    expect(entry.locator(".badge.ok")).to_have_text("resolved")
    expect(entry.locator(".badge.warn")).to_have_text("outdated")
    expect(entry.locator(":scope > .markdown strong")).to_have_text("bounded")
    expect(entry.locator(".timeline-replies > li")).to_have_count(1)
    expect(entry.locator(".timeline-replies > li")).to_contain_text("approver replied")
    expect(entry.locator(".timeline-replies .markdown em")).to_have_text("constant")
    expect(reviewed.nth(1)).to_contain_text(f"approver resolved thread #{thread.pk}")
    expect(reviewed.nth(2)).to_contain_text(f"approver requested changes on patch {first_sha[:12]}")
    expect(reviewed.nth(2).locator(".markdown strong")).to_have_text("test")
    expect(reviewed.nth(3)).to_contain_text("member sent it back to its writer (revision 1)")
    expect(reviewed.nth(3).locator(".markdown strong")).to_have_text("11")
    expect(reviewed.nth(4)).to_contain_text(f"Revision 1: its writer wrote patch {revised.patch_sha256[:12]}")
    expect(reviewed.nth(5)).to_contain_text(f"patch {revised.patch_sha256[:12]} replaces {first_sha[:12]}")
    expect(reviewed.nth(6)).to_contain_text(f"approver approved on patch {revised.patch_sha256[:12]}")
    expect(reviewed.nth(6).locator(".markdown em")).to_have_text("fine")
    expect(reviewed.nth(7)).to_contain_text(f"approver merged it onto {branch} as {merge.commit_sha[:12]}")
    assert "**" not in b.locator("#timeline").inner_text()
    step_shot(b, 15, "timeline")

    # A sees the same ending; the final page also at phone width.
    a.goto(url)
    expect(a.locator("#winner-status")).to_have_text("merged")
    expect(a.locator("#timeline ol.timeline > li.timeline-merge")).to_have_count(1)
    a.set_viewport_size(NARROW)
    expect(a.locator("#timeline")).to_be_visible()
    step_shot(a, 16, "final-390px")


def test_a_thread_is_marked_outdated_once_the_candidates_patch_no_longer_reads_as_it_did(
        personas, reviewing, browser_page):  # noqa: F811 (fixtures)
    search, candidate, repo = reviewing
    url = f"/searches/{search.search_id}/candidates/{candidate.candidate_id}/"
    page = prepare(browser_page)
    log_in(page, "member")
    diff_drawn(page, url)
    page.click(".diff-rendered .thread-add[aria-label='Start a thread on code/answer.py:2']")
    form = page.locator(".diff-rendered form.thread-new-form")
    form.locator("textarea").fill(THREAD)
    with page.expect_navigation():
        form.locator("button[type=submit]").click()
    thread = in_worker_thread(lambda: Comment.objects.get())
    expect(page.locator(".diff-rendered li.thread")).to_have_count(1)
    expect(page.locator(f"#comment-{thread.pk} .badge.warn")).to_have_count(0)

    # The patch changes under the thread, as a refinement rewrites it.
    in_worker_thread(patch_write, repo, candidate, "def answer():\n    return 10\n")
    diff_drawn(page, url)
    expect(page.locator(".diff-rendered")).to_contain_text("return 10")
    listed = page.locator(f"#comment-{thread.pk}")
    expect(listed).to_have_class(re.compile(r"\boutdated\b"))
    expect(listed.locator(".thread-head .badge.warn")).to_have_text("outdated")
    # Kept, with the line as it read when the thread started, but no longer under a diff line.
    expect(listed.locator(".thread-line")).to_contain_text("return 9")
    expect(listed.locator(".markdown strong")).to_have_text("bounded")
    expect(page.locator(".diff-rendered li.thread")).to_have_count(0)
    expect(page.locator("#timeline li.timeline-thread .badge.warn")).to_have_text("outdated")
    top_shot(page, "two-person-review-outdated-thread")
