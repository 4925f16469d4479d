"""Plain helpers of the search_app tests (the scripted repository and its runs: tests/search_app/runs.py)."""

from __future__ import annotations

import hashlib

from tests.gitrepo import git


def patch_write(repo, candidate, text: str) -> None:
    """Give `candidate` the patch that makes code/answer.py read `text`, the way a refinement
    rewrites it (services.steps._refinement_apply): new bytes, hash, round, line count and files."""
    answer = repo / "code" / "answer.py"
    baseline = answer.read_text()
    answer.write_text(text)
    try:
        patch = (git(repo, "diff", "--no-color", "--", "code/answer.py") + "\n").encode()
    finally:
        answer.write_text(baseline)
    if candidate.patch_sha256:  # a refinement: the next round's writer wrote it
        candidate.patch_round += 1
    candidate.patch, candidate.patch_sha256 = patch, hashlib.sha256(patch).hexdigest()
    candidate.diff_lines, candidate.files = patch.count(b"\n"), ["code/answer.py"]
    candidate.save()
