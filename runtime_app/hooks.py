"""Hooks that hold whoever changes roles and memberships, and however, to the same rules.

A role is a project membership's `role`, so every door that changes one (the members page,
the API, the CLI, the Django admin, the ORM) goes through these hooks: each change is audited
and announced (services.project_membership_role_changed), and whoever may no longer decide on a
project's winners (their membership is deleted, their role drops below approver, their account
is deactivated or loses the superuser flag) has their pending decisions withdrawn: the hooks
call one service, which sends `approver_standing_ended` for the apps that hold decisions
(runtime_app never imports them). RuntimeAppConfig.ready() imports this module and calls connect().
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery.signals import worker_ready
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.db.models.signals import post_save, pre_delete, pre_save

from runtime_app import access, sandbox
from runtime_app.models import Project, ProjectMembership
from runtime_app.services import (
    approver_standing_end,
    project_membership_end,
    project_membership_role_changed,
)
from runtime_app.signals import current_actor

logger = logging.getLogger(__name__)


def connect() -> None:
    """Leaving a project, a role dropping below approver or losing the account withdraws pending
    decisions, and every role change is audited, whichever door made the change (services, the
    admin, the ORM)."""
    pre_delete.connect(membership_deleting, sender=ProjectMembership, dispatch_uid="crucible_membership_end")
    pre_save.connect(membership_saving, sender=ProjectMembership, dispatch_uid="crucible_membership_saving")
    post_save.connect(membership_saved, sender=ProjectMembership, dispatch_uid="crucible_membership_saved")
    user_model = get_user_model()
    pre_save.connect(user_saving, sender=user_model, dispatch_uid="crucible_user_saving")
    post_save.connect(user_saved, sender=user_model, dispatch_uid="crucible_user_saved")
    worker_ready.connect(root_worker_check, weak=False, dispatch_uid="crucible_root_worker_check")


def root_worker_check(**kwargs: Any) -> None:
    """A root worker is fine while commands run in bubblewrap as the unprivileged uid; say
    plainly when they would not (crucible/celery.py silences Celery's own warning for this)."""
    if os.geteuid() != 0:
        return
    try:
        isolation = sandbox.isolation_choose()
    except sandbox.SandboxError as error:
        logger.warning("The worker runs as root and %s", error)
        return
    if isolation != sandbox.BUBBLEWRAP:
        _, reason = sandbox.bubblewrap_probe()
        logger.warning("The worker runs as root and commands run without bubblewrap (CRUCIBLE_SANDBOX=%s, "
                       "%s): candidate code would run as root. Install bubblewrap or run Crucible as "
                       "an unprivileged user (docs/sandbox.md).", sandbox.sandbox_mode(), reason)


def membership_deleting(sender: Any, instance: Any, origin: Any = None, **kwargs: Any) -> None:
    """pre_delete on ProjectMembership, whatever deletes it (service, admin, ORM, a deleted user).

    Deleting the project itself deletes its searches and decisions with it: nothing to withdraw."""
    if isinstance(origin, Project) or (isinstance(origin, QuerySet) and origin.model is Project):
        return
    project_membership_end(current_actor(), instance)


def membership_saving(sender: Any, instance: Any, raw: bool = False, **kwargs: Any) -> None:
    """pre_save on ProjectMembership: note the role it had, so post_save can tell a change."""
    if raw or instance.pk is None:
        return
    instance.__dict__["_crucible_role_before"] = (
        sender._default_manager.filter(pk=instance.pk).values_list("role", flat=True).first())


def membership_saved(sender: Any, instance: Any, created: bool, raw: bool = False, **kwargs: Any) -> None:
    """post_save on ProjectMembership: a changed role is audited, announced and may end standing."""
    before = instance.__dict__.pop("_crucible_role_before", None)
    if raw or created or before is None or before == instance.role:
        return
    project_membership_role_changed(current_actor(), instance, before)


def user_saving(sender: Any, instance: Any, raw: bool = False, update_fields: Any = None,
                **kwargs: Any) -> None:
    """pre_save on the user model: note whether they were active and a superuser before this save."""
    if raw or instance.pk is None or (update_fields is not None and set(update_fields) <= {"last_login"}):
        return
    instance.__dict__["_crucible_before"] = (
        sender._default_manager.filter(pk=instance.pk).values_list("is_active", "is_superuser").first())


def user_saved(sender: Any, instance: Any, **kwargs: Any) -> None:
    """post_save on the user model: deactivation ends standing everywhere; a lost superuser flag
    ends it in every project where their own role is below approver."""
    before = instance.__dict__.pop("_crucible_before", None)
    if before is None:
        return
    was_active, was_superuser = before
    actor, username = current_actor(), instance.get_username()
    if was_active and not instance.is_active:
        approver_standing_end(actor, instance, project=None, reason=f"{username} was deactivated")
    elif was_superuser and not instance.is_superuser and instance.is_active:
        still = access.projects_with_role(instance, access.APPROVER).values_list("pk", flat=True)
        for project in Project.objects.exclude(pk__in=list(still)).order_by("pk"):
            approver_standing_end(actor, instance, project=project,
                                  reason=f"{username} lost the superuser flag")
