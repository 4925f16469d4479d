"""A search page kept open through a whole run, in a real browser with a real worker: it was
opened before the start, the run card arrives live, the baseline's row changes state live,
the winner's "awaiting approval" turns into "approved" when someone approves elsewhere, and no
out-of-band swap ever misses its target (htmx:oobErrorNoTarget) on the way."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid

import pytest

from search_app import services
from search_app.models import SearchRun
from tests.e2e import test_dashboard_flow as flow
from tests.e2e.helpers import WAIT_MS, in_worker_thread
from tests.helpers import REPO_ROOT, subprocess_env

pytestmark = pytest.mark.integration
demo_repository = flow.demo_repository

# Every document of the page counts the swaps htmx could not place, from before its first message.
COUNT_MISSED_SWAPS = """
window.crucibleMissedSwaps = [];
document.addEventListener("htmx:oobErrorNoTarget", function (event) {
  window.crucibleMissedSwaps.push(String(event.detail.target || ""));
});
"""


@pytest.fixture
def worker_later(tmp_path):
    """Start a real Celery worker (with beat) when the test says so: the steps wait in the queue
    until then, so the page is open on a baseline that is still being evaluated."""
    processes: list[subprocess.Popen] = []

    def start() -> None:
        log = (tmp_path / "worker.log").open("wb")
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "crucible", "worker", "-B", "--loglevel", "INFO",
             "--pool", "prefork", "--concurrency", "2", "--without-mingle", "--without-gossip",
             "--schedule", str(tmp_path / "beat"), "--hostname", f"e2e-{uuid.uuid4().hex[:8]}@%h"],
            cwd=REPO_ROOT, env=subprocess_env(), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True))

    yield start
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)


def test_an_open_search_page_follows_the_whole_run_without_a_missed_swap(
    personas, approver, demo_repository, worker_later, browser_page
):
    page = browser_page
    console_errors: list[str] = []
    page.on("console", lambda message: message.type == "error" and console_errors.append(message.text))
    page.add_init_script(COUNT_MISSED_SWAPS)
    search = in_worker_thread(lambda: services.search_freeze(
        personas.owner, personas.alpha, flow.demo_spec(), "HEAD", repository=demo_repository))
    flow.log_in(page, "owner")
    page.goto(f"/searches/{search.search_id}/")
    page.wait_for_selector("section.live.connected")
    assert page.locator("#run-funnel").count() == 0  # not started: no funnel, plot or table yet
    page.evaluate("window.crucibleSameDocument = true")

    # Someone starts it elsewhere: the run card arrives whole, the baseline still being evaluated.
    in_worker_thread(lambda: services.search_start(personas.owner, search))
    page.wait_for_selector("#candidate-row-baseline[data-state='evaluating']")
    assert page.locator("#run-funnel").count() == 1 and page.locator("#score-plot").count() == 1
    # No worker yet, so no event comes: the elapsed time still moves on by itself.
    shown = page.locator("#run-elapsed .ticking").text_content()
    page.wait_for_function("shown => document.querySelector('#run-elapsed .ticking').textContent !== shown",
                           arg=shown, timeout=WAIT_MS)

    worker_later()
    page.wait_for_selector("#candidate-row-baseline[data-state='alive']", timeout=flow.RUN_TIMEOUT_MS)
    # The run's one status once it ends (awaiting approval, NONE, failed …).
    page.wait_for_selector("#run-status:not([data-status='running']):not([data-status='frozen'])",
                           timeout=flow.RUN_TIMEOUT_MS)
    run = in_worker_thread(lambda: SearchRun.objects.select_related("winner").get(search=search))
    assert run.outcome == "winner", run.reason
    page.wait_for_selector("#winner-status:text('awaiting approval')", timeout=WAIT_MS)
    assert page.evaluate("window.crucibleSameDocument") is True
    assert page.evaluate("window.crucibleMissedSwaps") == []
    event_subjects = page.locator("#event-log .event-subject").all_inner_texts()
    assert event_subjects and all(search.search_id in text for text in event_subjects)

    # The table filtered to the eliminated: the winner's row is not on this page.
    page.goto(f"/searches/{search.search_id}/?state=eliminated")
    page.wait_for_selector("section.live.connected")
    row = f"#candidate-row-{run.winner.candidate_id}"
    assert page.locator(row).count() == 0
    # An approver decides on another screen: this page says so without a reload, and the
    # winner's row it does not show is dropped, not reported as a swap without a target.
    in_worker_thread(lambda: services.approval_record(approver, run.winner, "approve",
                                                      run.winner.patch_sha256))
    page.wait_for_selector("#winner-status:text('approved')", timeout=WAIT_MS)
    assert "awaiting" not in page.inner_text("#run-summary")
    assert page.locator(row).count() == 0
    assert page.evaluate("window.crucibleMissedSwaps") == []
    assert not [text for text in console_errors if "oobErrorNoTarget" in text], console_errors
