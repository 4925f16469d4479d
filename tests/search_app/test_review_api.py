"""Comment, approve, request changes and merge from the API and the CLI, side by side with the
pages: the same services, so the same refusals in the same words and the same merge commit."""

from __future__ import annotations

import dataclasses
import io
import subprocess

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.test import Client

from runtime_app.models import AuditEntry, ProjectMembership, Receipt
from runtime_app.services import api_token_create
from search_app.models import Approval, Candidate, Comment, Merge
from tests.helpers import login, make_user, text_of

pytestmark = pytest.mark.django_db(transaction=True)


def git(repo, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def api(user, url: str, body: dict):
    return login(user).post(url, body, content_type="application/json")


@dataclasses.dataclass
class Done:
    code: int
    out: str
    err: str


def cli(user, *args: str) -> Done:
    """`manage.py search …` in this process, as `user`: its exit code and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("search", *args, "--user", user.username, stdout=out, stderr=err)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    return Done(code, out.getvalue().strip(), err.getvalue().strip())


def page_decide(user, search, decision: str, patch_sha256: str):
    return login(user).post(f"/searches/{search.search_id}/candidates/cand_002/decide/",
                            {"decision": decision, "patch_sha256": patch_sha256})


def api_decide(user, search, route: str, patch_sha256: str):
    return api(user, f"/api/searches/{search.search_id}/candidates/cand_002/{route}",
               {"patch_sha256": patch_sha256})


@pytest.fixture
def config(settings):
    def change(**values):
        settings.CONFIG = dataclasses.replace(django_settings.CONFIG, **values)
    return change


# ------------------------------------------------------------------ approve then merge, three doors


@pytest.mark.parametrize("door", ["page", "api", "cli"])
def test_approving_then_merging_makes_the_same_merge_row_and_commit_through_every_door(
        finished, approver, door):
    search, winner, repo = finished
    branch = f"crucible/{search.search_id}"
    if door == "page":
        assert page_decide(approver, search, "approve", winner.patch_sha256).status_code == 302
        merged = login(approver).post(f"/searches/{search.search_id}/merge/", {"target": "new_branch"})
        assert merged.status_code == 302
    elif door == "api":
        decided = api_decide(approver, search, "approve", winner.patch_sha256)
        assert decided.status_code == 200
        assert decided.json() | {"id": 0, "created_at": ""} == {
            "id": 0, "search_id": search.search_id, "candidate_id": "cand_002", "decision": "approve",
            "patch_sha256": winner.patch_sha256, "user": "approver", "note": "", "created_at": "",
            "mergeable": True, "blocker": ""}
        again = api_decide(approver, search, "approve", winner.patch_sha256)  # a double submit
        assert again.json()["id"] == decided.json()["id"]
        merged = api(approver, f"/api/searches/{search.search_id}/merge", {})
        assert merged.status_code == 201
    else:
        decided = cli(approver, "approve", search.search_id, "cand_002",
                      "--patch-sha256", winner.patch_sha256)
        assert decided == Done(0, f"{search.search_id}: approver approved cand_002 (patch "
                                  f"{winner.patch_sha256[:12]}); ready to merge.", "")
        merged = cli(approver, "merge", search.search_id)
        assert merged.code == 0, merged.err
    merge = Merge.objects.get()
    assert (merge.search, merge.candidate, merge.target) == (search, winner, "new_branch")
    assert (merge.branch, merge.patch_sha256, merge.merged_by) == (branch, winner.patch_sha256, approver)
    if door == "api":
        assert merged.json() | {"created_at": ""} == {
            "search_id": search.search_id, "candidate_id": "cand_002", "target": "new_branch",
            "branch": branch, "commit_sha": merge.commit_sha, "patch_sha256": winner.patch_sha256,
            "merged_by": "approver", "receipt_id": merge.receipt_id, "created_at": ""}
    if door == "cli":
        assert merged.out == (f"{search.search_id}: merged cand_002 onto {branch} as {merge.commit_sha} "
                              "(not pushed)")
    assert Approval.objects.count() == 1
    assert git(repo, "rev-parse", branch) == merge.commit_sha
    assert git(repo, "rev-parse", f"{branch}^") == search.baseline_commit
    assert git(repo, "log", "-1", "--format=%(trailers:only,unfold)", branch).splitlines() == [
        f"Crucible-Search: {search.search_id}", f"Crucible-Preregistration: {search.preregistration_hash}",
        f"Crucible-Candidate: cand_002 {winner.patch_sha256}", "Approved-by: approver"]
    assert git(repo, "show", f"{branch}:code/answer.py") == "def answer():\n    return 9"
    assert Receipt.objects.get(kind="merge").detail["pushed"] is False
    assert list(AuditEntry.objects.filter(action__in=["approval.approve", "merge.create"])
                .order_by("id").values_list("action", flat=True)) == ["approval.approve", "merge.create"]


# ------------------------------------------------------------------ the same refusals, the same words


def test_a_viewer_and_an_operator_without_the_approver_role_are_refused_by_page_api_and_cli(
        finished, personas):
    search, winner, _ = finished
    viewer = make_user("viewer")
    ProjectMembership.objects.create(project=personas.alpha, user=viewer)
    for user, role in ((viewer, "viewer"), (personas.member, "operator")):
        words = f"This needs the approver role in alpha (yours is {role})."
        assert page_decide(user, search, "approve", winner.patch_sha256).status_code == 403
        for route in ("approve", "request-changes"):
            refused = api_decide(user, search, route, winner.patch_sha256)
            assert (refused.status_code, refused.json()["detail"]) == (403, words)
            done = cli(user, route, search.search_id, "cand_002", "--patch-sha256", winner.patch_sha256)
            assert (done.code, done.out, done.err) == (1, "", f"{user.username}: {words}")
        page = login(user).post(f"/searches/{search.search_id}/merge/", {"target": "new_branch"})
        assert page.status_code == 403
        refused = api(user, f"/api/searches/{search.search_id}/merge", {})
        assert (refused.status_code, refused.json()["detail"]) == (403, words)
        assert cli(user, "merge", search.search_id) == Done(1, "", f"{user.username}: {words}")
    assert not Approval.objects.exists() and not Merge.objects.exists()


def test_a_stale_patch_hash_is_refused_by_page_api_and_cli_in_the_same_words_and_the_api_says_409(
        finished, approver):
    search, winner, _ = finished
    stale = "a" * 64
    words = (f"The patch changed since you looked (now {winner.patch_sha256[:12]}): "
             "read it again, then decide.")
    page = page_decide(approver, search, "approve", stale)
    assert page.status_code == 400 and words in text_of(page)
    for route in ("approve", "request-changes"):
        refused = api_decide(approver, search, route, stale)
        assert refused.status_code == 409
        assert refused.json() == {"detail": f"patch_sha256: {words}", "errors": {"patch_sha256": [words]}}
        done = cli(approver, route, search.search_id, "cand_002", "--patch-sha256", stale)
        assert done == Done(1, "", words)
    # A hash that is not a SHA-256 at all is bad input, refused before anything is compared.
    refused = api_decide(approver, search, "approve", "nope")
    assert (refused.status_code, refused.json()["detail"]) == \
        (400, "patch_sha256: The patch hash is not a SHA-256.")
    assert cli(approver, "approve", search.search_id, "cand_002", "--patch-sha256", "nope") == \
        Done(1, "", "The patch hash is not a SHA-256.")
    missing = api(approver, f"/api/searches/{search.search_id}/candidates/cand_002/approve", {"note": "ok"})
    assert missing.status_code == 422  # the hash is required: a decision is bound to the patch read
    assert not Approval.objects.exists()


def test_self_approval_when_off_is_refused_by_page_api_and_cli_but_requesting_changes_is_not(
        finished, personas, config):
    search, winner, _ = finished
    owner = personas.owner  # froze the search, and has the approver role
    words = ("You froze this search, so someone else must approve its winner (an administrator can "
             "allow it with CRUCIBLE_SELF_APPROVAL=true).")
    page = page_decide(owner, search, "approve", winner.patch_sha256)
    assert page.status_code == 400 and words in text_of(page)
    refused = api_decide(owner, search, "approve", winner.patch_sha256)
    assert (refused.status_code, refused.json()["detail"]) == (400, words)
    done = cli(owner, "approve", search.search_id, "cand_002", "--patch-sha256", winner.patch_sha256)
    assert done == Done(1, "", words)
    assert not Approval.objects.exists()
    asked = api(owner, f"/api/searches/{search.search_id}/candidates/cand_002/request-changes",
                {"patch_sha256": winner.patch_sha256, "note": "rename it"})
    assert asked.status_code == 200
    assert (asked.json()["decision"], asked.json()["note"]) == ("request_changes", "rename it")
    assert (asked.json()["mergeable"], asked.json()["blocker"]) == (False, "owner requested changes.")
    config(self_approval=True)
    done = cli(owner, "approve", search.search_id, "cand_002", "--patch-sha256", winner.patch_sha256)
    assert done.code == 0 and done.out.endswith("owner approved cand_002 "
                                                f"(patch {winner.patch_sha256[:12]}); ready to merge.")


def test_merge_refusals_read_the_same_from_page_api_and_cli(finished, approver, config):
    search, winner, repo = finished
    merge_page = f"/searches/{search.search_id}/merge/"
    merge_api = f"/api/searches/{search.search_id}/merge"
    # Not enough approvals.
    config(required_approvals=2)
    api_decide(approver, search, "approve", winner.patch_sha256)
    words = "It needs 2 approvals on the current patch; it has 1."
    page = login(approver).post(merge_page, {"target": "new_branch"})
    assert page.status_code == 400 and words in text_of(page)
    assert api(approver, merge_api, {}).json() == {"detail": words, "errors": {"__all__": [words]}}
    assert cli(approver, "merge", search.search_id) == Done(1, "", words)
    config(required_approvals=1)
    # A branch name git would read as something else, and an existing branch that moved on.
    page = login(approver).post(merge_page, {"target": "new_branch", "branch": "HEAD"})
    refused = api(approver, merge_api, {"target": "new_branch", "branch": "HEAD"})
    done = cli(approver, "merge", search.search_id, "--branch", "HEAD")
    words = refused.json()["errors"]["branch"][0]
    assert refused.status_code == 400
    assert words.startswith("'HEAD' cannot be a branch: git reads it as a special ref")
    assert page.status_code == 400 and words in text_of(page) and done == Done(1, "", words)
    refused = api(approver, merge_api, {"target": "existing_branch", "branch": "nope"})
    assert (refused.status_code, refused.json()["detail"]) == (400, "branch: There is no branch nope.")
    assert cli(approver, "merge", search.search_id, "--target", "existing_branch", "--branch", "nope") == \
        Done(1, "", "There is no branch nope.")
    assert api(approver, merge_api, {"target": "elsewhere"}).status_code == 422
    # Stored bytes altered after the approval: the state moved on, so a 409.
    Candidate.objects.filter(pk=winner.pk).update(patch=bytes(winner.patch).replace(b"return 9", b"return 6"))
    altered = api(approver, merge_api, {})
    assert altered.status_code == 409 and "do not match the approved hash" in altered.json()["detail"]
    assert "do not match the approved hash" in cli(approver, "merge", search.search_id).err
    Candidate.objects.filter(pk=winner.pk).update(patch=winner.patch)
    assert not Merge.objects.exists()
    # Onto an existing branch at the baseline; then a second merge is a conflict.
    git(repo, "branch", "release", search.baseline_commit)
    done = cli(approver, "merge", search.search_id, "--target", "existing_branch", "--branch", "release")
    assert done.code == 0 and git(repo, "rev-parse", "release") == Merge.objects.get().commit_sha
    again = api(approver, merge_api, {})
    words = f"Merged already: release @ {Merge.objects.get().commit_sha[:12]}."
    assert (again.status_code, again.json()["detail"]) == (409, words)
    assert cli(approver, "merge", search.search_id) == Done(1, "", words)
    decided = api_decide(approver, search, "request-changes", winner.patch_sha256)
    assert (decided.status_code, decided.json()["detail"]) == (409, "This winner is merged already.")


# -------------------------------------------------------------------------------------- comments


def test_comments_from_the_api_and_the_cli_show_on_the_candidate_page(finished, personas):
    search, _, _ = finished
    url = f"/api/searches/{search.search_id}/candidates/cand_002/comments"
    made = api(personas.member, url, {"body": "Why 9?", "path": "code/answer.py", "line": 2})
    assert made.status_code == 201
    comment = Comment.objects.get()
    assert made.json() | {"created_at": ""} == {
        "id": comment.pk, "search_id": search.search_id, "candidate_id": "cand_002", "author": "member",
        "path": "code/answer.py", "line": 2, "side": "new", "body": "Why 9?", "created_at": "",
        "reply_to": None,
        "state": "open", "state_changed_by": "", "state_changed_at": None,
        "patch_sha256": comment.candidate.patch_sha256, "line_text": "    return 9"}
    done = cli(personas.owner, "comment", search.search_id, "cand_002", "Because it is bigger.")
    assert done.code == 0
    assert done.out == f"{search.search_id} cand_002: comment #{comment.pk + 1} by owner"
    page = text_of(login(personas.member).get(f"/searches/{search.search_id}/candidates/cand_002/"))
    assert "Why 9?" in page and "Because it is bigger." in page


def test_a_bad_comment_is_refused_by_page_api_and_cli_in_the_same_words(finished, personas):
    search, _, _ = finished
    words = "'../../etc/passwd' is not a file this candidate's patch changes."
    page = login(personas.member).post(f"/searches/{search.search_id}/candidates/cand_002/comment/",
                                       {"body": "x", "path": "../../etc/passwd"})
    assert page.status_code == 400 and words in text_of(page)
    url = f"/api/searches/{search.search_id}/candidates/cand_002/comments"
    refused = api(personas.member, url, {"body": "x", "path": "../../etc/passwd"})
    assert (refused.status_code, refused.json()["detail"]) == (400, f"path: {words}")
    done = cli(personas.member, "comment", search.search_id, "cand_002", "x", "--path", "../../etc/passwd")
    assert done == Done(1, "", words)
    refused = api(personas.member, url, {"body": "  ", "line": 3})
    assert refused.json()["errors"] == {"body": ["Write something."], "line": ["A line needs a file."]}
    assert not Comment.objects.exists()


def test_a_comment_on_a_line_the_diff_does_not_show_is_refused_by_page_api_and_cli_in_the_same_words(
        finished, personas):
    search, _, _ = finished
    words = "Line 3 of code/answer.py is not in this candidate's diff (it shows lines 1–2)."
    page = login(personas.member).post(f"/searches/{search.search_id}/candidates/cand_002/comment/",
                                       {"body": "x", "path": "code/answer.py", "line": "3"})
    assert page.status_code == 400 and words in text_of(page)
    url = f"/api/searches/{search.search_id}/candidates/cand_002/comments"
    refused = api(personas.member, url, {"body": "x", "path": "code/answer.py", "line": 3})
    assert (refused.status_code, refused.json()["detail"]) == (400, f"line: {words}")
    done = cli(personas.member, "comment", search.search_id, "cand_002", "x",
               "--path", "code/answer.py", "--line", "3")
    assert done == Done(1, "", words)
    assert not Comment.objects.exists()
    # Line 1 is a context line of the hunk: a comment may anchor there.
    assert api(personas.member, url, {"body": "x", "path": "code/answer.py", "line": 1}).status_code == 201


# ------------------------------------------------------------------------- who may call at all


def test_outsiders_get_404_and_a_session_needs_csrf_while_a_bearer_token_does_not(
        finished, personas, approver):
    search, winner, _ = finished
    base = f"/api/searches/{search.search_id}"
    calls = [(f"{base}/candidates/cand_002/comments", {"body": "hi"}),
             (f"{base}/candidates/cand_002/request-changes", {"patch_sha256": winner.patch_sha256,
                                                              "note": "rename it"}),
             (f"{base}/candidates/cand_002/approve", {"patch_sha256": winner.patch_sha256}),
             (f"{base}/merge", {})]
    for url, body in calls:
        assert api(personas.outsider, url, body).status_code == 404
    assert api(approver, f"{base}/candidates/cand_999/approve", {"patch_sha256": winner.patch_sha256}) \
        .status_code == 404
    assert cli(personas.outsider, "merge", search.search_id) == \
        Done(1, "", f"no candidate or search {search.search_id!r} that outsider can see")
    session = Client(enforce_csrf_checks=True)
    session.force_login(approver)
    for url, body in calls:
        assert session.post(url, body, content_type="application/json").status_code in {401, 403}
    assert not Comment.objects.exists() and not Approval.objects.exists()
    _, token = api_token_create(approver, "ci")
    bearer = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    for url, body in calls:
        assert bearer.post(url, body, content_type="application/json").status_code in {200, 201}
    assert Merge.objects.get().merged_by == approver
    # Resolving a thread: not found for an outsider, CSRF for a session, fine with a token.
    resolve = f"{base}/candidates/cand_002/comments/{Comment.objects.get().pk}/resolve"
    assert api(personas.outsider, resolve, {}).status_code == 404
    assert session.post(resolve, {}, content_type="application/json").status_code in {401, 403}
    assert bearer.post(resolve, {}, content_type="application/json").json()["state"] == "resolved"


# ------------------------------------------------------------------ a request for changes says what


def test_a_request_for_changes_without_a_note_is_refused_by_page_api_and_cli(finished, approver):
    search, winner, _ = finished
    words = "Say what should change: a request for changes needs a note (what to fix, and why)."
    page = login(approver).post(f"/searches/{search.search_id}/candidates/cand_002/decide/",
                                {"decision": "request_changes", "patch_sha256": winner.patch_sha256,
                                 "note": "  \n "})
    assert page.status_code == 400 and words in text_of(page)
    refused = api(approver, f"/api/searches/{search.search_id}/candidates/cand_002/request-changes",
                  {"patch_sha256": winner.patch_sha256, "note": " "})
    assert refused.status_code == 400 and refused.json()["errors"] == {"note": [words]}
    done = cli(approver, "request-changes", search.search_id, "cand_002", "--patch-sha256",
               winner.patch_sha256)
    assert done == Done(1, "", words)
    assert not Approval.objects.exists()
    # With a note it stands; approving needs none.
    asked = api(approver, f"/api/searches/{search.search_id}/candidates/cand_002/request-changes",
                {"patch_sha256": winner.patch_sha256, "note": "rename it"})
    assert asked.status_code == 200 and asked.json()["note"] == "rename it"
