"""The compare page: candidates' metrics side by side and the diff between their patched trees,
on a search run inline against a real repository."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from runtime_app.lane import EXCLUSIVE, lane_hold
from search_app import diffs, selectors
from search_app.models import Candidate
from tests.helpers import login
from tests.search_app.runs import frozen, run_inline

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT_PATCH = b"""diff --git a/code/page.html b/code/page.html
new file mode 100644
--- /dev/null
+++ b/code/page.html
@@ -0,0 +1 @@
+</script><script>alert("patch")</script>
"""
STALE_PATCH = b"""diff --git a/code/answer.py b/code/answer.py
--- a/code/answer.py
+++ b/code/answer.py
@@ -1,2 +1,2 @@
 def answer():
-    return 12345
+    return 6
"""


@pytest.fixture
def finished(personas, tmp_path, data_dir):
    """A finished search of project alpha: cand_001 returns 4, cand_002 9 (the winner), cand_003 7,
    cand_004 5; the baseline returns 2."""
    search = frozen(personas, tmp_path, {"cand_001": 4, "cand_002": 9, "cand_003": 7, "cand_004": 5},
                    repo_name="repo", population=4, rounds=[4, 1])
    run = run_inline(personas, search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002"
    return search, tmp_path / "repo"


def compare_url(search, *ids: str, diff: bool = False) -> str:
    query = "&".join([f"c={candidate_id}" for candidate_id in ids] + (["diff=1"] if diff else []))
    return f"{reverse('search_compare', args=[search.search_id])}?{query}"


class _Table(HTMLParser):
    """The compare table as {row label: [cell texts]}, with each cell's title kept aside."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[str]] = {}
        self.titles: dict[str, list[str]] = {}
        self.heads: list[str] = []
        self._in_table = self._in_head = False
        self._cells: list[str] | None = None
        self._row_titles: list[str] = []
        self._text: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and "compare-table" in (attrs.get("class") or ""):
            self._in_table = True
        elif self._in_table and tag == "thead":
            self._in_head = True
        elif self._in_table and tag == "tr":
            self._cells, self._row_titles = [], []
        elif self._in_table and tag in ("th", "td") and self._cells is not None:
            self._text = []
            self._row_titles.append(attrs.get("title") or "")

    def handle_endtag(self, tag):
        if tag in ("th", "td") and self._text is not None and self._cells is not None:
            self._cells.append(" ".join("".join(self._text).split()))
            self._text = None
        elif tag == "tr" and self._cells is not None:
            if self._in_head:
                self.heads = self._cells[1:]
            elif len(self._cells) > 1:
                self.rows[self._cells[0]] = self._cells[1:]
                self.titles[self._cells[0]] = self._row_titles[1:]
            self._cells = None
        elif tag == "thead":
            self._in_head = False
        elif tag == "table":
            self._in_table = False

    def handle_data(self, data):
        if self._text is not None:
            self._text.append(data)


def table(html: str) -> _Table:
    parser = _Table()
    parser.feed(html)
    return parser


def diff_data(html: str) -> str:
    found = re.search(r'<script id="compare-diff-data" type="application/json">(.*?)</script>', html, re.S)
    assert found, "the page carries the diff for the viewer"
    return json.loads(found.group(1))


def worktree_names() -> set[str]:
    root = Path(django_settings.DATA_DIR) / "worktrees"
    return {path.name for path in root.iterdir()} if root.exists() else set()


def test_the_picked_candidates_metrics_are_shown_side_by_side_in_the_order_picked(finished, personas):
    search, _ = finished
    response = login(personas.member).get(compare_url(search, "cand_002", "cand_001", "baseline"))
    assert response.status_code == 200
    html = response.content.decode()
    shown = table(html)
    assert [head.split()[0] for head in shown.heads] == ["cand_002", "cand_001", "baseline"]
    assert shown.rows["State"] == ["winner", "eliminated", "alive"]
    assert shown.rows["Score"] == ["4.5× higher", "2× higher", "2"]  # ratios to the baseline; its own value
    assert shown.rows["Median value"] == ["9", "4", "2"]
    assert shown.rows["Trials, round 0"] == ["9, 9", "4, 4", "2, 2"]
    # Only the winner went on; the baseline runs in every round's blocks.
    assert shown.rows["Trials, round 1"] == ["9, 9", "—", "2, 2"]
    assert shown.rows["Round reached"] == ["1 (last)", "0", "1 (last)"]
    assert shown.rows["Gates passed"] == ["1 of 1", "1 of 1", "1 of 1"]
    assert shown.rows["Files changed"] == ["1", "1", "0"]
    assert shown.titles["Files changed"][0] == "code/answer.py"
    assert shown.rows["Diff lines"] == ["2", "2", "—"]
    assert "Cost" not in shown.rows  # nothing spent by any picked candidate: no row of zeros
    assert shown.rows["Reason"][2] == "the unchanged baseline, for comparison"
    for label in ("Spread (max − min)", "Runtime (mean trial)", "Diff lines", "Reason"):
        assert len(shown.rows[label]) == 3
    assert "Tokens" not in shown.rows  # nothing spent in any column
    winner = Candidate.objects.get(search=search, candidate_id="cand_002")
    assert shown.rows["Patch SHA-256"][0] == winner.patch_sha256[:12]
    assert shown.titles["Patch SHA-256"][0] == winner.patch_sha256
    assert shown.rows["Patch SHA-256"][2] == "—"  # the baseline has no patch
    for candidate_id in ("cand_002", "cand_001", "baseline"):
        assert f'href="/searches/{search.search_id}/candidates/{candidate_id}/"' in html
    assert f'href="{reverse("search_detail", args=[search.search_id])}"' in html


def test_differences_only_hides_the_rows_whose_values_are_all_equal_and_keeps_the_pick(finished, personas):
    search, _ = finished
    client = login(personas.member)
    everything = table(client.get(compare_url(search, "cand_001", "cand_003")).content.decode())
    assert everything.rows["Gates passed"] == ["1 of 1", "1 of 1"]
    response = client.get(compare_url(search, "cand_001", "cand_003", diff=True))
    assert response.status_code == 200
    html = response.content.decode()
    differing = table(html)
    assert "Gates passed" not in differing.rows and "Tokens" not in differing.rows
    assert differing.rows["Median value"] == ["4", "7"]
    assert set(differing.rows) < set(everything.rows)
    assert "row" in html and "hidden" in html
    # The toggle link keeps the picked candidates and turns the filter off; and the other way.
    page = reverse("search_compare", args=[search.search_id])
    assert f'href="{page}?c=cand_001&amp;c=cand_003"' in html
    plain = client.get(compare_url(search, "cand_001", "cand_003")).content.decode()
    assert f'href="{page}?c=cand_001&amp;c=cand_003&amp;diff=1"' in plain
    # Without JavaScript the form's checkbox does the same.
    assert re.search(r'<input type="checkbox" name="diff" value="1" checked>', html)


def test_the_tree_diff_between_two_candidates_shows_the_changed_line(finished, personas):
    search, _ = finished
    before = worktree_names()
    response = login(personas.member).get(compare_url(search, "cand_001", "cand_002"))
    html = response.content.decode()
    text = diff_data(html)
    assert "-    return 4\n" in text and "+    return 9\n" in text
    assert "diff --git a/code/answer.py b/code/answer.py" in text
    # The server-rendered fallback has the same lines, per file, open (a small file).
    assert '<span class="diff-del">-    return 4</span>' in html
    assert '<span class="diff-add">+    return 9</span>' in html
    assert '<details class="diff-file-block" open>' in html
    assert 'data-patch-source="compare-diff-data"' in html and 'data-large-lines="400"' in html
    assert "js/diff_view.js" in html and "diff2html-ui-base.min.js" in html and "css/diff_view.css" in html
    assert worktree_names() == before  # the worktrees made for the trees are gone


def test_the_baseline_is_compared_as_the_baseline_commit_itself(finished, personas):
    search, _ = finished
    html = login(personas.member).get(compare_url(search, "baseline", "cand_002")).content.decode()
    text = diff_data(html)
    assert "-    return 2\n" in text and "+    return 9\n" in text
    # Two candidates with the same tree: no differences.
    Candidate.objects.filter(search=search, candidate_id="cand_004").update(patch=b"", patch_sha256="")
    html = login(personas.member).get(compare_url(search, "cand_004", "baseline")).content.decode()
    assert diff_data(html) == "" and "No differences" in html


@pytest.mark.parametrize(("ids", "problem"), [
    (["cand_001", "nope"], "This search has no candidate “nope”."),
    (["cand_001"], "Pick at least 2 candidates to compare; 1 is picked."),
    (["baseline", "cand_001", "cand_002", "cand_003", "cand_004"],
     "Pick at most 4 candidates to compare; 5 are picked."),
    (["cand_001", "cand_001"], "cand_001 is picked more than once; pick each candidate once."),
    (["", ""], "Pick at least 2 candidates to compare; none is picked."),
])
def test_a_bad_pick_is_a_clear_message_with_the_picker_shown_again(finished, personas, ids, problem):
    search, _ = finished
    response = login(personas.member).get(compare_url(search, *ids))
    assert response.status_code == 400
    html = response.content.decode()
    assert problem in unescape(html)
    assert 'id="compare-picker"' in html and "compare-table" not in html and "compare-diff-data" not in html
    for candidate_id in ("baseline", "cand_001", "cand_002", "cand_003", "cand_004"):
        assert f'name="c" value="{candidate_id}"' in html
    assert html.index('value="baseline"') < html.index('value="cand_001"')  # baseline first


def test_without_a_pick_the_picker_lists_every_candidate_with_its_state(finished, personas):
    search, _ = finished
    response = login(personas.member).get(reverse("search_compare", args=[search.search_id]))
    assert response.status_code == 200
    html = response.content.decode()
    assert re.search(r'value="cand_002"> <code>cand_002</code> <span class="muted">winner</span>', html)
    assert "compare-problems" not in html and "Pick the candidates to compare" in html


def test_a_patch_that_no_longer_applies_or_a_missing_repository_is_a_message_not_an_error(finished, personas):
    search, repo = finished
    Candidate.objects.filter(search=search, candidate_id="cand_003").update(patch=STALE_PATCH)
    client = login(personas.member)
    before = worktree_names()
    response = client.get(compare_url(search, "cand_001", "cand_003"))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="compare-diff-error"' in html and "does not apply" in html
    assert table(html).rows["Median value"] == ["4", "7"]  # the metrics still show
    assert worktree_names() == before
    shutil.rmtree(repo)
    response = client.get(compare_url(search, "cand_001", "cand_002"))
    assert response.status_code == 200
    assert 'id="compare-diff-error"' in response.content.decode()


def test_a_long_diff_is_cut_with_a_note(finished, personas, monkeypatch):
    search, _ = finished
    monkeypatch.setattr(selectors, "COMPARE_DIFF_MAX_BYTES", 60)
    html = login(personas.member).get(compare_url(search, "cand_001", "cand_002")).content.decode()
    text = diff_data(html)
    assert 'id="compare-diff-truncated"' in html
    assert len(text.encode()) <= 60 and text.endswith("\n") and "+    return 9" not in text


def test_patch_data_with_a_script_tag_is_escaped_by_json_script(finished, personas):
    search, _ = finished
    Candidate.objects.filter(search=search, candidate_id="cand_003").update(patch=SCRIPT_PATCH)
    response = login(personas.member).get(compare_url(search, "baseline", "cand_003"))
    raw = response.content.decode()
    assert response.status_code == 200 and 'id="compare-diff-error"' not in raw
    assert "</script><script>" not in raw and '<script>alert("patch")' not in raw
    assert '+</script><script>alert("patch")</script>\n' in diff_data(raw)
    assert "&lt;/script&gt;&lt;script&gt;alert" in raw  # the fallback, autoescaped


def test_a_file_changing_many_lines_starts_collapsed_in_the_fallback():
    many = "".join(f"+line {n}\n" for n in range(401))
    text = ("diff --git a/big.txt b/big.txt\nnew file mode 100644\n--- /dev/null\n+++ b/big.txt\n"
            f"@@ -0,0 +1,401 @@\n{many}"
            "diff --git a/gone.txt b/gone.txt\ndeleted file mode 100644\n--- a/gone.txt\n+++ /dev/null\n"
            "@@ -1 +0,0 @@\n-bye\n")
    big, gone = diffs.compare_diff_files(text)
    assert (big["path"], big["added"], big["deleted"], big["large"]) == ("big.txt", 401, 0, True)
    assert (gone["path"], gone["added"], gone["deleted"], gone["large"]) == ("gone.txt", 0, 1, False)
    assert gone["lines"][-1] == ("del", "-bye") and big["lines"][0][0] == "file"


def test_an_outsider_gets_404_and_an_anonymous_visitor_is_sent_to_log_in(finished, personas):
    search, _ = finished
    url = compare_url(search, "cand_001", "cand_002")
    assert login(personas.outsider).get(url).status_code == 404
    assert login(personas.member).get(compare_url(search, "x")).status_code == 400
    missing = reverse("search_compare", args=["search-0000000000000000"]) + "?c=cand_001&c=cand_002"
    assert login(personas.member).get(missing).status_code == 404
    response = Client().get(url)
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_the_number_of_queries_does_not_grow_with_the_candidates_picked(finished, personas):
    search, _ = finished
    client = login(personas.member)
    client.get(compare_url(search, "cand_001", "cand_002"))  # warm the session
    with CaptureQueriesContext(connection) as two:
        assert client.get(compare_url(search, "cand_001", "cand_002")).status_code == 200
    with CaptureQueriesContext(connection) as four:
        response = client.get(compare_url(search, "cand_001", "cand_002", "cand_003", "baseline"))
        assert response.status_code == 200 and len(table(response.content.decode()).heads) == 4
    assert len(two) == len(four)
    candidate_queries = [q["sql"] for q in four.captured_queries if "search_app_candidate" in q["sql"]]
    # The picker's list, the picked candidates and the baseline's state (is it paired?).
    assert len(candidate_queries) == 3


def test_a_second_view_of_the_same_pick_reuses_its_diff_without_building_the_trees_again(
        finished, personas, monkeypatch):
    search, _ = finished
    built = []
    real = selectors.patched_tree
    monkeypatch.setattr(selectors, "patched_tree",
                        lambda *args, **kwargs: built.append(1) or real(*args, **kwargs))
    client = login(personas.member)
    first = diff_data(client.get(compare_url(search, "cand_001", "cand_003")).content.decode())
    again = diff_data(client.get(compare_url(search, "cand_001", "cand_003")).content.decode())
    assert first == again and "+    return 7\n" in again
    assert len(built) == 2  # the two trees of the first view only


def test_a_revised_patch_is_compared_afresh_not_from_the_kept_diff(finished, personas):
    search, _ = finished
    client = login(personas.member)
    before = diff_data(client.get(compare_url(search, "cand_001", "cand_003")).content.decode())
    assert "+    return 7\n" in before
    revised = bytes(Candidate.objects.get(search=search, candidate_id="cand_003").patch).replace(
        b"+    return 7", b"+    return 8")
    Candidate.objects.filter(search=search, candidate_id="cand_003").update(
        patch=revised, patch_sha256=hashlib.sha256(revised).hexdigest())
    text = diff_data(client.get(compare_url(search, "cand_001", "cand_003")).content.decode())
    assert "+    return 8\n" in text and "return 7" not in text


def test_the_compare_page_answers_while_a_timing_trial_holds_the_lane(finished, personas):
    search, _ = finished
    client = login(personas.member)
    held, answered = threading.Event(), threading.Event()

    def trial():
        with lane_hold(EXCLUSIVE):
            held.set()
            answered.wait(30)  # old code: the page's git calls waited here for the trial to end

    thread = threading.Thread(target=trial, daemon=True)
    thread.start()
    assert held.wait(30)
    response = client.get(compare_url(search, "cand_001", "cand_004"))
    answered_while_held = thread.is_alive()
    answered.set()
    thread.join(60)
    assert response.status_code == 200 and "+    return 5\n" in diff_data(response.content.decode())
    assert answered_while_held, "the page waited for the timing trial to end"
