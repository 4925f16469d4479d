"""The diff viewer in the real candidate page (Daphne, Chromium), read as on a code host: line
numbers of both sides that match the hunk header, long lines reachable, unified on a phone with
the comment box inside the screen, threads on old-side (deleted) lines, and keys that move
between files and threads."""

from __future__ import annotations

import hashlib

import pytest

from search_app import services
from tests.e2e.helpers import in_worker_thread
from tests.e2e.test_dashboard_flow import log_in, shot
from tests.search_app.fixtures import data_dir, reviewing  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration

LONG_TAIL = "END_OF_THE_LONG_LINE"
LONG_LINE = "    total = " + " + ".join(f"value_{n}" for n in range(40)) + f"  # {LONG_TAIL}"

# A change deep in code/answer.py (old 118-124, new 118-125) and one in code/other.py.
DEEP_PATCH = "\n".join([
    "diff --git a/code/answer.py b/code/answer.py",
    "index 1111111..2222222 100644",
    "--- a/code/answer.py",
    "+++ b/code/answer.py",
    "@@ -118,7 +118,8 @@ def answer():",
    "     context_118 = 118",
    "     context_119 = 119",
    "     context_120 = 120",
    "-    removed_121 = 121",
    "-    removed_122 = 122",
    "+    added_121 = 121",
    "+    added_122 = 122",
    "+" + LONG_LINE,
    "     context_123 = 124",
    "     context_124 = 125",
    "diff --git a/code/other.py b/code/other.py",
    "index 3333333..4444444 100644",
    "--- a/code/other.py",
    "+++ b/code/other.py",
    "@@ -40,3 +40,3 @@",
    " before = 40",
    "-middle = 41",
    "+middle = 'forty-one'",
    " after = 42",
    "",
])


@pytest.fixture
def deep(personas, reviewing):  # noqa: F811 (fixtures)
    """cand_002 with DEEP_PATCH as its patch."""
    search, candidate, _ = reviewing
    patch = DEEP_PATCH.encode()
    candidate.patch, candidate.patch_sha256 = patch, hashlib.sha256(patch).hexdigest()
    candidate.diff_lines, candidate.files = patch.count(b"\n"), ["code/answer.py", "code/other.py"]
    candidate.save()
    return search, candidate


def _open(page, search, width: int, height: int = 900, user: str = "member") -> None:
    page.set_viewport_size({"width": width, "height": height})
    if user:
        log_in(page, user)
    page.goto(f"/searches/{search.search_id}/candidates/cand_002/")
    page.wait_for_selector(".diff-rendered .d2h-file-wrapper")


def test_look(deep, browser_page):
    search, _ = deep
    page = browser_page
    _open(page, search, 1400)
    page.click("[data-diff-format=side-by-side]")
    page.locator("#diff").scroll_into_view_if_needed()
    page.locator("#diff").screenshot(path="/tmp/diff-wide.png")
    page.locator("[aria-label='Start a thread on code/answer.py:122 (old side)']").click()
    page.locator("#diff").screenshot(path="/tmp/diff-wide-form.png")
    _open(page, search, 390, user="")
    page.locator("#diff").screenshot(path="/tmp/diff-phone.png")
    page.locator("[aria-label='Start a thread on code/answer.py:122 (old side)']").click()
    page.locator("#diff").screenshot(path="/tmp/diff-phone-form.png")
