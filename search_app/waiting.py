"""search_app's part of "Waiting for you" (runtime_app/waiting.py): winners a person may approve
or merge, review threads waiting for their answer, changes requested on their searches' winners,
and their searches that failed or came out NONE recently. Only projects they can see; a few
queries whatever the number of searches."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from runtime_app import access
from runtime_app.selectors import projects_for_user
from runtime_app.status import StatusWord
from runtime_app.waiting import WaitingItem, WaitingKind
from search_app.models import Comment, Search, SearchRun
from search_app.status import search_facts, search_status, search_statuses

RECENT_FAILURE_DAYS = 7  # a failed or NONE search of theirs is listed this long after it ended
MAX_ITEMS = 50  # per kind: a list to act on, not an archive

# Events after which someone's list may differ (runtime_app.waiting.waiting_changed_by).
EVENT_KINDS = ("approval.", "search.finished", "search.cancelled", "search.revising", "search.merged",
               "search.spec_failure", "candidate.comment", "merge.")


def _mentions(body: str, username: str) -> bool:
    return re.search(rf"(?<![\w@])@{re.escape(username)}(?![\w.-])", body or "", re.IGNORECASE) is not None


def _winner_items(user: Any) -> list[WaitingItem]:
    """Winners the user may approve (awaiting approval, no decision of theirs on this patch yet)
    or merge (approved), in projects where they hold the approve permission."""
    projects = access.projects_with_role(user, access.APPROVER)
    searches = list(Search.objects.filter(project__in=projects, run__status=SearchRun.Status.FINISHED,
                                          run__outcome=SearchRun.WINNER, run__winner__isnull=False,
                                          merge__isnull=True)
                    .select_related("project", "run__winner").defer("spec_text", "hashed_inputs")
                    .order_by("-run__finished_at")[:MAX_ITEMS])
    facts = search_facts(searches)
    items = []
    for search in searches:
        winner = search.run.winner
        if winner is None:
            continue
        tally = facts["tallies"].get(winner.pk)
        status = search_status(search.run, merge_branch=facts["merges"].get(search.pk), tally=tally)
        url_args = [search.search_id, winner.candidate_id]
        if status.word == StatusWord.AWAITING_APPROVAL:
            own = search.created_by_id == user.pk and not settings.CONFIG.self_approval
            if own or (tally is not None and user.pk in tally.decided):
                continue
            items.append(WaitingItem(
                WaitingKind.APPROVE, search.project_id, search.project.name,
                f"Approve {winner.candidate_id} of {search.name}", reverse("candidate_decide", args=url_args),
                detail=f"{search.search_id}: its winner's patch waits for approvals", status=status.label,
                when=search.run.finished_at, key=f"approve-{search.search_id}"))
        elif status.word == StatusWord.APPROVED:
            items.append(WaitingItem(
                WaitingKind.MERGE, search.project_id, search.project.name,
                f"Merge {winner.candidate_id} of {search.name}",
                reverse("search_merge", args=[search.search_id]),
                detail=f"{search.search_id}: approved, ready to merge", status=status.label,
                when=search.run.finished_at, key=f"merge-{search.search_id}"))
    return items


def _thread_items(user: Any) -> list[WaitingItem]:
    """Open threads that mention the user (@name) or that they started or replied in, whose
    latest message after the user's own last one is someone else's."""
    username = user.get_username()
    mine = Q(author=user) | Q(replies__author=user)
    mentioned = Q(body__icontains=f"@{username}") | Q(replies__body__icontains=f"@{username}")
    threads = list(Comment.objects.filter(
        reply_to__isnull=True, state=Comment.State.OPEN,
        candidate__search__project__in=projects_for_user(user)).filter(mine | mentioned)
        .select_related("candidate__search__project").distinct().order_by("-created_at")[:MAX_ITEMS])
    replies: dict[int | None, list[Any]] = {}
    for reply in Comment.objects.filter(reply_to__in=threads).order_by("created_at", "id"):
        replies.setdefault(reply.reply_to_id, []).append(reply)
    items = []
    for thread in threads:
        messages = [thread, *replies.get(thread.pk, [])]
        last_mine = max((index for index, message in enumerate(messages) if message.author_id == user.pk),
                        default=-1)
        unanswered = [message for message in messages[last_mine + 1:] if message.author_id != user.pk]
        if not unanswered:
            continue
        if last_mine < 0 and not any(_mentions(message.body, username) for message in messages):
            continue  # found by a name that only begins like theirs (@ann in @anna)
        latest = unanswered[-1]
        candidate, search = thread.candidate, thread.candidate.search
        place = f"{thread.path}:{thread.line}" if thread.line else (thread.path or "the whole candidate")
        items.append(WaitingItem(
            WaitingKind.THREAD, search.project_id, search.project.name,
            f"Thread #{thread.pk} on {candidate.candidate_id} of {search.name}",
            reverse("candidate_detail", args=[search.search_id, candidate.candidate_id])
            + f"#comment-{thread.pk}",
            detail=f"{latest.author_name} on {place}: {' '.join(latest.body.split())[:120]}",
            when=latest.created_at, key=f"thread-{thread.pk}"))
    return items


def _own_search_items(user: Any) -> list[WaitingItem]:
    """The user's searches (they froze or started them) whose winner got a request for changes,
    or that failed or came out NONE in the last RECENT_FAILURE_DAYS days."""
    since = timezone.now() - timedelta(days=RECENT_FAILURE_DAYS)
    theirs = Search.objects.filter(project__in=projects_for_user(user)).filter(
        Q(created_by=user) | Q(run__started_by=user)).filter(run__status=SearchRun.Status.FINISHED).filter(
        Q(run__outcome=SearchRun.WINNER, merge__isnull=True) | Q(run__outcome=SearchRun.NONE,
                                                               run__finished_at__gte=since))
    searches = list(theirs.select_related("project", "run__winner").defer("spec_text", "hashed_inputs")
                    .distinct().order_by("-run__finished_at")[:MAX_ITEMS])
    statuses = search_statuses(searches)
    items = []
    for search in searches:
        status, run = statuses[search.pk], search.run
        if status.word == StatusWord.CHANGES_REQUESTED and run.winner is not None:
            items.append(WaitingItem(
                WaitingKind.CHANGES_REQUESTED, search.project_id, search.project.name,
                f"Changes requested on {run.winner.candidate_id} of {search.name}",
                reverse("candidate_detail", args=[search.search_id, run.winner.candidate_id]),
                detail=f"{search.search_id}: send it back to its writer, or answer the reviewers",
                status=status.label, when=run.updated_at, key=f"changes-{search.search_id}"))
        elif status.word in (StatusWord.FAILED, StatusWord.NONE):
            items.append(WaitingItem(
                WaitingKind.FAILED, search.project_id, search.project.name,
                f"{search.name} {'failed' if status.word == StatusWord.FAILED else 'came out NONE'}",
                reverse("search_detail", args=[search.search_id]),
                detail=f"{search.search_id}: {status.detail}",
                status=status.label, when=run.finished_at, key=f"failed-{search.search_id}"))
    return items


def search_waiting(user: Any) -> list[WaitingItem]:
    return [*_winner_items(user), *_thread_items(user), *_own_search_items(user)]
