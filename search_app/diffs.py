"""Diffs as text: a spec's versions compared, and a patch split per file and line for the pages.

Pure functions of the text (no queries), shared by selectors (comment anchors), services
(checking a comment's line) and the pages.
"""

from __future__ import annotations

import difflib
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from search_app.models import SpecVersion


def _diff_lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):  # else the diff glues `-last` and `+last` together
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def spec_diff(old: SpecVersion, new: SpecVersion) -> str:
    """A unified diff between two versions of a spec."""
    return "".join(difflib.unified_diff(
        _diff_lines(old.text), _diff_lines(new.text),
        fromfile=f"v{old.number}", tofile=f"v{new.number}",
    ))


COMPARE_LARGE_FILE_LINES = 400  # a file changing more lines starts collapsed


def compare_diff_files(text: str, large: int = COMPARE_LARGE_FILE_LINES) -> list[dict[str, Any]]:
    """The diff split per file for the page's no-JavaScript view: path, lines added and
    deleted, `large` when it changes more than `large` lines, and its lines as (kind, text)."""
    files: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for line in lines:
        if line.startswith("diff --git ") or not current:
            header = line.removeprefix("diff --git ")
            path = header[header.rfind(" b/") + 3:] if " b/" in header else header
            current = {"path": path, "added": 0, "deleted": 0, "lines": [], "header": True}
            files.append(current)
        if current["header"] and line.startswith(("--- ", "+++ ")):
            kind = "file"
            named = line[4:]
            if named != "/dev/null":
                current["path"] = named[2:] if named.startswith(("a/", "b/")) else named
        elif line.startswith("@@"):
            kind = "hunk"
            current["header"] = False
        elif current["header"]:
            kind = "file"
        elif line.startswith("+"):
            kind = "add"
            current["added"] += 1
        elif line.startswith("-"):
            kind = "del"
            current["deleted"] += 1
        elif line.startswith("\\"):
            kind = "note"
        else:
            kind = "context"
        current["lines"].append((kind, line))
    for item in files:
        item["large"] = item["added"] + item["deleted"] > large
        del item["header"]
    return files


OLD, NEW = "old", "new"  # the two sides of a diff: the file before the patch, and after it


def diff_line_texts(text: str, path: str, side: str = NEW) -> dict[int, str]:
    """The lines the diff shows for `path` on one side, by number, with their text (without the
    leading "+", "-" or " "): on the new side added and context lines, on the old side deleted and
    context lines. These are the lines a comment may anchor on."""
    numbered: dict[int, str] = {}
    kinds = ("add", "context") if side == NEW else ("del", "context")
    for item in compare_diff_files(text):
        if item["path"] != path:
            continue
        number = 0
        for kind, line in item["lines"]:
            if kind == "hunk":
                start = re.match(r"@@ -(\d+)(?:,\d+)? \+(\d+)", line)
                number = int(start.group(2 if side == NEW else 1)) if start else 0
            elif kind in kinds and number:
                numbered[number] = line[1:]
                number += 1
    return numbered


def diff_new_line_texts(text: str, path: str) -> dict[int, str]:
    """The new-side lines the diff shows for `path` (added and context lines), with their text."""
    return diff_line_texts(text, path, NEW)


def diff_lines(text: str, path: str, side: str = NEW) -> list[int]:
    """The line numbers the diff shows for `path` on one side, in order."""
    return list(diff_line_texts(text, path, side))


def diff_new_lines(text: str, path: str) -> list[int]:
    """The new-side line numbers the diff shows for `path`, in order."""
    return diff_lines(text, path, NEW)


def line_ranges_text(numbers: list[int]) -> str:
    """1, 2, 3, 7 as "1–3, 7": a short list of the lines a diff shows."""
    ranges: list[list[int]] = []
    for number in sorted(set(numbers)):
        if ranges and number == ranges[-1][1] + 1:
            ranges[-1][1] = number
        else:
            ranges.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in ranges)



def diff_rows(diff: str) -> list[tuple[str, str]]:
    """A unified diff as (kind, line) rows for the spec diff page: file, hunk, add, del, note, context."""
    rows = []
    for index, line in enumerate(diff.split("\n")[:-1] if diff else []):
        if index < 2:
            kind = "file"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        elif line.startswith("\\"):
            kind = "note"
        else:
            kind = "context"
        rows.append((kind, line))
    return rows

