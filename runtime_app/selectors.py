"""Reads for runtime_app: access-filtered and N+1-free."""

from __future__ import annotations

from typing import Any

from django.db.models import Max, QuerySet
from django.http import Http404

from runtime_app.git import GitError, refs_list, repo_open
from runtime_app.models import ApiToken, AuditEntry, Event, Project, Receipt, Repository
from runtime_app.subjects import subject_project_id


def projects_for_user(user: Any) -> QuerySet[Project]:
    if not user.is_authenticated or not user.is_active:
        return Project.objects.none()
    if user.is_superuser:
        return Project.objects.all()
    return Project.objects.filter(memberships__user=user)


def project_for_user(user: Any, project_id: int) -> Project:
    """The project if the user may see it; otherwise 404, so outsiders learn nothing."""
    project = projects_for_user(user).filter(pk=project_id).first()
    if project is None:
        raise Http404("No such project.")
    return project


def project_accessible(user: Any, project_id: int | None) -> bool:
    return project_id is not None and projects_for_user(user).filter(pk=project_id).exists()


def subject_accessible_project(user: Any, subject_type: str, subject_id: int) -> int | None:
    """The subject's project id when the user may watch it, else None."""
    project_id = subject_project_id(subject_type, subject_id)
    return project_id if project_accessible(user, project_id) else None


def event_last_id() -> int:
    return Event.objects.aggregate(last=Max("id"))["last"] or 0


def events_for_user(
    user: Any,
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
    return list(events.order_by("id")[:limit])


def events_recent_for_user(
    user: Any, *, up_to_id: int, subject: tuple[str, int] | None = None, limit: int = 50
) -> list[Event]:
    """The newest events up to up_to_id, newest first, for a page's first render."""
    events = Event.objects.select_related("project").filter(
        id__lte=up_to_id, project__in=projects_for_user(user)
    )
    if subject is not None:
        events = events.filter(subject_type=subject[0], subject_id=subject[1])
    return list(events.order_by("-id")[:limit])


def audit_entries_for_user(user: Any) -> QuerySet[AuditEntry]:
    entries = AuditEntry.objects.select_related("project")
    if user.is_superuser:
        return entries
    return entries.filter(project__in=projects_for_user(user)) | entries.filter(
        project__isnull=True, actor=user
    )


def api_tokens_for_user(user: Any) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user)


def repositories_for_user(user: Any) -> QuerySet[Repository]:
    return Repository.objects.select_related("project").filter(project__in=projects_for_user(user))


def repository_for_user(user: Any, repository_id: int) -> Repository:
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


def receipts_for_user(user: Any) -> QuerySet[Receipt]:
    """Receipts of the user's projects; receipts with no project are for superusers only."""
    if not user.is_authenticated or not user.is_active:
        return Receipt.objects.none()
    if user.is_superuser:
        return Receipt.objects.all()
    return Receipt.objects.filter(project__memberships__user=user)


def receipt_for_user(user: Any, receipt_id: int) -> Receipt:
    receipt = receipts_for_user(user).filter(pk=receipt_id).first()
    if receipt is None:
        raise Http404("No such receipt.")
    return receipt


def receipts_for_subject(user: Any, subject_type: str, subject_id: int) -> QuerySet[Receipt]:
    return receipts_for_user(user).filter(subject_type=subject_type, subject_id=subject_id)
