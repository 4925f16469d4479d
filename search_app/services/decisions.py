"""Review, approval and merge.

A person decides; the reviewer's verdict is advice. An approval is bound to the exact patch
hash the approver was shown, so a changed patch leaves it stale. A merge needs enough
standing approvals, makes one commit with dulwich on a new or unmoved branch, and never pushes.
A decision is withdrawn when its maker may no longer decide; a merge commits only bytes whose
SHA-256 is the approved one, onto a branch name git reads as a plain branch and people read as
what it is (printable ASCII). A commit found on the branch is adopted only if its tree is the
baseline's with those bytes applied.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from pathlib import Path
from time import monotonic
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from dulwich.objects import Commit, ObjectID
from dulwich.refs import Ref, check_ref_format

from runtime_app import access, remotes
from runtime_app.git import GitError, commit_create, repo_open
from runtime_app.models import Project, Receipt
from runtime_app.names import name_refusal
from runtime_app.presenters import short_sha
from runtime_app.services import audit_record, receipt_record
from runtime_app.worktrees import object_scratch, patch_stage, tree_checkout, worktree_remove
from search_app.models import Approval, Candidate, Comment, Merge, Search, SearchRun
from search_app.selectors import (
    REVISING,
    approval_state,
    decision_refusals,
    diff_line_texts,
    line_ranges_text,
    winner_replay,
)
from search_app.services._common import _search_event, _winner_reason_refresh

if TYPE_CHECKING:
    from django.contrib.auth.models import User

MAX_COMMENT_CHARS = 10_000


MAX_BRANCH_CHARS = 200
_ASCII_SPACE = " \t\r\n"  # only these are trimmed: any other space is refused, never silently dropped


VALID_BRANCH_HINT = ("A valid branch name looks like crucible/faster-parser or feature/x-2: ASCII letters, "
                     "digits and . _ - / ; it does not start with '-', '.', '/' or 'refs/', is not HEAD or "
                     "another *_HEAD name, has no spaces, '..', '~^:?*[\\' or control characters and does "
                     "not end in '/', '.' or '.lock'.")


class Conflict(ValidationError):
    """A refusal because the state moved on from what the caller saw (a stale patch hash, a
    winner merged already, stored bytes that no longer match): the API answers 409."""


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _user_name(user: User) -> str:
    return user.get_username()


def comment_add(user: User, candidate: Candidate, body: str, path: str = "", line: int | None = None,
                reply_to: int | None = None, side: str | None = None) -> Any:
    """A project member's comment on a candidate. Without `reply_to` it starts a thread on the
    candidate, one file, or one line the diff shows on one side (`side` "new", the default: the
    file after the patch; "old": before it, a deleted or context line), keeping the patch hash and
    the line's text so a refinement can mark it outdated; with it, a reply in that thread, which has
    no place of its own."""
    access.require(user, access.VIEWER, candidate.search.project)
    body = (body or "").strip()
    errors = {}
    if not body:
        errors["body"] = "Write something."
    elif len(body) > MAX_COMMENT_CHARS:
        errors["body"] = f"Keep a comment under {MAX_COMMENT_CHARS:,} characters ({len(body):,} now)."
    path = (path or "").strip()
    side_given = side not in (None, "")
    side = str(side).strip().lower() if side_given else Comment.Side.NEW
    if side not in Comment.Side.values:
        errors["side"] = (f"{side!r} is not a side of the diff: give \"old\" (the file before the patch) "
                          "or \"new\" (after it).")
    elif side_given and line is None and reply_to is None:
        errors["side"] = "A side belongs to a line: give the line too, or no side."
    thread = None
    if reply_to is not None:
        thread = _thread_of(candidate, reply_to, "reply to", "reply_to")
        if path or line is not None or side_given:
            errors["reply_to"] = ("A reply belongs to its thread's place; give it no file or line "
                                  f"(thread #{thread.pk} is on {_place(thread)}).")
    elif path and path not in (candidate.files or []):
        errors["path"] = f"{path!r} is not a file this candidate's patch changes."
    if thread is None and line is not None and not path:
        errors["line"] = "A line needs a file."
    elif thread is None and line is not None and not 1 <= line <= 10_000_000:
        errors["line"] = "Give a line number from 1."
    elif thread is None and line is not None and "path" not in errors and "side" not in errors:
        errors.update(_line_in_diff_errors(candidate, path, line, side))
    if errors:
        raise ValidationError(errors)
    line_text = ""
    if thread is None and line is not None:
        line_text = diff_line_texts(_patch_text(candidate), path, side).get(line, "")
    else:
        side = Comment.Side.NEW  # only a line has a side; others keep the column's default
    with transaction.atomic():
        comment = Comment.objects.create(
            candidate=candidate, reply_to=thread, author=user, author_name=_user_name(user),
            path=path, line=line, side=side, body=body, patch_sha256=candidate.patch_sha256,
            line_text=line_text)
        if thread is not None:
            what = f"replied to thread #{thread.pk} on {candidate.candidate_id}"
        else:
            what = f"commented on {candidate.candidate_id}" + (f" on {_place(comment)}" if path else "")
        _search_event(candidate.search, "candidate.comment", f"{_user_name(user)} {what}",
                      candidate_id=candidate.candidate_id, comment=comment.pk, thread=(thread or comment).pk)
    return comment


def _patch_text(candidate: Candidate) -> str:
    return bytes(candidate.patch or b"").decode(errors="replace")


def _place(comment: Any) -> str:
    if not comment.path:
        return "the whole candidate"
    if not comment.line:
        return comment.path
    return f"{comment.path}:{comment.line}" + (" (old)" if comment.side == Comment.Side.OLD else "")


def _thread_of(candidate: Candidate, comment_id: Any, verb: str, field: str | None = None) -> Any:
    """The thread `comment_id` names on this candidate, or a refusal in the words every door uses
    (as an error of `field`, or of the whole request). A comment of another candidate, or of a
    project the user cannot see, reads as not existing."""

    def refuse(message: str) -> ValidationError:
        return ValidationError({field: message} if field else message)

    try:
        number = int(comment_id)
    except (TypeError, ValueError):
        raise refuse(f"{comment_id!r} is not a comment number.") from None
    comment = Comment.objects.filter(pk=number, candidate=candidate).first()
    if comment is None:
        raise refuse(f"#{number} is not a comment on this candidate ({candidate.candidate_id}).")
    if comment.reply_to_id is not None:
        raise refuse(f"#{number} is a reply; {verb} its thread (#{comment.reply_to_id}) instead.")
    return comment


def thread_resolve(user: User, candidate: Candidate, comment_id: Any) -> Any:
    """Mark a thread resolved (any project member). Resolving a resolved thread changes nothing."""
    return _thread_state_set(user, candidate, comment_id, Comment.State.RESOLVED)


def thread_reopen(user: User, candidate: Candidate, comment_id: Any) -> Any:
    """Open a resolved thread again (any project member). Reopening an open thread changes nothing."""
    return _thread_state_set(user, candidate, comment_id, Comment.State.OPEN)


def _thread_state_set(user: User, candidate: Candidate, comment_id: Any, state: str) -> Any:
    search = candidate.search
    access.require(user, access.VIEWER, search.project)
    verb = "resolve" if state == Comment.State.RESOLVED else "reopen"
    with transaction.atomic():
        thread = _thread_of(candidate, comment_id, verb)
        thread = Comment.objects.select_for_update().get(pk=thread.pk)
        if thread.state == state:
            return thread  # a double click, or someone else was first: harmless
        thread.state = state
        thread.state_changed_by, thread.state_changed_by_name = user, _user_name(user)
        thread.state_changed_at = timezone.now()
        thread.save(update_fields=["state", "state_changed_by", "state_changed_by_name", "state_changed_at"])
        audit_record(user, f"comment.{verb}", project=search.project,
                     target=f"{search.search_id} {candidate.candidate_id} #{thread.pk}",
                     detail={"comment": thread.pk, "candidate": candidate.candidate_id})
        done = "resolved" if state == Comment.State.RESOLVED else "reopened"
        _search_event(search, f"candidate.comment.{done}",
                      f"{_user_name(user)} {done} thread #{thread.pk} on {candidate.candidate_id}",
                      candidate_id=candidate.candidate_id, thread=thread.pk, state=state)
    return thread


def _line_in_diff_errors(candidate: Candidate, path: str, line: int, side: str) -> dict[str, str]:
    """A line comment anchors on a line the diff shows on its side, or a reader could never find it."""
    shown = list(diff_line_texts(_patch_text(candidate), path, side))
    if line in shown:
        return {}
    if side == Comment.Side.NEW:
        where = f"it shows lines {line_ranges_text(shown)}" if shown else "it shows no line of the new file"
        return {"line": f"Line {line} of {path} is not in this candidate's diff ({where})."}
    where = (f"there it shows lines {line_ranges_text(shown)} of the file before the patch" if shown
             else "it shows no line of the file before the patch")
    return {"line": f"Line {line} of {path} is not on the old side of this candidate's diff ({where})."}


def _winner_of(search: Search) -> Any:
    run = SearchRun.objects.filter(search=search).select_related("winner").first()
    if run is not None and run.phase == SearchRun.Phase.REVISE:
        raise ValidationError(REVISING)
    if run is None or run.status != SearchRun.Status.FINISHED or run.outcome != SearchRun.WINNER \
            or run.winner is None:
        raise ValidationError("Only a finished search's winner can be approved or merged; "
                              "this search has none yet." if not run or run.outcome != SearchRun.NONE
                              else "This search ended with NONE: there is nothing to approve or merge.")
    return run.winner


# A request for changes the writer and the team can act on says what to change.
REQUEST_CHANGES_NOTE = "Say what should change: a request for changes needs a note (what to fix, and why)."


def approval_record(user: User, candidate: Candidate, decision: str, patch_sha256: str,
                    note: str = "") -> Approval:
    """An approver's decision on a winner, bound to the patch hash they confirmed.

    Submitting the same decision on the same hash again returns the standing one (a double
    click is harmless). A later decision by the same person replaces theirs.
    """
    search = candidate.search
    access.require(user, access.APPROVER, search.project)
    if decision not in Approval.Decision.values:
        raise ValidationError({"decision": "Choose approve or request changes."})
    if not _SHA256_HEX.fullmatch(patch_sha256 or ""):
        raise ValidationError({"patch_sha256": "The patch hash is not a SHA-256."})
    if len(note or "") > MAX_COMMENT_CHARS:
        raise ValidationError({"note": f"Keep the note under {MAX_COMMENT_CHARS:,} characters."})
    with transaction.atomic():
        winner = _winner_of(search)
        candidate = type(candidate).objects.select_for_update().get(pk=candidate.pk)
        if candidate.pk != winner.pk:
            raise ValidationError(f"{candidate.candidate_id} is not this search's winner "
                                  f"({winner.candidate_id}); only the winner is approved or merged.")
        if Merge.objects.filter(search=search).exists():
            raise Conflict("This winner is merged already.")
        if patch_sha256 != candidate.patch_sha256:
            raise Conflict({"patch_sha256": "The patch changed since you looked "
                            f"(now {short_sha(candidate.patch_sha256)}): read it again, then decide."})
        refused = decision_refusals(user, search)[decision]
        if refused:
            raise ValidationError(refused)
        if decision == Approval.Decision.REQUEST_CHANGES and not (note or "").strip():
            raise ValidationError({"note": REQUEST_CHANGES_NOTE})
        standing = approval_state(candidate)["decisions"].get(user.pk)
        if (standing is not None and standing.decision == decision and not standing.stale
                and standing.withdrawn_at is None):
            return standing
        replay = winner_replay(search)
        approval = Approval.objects.create(
            candidate=candidate, user=user, user_name=_user_name(user), decision=decision,
            patch_sha256=patch_sha256, replay=replay["why"] if replay else "", note=(note or "").strip())
        action = "approval.approve" if decision == Approval.Decision.APPROVE else "approval.request_changes"
        audit_record(user, action, project=search.project,
                     target=f"{search.search_id} {candidate.candidate_id}",
                     detail={"patch_sha256": patch_sha256})
        verb = "approved" if decision == Approval.Decision.APPROVE else "requested changes to"
        _winner_reason_refresh(candidate)
        _search_event(search, f"approval.{decision}", f"{_user_name(user)} {verb} {candidate.candidate_id} "
                      f"(patch {short_sha(patch_sha256)})", candidate_id=candidate.candidate_id,
                      state=candidate.state, reason=candidate.reason)
    return approval


def approvals_withdraw(actor: User, user: User, *, project: Project | None = None, reason: str) -> int:
    """Withdraw, for good, the decisions `user` made on winners not merged yet (in `project`,
    or in every project): they left it or lost the approve permission. Each candidate's
    withdrawal is audited and announced; returns how many decisions were withdrawn."""
    pending = Approval.objects.filter(user=user, withdrawn_at__isnull=True,
                                      candidate__search__merge__isnull=True)
    if project is not None:
        pending = pending.filter(candidate__search__project=project)
    with transaction.atomic():
        by_candidate: dict[int, list[str]] = {}
        for candidate_id, decision in pending.values_list("candidate_id", "decision"):
            by_candidate.setdefault(candidate_id, []).append(decision)
        if not by_candidate:
            return 0
        withdrawn = Approval.objects.filter(pk__in=list(pending.values_list("pk", flat=True))).update(
            withdrawn_at=timezone.now(), withdrawn_reason=reason[:200])
        username = user.get_username()
        for candidate in Candidate.objects.filter(pk__in=by_candidate).select_related("search__project"):
            search = candidate.search
            audit_record(actor, "approval.withdraw", project=search.project,
                         target=f"{search.search_id} {candidate.candidate_id}",
                         detail={"user": username, "reason": reason, "decisions": by_candidate[candidate.pk]})
            if candidate.state == Candidate.State.WINNER:
                _winner_reason_refresh(candidate)
            _search_event(search, "approval.withdrawn", f"{username}'s decision on {candidate.candidate_id} "
                          f"was withdrawn: {reason}", candidate_id=candidate.candidate_id)
    return withdrawn


def branch_name_check(branch: str) -> str:
    """A branch name git's `check-ref-format --branch` accepts, that git cannot read as
    something else (HEAD-like names, options, full ref names) and that reads as what it is:
    printable ASCII only (runtime_app.names: no invisible, bidi, look-alike or compatibility
    characters); else a ValidationError naming the character and why."""
    name = (branch or "").strip(_ASCII_SPACE)
    problem = ""
    characters = name_refusal(name)
    if len(name) > MAX_BRANCH_CHARS:
        problem = f"it is {len(name)} characters long (at most {MAX_BRANCH_CHARS})"
    elif characters:
        problem = characters
    elif name.startswith("-"):
        problem = "it starts with '-', so git would read it as an option"
    elif name.startswith("refs/"):
        problem = "it starts with 'refs/'; give the branch's short name"
    elif _head_like(name):
        problem = "git reads it as a special ref, not a branch"
    elif not check_ref_format(Ref(f"refs/heads/{name}".encode())):
        problem = "git refuses it as a branch name"
    if problem:
        raise ValidationError({"branch": f"{name!r} cannot be a branch: {problem}. {VALID_BRANCH_HINT}"})
    return name


def _head_like(name: str) -> bool:
    """HEAD, ORIG_HEAD, FETCH_HEAD, MERGE_HEAD, …_HEAD and @: git resolves these before any branch."""
    return name == "@" or (name.endswith("HEAD") and all(c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ_" for c in name))


def merge_branch_default(search: Search) -> str:
    return f"crucible/{search.search_id}"


class PatchMismatch(ValidationError):
    """The winner's stored bytes do not hash to the patch hash its approvals were bound to."""

    def __init__(self, approved: str, actual: str) -> None:
        self.approved, self.actual = approved, actual
        super().__init__(f"The winner's patch bytes (SHA-256 {short_sha(actual)}) do not match the "
                         f"approved hash ({short_sha(approved)}): they changed after approval, so nothing "
                         "was merged. Ask an administrator to look at how the stored patch was altered.")


class BranchRefused(ValidationError):
    """The target branch's head is neither where a commit may be made nor the approved bytes."""

    def __init__(self, message: str, head: str, tree: str) -> None:
        self.head, self.tree, self.reason = head, tree, message
        super().__init__({"branch": message})


def _patch_verified(winner: Candidate) -> bytes:
    """The exact bytes to apply, once their SHA-256 is the one the approvals were bound to."""
    patch = bytes(winner.patch or b"")
    actual = hashlib.sha256(patch).hexdigest()
    if actual != winner.patch_sha256:
        raise PatchMismatch(winner.patch_sha256, actual)
    return patch


def merge_create(user: User, search: Search, target: str = Merge.Target.NEW_BRANCH, branch: str = "") -> Any:
    """Commit the approved winner's patch onto the baseline: on a new branch (default
    `crucible/<search-id>`) or on an existing branch that still points at the baseline.

    Needs the approver role and enough standing approvals; one merge per search. Pushes the branch
    only to a repository registered by URL (where it lives); a repository registered by path is
    never pushed.
    The branch name is checked (branch_name_check) and the bytes committed must hash to the
    approved patch hash, else nothing is merged and the refusal is audited. A head already on the
    branch is adopted (a crash between the commit and the row) only when its one parent is the
    baseline and its tree is the baseline with the approved bytes applied; any other head refuses
    the merge with the reason, audited. Trailers in a commit message never decide.
    """
    access.require(user, access.APPROVER, search.project)
    if target not in Merge.Target.values:
        raise ValidationError({"target": "Choose a new branch or an existing branch."})
    branch = (branch or "").strip(_ASCII_SPACE)
    if not branch and target == Merge.Target.NEW_BRANCH:
        branch = merge_branch_default(search)
    if not branch:
        raise ValidationError({"branch": "Name the existing branch to commit on."})
    branch = branch_name_check(branch)
    try:
        return _merge_create(user, search, target, branch)
    except PatchMismatch as mismatch:  # recorded outside the refused merge's rolled-back transaction
        audit_record(user, "merge.refuse", project=search.project, target=f"{search.search_id} → {branch}",
                     detail={"reason": "patch bytes do not match the approved hash",
                             "approved_sha256": mismatch.approved, "actual_sha256": mismatch.actual})
        raise Conflict(mismatch.messages[0]) from None
    except BranchRefused as refused:  # audited, like a mismatch, outside the rolled-back transaction
        audit_record(user, "merge.refuse", project=search.project, target=f"{search.search_id} → {branch}",
                     detail={"reason": refused.reason, "head": refused.head, "approved_tree": refused.tree})
        raise


def _merge_create(user: User, search: Search, target: str, branch: str) -> Merge:
    with transaction.atomic():
        SearchRun.objects.select_for_update().get(search=search)  # one merge decision at a time
        if Merge.objects.filter(search=search).exists():
            raise Conflict(f"Merged already: {search.merge.branch} @ {short_sha(search.merge.commit_sha)}.")
        winner = _winner_of(search)
        state = approval_state(winner)
        if not state["mergeable"]:
            raise ValidationError(state["blocker"])
        patch = _patch_verified(winner)
        approvers = ", ".join(sorted({a.user_name for a in state["standing_approvals"]}))
        started_at, started = datetime.now(UTC), monotonic()
        tree = _approved_tree(search, patch)
        # A merge whose commit was made but whose row was not (a crash between the two) is adopted:
        # only a commit on the baseline whose tree is the approved bytes applied to it.
        earlier = _earlier_merge_commit(search, winner, branch, tree, target)
        adopted = earlier is not None
        commit = earlier if earlier is not None else _merge_commit(
            search, winner, branch, target, user, approvers, patch=patch)
        pushed = _merge_push(search, branch, commit)
        receipt = receipt_record(Receipt(
            kind="merge", argv=["crucible", "merge", branch], cwd=".", started_at=started_at,
            finished_at=datetime.now(UTC), duration_seconds=round(monotonic() - started, 6), exit_code=0,
            detail={"branch": branch, "target": target, "commit": commit, "baseline": search.baseline_commit,
                    "patch_sha256": winner.patch_sha256, "approved_by": approvers,
                    "pushed": bool(pushed), "pushed_to": pushed,
                    "adopted": adopted, "tree": tree},
        ), project=search.project, subject=("candidate", winner.pk), label=f"{winner.candidate_id} merge")
        merge = Merge.objects.create(
            search=search, candidate=winner, target=target, branch=branch, commit_sha=commit,
            patch_sha256=winner.patch_sha256, merged_by=user, merged_by_name=_user_name(user),
            receipt=receipt)
        audit_record(user, "merge.create", project=search.project, target=f"{search.search_id} → {branch}",
                     detail={"commit": commit, "candidate": winner.candidate_id,
                             "patch_sha256": winner.patch_sha256, "tree": tree, "adopted": adopted})
        _winner_reason_refresh(winner)
        where = f"pushed to {pushed}" if pushed else "not pushed"
        earlier = "; the commit an earlier attempt made, holding the approved tree" if adopted else ""
        _search_event(search, "search.merged", f"{winner.candidate_id} merged onto {branch} as "
                      f"{short_sha(commit)} by {_user_name(user)} ({where}{earlier})",
                      candidate_id=winner.candidate_id,
                      state=winner.state, reason=winner.reason)
    return merge


def _merge_push(search: Search, branch: str, commit: str) -> str:
    """Push the merged branch back to a repository registered by URL (where it lives); the URL pushed
    to, or "" for a repository registered by path, which Crucible never pushes. A push that fails
    refuses the merge with the reason; merging again adopts the commit already made and pushes it."""
    url = search.repository.remote_url if search.repository is not None else ""
    if not url:
        return ""
    try:
        remotes.remote_push(url, Path(search.repository_path), branch)
    except remotes.RemoteError as error:
        raise ValidationError(f"The merge commit {short_sha(commit)} was made on {branch} in the server's "
                              f"clone, but not pushed: {error}. Fix the server's access to the remote, then "
                              "merge again.") from None
    return url


def _merge_commit(search: Search, winner: Candidate, branch: str, target: str, user: User, approvers: str,
                  patch: bytes | None = None) -> str:
    """The winner's patch on a clean baseline, committed with dulwich onto `branch`; `patch` is
    the bytes merge_create verified (read and verified here when not given). The commit's tree
    must be the approved tree (_approved_tree), else the branch is put back and nothing is merged."""
    patch = _patch_verified(winner) if patch is None else patch
    # No repo lock here: worktree creation takes it, and the branch moves by compare-and-set.
    if target == Merge.Target.NEW_BRANCH and _branch_exists(search.repository_path, branch):
        raise ValidationError({"branch": f"Branch {branch} exists already; choose another name."})
    if target == Merge.Target.EXISTING_BRANCH:
        _branch_at_baseline(search, branch)
    worktree = None
    try:
        with object_scratch(search.repository_path) as scratch:
            tree = patch_stage(search.repository_path, search.baseline_commit, patch, scratch)
            worktree = tree_checkout(search.repository_path, search.baseline_commit, tree,
                                     f"merge-{search.search_id}-{int(monotonic() * 1000)}", scratch)
        commit = commit_create(
            search.repository_path,
            message=f"{search.name}: {winner.candidate_id}\n\n{search.objective}",
            author=_identity(user), committer="Crucible <crucible@localhost>",
            trailers={"Crucible-Search": search.search_id,
                      "Crucible-Preregistration": search.preregistration_hash,
                      "Crucible-Candidate": f"{winner.candidate_id} {winner.patch_sha256}",
                      "Approved-by": approvers},
            parent_commit=search.baseline_commit, tree_from_worktree=worktree, branch=branch,
        )
    except GitError as error:
        raise ValidationError(f"The merge was not made: {error}") from None
    finally:
        if worktree is not None:
            worktree_remove(search.repository_path, worktree)
    _commit_tree_verify(search, branch, target, commit, tree)
    return commit


def _approved_tree(search: Search, patch: bytes) -> str:
    """The sha of the baseline's tree with the approved patch bytes applied, built in a scratch
    object directory: nothing is written into the repository to know it."""
    try:
        with object_scratch(search.repository_path) as scratch:
            return patch_stage(search.repository_path, search.baseline_commit, patch, scratch)
    except GitError as error:
        raise ValidationError(f"The merge was not made: the approved patch {error}") from None


def _commit_tree_verify(search: Search, branch: str, target: str, commit: str, tree: str) -> None:
    """A commit just made whose tree is not the approved tree (a checkout that lost a file) is
    taken back off `branch` (compare-and-set to the baseline, or removed if it was new)."""
    with repo_open(search.repository_path) as repo:
        made = repo[commit.encode()]
        if isinstance(made, Commit) and made.tree.decode() == tree:
            return
        ref = Ref(f"refs/heads/{branch}".encode())
        if target == Merge.Target.EXISTING_BRANCH:
            repo.refs.set_if_equals(ref, ObjectID(commit.encode()), ObjectID(search.baseline_commit.encode()))
        else:
            repo.refs.remove_if_equals(ref, ObjectID(commit.encode()))
    raise ValidationError(f"The merge was not made: the commit's tree is not the baseline with the approved "
                          f"patch applied ({short_sha(tree)}); {branch} was put back.")


def _earlier_merge_commit(search: Search, winner: Candidate, branch: str, tree: str,
                          target: str = Merge.Target.NEW_BRANCH) -> str | None:
    """The head of `branch` if it is this search's merge of the approved bytes: its only parent
    is the baseline, its tree is `tree` (the baseline with the approved patch applied) and its
    trailers name this search and this patch. None if the branch is absent or at the baseline
    (a commit is then made). Any other head refuses the merge with the reason: a new branch that
    exists names its head and asks for another name; an existing branch moved on."""
    with repo_open(search.repository_path) as repo:
        ref = Ref(f"refs/heads/{branch}".encode())
        if ref not in repo.refs:
            return None
        head = repo.refs[ref].decode()
        commit = repo[head.encode()]
    if head == search.baseline_commit and target == Merge.Target.EXISTING_BRANCH:
        return None
    why = _adoption_refusal(search, winner, commit, tree)
    if not why:
        return head
    if target == Merge.Target.EXISTING_BRANCH:
        raise BranchRefused(f"{branch} has moved on from the baseline ({short_sha(head)} is not "
                            f"{short_sha(search.baseline_commit)}) and {why}; merge to a new branch instead.",
                            head, tree)
    raise BranchRefused(f"Branch {branch} exists already and does not hold the approved patch: its head "
                        f"{short_sha(head)} {why}. Choose another branch name.", head, tree)


def _adoption_refusal(search: Search, winner: Candidate, commit: Any, tree: str) -> str:
    """Why `commit` is not this search's merge of the approved bytes ('' if it is)."""
    if not isinstance(commit, Commit):
        return "is not a commit"
    if commit.id.decode() == search.baseline_commit:
        return "is the baseline itself"
    parents = [parent.decode() for parent in commit.parents]
    if parents != [search.baseline_commit]:
        return f"does not have the baseline {short_sha(search.baseline_commit)} as its only parent"
    if commit.tree.decode() != tree:
        return (f"has tree {short_sha(commit.tree.decode())}, not {short_sha(tree)} (the baseline with the "
                "approved patch applied): it holds other bytes")
    trailers = _trailer_block(commit.message.decode(errors="replace"))
    wanted = (f"Crucible-Search: {search.search_id}",
              f"Crucible-Candidate: {winner.candidate_id} {winner.patch_sha256}")
    if not all(line in trailers for line in wanted):
        return "holds the approved bytes but is not a Crucible merge of this search (no trailers for it)"
    return ""


def _trailer_block(message: str) -> list[str]:
    """The lines of a commit message's last paragraph, where git reads trailers (not the body)."""
    paragraphs = [part for part in message.strip().split("\n\n") if part.strip()]
    return paragraphs[-1].splitlines() if paragraphs else []


def _identity(user: User) -> str:
    name = re.sub(r"[<>\n\r\0]", "", user.get_full_name() or user.get_username()).strip() or "user"
    local = re.sub(r"[^A-Za-z0-9._-]", "", user.get_username()) or "user"
    email = re.sub(r"[<>\s\0]", "", user.email or "") or f"{local}@crucible.invalid"
    return f"{name} <{email}>"


def _branch_exists(repo_path: str, branch: str) -> bool:
    with repo_open(repo_path) as repo:
        return Ref(f"refs/heads/{branch}".encode()) in repo.refs


def _branch_at_baseline(search: Search, branch: str) -> None:
    with repo_open(search.repository_path) as repo:
        ref = Ref(f"refs/heads/{branch}".encode())
        if ref not in repo.refs:
            raise ValidationError({"branch": f"There is no branch {branch}."})
        head = repo.refs[ref].decode()
    if head != search.baseline_commit:
        raise ValidationError({"branch": f"{branch} has moved on from the baseline ({short_sha(head)} is not "
                               f"{short_sha(search.baseline_commit)}); merge to a new branch instead."})
