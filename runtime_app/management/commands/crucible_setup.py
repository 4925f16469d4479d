"""First-run setup, safe to repeat: roles, the admin account, and a demo project."""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from runtime_app import roles, services
from runtime_app.models import Project, ProjectMembership

DEMO_PROJECT = "demo"


class Command(BaseCommand):
    help = "Create the roles, the admin account and the demo project if they are missing."

    def handle(self, *args: Any, **options: Any) -> None:
        roles.roles_sync()
        admin = self._admin()
        with transaction.atomic():
            project, created = Project.objects.get_or_create(
                name=DEMO_PROJECT,
                defaults={
                    "description": "A sandbox project made by `make run` to try Crucible.",
                    "created_by": admin,
                },
            )
            ProjectMembership.objects.get_or_create(project=project, user=admin)
            if created:
                services.audit_record(admin, "project.create", project=project, target=project.name)
                services.event_emit(
                    project, "project", project.pk, "project.created",
                    {"message": "Demo project ready: ping the workers from its page."},
                )

    def _admin(self):
        User = get_user_model()
        username = settings.CONFIG.admin_username
        admin = User.objects.filter(username=username).first()
        if admin is not None:
            return admin
        password = settings.CONFIG.admin_password
        generated = password is None
        if generated:
            password = secrets.token_urlsafe(12)
        admin = User.objects.create_superuser(username=username, email="", password=password)
        if generated:
            # Printed once; `manage.py changepassword` replaces a lost one.
            self.stdout.write(self.style.WARNING(
                f"Created the admin account {username!r} with password: {password}\n"
                "It is shown only this once."
            ))
        else:
            self.stdout.write(f"Created the admin account {username!r} (CRUCIBLE_ADMIN_PASSWORD).")
        return admin
