"""Who hears about what happens to searches, and what they read; runtime_app/notifications.py sends it.

- a winner awaits approval: the project's members who may approve it (`approvers_of`);
- a search finished (winner or NONE) or was cancelled: whoever froze or started it;
- a comment: the candidate's earlier commenters and the search's author (`reply_recipients`).

Hooked from search_app/apps.py on Event and Comment saves, acting once the change commits, so the
services that make the changes stay as they are. Nobody is told of their own action.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.urls import reverse

from runtime_app.models import AuditEntry, Event
from runtime_app.notifications import notification_send
from runtime_app.selectors import page_url
from search_app.models import Comment, Search, SearchRun
from search_app.selectors import decision_refusals

logger = logging.getLogger(__name__)

# The events that notify; the rest (rounds, candidates, approvals …) show on pages only.
SEARCH_EVENT_KINDS = ("search.finished", "search.cancelled")


def approvers_of(search: Any) -> list[Any]:
    """Who may approve `search`'s winner now: the project's active members whom the approval rule
    (selectors.decision_refusals, the same one the pages and approval_record use) lets approve."""
    members = search.project.members.filter(is_active=True).order_by("pk")
    return [user for user in members if not decision_refusals(user, search)["approve"]]


def starters_of(search: Any) -> list[Any]:
    """Who froze the search and who started it (often one person)."""
    run = SearchRun.objects.filter(search=search).select_related("started_by").first()
    people = {user.pk: user for user in (search.created_by, run.started_by if run else None) if user}
    return list(people.values())


def reply_recipients(comment: Any) -> list[Any]:
    """Who hears of a comment, among the project's active members: for a reply, the thread's
    author and its earlier repliers; for a new thread, the earlier commenters on its candidate
    and the search's author."""
    candidate = comment.candidate
    if comment.reply_to_id:
        thread = candidate.comments.filter(pk=comment.reply_to_id)
        earlier = candidate.comments.filter(reply_to_id=comment.reply_to_id, pk__lt=comment.pk)
        ids = set(thread.values_list("author", flat=True)) | set(earlier.values_list("author", flat=True))
    else:
        ids = set(candidate.comments.filter(pk__lt=comment.pk).values_list("author", flat=True))
        ids.add(candidate.search.created_by_id)
    ids.discard(None)
    return list(get_user_model().objects.filter(
        pk__in=ids, is_active=True, memberships__project_id=candidate.search.project_id).order_by("pk"))


def _cancelled_by(search: Any) -> Any:
    entry = (AuditEntry.objects.filter(action="search.cancel", project=search.project,
                                       target=search.search_id).select_related("actor").first())
    return entry.actor if entry else None


def search_event_notify(event_id: int) -> None:
    """Notify for a committed search event (a winner, NONE, a cancellation)."""
    event = Event.objects.filter(pk=event_id, subject_type="search").first()
    if event is None:
        return
    search = Search.objects.select_related("project", "created_by").filter(pk=event.subject_id).first()
    if search is None:
        return
    label = f"{search.search_id} ({search.name})"
    url = page_url(reverse("search_detail", args=[search.search_id]))
    outcome = event.payload.get("outcome", "")
    if event.kind == "search.cancelled":
        notification_send(search.project, "search_done", starters_of(search), f"{label} was cancelled",
                          event.payload.get("message", ""), url, actor=_cancelled_by(search),
                          event_kind=event.kind)
        return
    if outcome == SearchRun.WINNER:
        run = SearchRun.objects.filter(search=search).select_related("winner").first()
        winner = run.winner if run else None
        if winner is not None:
            url = page_url(reverse("candidate_detail", args=[search.search_id, winner.candidate_id]))
        name = winner.candidate_id if winner else "the winner"
        asked = notification_send(
            search.project, "approval_waiting", approvers_of(search), f"{label}: {name} awaits your approval",
            f"{event.payload.get('message', '')}\nRead its patch and the evidence, then approve it or "
            "request changes.", url, event_kind=event.kind)
        told = [user for user in starters_of(search) if user.get_username() not in asked["emailed"]]
        notification_send(search.project, "search_done", told, f"{label} finished: winner {name}",
                          event.payload.get("message", ""), url, event_kind=event.kind, webhooks=False)
        return
    notification_send(search.project, "search_done", starters_of(search), f"{label} finished with NONE",
                      event.payload.get("message", ""), url, event_kind=event.kind)


def comment_notify(comment_id: int) -> None:
    """Notify for a committed comment: its thread's (or candidate's) earlier participants,
    never its author."""
    comment = (Comment.objects.select_related("candidate__search__project", "author")
               .filter(pk=comment_id).first())
    if comment is None:
        return
    candidate, search = comment.candidate, comment.candidate.search
    where = f" on {comment.path}" + (f":{comment.line}" if comment.line else "") if comment.path else ""
    verb = f"replied to thread #{comment.reply_to_id}" if comment.reply_to_id else "commented"
    excerpt = comment.body if len(comment.body) <= 500 else comment.body[:500] + "…"
    notification_send(
        search.project, "replies", reply_recipients(comment),
        f"{comment.author_name} {verb} on {candidate.candidate_id} of {search.search_id}{where}",
        excerpt, page_url(reverse("candidate_detail", args=[search.search_id, candidate.candidate_id])),
        actor=comment.author, event_kind="candidate.comment")


def _safely(action: Any, *args: Any) -> None:
    """A notification that cannot be made is logged; it never undoes or stops the change."""
    try:
        action(*args)
    except Exception:
        logger.exception("could not notify (%s%r)", action.__name__, args)


def event_saved(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    if created and instance.subject_type == "search" and instance.kind in SEARCH_EVENT_KINDS:
        transaction.on_commit(lambda: _safely(search_event_notify, instance.pk))


def comment_saved(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    if created:
        transaction.on_commit(lambda: _safely(comment_notify, instance.pk))
