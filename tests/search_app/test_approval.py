"""Comments, approvals bound to the patch hash, and merges onto real branches (checked with git)."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.test import modify_settings

from runtime_app import access
from runtime_app.models import AuditEntry, Event, ProjectMembership, Receipt
from runtime_app.services import project_member_add, project_member_remove, project_member_role_set
from search_app import services
from search_app.models import Approval, Candidate, Merge
from search_app.selectors import approval_state
from tests.helpers import login, make_user, text_of
from tests.search_app.runs import frozen, run_inline

pytestmark = pytest.mark.django_db(transaction=True)


def git(repo, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def config(settings):
    def change(**values):
        settings.CONFIG = dataclasses.replace(django_settings.CONFIG, **values)
    return change


def test_an_approved_winner_merges_onto_a_new_branch_with_its_trailers(finished, approver):
    search, winner, repo = finished
    head_before = git(repo, "rev-parse", "HEAD")
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    merge = services.merge_create(approver, search)
    branch = f"crucible/{search.search_id}"
    assert merge.branch == branch and git(repo, "rev-parse", branch) == merge.commit_sha
    assert git(repo, "rev-parse", f"{branch}^") == search.baseline_commit
    trailers = git(repo, "log", "-1", "--format=%(trailers:only,unfold)", branch).splitlines()
    assert trailers == [f"Crucible-Search: {search.search_id}",
                        f"Crucible-Preregistration: {search.preregistration_hash}",
                        f"Crucible-Candidate: cand_002 {winner.patch_sha256}",
                        "Approved-by: approver"]
    assert git(repo, "show", f"{branch}:code/answer.py") == "def answer():\n    return 9"
    identities = git(repo, "log", "-1", "--format=%an <%ae>|%cn", branch)
    assert identities == "approver <approver@crucible.invalid>|Crucible"
    # Nothing else moved: the checked-out branch and the working tree are as they were.
    assert git(repo, "rev-parse", "HEAD") == head_before and git(repo, "status", "--porcelain") == ""
    assert Receipt.objects.get(kind="merge").detail["pushed"] is False
    assert list(AuditEntry.objects.filter(action__in=["approval.approve", "merge.create"])
                .values_list("action", flat=True).order_by("id")) == ["approval.approve", "merge.create"]
    with pytest.raises(ValidationError, match="Merged already"):
        services.merge_create(approver, search)


def test_only_approvers_who_are_members_may_approve_or_merge(finished, personas, approver):
    search, winner, _ = finished
    viewer = make_user("viewer")
    ProjectMembership.objects.create(project=personas.alpha, user=viewer)
    for user in (viewer, personas.member, personas.outsider):  # viewer; operator only; not a member
        with pytest.raises(PermissionDenied):
            services.approval_record(user, winner, "approve", winner.patch_sha256)
        with pytest.raises(PermissionDenied):
            services.merge_create(user, search)
    assert not Approval.objects.exists() and not Merge.objects.exists()


def test_merging_needs_the_required_number_of_standing_approvals(finished, approver, personas, config):
    search, winner, _ = finished
    with pytest.raises(ValidationError, match="needs 1 approval on the current patch; it has 0"):
        services.merge_create(approver, search)
    config(required_approvals=2)
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    with pytest.raises(ValidationError, match="needs 2 approvals"):
        services.merge_create(approver, search)
    config(required_approvals=2, self_approval=True)
    services.approval_record(personas.owner, winner, "approve", winner.patch_sha256)
    assert services.merge_create(approver, search).commit_sha


def test_the_author_may_not_approve_their_own_search_unless_allowed(finished, personas, config):
    _, winner, _ = finished
    with pytest.raises(ValidationError, match="someone else must approve"):
        services.approval_record(personas.owner, winner, "approve", winner.patch_sha256)
    # Requesting changes is always open to the author.
    services.approval_record(personas.owner, winner, "request_changes", winner.patch_sha256, "rename it")
    config(self_approval=True)
    services.approval_record(personas.owner, winner, "approve", winner.patch_sha256)
    assert approval_state(winner)["mergeable"]


def test_an_approval_goes_stale_when_the_patch_hash_changes(finished, approver):
    search, winner, _ = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    assert approval_state(winner)["mergeable"]
    winner.patch_sha256 = "0" * 64  # the winner's patch is no longer the one that was approved
    winner.save(update_fields=["patch_sha256"])
    state = approval_state(winner)
    assert not state["mergeable"] and len(state["stale"]) == 1 and not state["standing_approvals"]
    with pytest.raises(ValidationError, match="it has 0"):
        services.merge_create(approver, search)
    # Approving with the hash one saw before is refused: the page must be read again.
    with pytest.raises(ValidationError, match="The patch changed since you looked"):
        services.approval_record(approver, winner, "approve", "f" * 64)


def test_double_submitting_an_approval_is_harmless(finished, approver):
    _, winner, _ = finished
    first = services.approval_record(approver, winner, "approve", winner.patch_sha256)
    again = services.approval_record(approver, winner, "approve", winner.patch_sha256)
    assert again.pk == first.pk and Approval.objects.count() == 1
    assert AuditEntry.objects.filter(action="approval.approve").count() == 1


def test_a_request_for_changes_blocks_the_merge_until_its_author_approves(finished, approver):
    search, winner, _ = finished
    services.approval_record(approver, winner, "request_changes", winner.patch_sha256, note="rename it")
    state = approval_state(winner)
    assert state["blocker"] == "approver requested changes."
    with pytest.raises(ValidationError, match="requested changes"):
        services.merge_create(approver, search)
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    assert approval_state(winner)["mergeable"] and Approval.objects.count() == 2


def test_only_the_winner_of_a_finished_search_is_approved(finished, approver):
    search, winner, _ = finished
    loser = search.candidates.get(candidate_id="cand_001")
    with pytest.raises(ValidationError, match="cand_001 is not this search's winner"):
        services.approval_record(approver, loser, "approve", loser.patch_sha256)
    with pytest.raises(ValidationError, match="Choose approve or request changes"):
        services.approval_record(approver, winner, "merge-it-now", winner.patch_sha256)


def test_a_none_search_has_nothing_to_approve_or_merge(personas, approver, tmp_path, data_dir):
    search = frozen(personas, tmp_path, {"cand_001": "broken", "cand_002": "broken"}, population=2,
                    rounds=[2, 1])
    assert run_inline(personas, search).outcome == "NONE"
    candidate = search.candidates.get(candidate_id="cand_001")
    with pytest.raises(ValidationError, match="ended with NONE"):
        services.approval_record(approver, candidate, "approve", candidate.patch_sha256)
    with pytest.raises(ValidationError, match="ended with NONE"):
        services.merge_create(approver, search)


def test_an_existing_branch_is_used_only_while_it_still_points_at_the_baseline(finished, approver):
    search, winner, repo = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    git(repo, "branch", "moved", search.baseline_commit)
    git(repo, "branch", "release", search.baseline_commit)
    (repo / "extra.txt").write_text("x\n")
    git(repo, "-c", "core.hooksPath=/dev/null", "checkout", "-q", "moved")
    git(repo, "add", "extra.txt")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "moved on")
    with pytest.raises(ValidationError, match="moved has moved on from the baseline"):
        services.merge_create(approver, search, target="existing_branch", branch="moved")
    with pytest.raises(ValidationError, match="There is no branch nope"):
        services.merge_create(approver, search, target="existing_branch", branch="nope")
    git(repo, "branch", f"crucible/{search.search_id}", search.baseline_commit)
    with pytest.raises(ValidationError, match="exists already"):
        services.merge_create(approver, search)
    merge = services.merge_create(approver, search, target="existing_branch", branch="release")
    assert git(repo, "rev-parse", "release") == merge.commit_sha
    assert git(repo, "rev-parse", "release^") == search.baseline_commit


def test_comments_name_a_changed_file_and_a_line(finished, personas):
    _, winner, _ = finished
    comment = services.comment_add(personas.member, winner, "Why 9?", path="code/answer.py", line=2)
    assert (comment.path, comment.line, comment.author_name) == ("code/answer.py", 2, "member")
    with pytest.raises(ValidationError) as raised:
        services.comment_add(personas.member, winner, "  ", path="nope.py", line=0)
    assert set(raised.value.message_dict) == {"body", "path", "line"}
    with pytest.raises(PermissionDenied):
        services.comment_add(personas.outsider, winner, "hi")


def test_the_lines_a_comment_may_anchor_on_are_the_added_and_context_lines_of_that_files_hunks():
    from search_app.diffs import diff_new_lines

    patch = ("diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n"
             "@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
             "@@ -10,2 +10,3 @@\n ten\n+ten and a half\n eleven\n\\ No newline at end of file\n"
             "diff --git a/gone.py b/gone.py\n--- a/gone.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"
             "diff --git a/b.py b/b.py\n--- a/b.py\n+++ b/b.py\n@@ -5,0 +6 @@\n+six\n")
    assert diff_new_lines(patch, "a.py") == [1, 2, 3, 10, 11, 12]
    assert diff_new_lines(patch, "b.py") == [6]
    assert diff_new_lines(patch, "gone.py") == []  # a deleted file has no new line to comment on
    assert diff_new_lines(patch, "elsewhere.py") == []


def test_a_merge_whose_commit_was_made_before_a_crash_is_adopted_not_repeated(finished, approver):
    """The process died after the dulwich commit and before the database row: merging again
    records that commit instead of refusing the branch or committing twice."""
    search, winner, repo = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    made = services.decisions._merge_commit(search, winner, f"crucible/{search.search_id}", "new_branch",
                                            approver, "approver")
    assert not Merge.objects.exists()
    merge = services.merge_create(approver, search)
    assert merge.commit_sha == made and Receipt.objects.get(kind="merge").detail["adopted"] is True
    assert git(repo, "rev-list", "--count", f"{search.baseline_commit}..crucible/{search.search_id}") == "1"


# ------------------------------------------------------------- an approver who may no longer decide


def withdrawals(user) -> list[str]:
    return list(AuditEntry.objects.filter(action="approval.withdraw", detail__user=user.username)
                .values_list("target", flat=True))


def assert_withdrawn_and_unmergeable(search, winner, approver, merger) -> None:
    """The approval no longer counts, the merge is refused, and the withdrawal is on record."""
    state = approval_state(winner)
    assert not state["mergeable"] and not state["standing_approvals"]
    with pytest.raises(ValidationError, match="it has 0"):
        services.merge_create(merger, search)
    assert not Merge.objects.exists()
    assert withdrawals(approver) == [f"{search.search_id} {winner.candidate_id}"]
    assert Event.objects.filter(kind="approval.withdrawn", payload__candidate_id=winner.candidate_id).exists()
    assert Approval.objects.get(user=approver).withdrawn_at is not None


def test_an_approval_stops_counting_when_its_approver_is_removed_from_the_project(finished, approver,
                                                                                   personas):
    search, winner, _ = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    project_member_remove(personas.owner, personas.alpha, approver)
    assert_withdrawn_and_unmergeable(search, winner, approver, personas.owner)
    entry = AuditEntry.objects.get(action="approval.withdraw")
    assert entry.actor == personas.owner and entry.project == personas.alpha
    assert AuditEntry.objects.filter(action="project.member_remove", target="approver").exists()
    page = text_of(login(personas.owner).get(f"/searches/{search.search_id}/candidates/cand_002/"))
    assert "withdrawn: approver was removed from alpha" in page


def test_deleting_the_membership_with_the_orm_withdraws_the_approval(finished, approver, personas):
    search, winner, _ = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    ProjectMembership.objects.filter(project=personas.alpha, user=approver).delete()
    assert_withdrawn_and_unmergeable(search, winner, approver, personas.owner)


@modify_settings(MIDDLEWARE={"append": "runtime_app.signals.AuditActorMiddleware"})
def test_deleting_the_membership_in_the_admin_withdraws_the_approval(finished, approver, personas):
    search, winner, _ = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    root = get_user_model().objects.create_superuser("root", password="pw-root")
    membership = ProjectMembership.objects.get(project=personas.alpha, user=approver)
    response = login(root).post(f"/admin/runtime_app/projectmembership/{membership.pk}/delete/",
                                {"post": "yes"})
    assert response.status_code == 302 and not ProjectMembership.objects.filter(pk=membership.pk).exists()
    assert_withdrawn_and_unmergeable(search, winner, approver, personas.owner)
    assert AuditEntry.objects.get(action="approval.withdraw").actor == root


@pytest.mark.parametrize("door", ["service", "admin", "orm.save", "user.is_active"])
def test_an_approval_stops_counting_when_its_approver_loses_the_approver_role(
        finished, approver, personas, config, door):
    search, winner, _ = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    membership = ProjectMembership.objects.get(project=personas.alpha, user=approver)
    if door == "service":
        project_member_role_set(personas.owner, personas.alpha, approver, access.OPERATOR)
    elif door == "admin":
        root = get_user_model().objects.create_superuser("root", password="pw-root")
        response = login(root).post(f"/admin/runtime_app/projectmembership/{membership.pk}/change/",
                                    {"project": personas.alpha.pk, "user": approver.pk, "role": "viewer"})
        assert response.status_code == 302, response.content.decode()[:2000]
    elif door == "orm.save":
        membership.role = access.VIEWER
        membership.save()
    else:
        approver.is_active = False
        approver.save()
    assert_withdrawn_and_unmergeable(search, winner, approver, personas.owner)


def test_a_role_lowered_behind_every_hook_no_longer_counts(finished, approver, personas):
    """The read side stands alone: an UPDATE that sends no signal still takes the approval away."""
    _, winner, _ = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    ProjectMembership.objects.filter(user=approver).update(role=access.OPERATOR)
    assert not approval_state(winner)["mergeable"]


def test_a_superuser_who_loses_the_flag_keeps_deciding_only_where_their_role_allows(
        finished, approver, personas):
    _, winner, _ = finished
    root = get_user_model().objects.create_superuser("root", password="pw-root")
    services.approval_record(root, winner, "approve", winner.patch_sha256)
    assert approval_state(winner)["mergeable"]
    root.is_superuser = False
    root.save()
    assert Approval.objects.get(user=root).withdrawn_at is not None
    assert not approval_state(winner)["mergeable"]


def test_a_departed_approver_never_counts_even_if_no_hook_saw_them_leave(finished, approver, personas):
    """The read side stands alone: a membership row removed behind every hook's back."""
    search, winner, _ = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    ProjectMembership.objects.filter(user=approver)._raw_delete(using="default")  # no signal is sent
    state = approval_state(winner)
    assert not state["mergeable"] and not state["standing_approvals"]
    with pytest.raises(ValidationError, match="it has 0"):
        services.merge_create(personas.owner, search)


def test_a_withdrawn_approval_stays_withdrawn_when_its_approver_comes_back(finished, approver, personas):
    search, winner, _ = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    project_member_remove(personas.owner, personas.alpha, approver)
    project_member_add(personas.owner, personas.alpha, approver, access.APPROVER)
    assert not approval_state(winner)["mergeable"]
    again = services.approval_record(approver, winner, "approve", winner.patch_sha256)  # decides anew
    assert again.withdrawn_at is None and approval_state(winner)["mergeable"]
    assert services.merge_create(approver, search).commit_sha


def test_a_merged_winners_approvals_are_history_and_are_not_withdrawn(finished, approver, personas):
    search, winner, _ = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    services.merge_create(approver, search)
    project_member_remove(personas.owner, personas.alpha, approver)
    assert Approval.objects.get(user=approver).withdrawn_at is None and not withdrawals(approver)


def test_a_request_for_changes_by_someone_who_left_no_longer_blocks(finished, approver, personas):
    _, winner, _ = finished
    services.approval_record(approver, winner, "request_changes", winner.patch_sha256, "rename it")
    second = make_user("second")
    ProjectMembership.objects.create(project=personas.alpha, user=second, role=access.APPROVER)
    services.approval_record(second, winner, "approve", winner.patch_sha256)
    assert "requested changes" in approval_state(winner)["blocker"]
    project_member_remove(personas.owner, personas.alpha, approver)
    assert approval_state(winner)["mergeable"]


# ------------------------------------------------------------------------- merge checks the bytes


def test_patch_bytes_altered_after_approval_are_refused_and_no_branch_is_made(finished, approver):
    search, winner, repo = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    altered = bytes(winner.patch).replace(b"return 9", b"return 6")
    assert altered != bytes(winner.patch)
    Candidate.objects.filter(pk=winner.pk).update(patch=altered)  # the stored hash still says "approved"
    with pytest.raises(ValidationError, match="do not match the approved hash"):
        services.merge_create(approver, search)
    assert not Merge.objects.exists() and not Receipt.objects.filter(kind="merge").exists()
    assert git(repo, "branch", "--list", f"crucible/{search.search_id}") == ""
    refusal = AuditEntry.objects.get(action="merge.refuse")
    assert refusal.actor == approver and refusal.detail["approved_sha256"] == winner.patch_sha256
    assert refusal.detail["actual_sha256"] == hashlib.sha256(altered).hexdigest()


def test_altered_bytes_are_refused_even_where_an_earlier_merge_commit_would_be_adopted(finished, approver):
    search, winner, _ = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    branch = f"crucible/{search.search_id}"
    services.decisions._merge_commit(search, winner, branch, "new_branch", approver,
                                     "approver")  # then a crash
    Candidate.objects.filter(pk=winner.pk).update(patch=bytes(winner.patch).replace(b"return 9", b"return 6"))
    with pytest.raises(ValidationError, match="do not match the approved hash"):
        services.merge_create(approver, search)
    assert not Merge.objects.exists() and AuditEntry.objects.filter(action="merge.refuse").count() == 1


def test_the_merge_commit_itself_refuses_bytes_that_do_not_hash_to_the_approved_patch(finished, approver):
    search, winner, repo = finished
    Candidate.objects.filter(pk=winner.pk).update(patch=bytes(winner.patch).replace(b"return 9", b"return 6"))
    with pytest.raises(ValidationError, match="do not match the approved hash"):
        services.decisions._merge_commit(search, Candidate.objects.get(pk=winner.pk), "side", "new_branch",
                                         approver, "approver")
    assert git(repo, "branch", "--list", "side") == ""


# ------------------------------------------------------------------------------- branch names

BAD_BRANCHES = ["-evil", "HEAD", "ORIG_HEAD", "FETCH_HEAD", "MERGE_HEAD", "CHERRY_PICK_HEAD", "refs/heads/x",
                "a..b", "x.lock", "a b", "~x", "@", "x/", "a:b", "a\x01b", "x" * 300]


def test_branch_names_git_would_refuse_or_read_as_head_are_refused(finished, approver):
    search, winner, repo = finished
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    branches_before = git(repo, "for-each-ref", "--format=%(refname)")
    for name in BAD_BRANCHES:
        for target in ("new_branch", "existing_branch"):
            with pytest.raises(ValidationError) as raised:
                services.merge_create(approver, search, target=target, branch=name)
            assert "valid branch name looks like" in raised.value.message_dict["branch"][0], name
    assert git(repo, "for-each-ref", "--format=%(refname)") == branches_before
    assert not Merge.objects.exists() and not AuditEntry.objects.filter(action="merge.create").exists()
    assert services.merge_create(approver, search, branch="feature/faster-answer_2").branch == \
        "feature/faster-answer_2"
