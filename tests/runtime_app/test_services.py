"""runtime_app services: events, pings, tokens, project members."""

from __future__ import annotations

import threading

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection, transaction

from runtime_app import access
from runtime_app.models import AuditEntry, Event, ProjectMembership
from runtime_app.services import (
    api_token_authenticate,
    api_token_create,
    event_emit,
    project_member_add,
    project_member_remove,
    project_member_role_set,
    project_ping_answer,
)
from runtime_app.signals import approver_standing_ended
from tests.helpers import make_user


@pytest.mark.django_db
def test_events_are_append_only(personas):
    event = event_emit(personas.alpha, "project", personas.alpha.pk, "test", {"n": 1})
    event.kind = "changed"
    with pytest.raises(ValueError, match="append-only"):
        event.save()


@pytest.mark.django_db
def test_answering_a_ping_twice_makes_one_pong(personas):
    ping = event_emit(personas.alpha, "project", personas.alpha.pk, "worker.ping", {})
    first = project_ping_answer(ping.pk, "host-a")
    second = project_ping_answer(ping.pk, "host-b")
    assert first.pk == second.pk
    assert Event.objects.filter(kind="worker.pong").count() == 1
    assert project_ping_answer(999_999, "host-a") is None


@pytest.mark.django_db
def test_a_token_of_an_inactive_user_stops_working(personas):
    _, plain = api_token_create(personas.member, "cli")
    assert api_token_authenticate(plain) == personas.member
    personas.member.is_active = False
    personas.member.save()
    assert api_token_authenticate(plain) is None


@pytest.fixture
def ended() -> list[dict]:
    """What approver_standing_ended announced during the test."""
    calls: list[dict] = []

    def listen(sender, **kwargs) -> None:
        calls.append({k: kwargs[k] for k in ("user", "project", "actor", "reason")})
    approver_standing_ended.connect(listen, dispatch_uid="test_ended")
    yield calls
    approver_standing_ended.disconnect(dispatch_uid="test_ended")


@pytest.mark.django_db
def test_a_project_admin_removes_a_member_audited_announced_and_their_standing_ended(personas, ended):
    project_member_remove(personas.owner, personas.alpha, personas.member)
    assert not ProjectMembership.objects.filter(project=personas.alpha, user=personas.member).exists()
    entry = AuditEntry.objects.get(action="project.member_remove")
    assert (entry.actor, entry.project, entry.target) == (personas.owner, personas.alpha, "member")
    assert Event.objects.filter(kind="project.member_removed", payload__message="member left").exists()
    assert ended == [{"user": personas.member, "project": personas.alpha, "actor": personas.owner,
                      "reason": "member was removed from alpha"}]


@pytest.mark.django_db
def test_only_project_admins_or_superusers_remove_members(personas, django_user_model):
    viewer = make_user("viewer")
    ProjectMembership.objects.create(project=personas.alpha, user=viewer)
    # a viewer, an operator of the project, a project admin elsewhere (anyone may leave by themselves)
    for actor, target in ((viewer, personas.member), (personas.member, viewer),
                          (personas.outsider, personas.member)):
        with pytest.raises(PermissionDenied):
            project_member_remove(actor, personas.alpha, target)
    assert not AuditEntry.objects.filter(action="project.member_remove").exists()
    root = django_user_model.objects.create_superuser("root", password="pw-root")
    project_member_remove(root, personas.alpha, personas.member)
    with pytest.raises(ValidationError, match="member is not a member of alpha"):
        project_member_remove(root, personas.alpha, personas.member)
    project_member_add(root, personas.alpha, personas.member)
    assert ProjectMembership.objects.filter(project=personas.alpha, user=personas.member).exists()


@pytest.mark.django_db
def test_every_deletion_of_a_membership_is_recorded_but_deleting_the_project_withdraws_nothing(
        personas, ended):
    ProjectMembership.objects.filter(user=personas.member).delete()  # the ORM: the system did it
    assert AuditEntry.objects.get(action="project.member_remove").actor_name == "system"
    personas.owner.delete()  # a deleted user leaves their projects too
    personas.beta.delete()  # its memberships go with it, and so does everything they decided on
    assert [(call["user"].username, call["project"].name) for call in ended] == [
        ("member", "alpha"), ("owner", "alpha")]


@pytest.mark.django_db
def test_dropping_below_approver_ends_standing_in_that_project_but_other_changes_do_not(
        personas, ended):
    project_member_role_set(personas.owner, personas.alpha, personas.member, access.VIEWER)  # never could
    project_member_role_set(personas.owner, personas.alpha, personas.member, access.APPROVER)  # gains
    personas.owner.last_login = None
    personas.owner.save(update_fields=["last_login"])
    assert ended == []
    project_member_role_set(personas.owner, personas.alpha, personas.member, access.OPERATOR)
    personas.owner.is_active = False
    personas.owner.save()
    assert [(c["user"].username, c["project"], c["reason"]) for c in ended] == [
        ("member", personas.alpha, "member is no longer an approver in alpha"),
        ("owner", None, "owner was deactivated")]


@pytest.mark.django_db
def test_a_project_never_loses_its_last_admin(personas):
    with pytest.raises(ValidationError, match="owner is the last project admin of alpha"):
        project_member_role_set(personas.owner, personas.alpha, personas.owner, access.APPROVER)
    with pytest.raises(ValidationError, match="last project admin"):
        project_member_remove(personas.owner, personas.alpha, personas.owner)
    project_member_role_set(personas.owner, personas.alpha, personas.member, access.ADMIN)
    project_member_remove(personas.owner, personas.alpha, personas.owner)  # leaves; member runs it now
    assert access.role_in(personas.member, personas.alpha) == access.ADMIN


@pytest.mark.django_db
def test_a_role_must_be_one_of_the_four(personas):
    with pytest.raises(ValidationError, match="Choose one of: viewer, operator, approver, project admin"):
        project_member_role_set(personas.owner, personas.alpha, personas.member, "owner")


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_second_emitter_waits_for_the_first_to_commit(personas):
    """Ids become visible in order: an event emitted while another transaction holding
    an earlier event is open can only commit after it, so watchers never skip one."""
    first_emitted, first_committing = threading.Event(), threading.Event()
    order: list[str] = []
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with transaction.atomic():
                event_emit(personas.alpha, "project", personas.alpha.pk, "test.first", {})
                first_emitted.set()
                # Give the second emitter time to block on us, then commit.
                threading.Event().wait(1.0)
                order.append("first commits")
                first_committing.set()
        except BaseException as error:
            errors.append(error)
        finally:
            connection.close()

    def second() -> None:
        try:
            first_emitted.wait(10)
            event_emit(personas.alpha, "project", personas.alpha.pk, "test.second", {})
            order.append("second done" if first_committing.is_set() else "second overtook")
        except BaseException as error:
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert order == ["first commits", "second done"]
    kinds = list(Event.objects.filter(kind__startswith="test.").order_by("id").values_list("kind", flat=True))
    assert kinds == ["test.first", "test.second"]
