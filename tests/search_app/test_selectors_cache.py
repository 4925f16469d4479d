"""What the candidate page derives from a patch (its files' line counts) is made by git once per
patch: kept in the derived cache under the patch's SHA-256, so a revised patch is counted afresh."""

from __future__ import annotations

from types import SimpleNamespace

from django.core.cache import caches

from search_app import selectors

PATCH = b"""diff --git a/code/answer.py b/code/answer.py
--- a/code/answer.py
+++ b/code/answer.py
@@ -1,2 +1,2 @@
 def answer():
-    return 2
+    return 9
"""
REVISED = PATCH.replace(b"@@ -1,2 +1,2 @@", b"@@ -1,2 +1,3 @@") + b"+# revised\n"


def test_a_patchs_file_counts_are_made_by_git_once_and_a_revised_patch_is_counted_again(monkeypatch):
    made = []
    real = selectors.patch_from_text
    monkeypatch.setattr(selectors, "patch_from_text", lambda text: made.append(text) or real(text))
    caches["derived"].clear()
    first = SimpleNamespace(patch=PATCH)
    expected = [{"path": "code/answer.py", "added": 1, "deleted": 1}]
    assert selectors.candidate_file_stats(first) == expected
    assert selectors.candidate_file_stats(first) == expected
    assert len(made) == 1
    revised = SimpleNamespace(patch=REVISED)
    assert selectors.candidate_file_stats(revised) == [{"path": "code/answer.py", "added": 2, "deleted": 1}]
    assert len(made) == 2
