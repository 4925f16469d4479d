"""The spec editor's "describe what you want": a model drafts TOML that is only ever an
editable, validated draft (the real anthropic SDK against the loopback fake)."""

from __future__ import annotations

import dataclasses
import html

import pytest

from runtime_app.models import ProjectMembership, Receipt
from search_app.models import Spec
from tests.fakes.anthropic_server import FakeAnthropic
from tests.helpers import login, make_user
from tests.search_app.runs import spec_text

pytestmark = pytest.mark.django_db
DESCRIPTION = "Make answer() in code/answer.py return a larger number; tests must pass."


@pytest.fixture
def fake(monkeypatch, settings):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-draft-secret-0123456789")
    settings.CONFIG = dataclasses.replace(settings.CONFIG, draft_model="anthropic:fake-sonnet")
    with FakeAnthropic() as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        server.draft_toml = spec_text(population=4, rounds=[4, 1], name="drafted-search")
        yield server


def draft(client, project, description=DESCRIPTION):
    return client.post("/searches/specs/draft/", {"project": project.pk, "description": description})


def test_a_draft_fills_the_editor_validated_and_unsaved(personas, fake):
    response = draft(login(personas.member), personas.alpha)
    body = response.content.decode()
    assert response.status_code == 200
    assert 'name = &quot;drafted-search&quot;' in body and "Nothing is saved yet" in body
    assert "validation is-valid" in body
    assert not Spec.objects.exists()
    receipt = Receipt.objects.get(kind="llm_call", label="spec draft")
    assert receipt.project == personas.alpha and receipt.resolved_model == "fake-sonnet-20261201"
    assert "You draft Crucible search specs" in str(fake.requests[0]["system"])
    assert fake.requests[0]["messages"][0]["content"] == DESCRIPTION


def test_a_draft_that_does_not_validate_shows_its_errors_with_line_and_column(personas, fake):
    fake.draft_toml = 'name = "x"\npopulation = "many"\n'
    body = draft(login(personas.member), personas.alpha).content.decode()
    assert "population = &quot;many&quot;" in body
    assert "validation is-invalid" in body and "2:" in html.unescape(body) and "population" in body


def test_drafting_is_off_until_an_administrator_names_a_model(personas, settings):
    settings.CONFIG = dataclasses.replace(settings.CONFIG, draft_model="")
    response = draft(login(personas.member), personas.alpha)
    assert response.status_code == 400 and "CRUCIBLE_DRAFT_MODEL" in response.content.decode()


@pytest.mark.parametrize("description", ["", "too short", "x" * 4001])
def test_a_description_must_say_something(personas, fake, description):
    response = draft(login(personas.member), personas.alpha, description)
    assert response.status_code == 400 and "10 to 4,000 characters" in response.content.decode()
    assert not fake.requests


def test_viewers_cannot_draft_and_outsiders_cannot_draft_into_a_project_they_cannot_see(personas, fake):
    viewer = make_user("viewer-only")
    ProjectMembership.objects.create(project=personas.alpha, user=viewer)
    assert draft(login(viewer), personas.alpha).status_code == 403
    outsider = draft(login(personas.outsider), personas.alpha)
    assert outsider.status_code == 400 and "Pick one of your projects" in outsider.content.decode()
    assert not fake.requests


def test_a_failing_provider_is_a_clear_message_not_a_500(personas, fake):
    fake.fail_next(("529", 0), ("529", 0), ("529", 0), ("529", 0), ("529", 0), ("529", 0))
    response = draft(login(personas.member), personas.alpha)
    assert response.status_code == 400 and "could not draft a spec" in response.content.decode()
