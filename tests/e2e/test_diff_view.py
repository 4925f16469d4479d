"""The diff viewer in the real candidate page (Daphne, Chromium), read as on a code host: line
numbers of both sides that match the hunk header, long lines reachable, unified on a phone with
the comment box inside the screen, threads on old-side (deleted) lines, and keys that move
between files and threads."""

from __future__ import annotations

import hashlib

import pytest

from search_app import services
from search_app.models import Comment
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


@pytest.fixture
def deep_threads(personas, deep):
    """DEEP_PATCH with a thread on a deleted line of code/answer.py and one on code/other.py."""
    search, candidate = deep
    old = services.comment_add(personas.owner, candidate, "Why drop it?", "code/answer.py", 121, side="old")
    new = services.comment_add(personas.owner, candidate, "A string now?", "code/other.py", 41)
    return search, old, new


# The line numbers and code of a file's rows as the reader sees them: per row, each number cell's
# text and whether it sits on the same line as its code (a shifted number does not).
ROWS_JS = """wrapper => Array.from(wrapper.querySelectorAll('tbody > tr'))
  .filter(row => !row.classList.contains('thread-row')).map(row => {
    const cells = Array.from(row.children);
    const text = row.innerText.replace(/\\s+/g, ' ').trim();
    const out = {text: text, numbers: [], aligned: true, clipped: false};
    cells.forEach((cell, index) => {
      if (!/linenumber/.test(cell.className)) return;
      const code = cells[index + 1];
      const both = cell.querySelectorAll('.line-num1, .line-num2');
      const parts = both.length ? Array.from(both) : [cell];
      parts.forEach(part => out.numbers.push(Array.from(part.childNodes)
        .filter(node => node.nodeName !== 'BUTTON').map(node => node.textContent).join('').trim()));
      const top = code ? Math.abs(cell.getBoundingClientRect().top - code.getBoundingClientRect().top) : 0;
      if (top > 1) out.aligned = false;
      if (cell.scrollWidth > cell.clientWidth + 1 || /…|--/.test(cell.innerText)) out.clipped = true;
    });
    return out;
  })"""

# Whether the last characters of the long line are on screen inside their file's box: scrolled to,
# they must be painted there (not clipped by an overflow) and within the box's left and right edges.
LONG_END_JS = """([wrapper, tail]) => {
  const walker = document.createTreeWalker(wrapper, NodeFilter.SHOW_TEXT);
  let node = null;
  while (walker.nextNode()) if (walker.currentNode.textContent.includes(tail)) node = walker.currentNode;
  if (!node) return 'not drawn';
  const range = document.createRange();
  const end = node.textContent.indexOf(tail) + tail.length;
  range.setStart(node, end - 1); range.setEnd(node, end);
  node.parentElement.scrollIntoView({block: 'center'});
  const rect = range.getBoundingClientRect(), box = wrapper.getBoundingClientRect();
  if (rect.right > box.right + 1 || rect.left < box.left - 1) return 'outside its box';
  const hit = document.elementFromPoint(rect.left + rect.width / 2, rect.top + rect.height / 2);
  return hit && node.parentElement.contains(hit) ? 'visible' : 'hidden';
}"""


def test_side_by_side_numbers_both_sides_from_the_hunk_header_on_the_line_of_their_code_and_wraps_long_lines(
        deep, browser_page):
    search, _ = deep
    page = browser_page
    _open(page, search, 1400)
    # A desktop opens side by side when nothing was chosen.
    assert page.locator("[data-diff-format=side-by-side]").get_attribute("aria-pressed") == "true"
    wrapper = page.locator(".d2h-file-wrapper", has_text="code/answer.py")
    rows = wrapper.evaluate(ROWS_JS)
    assert rows[0]["text"].startswith("@@ -118,7 +118,8 @@")
    numbered = [(row["numbers"], row["text"]) for row in rows[1:]]
    # Old numbers count 118.. from "-118", new ones 118.. from "+118"; a side without the line is empty.
    assert [numbers for numbers, _ in numbered] == [
        ["118", "118"], ["119", "119"], ["120", "120"], ["121", "121"], ["122", "122"], ["", "123"],
        ["123", "124"], ["124", "125"]]
    assert "removed_121" in numbered[3][1] and "added_121" in numbered[3][1]
    assert LONG_TAIL in numbered[5][1] and "removed" not in numbered[5][1]
    assert all(row["aligned"] for row in rows), [row["text"][:30] for row in rows if not row["aligned"]]
    assert not any(row["clipped"] for row in rows)
    assert page.evaluate(LONG_END_JS, [wrapper.element_handle(), LONG_TAIL]) == "visible"
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
    shot(page, "diff-side-by-side-deep")


def test_a_phone_gets_the_unified_diff_without_sideways_scrolling_and_a_comment_box_inside_the_screen(
        deep, browser_page):
    search, _ = deep
    page = browser_page
    _open(page, search, 390, 844)
    assert page.locator("[data-diff-format=line-by-line]").get_attribute("aria-pressed") == "true"
    assert page.locator(".diff-rendered .d2h-files-diff").count() == 0
    wrapper = page.locator(".d2h-file-wrapper", has_text="code/answer.py")
    rows = wrapper.evaluate(ROWS_JS)
    assert [row["numbers"] for row in rows[1:]] == [
        ["118", "118"], ["119", "119"], ["120", "120"], ["121", ""], ["122", ""], ["", "121"], ["", "122"],
        ["", "123"], ["123", "124"], ["124", "125"]]
    assert all(row["aligned"] for row in rows) and not any(row["clipped"] for row in rows)
    assert page.evaluate(LONG_END_JS, [wrapper.element_handle(), LONG_TAIL]) == "visible"
    # The deleted line 122 is on the old side: a tap on it opens the box there, inside the screen.
    wrapper.locator("tr[data-old='122']:not([data-new]) td").last.click()
    form = page.locator(".diff-rendered form.thread-new-form")
    assert "code/answer.py:122 (old side)" in form.inner_text()
    for element in (form, form.locator("textarea"), form.locator("button[type=submit]")):
        box = element.bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, box
    assert form.bounding_box()["width"] > 300  # it spans the width, not a sliver
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    shot(page, "diff-phone-comment-box")
    # A choice made on the phone is remembered there.
    page.click("[data-diff-format=side-by-side]")
    page.reload()
    page.wait_for_selector(".diff-rendered .d2h-file-wrapper")
    assert page.locator("[data-diff-format=side-by-side]").get_attribute("aria-pressed") == "true"


def test_a_comment_on_a_deleted_line_is_kept_on_the_old_side_and_shown_under_that_line_after_reload(
        deep, browser_page):
    search, _ = deep
    page = browser_page
    _open(page, search, 1400)
    page.click(".diff-rendered .thread-add[aria-label='Start a thread on code/answer.py:122 (old side)']")
    form = page.locator(".diff-rendered form.thread-new-form")
    form.locator("textarea").fill("Was **122** still used?")
    with page.expect_navigation():
        form.locator("button[type=submit]").click()
    thread = in_worker_thread(lambda: Comment.objects.get())
    assert (thread.path, thread.side, thread.line, thread.line_text) == (
        "code/answer.py", "old", 122, "    removed_122 = 122")
    page.reload()
    page.wait_for_selector(".diff-rendered li.thread")
    placed = "tr.thread-row[data-side=old] li.thread"
    for format_name in ("side-by-side", "line-by-line"):
        page.click(f"[data-diff-format={format_name}]")
        inline = page.locator(f".diff-rendered {placed}")
        assert inline.count() == 1 and inline.locator(".markdown strong").inner_text() == "122"
        above = inline.evaluate("li => li.closest('tr').previousElementSibling.dataset.old")
        assert above == "122"
        if format_name == "side-by-side":
            file = page.locator(".d2h-file-wrapper", has_text="code/answer.py")
            table = file.locator("table").bounding_box()
            box = inline.bounding_box()
            assert box["x"] + box["width"] <= table["x"] + table["width"] / 2 + 1  # the left (old) half
    assert page.locator(f"#comment-{thread.pk} .badge.side-old").inner_text() == "old side"


def test_keys_move_to_the_next_and_previous_file_and_thread_but_not_while_typing(deep_threads, browser_page):
    search, old, new = deep_threads
    page = browser_page
    _open(page, search, 1400, 600)
    assert "next/previous file" in page.locator(".diff-keys").inner_text()
    focused = "() => { const a = document.activeElement; const f = a.closest('.d2h-file-wrapper');" \
              " const t = a.closest('li.thread'); const r = a.getBoundingClientRect();" \
              " return [f && f.querySelector('.d2h-file-name').textContent, t && t.dataset.thread," \
              " r.top >= 0 && r.top < innerHeight]; }"
    page.keyboard.press("n")
    assert page.evaluate(focused) == ["code/answer.py", None, True]
    page.keyboard.press("n")
    assert page.evaluate(focused) == ["code/other.py", None, True]
    page.keyboard.press("p")
    assert page.evaluate(focused) == ["code/answer.py", None, True]
    page.keyboard.press("]")
    assert page.evaluate(focused) == ["code/answer.py", str(old.pk), True]
    page.keyboard.press("]")
    assert page.evaluate(focused) == ["code/other.py", str(new.pk), True]
    page.keyboard.press("[")
    assert page.evaluate(focused) == ["code/answer.py", str(old.pk), True]
    # Typing in a reply box types: the keys are letters there.
    reply = page.locator(".diff-rendered li.thread textarea[name=body]").first
    reply.click()
    page.keyboard.type("np][")
    assert reply.input_value() == "np]["
    assert page.evaluate("document.activeElement.name") == "body"
