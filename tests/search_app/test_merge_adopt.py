"""A merge writes what was approved: a commit already on the target branch is adopted only when
its tree is the baseline with the approved patch bytes applied, never because its message
carries the search's trailers; and a branch name reads as what it is, at every door."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest
from django.core.exceptions import ValidationError

from runtime_app.models import AuditEntry, Receipt
from search_app import services
from search_app.models import Candidate, Merge
from tests.helpers import login, text_of
from tests.search_app.runs import fates, run_inline, spec_text
from tests.search_app.test_review_api import api, cli

pytestmark = pytest.mark.django_db(transaction=True)

# Another search's writer: every candidate makes answer() return 7 or 8, not B's 9.
OTHER_WRITER = ("python -c \"import os, pathlib; n = 7 if os.environ['CRUCIBLE_CANDIDATE_ID'] == 'cand_001' "
                "else 8; pathlib.Path('code/answer.py').write_text(f'def answer():\\n    return {n}\\n')\"")


def git(repo, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          input=stdin).stdout.strip()


def trailers_of(search, winner) -> str:
    return (f"Crucible-Search: {search.search_id}\n"
            f"Crucible-Candidate: {winner.candidate_id} {winner.patch_sha256}")


def forge(repo, branch: str, parent: str, content: str, message: str) -> str:
    """What anyone who can write to the repository can do: a commit on `parent` with other
    content and the message they like, as the head of `branch`."""
    git(repo, "worktree", "add", "-q", "--detach", str(repo.parent / "forger"), parent)
    forger = repo.parent / "forger"
    (forger / "code" / "answer.py").write_text(content)
    git(forger, "add", "-A")
    git(forger, "-c", "user.name=m", "-c", "user.email=m@m", "-c", "core.hooksPath=/dev/null",
        "commit", "-q", "-F", "-", stdin=message)
    head = git(forger, "rev-parse", "HEAD")
    git(repo, "branch", "-f", branch, head)
    git(repo, "worktree", "remove", "--force", str(forger))
    return head


def refusals() -> list[dict]:
    return list(AuditEntry.objects.filter(action="merge.refuse").values_list("detail", flat=True))


def test_a_merge_does_not_adopt_another_searchs_commit_whose_objective_carries_its_trailers(
        finished, approver, personas, tmp_path):
    """Search A's operator writes B's trailers into A's objective; A's approver merges A onto
    `crucible/<B>`. That commit has the baseline as parent and B's trailer lines, but A's code.
    B's approved merge must refuse it, not record A's code under B's approved hash."""
    search_b, winner_b, repo = finished
    services.approval_record(approver, winner_b, "approve", winner_b.patch_sha256)
    objective = f"Make answer() return a large number.\n\n{trailers_of(search_b, winner_b)}"
    spec = spec_text(population=2, rounds=[2, 1], name="search-a").replace(
        'objective = "Make answer() return the largest number you can"',
        f"objective = {json.dumps(objective)}",
    ).replace('command = "python scripts/writer.py"', f"command = {json.dumps(OTHER_WRITER)}")
    search_a = services.search_freeze(personas.owner, personas.alpha, spec, search_b.baseline_commit,
                                      repository_path=str(repo))
    assert search_a.baseline_commit == search_b.baseline_commit
    run = run_inline(personas, search_a)
    assert run.outcome == "winner", fates(search_a)
    services.approval_record(approver, run.winner, "approve", run.winner.patch_sha256)
    branch_b = services.merge_branch_default(search_b)
    forged = services.merge_create(approver, search_a, branch=branch_b).commit_sha
    assert git(repo, "rev-parse", f"{forged}^") == search_b.baseline_commit
    assert trailers_of(search_b, winner_b) in git(repo, "log", "-1", "--format=%B", forged)

    with pytest.raises(ValidationError) as raised:
        services.merge_create(approver, search_b)
    words = raised.value.message_dict["branch"][0]
    assert words.startswith(f"Branch {branch_b} exists already and does not hold the approved patch: "
                            f"its head {forged[:12]} has tree ")
    assert "it holds other bytes. Choose another branch name." in words
    assert list(Merge.objects.values_list("search", flat=True)) == [search_a.pk]
    assert git(repo, "rev-parse", branch_b) == forged
    assert refusals()[-1]["head"] == forged
    # Onto another branch, B's own bytes are committed; the receipt names the tree it holds.
    merge = services.merge_create(approver, search_b, branch="crucible/b-again")
    assert git(repo, "show", f"{merge.commit_sha}:code/answer.py") == "def answer():\n    return 9"
    detail = Receipt.objects.get(kind="merge", detail__branch="crucible/b-again").detail
    assert detail["adopted"] is False
    assert detail["tree"] == git(repo, "rev-parse", f"{merge.commit_sha}^{{tree}}")


def test_a_commit_forged_on_the_branch_with_the_searchs_trailers_is_refused_on_either_target(
        finished, approver):
    search, winner, repo = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    message = f"{search.name}: cand_002\n\n{trailers_of(search, winner)}\nApproved-by: approver\n"
    branch = services.merge_branch_default(search)
    forged = forge(repo, branch, search.baseline_commit, "def answer():\n    return 1000\n", message)
    git(repo, "branch", "release", forged)
    with pytest.raises(ValidationError, match=f"Branch {branch} exists already and does not hold the "
                                              f"approved patch: its head {forged[:12]} has tree"):
        services.merge_create(approver, search)
    with pytest.raises(ValidationError, match=r"release has moved on from the baseline .* and has tree .* it "
                                              "holds other bytes; merge to a new branch instead"):
        services.merge_create(approver, search, target="existing_branch", branch="release")
    assert not Merge.objects.exists() and not Receipt.objects.filter(kind="merge").exists()
    assert [detail["head"] for detail in refusals()] == [forged, forged]
    assert git(repo, "rev-parse", branch) == git(repo, "rev-parse", "release") == forged


def test_a_merge_that_crashed_after_its_commit_is_adopted_because_its_tree_is_the_approved_one(
        finished, approver, monkeypatch):
    """The commit is made, then the process fails before the Merge row: merging again records
    that very commit (its tree is the baseline with the approved bytes applied)."""
    search, winner, repo = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)

    def crash(*args, **kwargs):
        raise RuntimeError("the server died")

    monkeypatch.setattr(services.decisions, "receipt_record", crash)
    with pytest.raises(RuntimeError):
        services.merge_create(approver, search)
    monkeypatch.undo()
    branch = services.merge_branch_default(search)
    made = git(repo, "rev-parse", branch)
    assert not Merge.objects.exists() and git(repo, "rev-parse", f"{made}^") == search.baseline_commit
    merge = services.merge_create(approver, search)
    detail = Receipt.objects.get(kind="merge").detail
    assert merge.commit_sha == made and detail["adopted"] is True
    assert detail["tree"] == git(repo, "rev-parse", f"{made}^{{tree}}")
    assert git(repo, "rev-list", "--count", f"{search.baseline_commit}..{branch}") == "1"


# ------------------------------------------------------------------------- branch names, every door

HOSTILE = {"fix\u202egnp.exe": "U+202E RIGHT-TO-LEFT OVERRIDE", "m\u0430in": "U+0430 CYRILLIC SMALL LETTER A",
           "fix\u00a0bug": "U+00A0 NO-BREAK SPACE"}


def test_a_hostile_branch_name_is_refused_naming_its_character_by_page_api_and_cli(finished, approver):
    search, winner, repo = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    refs_before = git(repo, "for-each-ref", "--format=%(refname)")
    (page_name, page_char), (api_name, api_char), (cli_name, cli_char) = HOSTILE.items()
    page = login(approver).post(f"/searches/{search.search_id}/merge/",
                                {"target": "new_branch", "branch": page_name})
    assert page.status_code == 400
    assert f"{page_char} (character 4) is a bidirectional control" in text_of(page)
    page = login(approver).post(f"/searches/{search.search_id}/merge/",
                                {"target": "new_branch", "branch": "\u00a0main"})  # not trimmed away
    assert page.status_code == 400 and "U+00A0 NO-BREAK SPACE (character 1)" in text_of(page)
    refused = api(approver, f"/api/searches/{search.search_id}/merge", {"branch": api_name})
    assert refused.status_code == 400
    assert f"{api_char} (character 2) looks like the ASCII 'a'" in refused.json()["errors"]["branch"][0]
    done = cli(approver, "merge", search.search_id, "--target", "existing_branch", "--branch", cli_name)
    assert done.code == 1 and f"{cli_char} (character 4) is a space" in done.err
    assert git(repo, "for-each-ref", "--format=%(refname)") == refs_before
    assert not Merge.objects.exists()
    assert cli(approver, "merge", search.search_id, "--branch", "feature/x_y.z").code == 0
    assert Merge.objects.get().branch == "feature/x_y.z"


IGNORED_IN_ITS_OWN_PATCH = b"""diff --git a/.gitignore b/.gitignore
new file mode 100644
--- /dev/null
+++ b/.gitignore
@@ -0,0 +1 @@
+*.log
diff --git a/keep.log b/keep.log
new file mode 100644
--- /dev/null
+++ b/keep.log
@@ -0,0 +1 @@
+kept
"""


def test_a_merge_commit_whose_tree_is_not_the_approved_tree_is_taken_back_and_nothing_is_merged(
        finished, approver):
    """A patch that adds a file its own .gitignore ignores: the checkout has the file, but
    hashing the checkout leaves it out, so the commit would not hold the approved bytes."""
    search, winner, repo = finished
    patch = bytes(winner.patch) + IGNORED_IN_ITS_OWN_PATCH
    Candidate.objects.filter(pk=winner.pk).update(patch=patch, patch_sha256=hashlib.sha256(patch).hexdigest())
    winner = Candidate.objects.get(pk=winner.pk)
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    with pytest.raises(ValidationError, match=r"the commit's tree is not the baseline with the approved "
                                              r"patch applied .*; crucible/search-.* was put back"):
        services.merge_create(approver, search)
    assert git(repo, "branch", "--list", f"crucible/{search.search_id}") == ""
    assert not Merge.objects.exists()
    git(repo, "branch", "release", search.baseline_commit)
    with pytest.raises(ValidationError, match="release was put back"):
        services.merge_create(approver, search, target="existing_branch", branch="release")
    assert git(repo, "rev-parse", "release") == search.baseline_commit and not Merge.objects.exists()
