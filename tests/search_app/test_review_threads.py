"""Review threads like a code host: a comment starts a thread on a candidate, a file or a line
the diff shows; replies belong to it; any member resolves and reopens it; a refinement of the
patch marks line threads outdated without hiding them; and a timeline puts it all in order."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from runtime_app.models import AuditEntry, Event
from search_app import selectors, services
from search_app.models import Approval, Comment, Review, Step
from tests.helpers import login, text_of
from tests.search_app.helpers import patch_write
from tests.search_app.runs import plan_repo, spec_text
from tests.search_app.test_review_api import Done, api, cli

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


# ------------------------------------------------------------------- the page, the API and the CLI


def page_url(search) -> str:
    return f"/searches/{search.search_id}/candidates/cand_002/"


def test_the_page_lists_every_thread_with_replies_forms_outdated_marks_and_safe_markdown(reviewing, personas):
    search, candidate, repo = reviewing
    thread = services.comment_add(personas.member, candidate, "**Why** 9? <script>window.x=1</script>",
                                  "code/answer.py", 2)
    services.comment_add(personas.owner, candidate, "[docs](javascript:alert(1)) `bigger`",
                         reply_to=thread.pk)
    patch_write(repo, candidate, "def answer():\n    return 10\n")
    page = login(personas.member).get(page_url(search))
    html = page.content.decode()
    assert page.status_code == 200
    assert "<strong>Why</strong> 9? &lt;script&gt;window.x=1&lt;/script&gt;" in html
    assert "[docs](javascript:alert(1)) <code>bigger</code>" in html and 'href="javascript' not in html
    assert f'id="comment-{thread.pk}" data-thread="{thread.pk}" data-path="code/answer.py" data-line="2" ' \
           'data-side="new" data-inline="false"' in html
    assert ">outdated</span>" in html
    assert '<span class="thread-line-number">2</span>    return 9</pre>' in html
    assert f'<input type="hidden" name="reply_to" value="{thread.pk}">' in html
    assert f"/comments/{thread.pk}/resolve/" in html
    assert '<script id="comment-anchors" type="application/json">' \
           '{"code/answer.py": {"old": [1, 2], "new": [1, 2]}}</script>' in html
    assert 'id="timeline"' in html and "Nothing reviewed yet." not in html


def test_replying_resolving_and_reopening_from_the_page_and_its_refusals_come_back_in_the_services_words(
        reviewing, personas):
    search, candidate, _ = reviewing
    thread = services.comment_add(personas.member, candidate, "Why 9?")
    client = login(personas.owner)
    base = f"/searches/{search.search_id}/candidates/cand_002"
    done = client.post(f"{base}/comment/", {"body": "Bigger.", "reply_to": thread.pk})
    assert (done.status_code, done["Location"]) == (302, f"{base}/#comment-{thread.pk}")
    reply = Comment.objects.get(reply_to=thread)
    refused_reply = client.post(f"{base}/comment/", {"body": "And?", "reply_to": reply.pk})
    assert refused_reply.status_code == 400
    assert f"#{reply.pk} is a reply; reply to its thread (#{thread.pk}) instead." in text_of(refused_reply)
    assert client.post(f"{base}/comments/{thread.pk}/resolve/").status_code == 302
    assert Comment.objects.get(pk=thread.pk).state == "resolved"
    assert "Reopen</button>" in text_of(client.get(page_url(search)))
    assert client.post(f"{base}/comments/{thread.pk}/reopen/").status_code == 302
    assert Comment.objects.get(pk=thread.pk).state == "open"
    refused_resolve = client.post(f"{base}/comments/{reply.pk}/resolve/")
    assert refused_resolve.status_code == 400
    assert f"#{reply.pk} is a reply; resolve its thread (#{thread.pk}) instead." in text_of(refused_resolve)
    assert login(personas.outsider).post(f"{base}/comments/{thread.pk}/resolve/").status_code == 404


def test_reply_resolve_and_reopen_answer_the_same_through_api_and_cli_with_the_same_refusals(
        reviewing, personas):
    search, candidate, _ = reviewing
    base = f"/api/searches/{search.search_id}/candidates/cand_002/comments"
    made = api(personas.member, base, {"body": "Why 9?", "path": "code/answer.py", "line": 2}).json()
    assert made | {"created_at": ""} == {
        "id": made["id"], "search_id": search.search_id, "candidate_id": "cand_002", "author": "member",
        "path": "code/answer.py", "line": 2, "side": "new", "body": "Why 9?", "created_at": "",
        "reply_to": None,
        "state": "open", "state_changed_by": "", "state_changed_at": None,
        "patch_sha256": candidate.patch_sha256, "line_text": "    return 9"}
    thread = made["id"]
    reply = api(personas.owner, base, {"body": "Bigger.", "reply_to": thread})
    assert reply.status_code == 201 and (reply.json()["reply_to"], reply.json()["state"]) == (thread, None)
    done = cli(personas.member, "comment", search.search_id, "cand_002", "Agreed.", "--reply-to", str(thread))
    assert done == Done(0, f"{search.search_id} cand_002: comment #{reply.json()['id'] + 1} by member "
                           f"in thread #{thread}", "")
    resolved = api(personas.owner, f"{base}/{thread}/resolve", {})
    assert resolved.status_code == 200
    assert (resolved.json()["state"], resolved.json()["state_changed_by"]) == ("resolved", "owner")
    assert cli(personas.member, "resolve", search.search_id, "cand_002", str(thread)) == \
        Done(0, f"{search.search_id} cand_002: thread #{thread} is resolved (by owner)", "")
    assert cli(personas.member, "reopen", search.search_id, "cand_002", str(thread)) == \
        Done(0, f"{search.search_id} cand_002: thread #{thread} is open (by member)", "")
    assert api(personas.owner, f"{base}/{thread}/reopen", {}).json()["state_changed_by"] == "member"
    listed = login(personas.member).get(base).json()
    assert [(t["id"], t["outdated"], [r["body"] for r in t["replies"]]) for t in listed] == [
        (thread, False, ["Bigger.", "Agreed."])]
    # The same refusals, in the same words: a reply to a reply, resolving a reply, not on this candidate.
    words = f"#{reply.json()['id']} is a reply; reply to its thread (#{thread}) instead."
    refused = api(personas.member, base, {"body": "x", "reply_to": reply.json()["id"]})
    assert (refused.status_code, refused.json()["detail"]) == (400, f"reply_to: {words}")
    assert cli(personas.member, "comment", search.search_id, "cand_002", "x", "--reply-to",
               str(reply.json()["id"])) == Done(1, "", words)
    words = f"#{reply.json()['id']} is a reply; resolve its thread (#{thread}) instead."
    refused = api(personas.member, f"{base}/{reply.json()['id']}/resolve", {})
    assert (refused.status_code, refused.json()["detail"]) == (400, words)
    assert cli(personas.member, "resolve", search.search_id, "cand_002", str(reply.json()["id"])) == \
        Done(1, "", words)
    words = "#999999 is not a comment on this candidate (cand_002)."
    assert api(personas.member, f"{base}/999999/reopen", {}).json()["detail"] == words
    assert cli(personas.member, "reopen", search.search_id, "cand_002", "999999") == Done(1, "", words)
    # An outsider cannot see the candidate at all: 404 from the API, the CLI says so.
    assert api(personas.outsider, f"{base}/{thread}/resolve", {}).status_code == 404
    assert cli(personas.outsider, "resolve", search.search_id, "cand_002", str(thread)).code == 1


# ------------------------------------------------------------------------ old-side threads


def test_a_thread_on_a_deleted_line_is_on_the_old_side_and_keeps_the_line_as_it_read_before(
        reviewing, personas):
    _, candidate, _ = reviewing
    thread = services.comment_add(personas.member, candidate, "Why drop 2?", "code/answer.py", 2, side="old")
    assert (thread.side, thread.line, thread.line_text) == ("old", 2, "    return 2")
    new = services.comment_add(personas.member, candidate, "Why 9?", "code/answer.py", 2)
    assert (new.side, new.line_text) == ("new", "    return 9")
    event = Event.objects.filter(kind="candidate.comment").order_by("id").first()
    assert event.payload["message"] == "member commented on cand_002 on code/answer.py:2 (old)"


def test_a_side_that_is_not_old_or_new_or_a_line_not_on_that_side_is_refused_in_words(reviewing, personas):
    _, candidate, _ = reviewing
    add = services.comment_add
    assert refused(add, personas.member, candidate, "x", "code/answer.py", 2, side="left") == [
        "'left' is not a side of the diff: give \"old\" (the file before the patch) or \"new\" (after it)."]
    assert refused(add, personas.member, candidate, "x", "code/answer.py", 3, side="old") == [
        "Line 3 of code/answer.py is not on the old side of this candidate's diff "
        "(there it shows lines 1–2 of the file before the patch)."]
    assert refused(services.comment_add, personas.member, candidate, "x", "code/answer.py", side="old") == [
        "A side belongs to a line: give the line too, or no side."]
    thread = services.comment_add(personas.member, candidate, "Why?", "code/answer.py", 1, side="old")
    assert refused(services.comment_add, personas.owner, candidate, "x", reply_to=thread.pk, side="old") == [
        f"A reply belongs to its thread's place; give it no file or line "
        f"(thread #{thread.pk} is on code/answer.py:1 (old))."]
    assert Comment.objects.count() == 1


def test_a_refinement_outdates_a_thread_by_its_side_the_old_side_line_still_shown_stays_current(
        reviewing, personas):
    _, candidate, repo = reviewing
    old = services.comment_add(personas.member, candidate, "Why drop 2?", "code/answer.py", 2, side="old")
    new = services.comment_add(personas.member, candidate, "Why 9?", "code/answer.py", 2)
    patch_write(repo, candidate, "def answer():\n    return 10\n")
    outdated = {t["comment"].pk: t["outdated"] for t in selectors.candidate_threads(candidate)}
    assert outdated == {old.pk: False, new.pk: True}
    assert selectors.diff_anchors(candidate) == {"code/answer.py": {"old": [1, 2], "new": [1, 2]}}


def test_old_side_threads_come_through_the_page_the_api_and_the_cli_and_show_their_side(reviewing, personas):
    search, _, _ = reviewing
    base = f"/api/searches/{search.search_id}/candidates/cand_002/comments"
    made = api(personas.member, base, {"body": "Old 2?", "path": "code/answer.py", "line": 2, "side": "old"})
    assert made.status_code == 201
    assert (made.json()["side"], made.json()["line_text"]) == ("old", "    return 2")
    bad = api(personas.member, base, {"body": "x", "path": "code/answer.py", "line": 2, "side": "sideways"})
    assert (bad.status_code, bad.json()["detail"]) == (
        400, "side: 'sideways' is not a side of the diff: give \"old\" (the file before the patch) "
             "or \"new\" (after it).")
    done = cli(personas.owner, "comment", search.search_id, "cand_002", "Old 1.", "--path", "code/answer.py",
               "--line", "1", "--side", "old")
    assert done.code == 0 and done.out.endswith("on code/answer.py:1 (old)")
    page_url = f"/searches/{search.search_id}/candidates/cand_002/"
    posted = login(personas.member).post(f"{page_url}comment/", {
        "body": "From the page.", "path": "code/answer.py", "line": "2", "side": "old"})
    assert posted.status_code == 302
    refused_page = login(personas.member).post(f"{page_url}comment/", {
        "body": "x", "path": "code/answer.py", "line": "7", "side": "old"})
    assert refused_page.status_code == 400
    assert "Line 7 of code/answer.py is not on the old side of this candidate&#x27;s diff" \
        in refused_page.content.decode()
    assert [(c.side, c.line) for c in Comment.objects.order_by("id")] == [("old", 2), ("old", 1), ("old", 2)]
    html = login(personas.member).get(page_url).content.decode()
    assert html.count('data-side="old"') == 3 and html.count(">old side</span>") == 3
