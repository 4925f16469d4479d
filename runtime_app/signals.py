"""Audit hooks: every grant or revocation of a role is recorded, whoever makes it and however.

Roles are the viewer/operator/approver groups, so a role changes whenever a user joins or
leaves one of them, from either side of the m2m (`user.groups.add/remove/set/clear`,
`group.user_set.…`, the admin's user form). The actor is the user of the request being
served (set by AuditActorMiddleware), else nobody: the entry then says "system".
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from runtime_app.roles import ROLE_NAMES

_request: ContextVar[Any] = ContextVar("crucible_audit_request", default=None)


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


def current_actor() -> Any:
    """The authenticated user of the request being served, or None."""
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
