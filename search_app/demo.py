"""search_app's part of the demo project `crucible_setup` makes: draft specs for its repository
(SearchAppConfig.demo_setup names this)."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth.models import AbstractBaseUser

from runtime_app.models import Project
from search_app.models import Spec
from search_app.services import spec_create
from search_app.spec_templates import spec_template_get

DEMO_SPECS = {
    "speed up the certificate": "speed-up",
    "demo: scripted writers speed up the certificate": "demo-scripted",
}


def demo_setup(admin: AbstractBaseUser, project: Project, write: Callable[[str], None]) -> None:
    """The demo specs the project lacks, drafted from their templates (safe to repeat)."""
    for title, slug in DEMO_SPECS.items():
        if not Spec.objects.filter(project=project, title=title).exists():
            spec_create(admin, project, title, spec_template_get(slug).text)
