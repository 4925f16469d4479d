"""First-run setup, safe to repeat: roles, the admin account, a demo project with a demo
repository (a small git repo made in the data dir), and what each app adds to it (its
AppConfig.demo_setup: search_app drafts specs, evolve_app queues a demo agent's first run)."""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils.module_loading import import_string
from dulwich import porcelain
from dulwich.object_store import tree_lookup_path
from dulwich.repo import Repo

from runtime_app import access, services
from runtime_app.models import Project, ProjectMembership

DEMO_PROJECT = "demo"
DEMO_REPO_SOURCE = Path(__file__).resolve().parents[2] / "demo_repo"
DEMO_AUTHOR = b"Crucible demo <demo@crucible.invalid>"


def _demo_modes_set(target: Path) -> None:
    """The score script must be executable whatever the checkout kept (an archive or a copy
    can drop the bit), and every file's mode is fixed so the baseline sha is the same everywhere."""
    for path in _demo_files(target):
        path.chmod(0o755 if path.suffix == ".sh" else 0o644)


def _demo_files(target: Path) -> list[Path]:
    """The demo's own files in the demo repository (not what a user added there)."""
    return [target / source.relative_to(DEMO_REPO_SOURCE) for source in sorted(DEMO_REPO_SOURCE.rglob("*"))
            if source.is_file() and "__pycache__" not in source.parts
            and (target / source.relative_to(DEMO_REPO_SOURCE)).is_file()]


def _demo_modes_uncommitted(target: Path, changed: list[str]) -> list[str]:
    """Files whose mode on disk differs from the last demo commit (a repo made from a checkout
    that had lost the score script's executable bit)."""
    with Repo(str(target)) as repo:
        tree = repo[repo.head()].tree
        stale = []
        for path in _demo_files(target):
            if str(path) in changed:
                continue
            try:
                mode, _ = tree_lookup_path(repo.__getitem__, tree, str(path.relative_to(target)).encode())
            except KeyError:
                continue
            if mode & 0o777 != path.stat().st_mode & 0o777:
                stale.append(str(path))
        return stale


class Command(BaseCommand):
    help = "Create the admin account and the demo project if they are missing."

    def handle(self, *args: Any, **options: Any) -> None:
        admin = self._admin()
        with transaction.atomic():
            project, created = Project.objects.get_or_create(
                name=DEMO_PROJECT,
                defaults={
                    "description": "A sandbox project made by `make run` to try Crucible.",
                    "created_by": admin,
                },
            )
            ProjectMembership.objects.get_or_create(project=project, user=admin,
                                                    defaults={"role": access.ADMIN})
            if created:
                services.audit_record(admin, "project.create", project=project, target=project.name)
                services.event_emit(
                    project, "project", project.pk, "project.created",
                    {"message": "Demo project ready: ping the workers from its page."},
                )
        services.repository_register(
            admin, project, str(self._demo_repository()), "certificate", trusted=True
        )
        # The apps built on the runtime add their part (AppConfig.demo_setup: a dotted path),
        # in INSTALLED_APPS order, so runtime_app names none of them.
        for config in apps.get_app_configs():
            setup = getattr(config, "demo_setup", None)
            if setup:
                import_string(setup)(admin, project, self.stdout.write)

    def _demo_repository(self) -> Path:
        """A small git repo in the data dir, committed with fixed dates (same sha everywhere)."""
        target = Path(settings.DATA_DIR) / "demo-repos" / "certificate"
        if (target / ".git").exists():
            self._demo_repository_update(target)
            return target
        shutil.copytree(DEMO_REPO_SOURCE, target, dirs_exist_ok=True)
        _demo_modes_set(target)
        porcelain.init(str(target))
        porcelain.add(str(target), paths=[str(p) for p in sorted(target.rglob("*"))
                                          if p.is_file() and ".git" not in p.parts])
        porcelain.commit(
            str(target), message=b"Demo baseline", author=DEMO_AUTHOR, committer=DEMO_AUTHOR,
            author_timestamp=1767225600, commit_timestamp=1767225600,
            author_timezone=0, commit_timezone=0, no_verify=True,
        )
        return target

    def _demo_repository_update(self, target: Path) -> None:
        """A demo repository made by an older Crucible gets the current demo files as a commit."""
        changed = []
        for source in sorted(DEMO_REPO_SOURCE.rglob("*")):
            if source.is_file() and "__pycache__" not in source.parts:
                relative = source.relative_to(DEMO_REPO_SOURCE)
                current = target / relative
                if not current.exists() or current.read_bytes() != source.read_bytes():
                    current.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, current)
                    changed.append(str(current))
        _demo_modes_set(target)
        changed.extend(_demo_modes_uncommitted(target, changed))
        if changed:
            porcelain.add(str(target), paths=changed)
            porcelain.commit(
                str(target), message=b"Demo: the current demo files", author=DEMO_AUTHOR,
                committer=DEMO_AUTHOR, author_timestamp=1767312000, commit_timestamp=1767312000,
                author_timezone=0, commit_timezone=0, no_verify=True,
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
