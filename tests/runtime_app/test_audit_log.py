"""The audit log: membership and role changes are recorded from every door; the page filters by
GET (bad values shown and ignored), pages, updates over htmx and exports the filter as CSV, each showing only
what the user may see."""

from __future__ import annotations

import csv
import functools
import io
import json
from datetime import datetime

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import AsyncClient, Client, modify_settings

from runtime_app import access, selectors
from runtime_app.models import AuditEntry, ProjectMembership
from runtime_app.services import (
    audit_record,
    project_member_add,
    project_member_remove,
    project_member_role_set,
)
from tests.helpers import login, text_of

pytestmark = pytest.mark.django_db

MIDDLEWARE = "runtime_app.signals.AuditActorMiddleware"




def role_entries() -> list[tuple[str, str, str]]:
    return list(AuditEntry.objects.filter(action__startswith="project.member").order_by("id")
                .values_list("actor_name", "action", "target"))


def csv_rows(response) -> list[list[str]]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(body)))


# ------------------------------------------------------------------------ role changes


def test_a_role_changed_directly_on_the_membership_is_recorded_as_the_system(personas):
    AuditEntry.objects.all().delete()
    membership = ProjectMembership.objects.get(project=personas.alpha, user=personas.member)
    membership.role = access.APPROVER
    membership.save()
    membership.save()  # unchanged: nothing is recorded
    assert role_entries() == [("system", "project.member_role", "member: operator → approver")]
    entry = AuditEntry.objects.get(action="project.member_role")
    assert (entry.actor, entry.project, entry.detail) == (
        None, personas.alpha, {"user": "member", "from": "operator", "to": "approver"})


def test_adding_changing_and_removing_a_member_through_the_services_names_the_admin(personas):
    AuditEntry.objects.all().delete()
    newcomer = get_user_model().objects.create_user("newcomer")
    project_member_add(personas.owner, personas.alpha, newcomer, access.OPERATOR)
    project_member_role_set(personas.owner, personas.alpha, newcomer, access.APPROVER)
    project_member_remove(personas.owner, personas.alpha, newcomer)
    assert role_entries() == [("owner", "project.member_add", "newcomer"),
                              ("owner", "project.member_role", "newcomer: operator → approver"),
                              ("owner", "project.member_remove", "newcomer")]


def test_the_audit_actor_middleware_is_installed():
    # Without it, role changes made in the admin are recorded as "system".
    assert MIDDLEWARE in settings.MIDDLEWARE
    assert settings.MIDDLEWARE.index(MIDDLEWARE) > settings.MIDDLEWARE.index(
        "django.contrib.auth.middleware.AuthenticationMiddleware")


@modify_settings(MIDDLEWARE={"append": MIDDLEWARE})
def test_a_superuser_changing_a_role_in_the_admin_is_recorded_as_the_actor(personas):
    root = get_user_model().objects.create_superuser("root", password="pw-root")
    membership = ProjectMembership.objects.get(project=personas.alpha, user=personas.member)
    last_id = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0
    response = login(root).post(f"/admin/runtime_app/projectmembership/{membership.pk}/change/", {
        "project": personas.alpha.pk, "user": personas.member.pk, "role": "approver", "_save": "Save"})
    assert response.status_code == 302, response.content.decode()[:3000]
    assert access.role_in(personas.member, personas.alpha) == access.APPROVER
    new = AuditEntry.objects.filter(id__gt=last_id, action="project.member_role")
    assert list(new.values_list("actor_name", "target")) == [("root", "member: operator → approver")]
    page = text_of(login(personas.owner).get("/audit/?action=project.member_role"))
    assert "member: operator → approver" in page
    # Outside a request the actor is the system again.
    membership.refresh_from_db()
    membership.role = access.VIEWER
    membership.save()
    assert AuditEntry.objects.order_by("-id").values_list("actor_name", "action").first() == (
        "system", "project.member_role")


def test_member_entries_belong_to_their_project_so_outsiders_do_not_see_them(personas):
    project_member_role_set(personas.owner, personas.alpha, personas.member, access.VIEWER)
    assert "member: operator → viewer" in text_of(login(personas.owner).get("/audit/"))
    assert "member: operator → viewer" not in text_of(login(personas.outsider).get("/audit/"))


# ------------------------------------------------------------------------ the page and its filter


@pytest.fixture
def entries(personas):
    """A handful of entries in alpha (the member's project), one in beta, one without a project."""
    owner, member = personas.owner, personas.member
    AuditEntry.objects.all().delete()  # the personas' role grants
    made = [
        audit_record(owner, "search.freeze", project=personas.alpha, target="S-1 speedup"),
        audit_record(member, "search.start", project=personas.alpha, target="S-1 speedup"),
        audit_record(owner, "approval.approve", project=personas.alpha, target="S-1 cand_003",
                     detail={"patch_sha256": "ab" * 32}),
        audit_record(owner, "approval.request_changes", project=personas.alpha, target="S-2 cand_001"),
        audit_record(owner, "merge.create", project=personas.alpha, target="S-1 → crucible/S-1"),
        audit_record(personas.outsider, "merge.create", project=personas.beta, target="S-9 secret"),
        audit_record(member, "api_token.create", target="laptop (abc…)"),
    ]
    days = ["2026-01-01", "2026-01-05", "2026-01-10", "2026-01-10", "2026-01-20", "2026-01-20", "2026-01-21"]
    for entry, day in zip(made, days, strict=True):
        noon = datetime.fromisoformat(day + "T12:00:00+00:00")
        AuditEntry.objects.filter(pk=entry.pk).update(created_at=noon)
    return made


def shown(response) -> list[str]:
    """The targets of the rows shown, top to bottom."""
    page = text_of(response)
    return [cell.split("</td>")[0] for cell in page.split('<td class="audit-target">')[1:]]


def test_a_member_sees_their_projects_and_their_own_project_less_entries(personas, entries):
    response = login(personas.member).get("/audit/")
    assert response.status_code == 200
    assert shown(response) == ["laptop (abc…)", "S-1 → crucible/S-1", "S-2 cand_001", "S-1 cand_003",
                               "S-1 speedup", "S-1 speedup"]
    assert shown(login(personas.owner).get("/audit/")) == shown(response)[1:]
    assert "S-9 secret" not in text_of(login(personas.owner).get("/audit/?project=&action=merge"))


@pytest.mark.parametrize(("query", "targets"), [
    ("action=merge", ["S-1 → crucible/S-1"]),
    ("action=approval", ["S-2 cand_001", "S-1 cand_003"]),
    ("action=approval.approve", ["S-1 cand_003"]),
    ("action=search.start", ["S-1 speedup"]),
    ("actor=MEMBER", ["laptop (abc…)", "S-1 speedup"]),
    ("actor=owner&action=search", ["S-1 speedup"]),
    ("project=none", ["laptop (abc…)"]),
    ("date_from=2026-01-10&date_to=2026-01-20", ["S-1 → crucible/S-1", "S-2 cand_001", "S-1 cand_003"]),
    ("date_to=2026-01-05", ["S-1 speedup", "S-1 speedup"]),
    ("q=CAND_", ["S-2 cand_001", "S-1 cand_003"]),
    ("q=crucible/&action=merge&date_from=2026-01-20", ["S-1 → crucible/S-1"]),
])
def test_the_filter_narrows_the_entries(personas, entries, query, targets):
    response = login(personas.member).get(f"/audit/?{query}")
    assert response.status_code == 200
    assert shown(response) == targets


def test_the_project_filter_offers_and_accepts_only_the_users_projects(personas, entries):
    client = login(personas.member)
    alpha = client.get(f"/audit/?project={personas.alpha.pk}")
    assert len(shown(alpha)) == 5 and f'<option value="{personas.alpha.pk}"' in alpha.content.decode()
    assert f'<option value="{personas.beta.pk}"' not in alpha.content.decode()
    beta = client.get(f"/audit/?project={personas.beta.pk}&action=merge")
    assert beta.status_code == 200
    assert "Some filters were ignored" in text_of(beta)
    assert "is not one of the available choices" in text_of(beta)
    assert shown(beta) == ["S-1 → crucible/S-1"]  # the project is ignored, the action still applies


@pytest.mark.parametrize(("query", "count"), [
    *[(query, 6) for query in [  # the bad value is ignored: all six entries are shown
        "date_from=yesterday", "date_from=2026-02-30", "date_to=99999-01-01", "project=abc", "project=1e9",
        "action=%3Cscript%3E", "action=" + "a" * 65, "q=" + "x" * 201, "actor=a%00b", "page=abc", "page=-1",
        "page=99999", "format=xml"]],
    ("date_from=2026-01-20&date_to=2026-01-01", 2),  # the end is ignored, the start kept
])
def test_bad_filter_values_are_reported_and_ignored_never_a_500(personas, entries, query, count):
    response = login(personas.member).get(f"/audit/?{query}")
    assert response.status_code == 200
    assert len(shown(response)) == count
    if not query.startswith(("page=", "format=")):
        assert "Some filters were ignored" in text_of(response)
    assert "<script>" not in response.content.decode().split("<main>")[1]


def test_a_reversed_date_range_keeps_its_start(personas, entries):
    response = login(personas.member).get("/audit/?date_from=2026-01-20&date_to=2026-01-01")
    assert "The end of the range is before its start." in text_of(response)
    assert shown(response) == ["laptop (abc…)", "S-1 → crucible/S-1"]


def test_the_page_keeps_the_filter_in_its_form_and_links(personas, entries):
    page = login(personas.member).get("/audit/?action=merge&q=crucible").content.decode()
    assert 'name="action" value="merge"' in page and 'name="q" value="crucible"' in page
    assert 'href="/audit/?action=merge&amp;q=crucible&amp;format=csv"' in page
    assert 'hx-push-url="true"' in page and 'hx-get="/audit/"' in page


def test_htmx_gets_only_the_results_and_a_clean_url_to_push(personas, entries):
    client = login(personas.member)
    response = client.get("/audit/?action=approval&actor=&project=&date_from=&date_to=&q=",
                          headers={"HX-Request": "true"})
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<section class="card" id="audit-results">')
    assert "<html" not in body and "audit-filter" not in body
    assert shown(response) == ["S-2 cand_001", "S-1 cand_003"]
    assert response["HX-Push-Url"] == "/audit/?action=approval"
    assert "HX-Request" in response["Vary"]
    bad = client.get("/audit/?date_from=never", headers={"HX-Request": "true"})
    assert "Some filters were ignored" in text_of(bad) and bad["HX-Push-Url"] == "/audit/"
    # A history restore (htmx's cache missed) needs the whole page.
    restore = client.get("/audit/?action=approval",
                         headers={"HX-Request": "true", "HX-History-Restore-Request": "true"})
    assert "<html" in restore.content.decode() and shown(restore) == shown(response)


def test_the_log_is_paged_by_100_and_pages_keep_the_filter(personas, entries):
    AuditEntry.objects.bulk_create([
        AuditEntry(actor=personas.owner, actor_name="owner", action="search.cancel", project=personas.alpha,
                   target=f"S-{n} cancelled") for n in range(205)
    ])
    client = login(personas.member)
    first = client.get("/audit/?action=search.cancel")
    assert len(shown(first)) == 100 and shown(first)[0] == "S-204 cancelled"
    assert "205 entries, page 1 of 3" in text_of(first)
    assert 'href="/audit/?action=search.cancel&amp;page=2"' in first.content.decode()
    last = client.get("/audit/?action=search.cancel&page=3", headers={"HX-Request": "true"})
    assert shown(last) == [f"S-{n} cancelled" for n in range(4, -1, -1)]
    assert last["HX-Push-Url"] == "/audit/?action=search.cancel&page=3"
    assert 'page=2"' in last.content.decode() and "page=4" not in last.content.decode()


# ------------------------------------------------------------------------ CSV export


def test_the_csv_export_streams_every_row_of_the_filter(personas, entries, monkeypatch):
    AuditEntry.objects.bulk_create([
        AuditEntry(actor=personas.owner, actor_name="owner", action="search.cancel", project=personas.alpha,
                   target=f"S-{n} cancelled") for n in range(150)
    ])
    # Small batches, so the export crosses several keyset batches.
    small = functools.partial(selectors.audit_entries_batch, size=7)
    monkeypatch.setattr(selectors, "audit_entries_batch", small)
    response = login(personas.member).get("/audit/?action=search&format=csv")
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="audit-')
    rows = csv_rows(response)
    assert rows[0] == ["when", "who", "action", "project", "target", "detail"]
    assert len(rows) == 1 + 150 + 2  # all of them, not a page
    assert rows[1][2:5] == ["search.cancel", "alpha", "S-149 cancelled"]
    assert rows[-1] == ["2026-01-01T12:00:00+00:00", "owner", "search.freeze", "alpha", "S-1 speedup", "{}"]
    assert len({row[4] for row in rows[1:]}) == 151  # no row twice across batches


def test_the_csv_export_has_the_detail_as_json_and_respects_access(personas, entries):
    rows = csv_rows(login(personas.member).get("/audit/?format=csv&action=approval.approve"))
    assert rows[1][1:] == ["owner", "approval.approve", "alpha", "S-1 cand_003",
                           json.dumps({"patch_sha256": "ab" * 32})]
    owner_rows = csv_rows(login(personas.owner).get("/audit/?format=csv"))
    targets = [row[4] for row in owner_rows[1:]]
    assert "S-9 secret" not in targets and "laptop (abc…)" not in targets and len(targets) == 5
    root = get_user_model().objects.create_superuser("root", password="pw-root")
    assert len(csv_rows(login(root).get("/audit/?format=csv"))) == 1 + 7


def test_csv_cells_that_could_be_formulas_are_quoted(personas):
    for target in ["=HYPERLINK(\"http://evil\")", "+1+1", "-2", "@SUM(A1)", "\tx", "safe = fine"]:
        audit_record(personas.owner, "project.note", project=personas.alpha, target=target,
                     detail={"x": "=1"})
    rows = csv_rows(login(personas.member).get("/audit/?format=csv&action=project.note"))
    assert [row[4] for row in reversed(rows[1:])] == [
        "'=HYPERLINK(\"http://evil\")", "'+1+1", "'-2", "'@SUM(A1)", "'\tx", "safe = fine"]
    assert all(row[5] == '{"x": "=1"}' for row in rows[1:])


def test_the_csv_export_streams_asynchronously_under_asgi(personas, entries):
    async def export():
        client = AsyncClient()
        await client.aforce_login(personas.member)
        response = await client.get("/audit/?format=csv&action=search")
        assert response.is_async
        return [chunk async for chunk in response.streaming_content]

    chunks = async_to_sync(export)()
    rows = list(csv.reader(io.StringIO(b"".join(chunks).decode())))
    assert [row[4] for row in rows[1:]] == ["S-1 speedup", "S-1 speedup"]


def test_the_audit_log_and_its_export_need_a_login(entries):
    for url in ("/audit/", "/audit/?format=csv"):
        response = Client().get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]


def test_the_audit_log_suggests_the_actions_and_actors_it_holds(personas, entries):
    page = login(personas.member).get("/audit/").content.decode()
    datalist = page.split('<datalist id="audit-actions">')[1].split("</datalist>")[0]
    assert '<option value="approval">' in datalist and '<option value="approval.approve">' in datalist
    assert "outsider" not in page.split('<datalist id="audit-actors">')[1].split("</datalist>")[0]


def test_the_timestamps_are_shown_in_utc(personas, entries):
    page = login(personas.member).get("/audit/?action=search.freeze").content.decode()
    assert ">2026-01-01 12:00 UTC</time>" in page
