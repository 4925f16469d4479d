"""Every spec template, frozen against the demo repository `make run` creates: the demo's own
templates freeze; the others, written for other repositories, are refused naming the path the
person must replace (never frozen to fail later)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management import call_command

from runtime_app.models import Project
from search_app.demo import DEMO_SPECS
from search_app.models import Search
from search_app.services import search_freeze
from search_app.spec import spec_validate
from search_app.spec_templates import SPEC_TEMPLATES

pytestmark = pytest.mark.django_db
# What each template does against the demo repository: None freezes, else the path freeze names.
AGAINST_THE_DEMO = {
    "speed-up": None,
    "demo-scripted": None,
    "bug-fix-with-tests": "scripts/count_failures.py",
    "refactor-with-gates": "scripts/golden_invoices.py",
}


@pytest.fixture
def demo_repository(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    settings.CONFIG = replace(settings.CONFIG, data_dir=tmp_path)
    call_command("crucible_setup", stdout=None)
    return Project.objects.get(name="demo").repositories.get()


def test_every_template_is_valid_and_its_outcome_against_the_demo_is_known():
    assert {template.slug for template in SPEC_TEMPLATES} == set(AGAINST_THE_DEMO)
    assert all(spec_validate(template.text).valid for template in SPEC_TEMPLATES)
    assert set(DEMO_SPECS.values()) <= {slug for slug, path in AGAINST_THE_DEMO.items() if path is None}


@pytest.mark.parametrize("template", SPEC_TEMPLATES, ids=lambda template: template.slug)
def test_a_template_freezes_against_the_demo_repository_or_is_refused_naming_the_path(
        template, demo_repository):
    admin = get_user_model().objects.get(username="admin")
    project = demo_repository.project
    expected = AGAINST_THE_DEMO[template.slug]
    if expected is None:
        search = search_freeze(admin, project, template.text, "HEAD", repository=demo_repository)
        assert search.name == spec_validate(template.text).spec.name
        return
    with pytest.raises(ValidationError) as caught:
        search_freeze(admin, project, template.text, "HEAD", repository=demo_repository)
    [first, *_] = caught.value.messages
    assert f"{expected} is not in the baseline tree" in first and "commit it, or fix the path" in first
    assert not Search.objects.exists()
