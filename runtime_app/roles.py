"""Roles are Django groups with permissions; projects decide which objects a user sees.

viewer reads, operator also registers repositories and launches runs, approver also
approves or rejects winners and merges. A superuser holds every role.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, Permission
from django.db.models import Q

VIEWER, OPERATOR, APPROVER = "viewer", "operator", "approver"
ROLE_NAMES = (VIEWER, OPERATOR, APPROVER)
OPERATE = "runtime_app.operate_project"
APPROVE = "runtime_app.approve_project"
# Apps whose view_* permissions every role gets; later apps add themselves here.
ROLE_APPS = ("runtime_app", "search_app", "evolve_app")
ROLE_EXTRA_CODENAMES = {
    VIEWER: (),
    OPERATOR: ("operate_project",),
    APPROVER: ("approve_project",),
}


def role_permissions(role: str) -> list[Permission]:
    wanted = Q(content_type__app_label__in=ROLE_APPS, codename__startswith="view_")
    extra = ROLE_EXTRA_CODENAMES[role]
    if extra:
        wanted |= Q(content_type__app_label="runtime_app", codename__in=extra)
    return list(Permission.objects.filter(wanted))


def roles_sync() -> None:
    """Create the three groups and give them exactly their permissions."""
    for role in ROLE_NAMES:
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set(role_permissions(role))


def roles_sync_after_migrate(**kwargs: Any) -> None:
    roles_sync()


def roles_of(user: Any) -> list[str]:
    if user.is_superuser:
        return list(ROLE_NAMES)
    return sorted(user.groups.filter(name__in=ROLE_NAMES).values_list("name", flat=True))
