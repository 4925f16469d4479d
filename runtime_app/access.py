"""Who may do what: the one place access is decided, for services, views, API, CLI and consumers.

Roles are per project: a member's role there says what they may do in that project.

viewer reads and comments; operator also registers repositories and launches searches and
evolution runs; approver also approves, requests changes and merges; project admin also
manages the project's members and their roles. A superuser holds every role in every project.
Creating a project needs the `runtime_app.add_project` permission (or a superuser); its creator
becomes its first project admin.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied

from runtime_app.models import Project, ProjectMembership, ProjectRole

VIEWER, OPERATOR, APPROVER, ADMIN = (ProjectRole.VIEWER.value, ProjectRole.OPERATOR.value,
                                     ProjectRole.APPROVER.value, ProjectRole.ADMIN.value)
ROLE_NAMES = (VIEWER, OPERATOR, APPROVER, ADMIN)
RANK = {role: rank for rank, role in enumerate(ROLE_NAMES, start=1)}
CREATE_PROJECT = "runtime_app.add_project"
# Storing provider keys and other server-wide settings: superusers only.
ADMINISTER = "administer"


def role_label(role: str) -> str:
    return ProjectRole(role).label


def role_in(user: Any, project: Any) -> str | None:
    """`user`'s role in `project`, or None when they are not a member (a superuser is an admin)."""
    if not (user.is_authenticated and user.is_active):
        return None
    if user.is_superuser:
        return ADMIN
    return (ProjectMembership.objects.filter(project=project, user=user)
            .values_list("role", flat=True).first())


def role_allows(role: str | None, needed: str) -> bool:
    return role is not None and RANK[role] >= RANK[needed]


def has_role(user: Any, project: Any, needed: str) -> bool:
    """Whether `user` holds `needed` (or a higher role) in `project`."""
    return role_allows(role_in(user, project), needed)


def has_role_anywhere(user: Any, needed: str) -> bool:
    """Whether `user` holds `needed` in at least one project (what list pages offer)."""
    if not (user.is_authenticated and user.is_active):
        return False
    if user.is_superuser:
        return True
    wanted = [role for role in ROLE_NAMES if RANK[role] >= RANK[needed]]
    return ProjectMembership.objects.filter(user=user, role__in=wanted).exists()


def may_operate(user: Any, project: Any = None) -> bool:
    """May `user` launch work in `project` (None: in any of their projects)? What pages offer."""
    if project is None:
        return has_role_anywhere(user, OPERATOR)
    return has_role(user, project, OPERATOR)


def projects_with_role(user: Any, needed: str) -> Any:
    """The projects where `user` holds `needed` or higher."""
    if user.is_superuser:
        return Project.objects.all()
    wanted = [role for role in ROLE_NAMES if RANK[role] >= RANK[needed]]
    return Project.objects.filter(memberships__user=user, memberships__role__in=wanted).distinct()


def can_create_project(user: Any) -> bool:
    return bool(user.is_authenticated and user.is_active and user.has_perm(CREATE_PROJECT))


def roles_of(user: Any) -> dict[str, str]:
    """Project name → role, for every project `user` is a member of."""
    return dict(ProjectMembership.objects.filter(user=user).order_by("project__name")
                .values_list("project__name", "role"))


def require(user: Any, permission: str, project: Project | None = None) -> str | None:
    """Refuse with PermissionDenied unless `user` holds `permission`; returns their role in `project`.

    `permission` is a role (VIEWER … ADMIN), needed in `project` or, without one, in at least one
    project; or CREATE_PROJECT; or ADMINISTER (a superuser).
    """
    if permission == CREATE_PROJECT:
        if not can_create_project(user):
            raise PermissionDenied("Creating a project needs the add project permission "
                                   "(an administrator grants it).")
        return None
    if permission == ADMINISTER:
        if not (user.is_authenticated and user.is_active and user.is_superuser):
            raise PermissionDenied("Only administrators can do this.")
        return None
    if permission not in RANK:
        raise ValueError(f"unknown permission {permission!r}")
    if project is None:
        if not has_role_anywhere(user, permission):
            raise PermissionDenied(f"This needs the {role_label(permission)} role in a project.")
        return None
    role = role_in(user, project)
    if role_allows(role, permission):
        return role
    if role is None:
        raise PermissionDenied(f"Only members of {project.name} can do this.")
    raise PermissionDenied(f"This needs the {role_label(permission)} role in {project.name} "
                           f"(yours is {role_label(role)}).")
