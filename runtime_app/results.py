"""What a score trial computed, compared with what the baseline computed in the same block.

Pure functions: the worker process reads a trial's results (its stdout, less its metric lines,
and the files the spec names) from files the sandbox handed back, outside every process the
candidate's code runs in, and compares them here. The rules (docs/running-searches.md):
- lines are split on `\\n`; a `\\r` ending a line and one final newline are not differences;
- `tolerance = 0` compares each line exactly; above 0, the numbers on a line compare with
  `math.isclose(rel_tol=tolerance, abs_tol=tolerance)` (so `1e-3` equals `0.001`) and the rest
  of the line exactly;
- a results file the trial did not write (missing or empty) differs from one it wrote.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

# How much of a difference a reason shows: lines either side, and characters of a line.
CONTEXT_LINES = 2
SHOWN_LINES = 5
SHOWN_CHARS = 200
STDOUT = "stdout"
_NUMBER = re.compile(rb"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Difference:
    """The first place two results differ: which result (`stdout` or a file), the 1-based line,
    and a few numbered lines of each side around it."""

    where: str
    line: int
    baseline: tuple[tuple[int, str], ...]
    candidate: tuple[tuple[int, str], ...]
    note: str = ""  # "the candidate wrote no file", …

    def summary(self) -> str:
        """One line: `stdout line 2: baseline `count 2262` · candidate `count 2261``."""
        if self.note:
            return f"{self.where}: {self.note}"
        return (f"{self.where} line {self.line}: baseline {_at(self.baseline, self.line)} · "
                f"candidate {_at(self.candidate, self.line)}")

    def excerpt(self) -> str:
        """The numbered lines of each side around the difference, for a page or a log."""
        parts = []
        for side, lines in (("baseline", self.baseline), ("candidate", self.candidate)):
            parts.append(f"{side}:")
            parts += [f"  {number:>5} | {text}" for number, text in lines] or ["  (nothing)"]
        return "\n".join(parts)

    def as_dict(self) -> dict:
        return {"where": self.where, "line": self.line, "note": self.note, "summary": self.summary(),
                "baseline": [list(item) for item in self.baseline],
                "candidate": [list(item) for item in self.candidate]}


def _at(lines: tuple[tuple[int, str], ...], number: int) -> str:
    for at, text in lines:
        if at == number:
            return f"`{text}`"
    return "(no such line)"


def _lines(data: bytes) -> list[bytes]:
    if not data:
        return []
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # one final newline ends the last line; it is not a line of its own
    return [line.removesuffix(b"\r") for line in lines]


def _line_equal(a: bytes, b: bytes, tolerance: float) -> bool:
    if a == b:
        return True
    if tolerance <= 0:
        return False
    if _NUMBER.sub(b"#", a) != _NUMBER.sub(b"#", b):
        return False  # the text around the numbers (and how many there are) differs
    for x, y in zip(_NUMBER.findall(a), _NUMBER.findall(b), strict=True):
        try:
            left, right = float(x), float(y)
        except ValueError:
            return False
        if not math.isclose(left, right, rel_tol=tolerance, abs_tol=tolerance):
            return False
    return True


def _shown(line: bytes) -> str:
    text = line.decode("utf-8", errors="replace")
    text = "".join(char if char.isprintable() else "�" for char in text)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def _around(lines: list[bytes], index: int) -> tuple[tuple[int, str], ...]:
    start = max(0, index - CONTEXT_LINES)
    return tuple((number + 1, _shown(lines[number])) for number in range(start, min(len(lines),
                                                                                  start + SHOWN_LINES)))


def results_compare(baseline: bytes | str | None, candidate: bytes | str | None, tolerance: float = 0.0,
                    where: str = STDOUT) -> Difference | None:
    """None when `candidate` computed what `baseline` computed, else the first difference.
    None for a side means it wrote nothing (a results file missing or empty)."""
    left = baseline.encode() if isinstance(baseline, str) else baseline
    right = candidate.encode() if isinstance(candidate, str) else candidate
    if not left and not right:
        return None
    if where != STDOUT and (not left or not right):
        note = "the candidate wrote nothing there" if left else "the baseline wrote nothing there"
        return Difference(where, 1, _around(_lines(left or b""), 0), _around(_lines(right or b""), 0), note)
    a, b = _lines(left or b""), _lines(right or b"")
    for index in range(max(len(a), len(b))):
        if index >= len(a) or index >= len(b) or not _line_equal(a[index], b[index], tolerance):
            return Difference(where, index + 1, _around(a, index), _around(b, index))
    return None


def results_compare_all(baseline: Mapping[str, bytes | None], candidate: Mapping[str, bytes | None],
                        tolerance: float = 0.0) -> Difference | None:
    """The first difference over every result (stdout first, then files in the order given)."""
    for where, expected in baseline.items():
        found = results_compare(expected, candidate.get(where), tolerance, where)
        if found is not None:
            return found
    return None


def stdout_results(stdout: bytes, metric: str) -> bytes:
    """A score command's stdout less its metric lines: each line that parses as a JSON object
    with `metric` as a key (what the command reports about itself is not what it computed)."""
    kept = []
    for line in stdout.split(b"\n"):
        stripped = line.strip()
        if stripped.startswith(b"{"):
            try:
                data = json.loads(stripped)
            except (ValueError, UnicodeDecodeError, RecursionError):
                data = None
            if isinstance(data, dict) and metric in data:
                continue
        kept.append(line)
    return b"\n".join(kept)


def results_digest(results: Mapping[str, bytes | None]) -> str:
    """One SHA-256 of every result, by name (what a receipt keeps instead of the results)."""
    digest = hashlib.sha256()
    for where in sorted(results):
        data = results[where]
        part = hashlib.sha256(data).hexdigest() if data is not None else "-"
        digest.update(f"{where}\0{part}\n".encode())
    return digest.hexdigest()
