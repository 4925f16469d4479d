"""The suite's schema check has teeth: an /api/ answer that /api/openapi.json does not describe
fails the test whose client received it (tests/conftest.py, api_responses_match_the_published_schema).

A test-only URLconf (this module) answers at the published path /api/me with whatever a test
puts in ANSWER, so the real checker sees a real test-client response of a chosen shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, JsonResponse
from django.test import Client
from django.urls import path

from tests.helpers import PublishedSchema, login

pytestmark = pytest.mark.django_db

PROJECT = {"id": 1, "name": "alpha", "description": "", "created_at": "2026-12-03T14:05:00Z"}
ME = {"username": "owner", "roles": {"alpha": "viewer"}, "can_create_projects": False, "projects": [PROJECT]}
ANSWER: dict = {}


@login_not_required  # the checker, not authentication, is under test
def answer(request: HttpRequest) -> JsonResponse:
    return JsonResponse(ANSWER["body"], status=ANSWER["status"], safe=False)


urlpatterns = [path("api/me", answer), path("api/nowhere", answer)]


@pytest.fixture
def forged(settings):
    """Route /api/me (and the unpublished /api/nowhere) to `answer`; give it a body and status."""
    settings.ROOT_URLCONF = __name__

    def give(body, status: int = 200) -> None:
        ANSWER.update(body=body, status=status)

    yield give
    ANSWER.clear()


def test_an_answer_of_the_published_shape_passes(forged):
    forged(ME)
    assert Client().get("/api/me").json() == ME  # the forged route itself is no mismatch


@pytest.mark.parametrize(("body", "status", "url", "why"), [
    ({"username": "owner", "roles": {}, "can_create_projects": True}, 200, "/api/me",
     "'projects' is a required property"),
    ({**ME, "projects": [{**PROJECT, "id": "one"}]}, 200, "/api/me",
     "at projects/0/id: 'one' is not of type 'integer'"),
    ({**ME, "roles": "viewer"}, 200, "/api/me", "at roles: 'viewer' is not of type 'object'"),
    (ME, 201, "/api/me", "GET /api/me answered 201, which its schema does not list"),
    (ME, 200, "/api/nowhere", "GET /api/nowhere is not in the published schema"),
], ids=["a-missing-field", "a-nested-wrong-type", "a-wrong-type", "an-unlisted-status",
        "an-unpublished-route"])
def test_an_answer_the_published_schema_rejects_fails_the_test_that_received_it(
    forged, body, status, url, why
):
    forged(body, status)
    with pytest.raises(pytest.fail.Exception, match=r"does not match /api/openapi\.json") as failure:
        Client().get(url)
    assert why in str(failure.value)


@dataclass
class Answer:
    """A hand-made test-client answer: what the checker reads of one."""

    status_code: int
    body: object

    def json(self) -> object:
        return self.body


def test_the_checker_accepts_a_real_answer_and_rejects_it_changed(personas):
    schema = PublishedSchema.load()
    real = login(personas.owner).get("/api/me")
    assert real.status_code == 200 and schema.problems("GET", "/api/me", real) == []
    changed = Answer(200, {**real.json(), "username": None})
    assert schema.problems("GET", "/api/me", changed) == [
        "GET /api/me (200) at username: None is not of type 'string'"]
