"""The REST API: session or token auth, object access, and clear errors."""

from __future__ import annotations

import pytest
from django.test import Client
from ninja import Schema

from runtime_app.models import Project
from runtime_app.services import api_token_create, api_token_revoke, event_emit
from tests.helpers import login, make_user

pytestmark = pytest.mark.django_db


def bearer(user) -> dict[str, str]:
    _, plain = api_token_create(user, "tests")
    return {"HTTP_AUTHORIZATION": f"Bearer {plain}"}


def test_anonymous_api_calls_get_401(client):
    for url in ["/api/me", "/api/projects", "/api/events", "/api/health"]:
        assert client.get(url).status_code == 401, url
    assert client.post("/api/projects", {"name": "x"}, content_type="application/json").status_code == 401


def test_a_token_authenticates_and_a_revoked_one_does_not(personas, client):
    token, plain = api_token_create(personas.member, "cli")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {plain}"}
    response = client.get("/api/me", **headers)
    assert response.status_code == 200
    assert response.json()["username"] == "member"
    assert response.json()["roles"] == {"alpha": "operator"}
    token.refresh_from_db()
    assert token.last_used_at is not None
    api_token_revoke(personas.member, token.pk)
    assert client.get("/api/me", **headers).status_code == 401
    assert client.get("/api/me", HTTP_AUTHORIZATION="Bearer crc_made-up").status_code == 401


def test_projects_are_filtered_and_outsiders_get_404(personas, client):
    headers = bearer(personas.outsider)
    names = [p["name"] for p in client.get("/api/projects", **headers).json()]
    assert names == ["beta"]
    assert client.get(f"/api/projects/{personas.alpha.pk}", **headers).status_code == 404
    assert client.post(f"/api/projects/{personas.alpha.pk}/ping", **headers).status_code == 404


def test_events_are_filtered_by_project_access(personas, client):
    mine = event_emit(personas.alpha, "project", personas.alpha.pk, "test.mine", {})
    event_emit(personas.beta, "project", personas.beta.pk, "test.theirs", {})
    kinds = [e["kind"] for e in client.get("/api/events", **bearer(personas.member)).json()]
    assert kinds == ["test.mine"]
    after = client.get(f"/api/events?after={mine.pk}", **bearer(personas.member)).json()
    assert after == []
    other = client.get(
        f"/api/events?subject_type=project&subject_id={personas.beta.pk}", **bearer(personas.member)
    ).json()
    assert other == []


def test_creating_a_project_through_the_api_uses_the_same_rules(personas, client):
    headers = bearer(personas.member)
    created = client.post("/api/projects", {"name": "gamma"}, content_type="application/json", **headers)
    assert created.status_code == 201
    duplicate = client.post("/api/projects", {"name": "gamma"}, content_type="application/json", **headers)
    assert duplicate.status_code == 400
    assert "already exists" in duplicate.json()["detail"]
    assert duplicate.json()["errors"]["name"]
    bad = client.post("/api/projects", "{not json", content_type="application/json", **headers)
    assert bad.status_code in {400, 422}
    missing = client.post("/api/projects", {}, content_type="application/json", **headers)
    assert missing.status_code == 422
    assert "name" in str(missing.json())


def test_a_viewer_gets_403_with_a_reason(db, client):
    viewer = make_user("viewer-only")
    response = client.post("/api/projects", {"name": "nope"}, content_type="application/json",
                           **bearer(viewer))
    assert response.status_code == 403
    assert "Creating a project needs the add project permission" in response.json()["detail"]
    assert not Project.objects.filter(name="nope").exists()


def test_session_posts_need_the_csrf_token(personas):
    client = Client(enforce_csrf_checks=True)
    client.force_login(personas.member)
    response = client.post("/api/projects", {"name": "gamma"}, content_type="application/json")
    assert response.status_code in {401, 403}
    assert not Project.objects.filter(name="gamma").exists()
    client.get("/")  # sets the csrftoken cookie
    token = client.cookies["csrftoken"].value
    ok = client.post("/api/projects", {"name": "gamma"}, content_type="application/json",
                     HTTP_X_CSRFTOKEN=token)
    assert ok.status_code == 201


def test_health_reports_each_part(personas, client):
    response = client.get("/api/health", **bearer(personas.member))
    body = response.json()
    assert set(body["checks"]) == {"database", "broker", "channel_layer", "workers"}
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["channel_layer"]["ok"] is True
    # No worker runs in this test, so health says so and answers 503.
    assert body["checks"]["workers"]["ok"] is False
    assert "no worker" in body["checks"]["workers"]["error"]
    assert response.status_code == 503


def test_the_api_docs_need_a_login(personas):
    assert Client().get("/api/docs").status_code == 302
    client = Client()
    client.force_login(personas.member)
    assert client.get("/api/docs").status_code == 200
    assert client.get("/api/openapi.json").status_code == 200


def test_the_api_docs_and_schema_take_a_bearer_token_like_every_other_route(personas):
    _, plain = api_token_create(personas.member, "docs")
    token = Client(HTTP_AUTHORIZATION=f"Bearer {plain}")
    assert token.get("/api/openapi.json").json()["info"]["title"] == "Crucible API"
    assert token.get("/api/docs").status_code == 200
    wrong = Client(HTTP_AUTHORIZATION="Bearer crc_not-a-token")
    assert wrong.get("/api/openapi.json").status_code == 401
    assert Client().get("/api/openapi.json").status_code == 302  # a browser is sent to the login page


def test_each_schema_of_the_api_has_its_own_name_in_the_published_components(personas):
    import evolve_app.api
    import runtime_app.api
    import search_app.api

    components = login(personas.member).get("/api/openapi.json").json()["components"]["schemas"]
    schemas = [value for module in (runtime_app.api, search_app.api, evolve_app.api)
               for value in vars(module).values()
               if isinstance(value, type) and issubclass(value, Schema)
               and value.__module__ == module.__name__]
    names = [schema.__name__ for schema in schemas]
    assert len(names) == len(set(names)), sorted(name for name in names if names.count(name) > 1)
    for schema in schemas:
        if schema.__name__ in components:
            assert set(components[schema.__name__]["properties"]) == set(schema.model_fields), schema
