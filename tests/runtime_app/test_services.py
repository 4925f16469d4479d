"""runtime_app services: events, pings, tokens."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from runtime_app.models import Event
from runtime_app.services import (
    api_token_authenticate,
    api_token_create,
    event_emit,
    project_ping_answer,
)


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
