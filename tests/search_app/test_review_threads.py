"""Review threads like a code host: a comment starts a thread on a candidate, a file or a line
the diff shows; replies belong to it; any member resolves and reopens it; a refinement of the
patch marks line threads outdated without hiding them; and a timeline puts it all in order."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from runtime_app.models import AuditEntry, Event
from search_app import selectors, services
from search_app.models import Approval, Comment, Review, Step
from tests.search_app.conftest import patch_write
from tests.search_app.runs import plan_repo, spec_text

pytestmark = pytest.mark.django_db(transaction=True)


def refused(call, *args, **kwargs) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        call(*args, **kwargs)
    return caught.value.messages


# ------------------------------------------------------------------------------------ threads


def test_a_line_comment_starts_a_thread_that_keeps_the_patch_it_was_made_on_and_its_line_text(
        reviewing, personas):
    _, candidate, _ = reviewing
    thread = services.comment_add(personas.member, candidate, "Why 9?", "code/answer.py", 2)
    assert (thread.is_thread, thread.state, thread.patch_sha256) == (True, "open", candidate.patch_sha256)
    assert thread.line_text == "    return 9"
    whole = services.comment_add(personas.member, candidate, "Looks fine.")
    assert (whole.path, whole.line, whole.line_text) == ("", None, "")


def test_replies_belong_to_their_thread_and_have_no_place_of_their_own(reviewing, personas):
    _, candidate, _ = reviewing
    thread = services.comment_add(personas.member, candidate, "Why 9?", "code/answer.py", 2)
    reply = services.comment_add(personas.owner, candidate, "It is bigger.", reply_to=thread.pk)
    assert (reply.reply_to, reply.path, reply.line) == (thread, "", None)
    assert [r.body for r in thread.replies.all()] == ["It is bigger."]
    assert refused(services.comment_add, personas.owner, candidate, "x", "code/answer.py", 1,
                   reply_to=thread.pk) == [f"A reply belongs to its thread's place; give it no file or line "
                                           f"(thread #{thread.pk} is on code/answer.py:2)."]
    event = Event.objects.filter(kind="candidate.comment").order_by("-id").first()
    assert event.payload["message"] == f"owner replied to thread #{thread.pk} on cand_002"
    assert event.payload["thread"] == thread.pk


def test_a_reply_to_a_reply_is_refused_and_names_the_thread_to_reply_to(reviewing, personas):
    _, candidate, _ = reviewing
    thread = services.comment_add(personas.member, candidate, "Why 9?")
    reply = services.comment_add(personas.owner, candidate, "Bigger.", reply_to=thread.pk)
    assert refused(services.comment_add, personas.member, candidate, "ok", reply_to=reply.pk) == [
        f"#{reply.pk} is a reply; reply to its thread (#{thread.pk}) instead."]


def test_a_reply_to_a_comment_of_another_candidate_or_another_project_is_not_on_this_candidate(
        reviewing, personas, tmp_path):
    search, candidate, _ = reviewing
    other = search.candidates.get(candidate_id="cand_001")
    elsewhere = services.comment_add(personas.member, other, "On cand_001.")
    repo = plan_repo(tmp_path / "beta-repo", {"cand_001": 3})
    beta = services.search_freeze(personas.outsider, personas.beta, spec_text(population=2, rounds=[2, 1]),
                                  "HEAD", repository_path=str(repo))
    services.search_start(personas.outsider, beta, enqueue=False)
    outside = services.comment_add(personas.outsider, beta.candidates.get(candidate_id="cand_001"), "Mine.")
    for number in (elsewhere.pk, outside.pk, 999_999):
        assert refused(services.comment_add, personas.member, candidate, "hi", reply_to=number) == [
            f"#{number} is not a comment on this candidate (cand_002)."]
        assert refused(services.thread_resolve, personas.member, candidate, number) == [
            f"#{number} is not a comment on this candidate (cand_002)."]
    assert not Comment.objects.filter(candidate=candidate).exists()


def test_any_member_resolves_and_reopens_a_thread_and_who_and_when_is_kept_audited_and_announced(
        reviewing, personas):
    search, candidate, _ = reviewing
    thread = services.comment_add(personas.owner, candidate, "Rename it.", "code/answer.py", 1)
    resolved = services.thread_resolve(personas.member, candidate, thread.pk)
    assert (resolved.state, resolved.state_changed_by, resolved.state_changed_by_name) == \
        ("resolved", personas.member, "member")
    assert resolved.state_changed_at is not None
    again = services.thread_resolve(personas.owner, candidate, thread.pk)  # harmless: nothing changes
    assert (again.state, again.state_changed_by_name) == ("resolved", "member")
    reopened = services.thread_reopen(personas.owner, candidate, thread.pk)
    assert (reopened.state, reopened.state_changed_by_name) == ("open", "owner")
    assert list(AuditEntry.objects.filter(action__startswith="comment.").order_by("id")
                .values_list("action", "actor_name", "target")) == [
        ("comment.resolve", "member", f"{search.search_id} cand_002 #{thread.pk}"),
        ("comment.reopen", "owner", f"{search.search_id} cand_002 #{thread.pk}")]
    assert [e.payload["message"] for e in Event.objects.filter(kind__startswith="candidate.comment.")
            .order_by("id")] == [f"member resolved thread #{thread.pk} on cand_002",
                                 f"owner reopened thread #{thread.pk} on cand_002"]


def test_a_reply_cannot_be_resolved_and_an_outsider_cannot_resolve_anything(reviewing, personas):
    _, candidate, _ = reviewing
    thread = services.comment_add(personas.owner, candidate, "Rename it.")
    reply = services.comment_add(personas.member, candidate, "Done.", reply_to=thread.pk)
    assert refused(services.thread_resolve, personas.member, candidate, reply.pk) == [
        f"#{reply.pk} is a reply; resolve its thread (#{thread.pk}) instead."]
    with pytest.raises(PermissionDenied):
        services.thread_resolve(personas.outsider, candidate, thread.pk)
    with pytest.raises(PermissionDenied):
        services.comment_add(personas.outsider, candidate, "hi", reply_to=thread.pk)
    assert Comment.objects.get(pk=thread.pk).state == "open"


# ----------------------------------------------------------------------------------- outdated


def test_a_refinement_outdates_line_threads_whose_line_is_gone_or_reads_otherwise_and_keeps_them(
        reviewing, personas):
    _, candidate, repo = reviewing
    kept = services.comment_add(personas.member, candidate, "Good name.", "code/answer.py", 1)
    changed = services.comment_add(personas.member, candidate, "Why 9?", "code/answer.py", 2)
    on_file = services.comment_add(personas.member, candidate, "One file only?", "code/answer.py")
    whole = services.comment_add(personas.member, candidate, "Nice.")

    def outdated() -> dict[int, bool]:
        return {t["comment"].pk: t["outdated"] for t in selectors.candidate_threads(candidate)}

    assert outdated() == {kept.pk: False, changed.pk: False, on_file.pk: False, whole.pk: False}
    # The next round's writer puts a comment line where `return 9` was.
    patch_write(repo, candidate, "def answer():\n    # the largest we found\n    return 9\n")
    assert outdated() == {kept.pk: False, changed.pk: True, on_file.pk: False, whole.pk: False}
    thread = next(t for t in selectors.candidate_threads(candidate) if t["comment"].pk == changed.pk)
    assert (thread["comment"].line_text, thread["inline"]) == ("    return 9", False)
    # A later patch with line 2 reading as it did makes the thread current again.
    patch_write(repo, candidate, "def answer():\n    return 9\n")
    assert outdated()[changed.pk] is False
    # A thread made on the current patch is current, even where an older thread is outdated.
    patch_write(repo, candidate, "def answer():\n    return 10\n")
    assert outdated()[changed.pk] is True
    fresh = services.comment_add(personas.member, candidate, "10 now?", "code/answer.py", 2)
    assert outdated()[fresh.pk] is False and fresh.line_text == "    return 10"


# ----------------------------------------------------------------------------------- timeline


def test_the_timeline_puts_threads_replies_decisions_verdicts_replays_refinements_and_withdrawals_in_order(
        reviewing, personas, approver):
    search, candidate, _ = reviewing
    step = Step.objects.create(search=search, candidate=candidate, kind="generate", round=1, state="done",
                               result={"patch_sha256": "b" * 64})
    Step.objects.filter(pk=step.pk).update(finished_at=step.created_at)
    replay = Step.objects.create(search=search, candidate=candidate, kind="replay", round=1, state="done",
                                 result={"passed": True, "why": "within the band"})
    Step.objects.filter(pk=replay.pk).update(finished_at=replay.created_at)
    Review.objects.create(search=search, candidate=candidate, verdict="approve", reviewer="fake-reviewer")
    thread = services.comment_add(personas.member, candidate, "Why 9?", "code/answer.py", 2)
    services.comment_add(personas.owner, candidate, "Bigger.", reply_to=thread.pk)
    services.thread_resolve(personas.member, candidate, thread.pk)
    Approval.objects.create(candidate=candidate, user=approver, user_name="approver",
                            decision="request_changes", patch_sha256=candidate.patch_sha256,
                            note="**Rename** it")
    decided = Approval.objects.create(candidate=candidate, user=approver, user_name="approver",
                                      decision="approve", patch_sha256=candidate.patch_sha256)
    services.approvals_withdraw(personas.owner, approver, project=personas.alpha, reason="left the project")
    decided.refresh_from_db()
    timeline = selectors.candidate_timeline(candidate)
    assert [entry["kind"] for entry in timeline] == [
        "refinement", "replay", "review", "thread", "resolved", "decision", "decision", "withdrawn",
        "withdrawn"]
    assert [entry["at"] for entry in timeline] == sorted(entry["at"] for entry in timeline)
    assert timeline[0]["outcome"] == f"its writer wrote patch {'b' * 12}"
    assert (timeline[1]["passed"], timeline[1]["why"]) == (True, "within the band")
    assert [r.body for r in timeline[3]["thread"]["replies"]] == ["Bigger."]
    assert (timeline[4]["by"], timeline[4]["thread_id"]) == ("member", thread.pk)
    assert timeline[5]["approval"].note == "**Rename** it"
