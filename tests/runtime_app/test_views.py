"""Pages: what each persona sees, what they may do, and what bad input gets back."""

from __future__ import annotations

import pytest
from django.test import Client

from runtime_app.models import AuditEntry, Event, Project
from tests.helpers import login, make_user

pytestmark = pytest.mark.django_db



def test_home_lists_only_the_users_projects(personas):
    page = login(personas.member).get("/").content.decode()
    assert "alpha" in page
    assert "beta" not in page


def test_home_shows_an_empty_state_that_says_what_to_do(db):
    newcomer = make_user("newcomer")
    page = login(newcomer).get("/").content.decode()
    assert "You are not a member of any project yet" in page
    assert "Ask a project" in page


def test_every_navigation_page_renders_for_a_member(personas):
    client = login(personas.member)
    for url in ["/", "/searches/", "/repositories/", "/agents/", "/audit/", "/account/",
                f"/projects/{personas.alpha.pk}/"]:
        response = client.get(url)
        assert response.status_code == 200, url
        assert b'href="/searches/"' in response.content


def test_an_outsider_gets_404_on_another_teams_project(personas):
    client = login(personas.outsider)
    assert client.get(f"/projects/{personas.alpha.pk}/").status_code == 404
    assert client.post(f"/projects/{personas.alpha.pk}/ping/").status_code == 404


def test_someone_allowed_to_create_projects_creates_one_and_becomes_its_admin(personas):
    response = login(personas.member).post("/projects/new/", {"name": "gamma", "description": ""})
    project = Project.objects.get(name="gamma")
    assert response.status_code == 302
    assert response["Location"] == f"/projects/{project.pk}/"
    assert project.memberships.get(user=personas.member).role == "admin"
    assert AuditEntry.objects.filter(action="project.create", project=project).exists()
    assert Event.objects.filter(project=project, kind="project.created").exists()


@pytest.mark.parametrize(
    ("name", "message"),
    [("", "This field is required"), ("alpha", "already exists"), ("../etc", "Use 1–96 letters")],
)
def test_a_bad_project_name_is_refused_with_a_clear_message(personas, name, message):
    response = login(personas.member).post("/projects/new/", {"name": name})
    assert response.status_code == 400
    assert message in response.content.decode()
    assert Project.objects.count() == 2


def test_a_viewer_cannot_create_a_project(db):
    viewer = make_user("viewer-only")
    assert login(viewer).post("/projects/new/", {"name": "sneaky"}).status_code == 403
    assert not Project.objects.filter(name="sneaky").exists()


def test_posts_without_a_csrf_token_are_refused(personas):
    client = Client(enforce_csrf_checks=True)
    client.force_login(personas.member)
    assert client.post("/projects/new/", {"name": "gamma"}).status_code == 403
    assert not Project.objects.filter(name="gamma").exists()


def test_event_payloads_are_escaped_on_the_page(personas):
    from runtime_app.services import event_emit

    event_emit(personas.alpha, "project", personas.alpha.pk, "test", {"message": "<b>bold</b>"})
    page = login(personas.member).get("/").content.decode()
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    assert "<b>bold</b>" not in page


def test_an_api_token_is_shown_once_and_only_its_hash_is_kept(personas):
    client = login(personas.member)
    page = client.post("/account/", {"name": "laptop CLI"}).content.decode()
    token = personas.member.api_tokens.get()
    assert "crc_" in page and token.prefix in page
    assert token.token_sha256 not in page
    later = client.get("/account/").content.decode()
    plain = page.split('<code id="new-token">')[1].split("</code>")[0]
    assert plain not in later
    assert plain not in str(list(personas.member.api_tokens.values()))


def test_a_user_can_revoke_only_their_own_tokens(personas):
    from runtime_app.services import api_token_create

    token, _ = api_token_create(personas.owner, "owner's")
    assert login(personas.member).post(f"/account/tokens/{token.pk}/revoke/").status_code == 403
    token.refresh_from_db()
    assert token.revoked_at is None
    assert login(personas.owner).post(f"/account/tokens/{token.pk}/revoke/").status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_the_audit_log_shows_only_entries_the_user_may_see(personas):
    from runtime_app.services import audit_record

    audit_record(personas.owner, "project.secret_thing", project=personas.alpha, target="a")
    audit_record(personas.outsider, "project.other_thing", project=personas.beta, target="b")
    page = login(personas.member).get("/audit/").content.decode()
    assert "project.secret_thing" in page
    assert "project.other_thing" not in page


def test_django_admin_opens_every_models_pages(personas):
    from django.contrib import admin
    from django.contrib.auth import get_user_model

    root = get_user_model().objects.create_superuser("root", password="pw-root")
    client = login(root)
    for model in admin.site._registry:
        opts = model._meta
        url = f"/admin/{opts.app_label}/{opts.model_name}/"
        assert client.get(url).status_code == 200, url
    project_change = f"/admin/runtime_app/project/{personas.alpha.pk}/change/"
    assert client.get(project_change).status_code == 200
