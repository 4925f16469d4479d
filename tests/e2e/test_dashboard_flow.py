"""The whole review flow in a real browser: an operator authors and launches the demo search and
watches it live; an approver approves the winner and merges it; git shows the commit.

Screenshots of every page land in var/screenshots/ (kept by CI as artifacts).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from runtime_app.services import repository_register
from search_app.models import Search, SearchRun
from tests.e2e.helpers import WAIT_MS, in_worker_thread
from tests.helpers import REPO_ROOT, subprocess_env

pytestmark = pytest.mark.integration
SCREENSHOTS = REPO_ROOT / "var" / "screenshots"
SEARCH_PAGE = re.compile(r"^http://127\.0\.0\.1:\d+/searches/search-[0-9a-f]{16}/$")
RUN_TIMEOUT_MS = 240_000


def demo_spec() -> str:
    """The scripted demo, cut to four candidates so the browser test stays quick."""
    text = (REPO_ROOT / "search_app" / "spec_templates" / "demo-scripted.toml").read_text()
    text = text.replace("population = 12\nrounds = [12, 4, 2, 1]", "population = 4\nrounds = [4, 2, 1]")
    return text.replace('reasoning_effort = ["low", "medium", "high", "high"]', 'reasoning_effort = "high"')


@pytest.fixture
def demo_repository(personas, tmp_path, settings):
    from runtime_app.management.commands.crucible_setup import Command

    settings.DATA_DIR = tmp_path
    path = Command()._demo_repository()
    return repository_register(personas.owner, personas.alpha, str(path), "certificate", trusted=True)


@pytest.fixture
def worker(tmp_path):
    """A real Celery worker with embedded beat, on this run's broker (filesystem or Redis)."""
    log = (tmp_path / "worker.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "crucible", "worker", "-B", "--loglevel", "INFO",
         "--pool", "prefork", "--concurrency", "2", "--without-mingle", "--without-gossip",
         "--schedule", str(tmp_path / "beat"), "--hostname", f"e2e-{uuid.uuid4().hex[:8]}@%h"],
        cwd=REPO_ROOT, env=subprocess_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    yield process
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


def shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def log_in(page, username: str) -> None:
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}")
    page.click("form button[type=submit]")
    page.wait_for_selector("h1")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_an_operator_launches_the_demo_and_an_approver_merges_its_winner(
    personas, approver, demo_repository, worker, browser_page
):
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 900})
    log_in(page, "owner")
    shot(page, "01-home")

    # Author the spec in the editor and freeze it against the demo repository.
    page.goto("/searches/specs/new/")
    page.select_option("#id_repository", str(demo_repository.pk))
    page.fill("#spec-text", demo_spec())
    page.wait_for_selector("#validation.is-valid", timeout=WAIT_MS)
    shot(page, "02-spec-editor")
    page.click("#freeze-button")
    page.wait_for_url(SEARCH_PAGE)
    search = in_worker_thread(lambda: Search.objects.get())

    # Launch it, then watch the table change without a reload.
    with page.expect_navigation():
        page.click("text=Start the search")
    page.wait_for_selector("#run-summary .badge.state-running, #run-summary .badge.state-finished")
    page.wait_for_selector("section.live.connected")
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: frame == page.main_frame and navigations.append(frame.url))
    page.evaluate("window.crucibleSameDocument = true")
    page.wait_for_selector("#candidate-row-cand_004[data-state='eliminated']", timeout=RUN_TIMEOUT_MS)
    # The run's one status once it ends (awaiting approval, NONE, failed …).
    page.wait_for_selector("#run-status:not([data-status='running']):not([data-status='frozen'])",
                           timeout=RUN_TIMEOUT_MS)
    fates = in_worker_thread(lambda: [f"{c.candidate_id}: {c.reason}" for c in search.candidates.all()])
    assert page.locator("#run-status").get_attribute("data-status") == "awaiting approval", "\n".join(fates)
    try:
        page.wait_for_selector("#candidate-row-cand_001[data-state='winner']", timeout=WAIT_MS)
    except PlaywrightTimeout:
        row = page.locator("#candidate-row-cand_001").inner_html()
        pytest.fail("cand_001's row never showed it as the winner.\nRow: " + row + "\n" + "\n".join(fates))
    assert page.evaluate("window.crucibleSameDocument") is True and navigations == []
    assert "patch refused at policy" in page.inner_text("#candidate-row-cand_004")
    assert page.locator("#score-plot circle").count() >= 2
    shot(page, "03-search-live")
    run = in_worker_thread(lambda: SearchRun.objects.select_related("winner").get(search=search))
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_001"

    # The winner's diff, rendered by diff2html from the patch data.
    page.click("#candidate-row-cand_001 a")
    page.wait_for_selector(".diff-view .d2h-file-wrapper", timeout=WAIT_MS)
    assert "primes.py" in page.inner_text(".diff-view")
    shot(page, "04-candidate")

    # Compare two candidates.
    page.goto(f"/searches/{search.search_id}/compare/?c=cand_001&c=cand_002")
    page.wait_for_selector(".diff-view", timeout=WAIT_MS)
    assert "cand_002" in page.inner_text("main")
    shot(page, "05-compare")

    # The author may not approve their own search: an approver does, then merges.
    page.click("form[action='/logout/'] button")
    log_in(page, "approver")
    page.goto(f"/searches/{search.search_id}/candidates/cand_001/")
    page.click("text=Approve…")
    page.wait_for_selector("#confirm-patch-hash")
    assert page.inner_text("#confirm-patch-hash") == run.winner.patch_sha256
    shot(page, "06-approve")
    page.click("#confirm-decision")
    page.wait_for_selector("text=You approved cand_001")
    page.click("#approval >> text=Merge…")
    page.wait_for_selector("#confirm-merge")
    shot(page, "07-merge")
    page.click("#confirm-merge")
    page.wait_for_url(SEARCH_PAGE)
    page.wait_for_selector("#run-status[data-status='merged']")
    shot(page, "08-merged")

    # git itself shows the commit on the new branch, with its trailers, and nothing else moved.
    repo = Path(demo_repository.path)
    branch = f"crucible/{search.search_id}"
    assert git(repo, "rev-parse", f"{branch}^") == search.baseline_commit
    trailers = git(repo, "log", "-1", "--format=%(trailers:only,unfold)", branch)
    assert f"Crucible-Search: {search.search_id}" in trailers
    assert f"Crucible-Preregistration: {search.preregistration_hash}" in trailers
    assert f"Crucible-Candidate: cand_001 {run.winner.patch_sha256}" in trailers
    assert "Approved-by: approver" in trailers
    assert "sieve" in git(repo, "show", f"{branch}:code/primes.py").lower()
    assert git(repo, "rev-parse", "HEAD") == search.baseline_commit

    page.goto("/audit/")
    audit = page.inner_text("main")
    assert "approval.approve" in audit and "merge.create" in audit and "search.freeze" in audit
    shot(page, "09-audit")
