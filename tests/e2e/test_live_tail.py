"""A candidate's page in a real browser follows its running gate: a real Celery worker runs the
search, the page shows "Running now" with the gate's output as it prints, then the gate's
receipt, without a reload. The gate waits for a file the test writes (in a read path of the
spec), so nothing depends on timing.

Screenshots at 1,400 and 390 px land in var/screenshots/.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid

import pytest

from search_app import services
from tests.e2e.helpers import in_worker_thread
from tests.helpers import REPO_ROOT, subprocess_env
from tests.search_app.hostspecs import roots
from tests.search_app.runs import GATE, plan_repo, spec_text

pytestmark = pytest.mark.integration
SCREENSHOTS = REPO_ROOT / "var" / "screenshots"
RUN_TIMEOUT_MS = 240_000
# The gate prints, waits for the test's go file, prints again, then checks answer() as usual.
GATE_SCRIPT = """import os, sys, time
sys.path.insert(0, "code")
import answer
print("gate: answer() is", answer.answer(), flush=True)
print("gate: waiting for the go signal", flush=True)
deadline = time.monotonic() + 200
while not os.path.exists(os.path.join(os.path.dirname(__file__), "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
print("gate: released", flush=True)
assert answer.answer() > 0
"""


@pytest.fixture
def signal_dir(tmp_path, settings):
    """The data dir the worker and the web server share, and the gate's read-only signal folder."""
    settings.DATA_DIR = tmp_path / "data"
    folder = tmp_path / "signal"
    folder.mkdir()
    (folder / "gate.py").write_text(GATE_SCRIPT)
    roots(settings, read_roots=[folder])
    return folder


@pytest.fixture
def search(personas, tmp_path, signal_dir):
    gate = f"python {signal_dir / 'gate.py'}"
    text = spec_text(population=2, rounds=[2, 1]).replace(json.dumps(GATE), json.dumps(gate)).replace(
        "[hard_gates]\n", f"[hard_gates]\nread_paths = [{json.dumps(str(signal_dir))}]\n")
    repo = plan_repo(tmp_path / "repo", {"cand_001": 4, "cand_002": 9})
    return services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))


@pytest.fixture
def worker(tmp_path, signal_dir):
    """A real Celery worker with embedded beat, sharing this test's database and data dir."""
    log = (tmp_path / "worker.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "crucible", "worker", "-B", "--loglevel", "INFO",
         "--pool", "prefork", "--concurrency", "2", "--without-mingle", "--without-gossip",
         "--schedule", str(tmp_path / "beat"), "--hostname", f"e2e-{uuid.uuid4().hex[:8]}@%h"],
        cwd=REPO_ROOT, env=subprocess_env(CRUCIBLE_READ_ROOTS=str(signal_dir)), stdin=subprocess.DEVNULL,
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    yield process
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


def shots(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for width, height in ((1400, 900), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
    page.set_viewport_size({"width": 1400, "height": 900})


def test_a_candidate_page_shows_its_running_gate_s_output_then_its_receipt(
    personas, search, signal_dir, worker, browser_page
):
    page = browser_page
    page.goto("/login/")
    page.fill("#id_username", "owner")
    page.fill("#id_password", "pw-owner")
    page.click("form button[type=submit]")
    page.wait_for_selector("h1")
    in_worker_thread(services.search_start, personas.owner, search)

    page.goto(f"/searches/{search.search_id}/candidates/cand_001/")
    page.evaluate("window.crucibleSameDocument = true")
    running = page.wait_for_selector("#live-tail .live-command:has-text('gate: waiting for the go signal')",
                                     timeout=RUN_TIMEOUT_MS)
    text = running.inner_text()
    assert "Running now:" in text and "gate.py" in text and "gate: answer() is 4" in text
    assert "gate: released" not in text
    shots(page, "live-tail-running")

    (signal_dir / "go").write_text("")
    # Its receipt takes its place: whole while nothing else runs, one line once the trials run.
    receipt = page.wait_for_selector("#live-tail :is(article.receipt, li):has-text('evaluate gate 1')",
                                     timeout=RUN_TIMEOUT_MS)
    assert "passed" in receipt.inner_text()
    shots(page, "live-tail-receipt")
    # cand_001 (4) falls to cand_002 (9) after round 0: the box stops polling, its receipts stay.
    page.wait_for_selector("#live-tail[data-active='false']", timeout=RUN_TIMEOUT_MS)
    assert "Running now" not in page.inner_text("#live-tail")
    assert page.locator("#live-tail :is(article.receipt, li)").count() >= 2
    assert page.evaluate("window.crucibleSameDocument") is True  # no reload: htmx swapped it all in
    shots(page, "live-tail-done")
