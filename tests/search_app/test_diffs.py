"""A patch's lines by side: the numbers a reader sees beside each line, counted from the hunk header."""

from __future__ import annotations

from search_app.diffs import diff_line_texts, diff_lines

DEEP = """diff --git a/code/answer.py b/code/answer.py
--- a/code/answer.py
+++ b/code/answer.py
@@ -118,4 +118,5 @@ def answer():
 keep = 118
-gone = 119
+came = 119
+also = 120
 keep = 120
@@ -300,2 +301,1 @@
-dropped = 300
 last = 301
"""


def test_each_side_counts_its_own_lines_from_the_hunk_header_deep_in_a_file():
    assert diff_line_texts(DEEP, "code/answer.py", "old") == {
        118: "keep = 118", 119: "gone = 119", 120: "keep = 120", 300: "dropped = 300", 301: "last = 301"}
    assert diff_line_texts(DEEP, "code/answer.py", "new") == {
        118: "keep = 118", 119: "came = 119", 120: "also = 120", 121: "keep = 120", 301: "last = 301"}
    assert diff_lines(DEEP, "code/other.py", "old") == []
