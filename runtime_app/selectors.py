"""Reads for runtime_app: access-filtered and N+1-free."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Max, QuerySet
from django.http import Http404
from dulwich.errors import ChecksumMismatch, ObjectFormatException, ObjectMissing

from runtime_app.git import GitError, commits_log, refs_list, repo_open
from runtime_app.models import ApiToken, AuditEntry, Event, Project, Receipt, Repository, WebhookDelivery
from runtime_app.notifications import RECEIPT_SUBJECT
from runtime_app.subjects import attention_sorted, project_sections, subject_labels_attach, subject_project_id

# Who reads: a signed-in account, or an anonymous visitor (who sees no project).
Visitor = AbstractBaseUser | AnonymousUser


def page_url(path: str) -> str:
    """The address of a page for a reader outside a request (the CLI): the public origin
    (CRUCIBLE_CSRF_TRUSTED_ORIGINS' first) when one is configured, else where `serve` listens."""
    config = settings.CONFIG
    if config.csrf_trusted_origins:
        return config.csrf_trusted_origins[0].rstrip("/") + path
    # A wildcard bind address is no address to open; this machine's loopback serves it.
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host  # noqa: S104
    host = f"[{host}]" if ":" in host else host
    return f"{'https' if config.https else 'http'}://{host}:{config.port}{path}"


def projects_for_user(user: Visitor) -> QuerySet[Project]:
    if not user.is_authenticated or not user.is_active:
        return Project.objects.none()
    if user.is_superuser:
        return Project.objects.all()
    return Project.objects.filter(memberships__user=user)


def project_for_reference(user: Visitor, reference: int | str) -> Project:
    """The project the user may see by its id (an int) or its name (a str); otherwise 404, so
    outsiders learn nothing. The one lookup behind the pages, the API and the CLI."""
    field = "pk" if isinstance(reference, int) else "name"
    project = projects_for_user(user).filter(**{field: reference}).first()
    if project is None:
        raise Http404("No such project.")
    return project


def project_for_user(user: Visitor, project_id: int | str) -> Project:
    """The project by its id (a form may give it as text) if the user may see it; otherwise 404."""
    return project_for_reference(user, int(project_id))


def project_memberships(project: Project) -> Any:
    """A project's members with their roles, by username."""
    return project.memberships.select_related("user").order_by("user__username")


def project_hub(user: Visitor, project: Project) -> dict[str, Any]:
    """What the project page shows: its repositories, each app's section (specs and searches,
    agents …) and, first, everything in them that needs a reader, most urgent first."""
    sections = project_sections(user, project)
    return {
        "repositories": list(Repository.objects.filter(project=project).order_by("name")),
        "sections": sections,
        "attention": attention_sorted([item for section in sections for item in section.attention]),
    }


def project_accessible(user: Visitor, project_id: int | None) -> bool:
    return project_id is not None and projects_for_user(user).filter(pk=project_id).exists()


def subject_accessible_project(user: Visitor, subject_type: str, subject_id: int) -> int | None:
    """The subject's project id when the user may watch it, else None."""
    project_id = subject_project_id(subject_type, subject_id)
    return project_id if project_accessible(user, project_id) else None


def event_last_id() -> int:
    return Event.objects.aggregate(last=Max("id"))["last"] or 0


def events_for_user(
    user: Visitor,
    *,
    after_id: int = 0,
    subject: tuple[str, int] | None = None,
    limit: int = 200,
) -> list[Event]:
    """Events after after_id, oldest first, only from projects the user may see."""
    events = Event.objects.select_related("project").filter(
        id__gt=after_id, project__in=projects_for_user(user)
    )
    if subject is not None:
        events = events.filter(subject_type=subject[0], subject_id=subject[1])
    return subject_labels_attach(list(events.order_by("id")[:limit]))


def events_recent_for_user(
    user: Visitor, *, up_to_id: int, subject: tuple[str, int] | None = None, limit: int = 50
) -> list[Event]:
    """The newest events up to up_to_id, newest first, for a page's first render."""
    events = Event.objects.select_related("project").filter(
        id__lte=up_to_id, project__in=projects_for_user(user)
    )
    if subject is not None:
        events = events.filter(subject_type=subject[0], subject_id=subject[1])
    return subject_labels_attach(list(events.order_by("-id")[:limit]))


def audit_entries_for_user(user: Visitor) -> QuerySet[AuditEntry]:
    entries = AuditEntry.objects.select_related("project")
    if user.is_superuser:
        return entries
    return entries.filter(project__in=projects_for_user(user)) | entries.filter(
        project__isnull=True, actor=user
    )


def api_tokens_for_user(user: Visitor) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user)


def repositories_for_user(user: Visitor) -> QuerySet[Repository]:
    return Repository.objects.select_related("project").filter(project__in=projects_for_user(user))


def repository_for_user(user: Visitor, repository_id: int) -> Repository:
    repository = repositories_for_user(user).filter(pk=repository_id).first()
    if repository is None:
        raise Http404("No such repository.")
    return repository


def repository_refs(repository) -> dict:
    """A registered repository's branches, tags and checked-out branch, read live from git;
    `error` says why they cannot be read (moved, deleted, no longer a repository)."""
    try:
        repo = repo_open(repository.path)
    except GitError as error:
        return {"branches": [], "tags": [], "head": "", "error": str(error)}
    try:
        refs = refs_list(repo)
        chain, _ = repo.refs.follow(b"HEAD")
        head = chain[-1].decode() if chain else ""
    finally:
        repo.close()
    return {**refs, "head": head.removeprefix("refs/heads/") if head.startswith("refs/heads/") else "",
            "error": ""}


def receipts_for_user(user: Visitor) -> QuerySet[Receipt]:
    """Receipts of the user's projects; receipts with no project are for superusers only."""
    if not user.is_authenticated or not user.is_active:
        return Receipt.objects.none()
    if user.is_superuser:
        return Receipt.objects.all()
    return Receipt.objects.filter(project__memberships__user=user)


def receipt_for_user(user: Visitor, receipt_id: int) -> Receipt:
    receipt = receipts_for_user(user).filter(pk=receipt_id).first()
    if receipt is None:
        raise Http404("No such receipt.")
    return receipt


def receipts_for_subject(user: Visitor, subject_type: str, subject_id: int) -> QuerySet[Receipt]:
    return receipts_for_user(user).filter(subject_type=subject_type, subject_id=subject_id)


# ------------------------------------------------------------------------ audit log: filter and export


def audit_entries_filtered(
    user: Visitor,
    *,
    action: str = "",
    actor: str = "",
    project: str = "",
    date_from: Any = None,
    date_to: Any = None,
    q: str = "",
) -> QuerySet[AuditEntry]:
    """The entries audit_entries_for_user lets the user see, narrowed by a filter, newest first.

    `action` is how the action begins ("merge" finds merge.create, "approval" every
    approval.*, a full name that action); `actor` a username (or "system"); `project` a
    project id, or "none" for entries without a project; date_from and date_to are inclusive
    `date`s; `q` is text contained in the target.
    """
    entries = audit_entries_for_user(user)
    if action:
        entries = entries.filter(action__startswith=action)
    if actor:
        entries = entries.filter(actor_name__iexact=actor)
    if project == "none":
        entries = entries.filter(project__isnull=True)
    elif project:
        entries = entries.filter(project_id=int(project))
    if date_from:
        entries = entries.filter(created_at__date__gte=date_from)
    if date_to:
        entries = entries.filter(created_at__date__lte=date_to)
    if q:
        entries = entries.filter(target__icontains=q)
    return entries.order_by("-id")


def audit_entries_batch(entries: QuerySet[AuditEntry], *, before_id: int | None = None,
                        size: int = 1000) -> list[AuditEntry]:
    """One batch of `entries`, newest first, with ids below before_id: keyset paging, so an
    export of any length reads in bounded memory and holds no cursor between batches."""
    if before_id is not None:
        entries = entries.filter(id__lt=before_id)
    return list(entries.order_by("-id")[:size])


def audit_filter_suggestions(user: Visitor) -> dict[str, list[str]]:
    """Action names (with their dotted prefixes) and actor names the user's entries hold."""
    entries = audit_entries_for_user(user).order_by()
    actions = set(entries.values_list("action", flat=True).distinct()[:500])
    actors = sorted(set(entries.values_list("actor_name", flat=True).distinct()[:500]))
    return {"actions": sorted(actions | {name.split(".", 1)[0] for name in actions}), "actors": actors}


# ------------------------------------------------------------------------ repository page


def repository_commits(repository: Repository, ref: str, limit: int = 20) -> dict:
    """The newest commits of a ref, read live with dulwich; `error` says why they cannot be."""
    try:
        repo = repo_open(repository.path)
    except GitError as error:
        return {"commits": [], "error": str(error)}
    try:
        return {"commits": commits_log(repo, ref, limit), "error": ""}
    except (GitError, KeyError, OSError, ChecksumMismatch, ObjectFormatException, ObjectMissing) as error:
        return {"commits": [], "error": f"{ref}: its history cannot be read ({error})"}
    finally:
        repo.close()


def repository_searches(repository: Repository, limit: int = 100) -> list:
    """The newest searches frozen against this repository, with their run and author."""
    searches = repository.searches.filter(project_id=repository.project_id)
    return list(searches.select_related("created_by", "run").order_by("-created_at")[:limit])


# ------------------------------------------------------------------------ notifications


def webhook_deliveries_recent(project: Project, limit: int = 25) -> list[Any]:
    """The project's latest webhook deliveries, each with `.receipts` (attempts, oldest first)."""
    deliveries = list(WebhookDelivery.objects.filter(webhook__project=project)
                      .select_related("webhook").order_by("-id")[:limit])
    by_delivery: dict[int, list[Receipt]] = {d.pk: [] for d in deliveries}
    for receipt in Receipt.objects.filter(subject_type=RECEIPT_SUBJECT, subject_id__in=list(by_delivery)):
        by_delivery[receipt.subject_id].append(receipt)
    for delivery in deliveries:
        delivery.receipts = by_delivery[delivery.pk]
    return deliveries


def live_feed(user: Any, subject: tuple[str, int] | None = None) -> dict[str, Any]:
    """What a page with a live activity feed needs: its recent events and the socket to resume on."""
    # Read the last id first: the page shows events up to it and the socket resumes there.
    last_event_id = event_last_id()
    events = events_recent_for_user(user, up_to_id=last_event_id, subject=subject)
    ws_path = f"/ws/events/{subject[0]}/{subject[1]}/" if subject else "/ws/events/"
    return {"events": events, "last_event_id": last_event_id, "ws_path": ws_path}
