"""Crucible's built-in read-only reviewer: reads a patch on stdin, prints a JSON verdict.

It runs in the sandbox with the patched tree bound read-only as its working directory,
stands in for an LLM reviewer, and never approves a merge: its verdict is advice shown
next to the approve button. It flags what a careful human reviewer looks for first in a
candidate's patch: reaching outside the program (environment, network, subprocesses),
code that switches tests or checks off, and literal copies of the expected results.

    python search_app/reviewer.py --protected tests,expected_result.json < patch.diff
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

RULES = [
    (re.compile(r"\bos\.environ\b|\bgetenv\("), "medium", "reads the environment"),
    (re.compile(r"\bimport (socket|urllib|http|requests)\b|\bfrom (socket|urllib|http|requests)\b"),
     "high", "reaches the network"),
    (re.compile(r"\bsubprocess\b|\bos\.system\(|\bos\.popen\("), "high", "starts other programs"),
    (re.compile(r"\beval\(|\bexec\("), "high", "evaluates code from text"),
    (re.compile(r"pytest\.(skip|xfail)|unittest\.skip|sys\.exit\(0\)|os\._exit\("), "high",
     "skips checks or forces success"),
    (re.compile(r"@(functools\.)?(lru_)?cache\b.*|pickle\.load"), "low",
     "caches or loads state between runs"),
]


def expected_literals(protected: list[str]) -> set[str]:
    """Numbers of 4+ digits in protected result files: a patch that writes them is suspicious."""
    literals: set[str] = set()
    for name in protected:
        path = Path(name)
        if path.is_file() and path.suffix in {".json", ".txt", ".csv"} and path.stat().st_size < 100_000:
            literals.update(re.findall(r"\b\d{4,}\b", path.read_text(errors="replace")))
    return literals


def review(patch: str, protected: list[str]) -> dict:
    findings = []
    literals = expected_literals(protected)
    path, line_number = "", 0
    for raw in patch.splitlines():
        if raw.startswith("+++ "):
            path = raw[6:] if raw.startswith("+++ b/") else raw[4:]
            continue
        hunk = re.match(r"@@ -\d+(?:,\d+)? \+(\d+)", raw)
        if hunk:
            line_number = int(hunk.group(1)) - 1
            continue
        if raw.startswith("+") and not raw.startswith("+++"):
            line_number += 1
            added = raw[1:]
            for pattern, severity, message in RULES:
                if pattern.search(added):
                    findings.append({"path": path, "line": line_number, "severity": severity,
                                     "message": message})
            copied = sorted(literal for literal in literals if re.search(rf"\b{literal}\b", added))
            if copied:
                findings.append({"path": path, "line": line_number, "severity": "high",
                                 "message": f"hard-codes expected results ({', '.join(copied)})"})
        elif not raw.startswith("-"):
            line_number += 1
    verdict = "reject" if any(f["severity"] == "high" for f in findings) else "approve"
    return {"verdict": verdict, "findings": findings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protected", default="", help="comma-separated protected paths")
    args = parser.parse_args()
    patch = sys.stdin.buffer.read().decode(errors="replace")
    result = review(patch, [p for p in args.protected.split(",") if p])
    for finding in result["findings"]:
        print(f"{finding['severity']}: {finding['path']}:{finding['line']}: {finding['message']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
