"""Hooks that hold whoever changes roles and memberships, and however, to the same rules.

Every grant or revocation of a role is recorded. Roles are the viewer/operator/approver
groups, so a role changes whenever a user joins or leaves one of them, from either side of
the m2m (`user.groups.add/remove/set/clear`, `group.user_set.…`, the admin's user form).

Whoever may no longer decide on a project's winners (their membership row is deleted, or
they lose the approve permission: a group, a direct permission, the group's permission,
deactivation) has their pending decisions withdrawn: the hooks call one service, which
sends `approver_standing_ended` for the apps that hold decisions (runtime_app never
imports them).

The actor is the one a service names (`acting_as`), else the user of the request being
served (set by AuditActorMiddleware), else nobody: the entry then says "system".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db.models import QuerySet
from django.dispatch import Signal

from runtime_app.roles import APPROVE, ROLE_NAMES

_request: ContextVar[Any] = ContextVar("crucible_audit_request", default=None)
_actor: ContextVar[Any] = ContextVar("crucible_audit_actor", default=None)

# Sent inside the transaction that ends it: `user` may no longer decide on the winners of
# `project` (None: of any project). Arguments: user, project, actor (or None), reason.
approver_standing_ended = Signal()


class AuditActorMiddleware:
    """Makes the request (and so its user, read lazily) known to audit hooks while it is served."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        token = _request.set(request)
        try:
            return self.get_response(request)
        finally:
            _request.reset(token)


@contextmanager
def acting_as(actor: Any) -> Iterator[None]:
    """Within the block, hooks record `actor` as the one who made the change (a service's caller)."""
    token = _actor.set(actor)
    try:
        yield
    finally:
        _actor.reset(token)


def current_actor() -> Any:
    """The actor a service named, else the authenticated user of the request being served, or None."""
    named = _actor.get()
    if named is not None:
        return named
    user = getattr(_request.get(), "user", None)
    return user if user is not None and user.is_authenticated else None


def role_membership_changed(
    sender: Any, instance: Any, action: str, reverse: bool, pk_set: set | None, using: str, **kwargs: Any
) -> None:
    """m2m_changed on User.groups.through: record role.grant after rows are added, and
    role.revoke for the rows that exist just before they are removed or cleared (inside the
    same transaction, so a failed change records nothing). `pk_set` of post_add holds only
    the rows actually added; removals are checked against the rows present."""
    if action not in ("post_add", "pre_remove", "pre_clear"):
        return
    from runtime_app.services import audit_record

    user_field, group_field = _through_fields()
    rows = sender._default_manager.using(using).filter(**{f"{group_field}__name__in": ROLE_NAMES})
    if reverse:  # instance is a group; pk_set holds user ids
        rows = rows.filter(**{group_field: instance})
        if pk_set is not None:
            rows = rows.filter(**{f"{user_field}_id__in": pk_set})
    else:  # instance is a user; pk_set holds group ids
        rows = rows.filter(**{user_field: instance})
        if pk_set is not None:
            rows = rows.filter(**{f"{group_field}_id__in": pk_set})
    verb = "role.grant" if action == "post_add" else "role.revoke"
    actor = current_actor()
    for row in rows.select_related(user_field, group_field).order_by("pk"):
        username = getattr(row, user_field).get_username()
        role = getattr(row, group_field).name
        audit_record(actor, verb, target=f"{username}: {role}", detail={"user": username, "role": role})


def _through_fields() -> tuple[str, str]:
    """The names of the user and the group foreign keys of User.groups.through."""
    from django.contrib.auth import get_user_model

    groups = get_user_model()._meta.get_field("groups")
    return groups.m2m_field_name(), groups.m2m_reverse_field_name()


def membership_deleting(sender: Any, instance: Any, origin: Any = None, **kwargs: Any) -> None:
    """pre_delete on ProjectMembership, whatever deletes it (service, admin, ORM, a deleted user).

    Deleting the project itself deletes its searches and decisions with it: nothing to withdraw."""
    from runtime_app.models import Project
    from runtime_app.services import project_membership_end

    if isinstance(origin, Project) or (isinstance(origin, QuerySet) and origin.model is Project):
        return
    project_membership_end(current_actor(), instance)


def approve_permission_changing(sender: Any, instance: Any, action: str, **kwargs: Any) -> None:
    """m2m_changed on the groups and permissions of users and groups: whoever held the approve
    permission before a removal and does not after it loses their standing as an approver."""
    if action not in ("pre_remove", "pre_clear", "post_remove", "post_clear"):
        return
    if action.startswith("pre_"):
        instance.__dict__["_crucible_approvers"] = _approver_ids()
        return
    before = instance.__dict__.pop("_crucible_approvers", set())
    _approvers_lost(before - _approver_ids(), "lost the approve permission")


def user_saving(sender: Any, instance: Any, raw: bool = False, update_fields: Any = None,
                **kwargs: Any) -> None:
    """pre_save on the user model: note whether they could approve before this save."""
    if raw or instance.pk is None or (update_fields is not None and set(update_fields) <= {"last_login"}):
        return
    instance.__dict__["_crucible_could_approve"] = instance.pk in _approver_ids([instance.pk])


def user_saved(sender: Any, instance: Any, **kwargs: Any) -> None:
    """post_save on the user model: deactivation or a lost superuser flag ends approver standing."""
    if instance.__dict__.pop("_crucible_could_approve", False) and not _approver_ids([instance.pk]):
        _approvers_lost({instance.pk}, "was deactivated" if not instance.is_active else
                        "lost the approve permission")


def _approver_ids(among: list[int] | None = None) -> set[int]:
    """Ids of the active users holding the approve permission now, through any backend."""
    from django.contrib.auth import get_user_model

    users = get_user_model()._default_manager.filter(is_active=True)
    if among is not None:
        users = users.filter(pk__in=among)
    return {user.pk for user in users if user.has_perm(APPROVE)}


def _approvers_lost(user_ids: set[int], why: str) -> None:
    from django.contrib.auth import get_user_model

    from runtime_app.services import approver_standing_end

    actor = current_actor()
    for user in get_user_model()._default_manager.filter(pk__in=user_ids).order_by("pk"):
        approver_standing_end(actor, user, project=None, reason=f"{user.get_username()} {why}")
