"""Per-project roles: a project admin manages members and roles from the members page, the API
and `manage.py project`, with the same checks and words; each role opens exactly its doors; the
migration carries yesterday's global groups into each membership without losing anyone's access."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from runtime_app import access
from runtime_app.models import AuditEntry, Project, ProjectMembership
from tests.helpers import login, make_user, text_of

pytestmark = pytest.mark.django_db


def members_of(project) -> dict[str, str]:
    return dict(project.memberships.values_list("user__username", "role"))


# ------------------------------------------------------------------------ the members page


def test_a_project_admin_adds_a_member_by_username_with_a_role_from_the_page(personas):
    make_user("newcomer")
    client = login(personas.owner)
    response = client.post(f"/projects/{personas.alpha.pk}/members/add/",
                           {"who": "newcomer", "role": "approver"})
    assert response.status_code == 302
    assert members_of(personas.alpha)["newcomer"] == access.APPROVER
    page = text_of(client.get(f"/projects/{personas.alpha.pk}/members/"))
    assert "newcomer added as approver." in page
    assert AuditEntry.objects.filter(action="project.member_add", target="newcomer",
                                     detail__role="approver", actor=personas.owner).exists()


@pytest.mark.parametrize("who, words", [
    ("", "This field is required."),
    ("nobody-here", "No account is named 'nobody-here': give their email address to invite them."),
    ("not-an@", "'not-an@' is not a valid email address."),
])
def test_adding_someone_who_cannot_be_found_says_why_on_the_form(personas, who, words):
    response = login(personas.owner).post(f"/projects/{personas.alpha.pk}/members/add/",
                                          {"who": who, "role": "viewer"})
    assert response.status_code == 400 and words in text_of(response)


def test_a_role_that_is_not_one_of_the_four_is_refused(personas):
    make_user("newcomer")
    response = login(personas.owner).post(f"/projects/{personas.alpha.pk}/members/add/",
                                          {"who": "newcomer", "role": "owner"})
    assert response.status_code == 400 and "Select a valid choice" in text_of(response)
    assert "newcomer" not in members_of(personas.alpha)


def test_a_project_admin_changes_a_role_and_removes_a_member_from_the_page(personas):
    client = login(personas.owner)
    member = personas.member
    client.post(f"/projects/{personas.alpha.pk}/members/{member.pk}/role/", {"role": "approver"})
    assert members_of(personas.alpha)["member"] == access.APPROVER
    client.post(f"/projects/{personas.alpha.pk}/members/{member.pk}/remove/")
    assert "member" not in members_of(personas.alpha)
    assert list(AuditEntry.objects.filter(action__startswith="project.member_").exclude(
        action="project.member_add").order_by("id").values_list("action", "target")) == [
        ("project.member_role", "member: operator → approver"), ("project.member_remove", "member")]


def test_the_last_admin_cannot_demote_themselves_and_is_told_why(personas):
    client = login(personas.owner)
    response = client.post(f"/projects/{personas.alpha.pk}/members/{personas.owner.pk}/role/",
                           {"role": "viewer"}, follow=True)
    assert "owner is the last project admin of alpha: make someone else admin first." in text_of(response)
    assert members_of(personas.alpha)["owner"] == access.ADMIN


def test_members_who_are_not_admins_see_the_roles_but_cannot_change_them(personas):
    client = login(personas.member)  # an operator
    page = text_of(client.get(f"/projects/{personas.alpha.pk}/members/"))
    assert "owner" in page and "project admin" in page and "Set role" not in page
    assert "Only a project admin of alpha can add members or change roles." in page
    make_user("newcomer")
    refused = client.post(f"/projects/{personas.alpha.pk}/members/add/", {"who": "newcomer", "role": "admin"})
    assert refused.status_code == 403
    refused = client.post(f"/projects/{personas.alpha.pk}/members/{personas.owner.pk}/remove/")
    assert refused.status_code == 403 and "owner" in members_of(personas.alpha)


def test_outsiders_get_a_404_and_anonymous_visitors_the_login_page(personas):
    assert login(personas.outsider).get(f"/projects/{personas.alpha.pk}/members/").status_code == 404
    assert login(personas.outsider).post(f"/projects/{personas.alpha.pk}/members/add/",
                                         {"who": "outsider", "role": "admin"}).status_code == 404
    response = Client().get(f"/projects/{personas.alpha.pk}/members/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_the_members_forms_need_a_csrf_token(personas):
    client = Client(enforce_csrf_checks=True)
    client.force_login(personas.owner)
    response = client.post(f"/projects/{personas.alpha.pk}/members/{personas.member.pk}/remove/")
    assert response.status_code == 403 and "member" in members_of(personas.alpha)


def test_a_member_may_leave_a_project_themselves(personas):
    url = f"/projects/{personas.alpha.pk}/members/{personas.member.pk}/remove/"
    response = login(personas.member).post(url)
    assert response.status_code == 302 and response["Location"] == "/"
    assert "member" not in members_of(personas.alpha)


# ------------------------------------------------------------------------ what each role opens


def test_each_role_opens_exactly_its_doors_in_its_own_project_only(personas):
    """The role is per project: an admin of beta is nobody in alpha, and a viewer of alpha cannot
    launch there even when they operate elsewhere."""
    reader = make_user("reader")
    ProjectMembership.objects.create(project=personas.alpha, user=reader, role=access.VIEWER)
    ProjectMembership.objects.create(project=personas.beta, user=reader, role=access.OPERATOR)
    client = login(reader)
    alpha_page = text_of(client.get(f"/projects/{personas.alpha.pk}/"))
    beta_page = text_of(client.get(f"/projects/{personas.beta.pk}/"))
    assert "Operators can ping the workers." in alpha_page
    assert "Ping the workers" in beta_page and "Operators can ping" not in beta_page
    assert client.post(f"/projects/{personas.alpha.pk}/ping/").status_code == 403
    assert client.post(f"/projects/{personas.beta.pk}/ping/").status_code == 302
    assert "alpha: viewer" in text_of(client.get("/")) and "beta: operator" in text_of(client.get("/"))


def test_creating_a_project_needs_the_add_project_permission_and_makes_its_creator_admin(personas):
    plain = make_user("plain")
    home = text_of(login(plain).get("/"))
    assert "Create project" not in home and "Ask a project admin to add you." in home
    assert login(plain).post("/projects/new/", {"name": "gamma"}).status_code == 403
    assert login(personas.owner).post("/projects/new/", {"name": "gamma"}).status_code == 302
    gamma = Project.objects.get(name="gamma")
    assert members_of(gamma) == {"owner": access.ADMIN}


# ------------------------------------------------------------------------ the API and the CLI


def api(user) -> Client:
    return login(user)


def test_the_api_lists_adds_changes_and_removes_members_like_the_page(personas):
    make_user("newcomer")
    client = api(personas.owner)
    base = f"/api/projects/{personas.alpha.pk}/members"
    added = client.post(base, {"who": "newcomer", "role": "operator"}, content_type="application/json")
    assert added.status_code == 201 and added.json()["role"] == "operator"
    again = client.post(base, {"who": "newcomer", "role": "admin"}, content_type="application/json")
    assert again.status_code == 200 and again.json()["role"] == "operator"  # keeps their role
    changed = client.patch(f"{base}/newcomer", {"role": "approver"}, content_type="application/json")
    assert changed.status_code == 200 and changed.json()["role"] == "approver"
    listed = {row["username"]: row["role"] for row in client.get(base).json()}
    assert listed == {"owner": "admin", "member": "operator", "newcomer": "approver"}
    assert client.delete(f"{base}/newcomer").status_code == 204
    bad = client.patch(f"{base}/member", {"role": "owner"}, content_type="application/json")
    assert bad.status_code == 400
    assert "Choose one of: viewer, operator, approver, project admin." in bad.json()["detail"]
    last = client.patch(f"{base}/owner", {"role": "viewer"}, content_type="application/json")
    assert last.status_code == 400 and "last project admin" in last.json()["detail"]
    refused = api(personas.member).patch(f"{base}/member", {"role": "admin"}, content_type="application/json")
    assert refused.status_code == 403
    assert refused.json()["detail"] == "This needs the project admin role in alpha (yours is operator)."
    assert api(personas.outsider).get(base).status_code == 404
    me = client.get("/api/me").json()
    assert me["roles"] == {"alpha": "admin"} and me["can_create_projects"] is True


def project_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("project", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    return code, out.getvalue(), err.getvalue()


def test_the_cli_manages_members_with_the_same_checks_and_words(personas):
    make_user("newcomer")
    assert project_cli("add", "alpha", "newcomer", "--role", "operator", "--user", "owner")[0] == 0
    assert project_cli("role", "alpha", "newcomer", "approver", "--user", "owner")[0] == 0
    code, out, _ = project_cli("members", "alpha", "--user", "member")
    assert code == 0 and out.splitlines() == ["member\toperator", "newcomer\tapprover", "owner\tadmin"]
    code, _, err = project_cli("role", "alpha", "newcomer", "admin", "--user", "member")
    assert code == 1
    assert err.strip() == "member: This needs the project admin role in alpha (yours is operator)."
    code, _, err = project_cli("remove", "alpha", "owner", "--user", "owner")
    assert code == 1 and "owner is the last project admin of alpha" in err
    code, _, err = project_cli("members", "alpha", "--user", "outsider")
    assert code == 1 and "no project named 'alpha' that outsider is in" in err
    assert project_cli("remove", "alpha", "newcomer", "--user", "owner")[0] == 0
    assert "newcomer" not in members_of(personas.alpha)


# ------------------------------------------------------------------------ the migration


@pytest.mark.django_db(transaction=True)
def test_the_migration_carries_global_groups_into_each_membership_without_losing_access():
    executor = MigrationExecutor(connection)
    before = [("runtime_app", "0008_notifications")]
    latest = executor.loader.graph.leaf_nodes()
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    Group, User = old.get_model("auth", "Group"), old.get_model("auth", "User")
    OldProject = old.get_model("runtime_app", "Project")
    OldMembership = old.get_model("runtime_app", "ProjectMembership")
    groups = {name: Group.objects.create(name=name) for name in ("viewer", "operator", "approver")}
    people = {name: User.objects.create(username=name)
              for name in ("creator", "op", "appr", "both", "reader", "none")}
    groups["operator"].user_set.add(people["creator"], people["op"], people["both"])
    groups["approver"].user_set.add(people["appr"], people["both"])
    groups["viewer"].user_set.add(people["reader"])
    project = OldProject.objects.create(name="legacy", created_by=people["creator"])
    for person in people.values():
        OldMembership.objects.create(project=project, user=person)
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(latest)
    legacy = Project.objects.get(name="legacy")
    assert members_of(legacy) == {"creator": "admin", "op": "operator", "appr": "approver",
                                  "both": "approver", "reader": "viewer", "none": "viewer"}
    users = get_user_model().objects
    assert users.get(username="op").has_perm(access.CREATE_PROJECT)  # operators could create projects
    assert not users.get(username="appr").has_perm(access.CREATE_PROJECT)
    from django.contrib.auth.models import Group as LiveGroup
    assert not LiveGroup.objects.filter(name__in=["viewer", "operator", "approver"]).exists()
