"""`manage.py project …`: the CLI door into the same membership services as the members page.

    project members PROJECT [--user U]             each member and their role
    project add PROJECT WHO [--role ROLE] [--user U]   add an account (username or email)
    project role PROJECT USERNAME ROLE [--user U]  change a member's role
    project remove PROJECT USERNAME [--user U]     take a member off the project

ROLE is viewer, operator, approver or admin (project admin). --user is who acts (default: the
admin account); the same checks as the page apply (only a project admin changes members).
Exit codes: 0 done, 1 refused (one line on stderr saying why).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError

from runtime_app import access
from runtime_app.cli import CrucibleCommand
from runtime_app.selectors import project_memberships
from runtime_app.services import member_find_and_add, project_member_remove, project_member_role_set


class Command(CrucibleCommand):
    help = "List a project's members, add one, change a role, or remove one."

    def add_arguments(self, parser: Any) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        members = actions.add_parser("members", help="each member and their role")
        members.add_argument("project")
        add = actions.add_parser("add", help="add an account (username or email) with a role")
        add.add_argument("project")
        add.add_argument("who")
        add.add_argument("--role", default=access.VIEWER, help=", ".join(access.ROLE_NAMES))
        role = actions.add_parser("role", help="change a member's role")
        role.add_argument("project")
        role.add_argument("username")
        role.add_argument("role", help=", ".join(access.ROLE_NAMES))
        remove = actions.add_parser("remove", help="take a member off the project")
        remove.add_argument("project")
        remove.add_argument("username")
        for sub in (members, add, role, remove):
            sub.add_argument("--user", default=None, help="who acts (default: the admin account)")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        actor = self.user_get(options["user"] or settings.CONFIG.admin_username)
        name, wanted = actor.get_username(), options["project"]
        missing = f"{name}: no project named {wanted!r} that {name} is in"
        project = self.project_get(actor, wanted, missing=missing)
        try:
            if action == "members":
                for membership in project_memberships(project):
                    self.stdout.write(f"{membership.user.get_username()}\t{membership.role}")
            elif action == "add":
                membership = member_find_and_add(actor, project, options["who"], options["role"])
                self.stdout.write(f"{membership.user.get_username()} is {membership.role} in {project.name}")
            else:
                member = project.memberships.filter(user__username=options["username"]).first()
                if member is None:
                    raise ValidationError(f"{options['username']} is not a member of {project.name}.")
                if action == "role":
                    project_member_role_set(actor, project, member.user, options["role"])
                    self.stdout.write(f"{options['username']} is {options['role']} in {project.name}")
                else:
                    project_member_remove(actor, project, member.user)
                    self.stdout.write(f"{options['username']} removed from {project.name}")
        except (ValidationError, PermissionDenied) as error:
            words = " ".join(error.messages) if isinstance(error, ValidationError) else str(error)
            self.fail([f"{actor.get_username()}: {words}"])
