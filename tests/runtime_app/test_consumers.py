"""Live events over websockets, through the real ASGI stack (origin check, session auth)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.test import Client

from crucible.asgi import application, origin_allowed
from runtime_app.services import event_emit

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
IDS = re.compile(r'data-event-id="(\d+)"')


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def connect(path: str, cookie: str | None, origin: str | None = "http://127.0.0.1",
            host: str = "127.0.0.1") -> WebsocketCommunicator:
    headers = [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if cookie:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


def connects(cookie: str, origin: str | None, host: str = "127.0.0.1:8000") -> bool:
    async def scenario() -> bool:
        communicator = connect("/ws/events/", cookie, origin=origin, host=host)
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return connected
    return async_to_sync(scenario)()


async def received_ids(communicator: WebsocketCommunicator, count: int) -> list[int]:
    """Read fragments until `count` event ids arrived; a fragment lists its events newest
    first (they are prepended to the log), so the ids come back sorted."""
    ids: list[int] = []
    while len(ids) < count:
        ids += [int(i) for i in IDS.findall(await communicator.receive_from(timeout=10))]
    assert len(ids) == len(set(ids)), f"duplicates in {ids}"
    return sorted(ids)


emit = database_sync_to_async(event_emit)


def test_an_anonymous_socket_is_closed():
    async def scenario():
        communicator = connect("/ws/events/", cookie=None)
        connected, code = await communicator.connect()
        assert not connected
        assert code == 4401
    async_to_sync(scenario)()


def test_a_socket_from_a_foreign_origin_is_refused(personas):
    cookie = session_cookie(personas.owner)

    async def scenario():
        communicator = connect("/ws/events/", cookie, origin="http://evil.example")
        connected, _ = await communicator.connect()
        assert not connected
    async_to_sync(scenario)()


@pytest.mark.parametrize("origin", [
    "https://127.0.0.1:8000",  # the page was served over http
    "http://127.0.0.1:9999",  # another port of the same host: another origin
    "http://127.0.0.1",  # port 80
    "http://localhost:8000",  # an allowed host, but not the one the page came from
    "http://evil.example",
    "http://127.0.0.1:8000.evil.example",
    "null",  # an opaque origin (a sandboxed frame, a file: page)
    "http://127.0.0.1:8000/path",
    None,  # browsers always send one
])
def test_a_socket_from_another_origin_than_the_pages_is_refused(personas, origin):
    assert not connects(session_cookie(personas.owner), origin)


def test_a_socket_from_the_pages_own_origin_is_accepted(personas):
    cookie = session_cookie(personas.owner)
    assert connects(cookie, "http://127.0.0.1:8000")
    assert connects(cookie, "HTTP://LocalHost:8000", host="localhost:8000")
    assert connects(cookie, "http://127.0.0.1", host="127.0.0.1:80")


def test_a_host_header_that_is_not_allowed_is_refused_even_with_a_matching_origin(personas):
    assert not connects(session_cookie(personas.owner), "http://evil.example:8000", host="evil.example:8000")


def test_exactly_a_trusted_origin_is_accepted(personas, settings):
    settings.ALLOWED_HOSTS = ["127.0.0.1", "crucible.example"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://crucible.example"]
    cookie = session_cookie(personas.owner)
    assert connects(cookie, "https://crucible.example", host="crucible.example")  # through a TLS proxy
    assert connects(cookie, "https://crucible.example:443", host="127.0.0.1:8000")
    for origin in ("http://crucible.example", "https://crucible.example:8443", "https://x.crucible.example"):
        assert not connects(cookie, origin, host="127.0.0.1:8000"), origin


@pytest.mark.parametrize(("scope", "origin", "allowed"), [
    ({"scheme": "wss"}, "https://127.0.0.1:8000", True),
    ({"scheme": "wss"}, "http://127.0.0.1:8000", False),
    ({"scheme": "wss", "host": "127.0.0.1"}, "https://127.0.0.1", True),
    ({"scheme": "ws"}, "https://127.0.0.1:8000", False),
    ({"scheme": "ws", "proto": "https"}, "https://127.0.0.1:8000", True),  # a TLS proxy said so
    ({"scheme": "ws", "proto": "https", "trust_proxy": False}, "https://127.0.0.1:8000", False),
])
def test_the_expected_scheme_follows_the_connection_or_a_trusted_proxy(settings, scope, origin, allowed):
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if scope.get("trust_proxy", True) \
        else None
    headers = [(b"host", scope.get("host", "127.0.0.1:8000").encode()), (b"origin", origin.encode())]
    if "proto" in scope:
        headers.append((b"x-forwarded-proto", scope["proto"].encode()))
    assert origin_allowed({"type": "websocket", "scheme": scope["scheme"], "headers": headers}) is allowed


def test_an_outsider_cannot_watch_another_teams_project(personas):
    cookie = session_cookie(personas.outsider)

    async def scenario():
        communicator = connect(f"/ws/events/project/{personas.alpha.pk}/", cookie)
        connected, code = await communicator.connect()
        assert not connected
        assert code == 4403
    async_to_sync(scenario)()


def test_a_committed_event_reaches_a_connected_client(personas):
    cookie = session_cookie(personas.member)

    async def scenario():
        communicator = connect(f"/ws/events/project/{personas.alpha.pk}/", cookie)
        assert (await communicator.connect())[0]
        await communicator.send_to(text_data=json.dumps({"type": "resume", "last_id": 0}))
        event = await emit(personas.alpha, "project", personas.alpha.pk, "test.hello",
                           {"message": "<i>hi</i>"})
        html = await communicator.receive_from(timeout=10)
        assert f'data-event-id="{event.pk}"' in html
        assert 'hx-swap-oob="afterbegin:#event-log"' in html
        assert "&lt;i&gt;hi&lt;/i&gt;" in html and "<i>hi</i>" not in html
        await communicator.disconnect()
    async_to_sync(scenario)()


def test_a_rolled_back_event_never_reaches_the_client(personas):
    cookie = session_cookie(personas.member)

    def emit_then_roll_back():
        with pytest.raises(RuntimeError), transaction.atomic():
            event_emit(personas.alpha, "project", personas.alpha.pk, "test.ghost", {})
            raise RuntimeError("roll back")

    async def scenario():
        communicator = connect("/ws/events/", cookie)
        assert (await communicator.connect())[0]
        await communicator.send_to(text_data=json.dumps({"type": "resume", "last_id": 0}))
        await database_sync_to_async(emit_then_roll_back)()
        # Longer than the DB poll in embedded mode, so a leak would show up here.
        assert await communicator.receive_nothing(timeout=1.5)
        real = await emit(personas.alpha, "project", personas.alpha.pk, "test.real", {})
        assert await received_ids(communicator, 1) == [real.pk]
        await communicator.disconnect()
    async_to_sync(scenario)()


def test_the_feed_carries_only_the_users_projects(personas):
    cookie = session_cookie(personas.member)

    async def scenario():
        communicator = connect("/ws/events/?last_id=0", cookie)
        assert (await communicator.connect())[0]
        await emit(personas.beta, "project", personas.beta.pk, "test.theirs", {})
        mine = await emit(personas.alpha, "project", personas.alpha.pk, "test.mine", {})
        assert await received_ids(communicator, 1) == [mine.pk]
        assert await communicator.receive_nothing(timeout=1)
        await communicator.disconnect()
    async_to_sync(scenario)()


def test_a_reconnecting_client_receives_exactly_the_missed_events(personas):
    cookie = session_cookie(personas.member)
    project = personas.alpha

    async def scenario():
        first = connect("/ws/events/", cookie)
        assert (await first.connect())[0]
        await first.send_to(text_data=json.dumps({"type": "resume", "last_id": 0}))
        seen = await emit(project, "project", project.pk, "test.seen", {})
        assert await received_ids(first, 1) == [seen.pk]
        await first.disconnect()

        missed = [await emit(project, "project", project.pk, f"test.missed{i}", {}) for i in range(3)]

        second = connect("/ws/events/", cookie)
        assert (await second.connect())[0]
        await second.send_to(text_data=json.dumps({"type": "resume", "last_id": seen.pk}))
        assert await received_ids(second, 3) == [event.pk for event in missed]
        assert await second.receive_nothing(timeout=1)
        later = await emit(project, "project", project.pk, "test.later", {})
        assert await received_ids(second, 1) == [later.pk]
        await second.disconnect()
    async_to_sync(scenario)()


def test_nothing_is_sent_before_the_client_says_where_it_stands(personas):
    cookie = session_cookie(personas.member)

    async def scenario():
        communicator = connect("/ws/events/", cookie)
        assert (await communicator.connect())[0]
        await emit(personas.alpha, "project", personas.alpha.pk, "test.early", {})
        assert await communicator.receive_nothing(timeout=1)
        await communicator.send_to(text_data="not json")
        await communicator.send_to(text_data=json.dumps({"type": "resume", "last_id": -5}))
        assert await communicator.receive_nothing(timeout=0.5)
        await communicator.disconnect()
    async_to_sync(scenario)()


def test_a_member_removed_from_the_project_is_disconnected(personas):
    from runtime_app.models import ProjectMembership

    cookie = session_cookie(personas.member)

    async def scenario():
        communicator = connect(f"/ws/events/project/{personas.alpha.pk}/?last_id=0", cookie)
        assert (await communicator.connect())[0]
        await database_sync_to_async(
            ProjectMembership.objects.filter(user=personas.member).delete
        )()
        await emit(personas.alpha, "project", personas.alpha.pk, "test.after_removal", {})
        output = await communicator.receive_output(timeout=10)
        assert output["type"] == "websocket.close"
        assert output["code"] == 4403
    async_to_sync(scenario)()


def test_a_socket_left_idle_longer_than_the_layers_blocking_read_stays_open(personas):
    """redis-py 8 gives up on a read after 5 s, as long as channels_redis's blocking pop waits:
    a page nobody touches must not lose its consumer to that (pass 2 runs this on Redis)."""
    cookie = session_cookie(personas.member)

    async def scenario():
        communicator = connect(f"/ws/events/project/{personas.alpha.pk}/", cookie)
        assert (await communicator.connect())[0]
        await asyncio.sleep(12)  # two of the layer's 5 s blocking pops, and then some
        assert await communicator.receive_nothing(timeout=0.1)
        await communicator.send_to(text_data=json.dumps({"type": "resume", "last_id": 0}))
        event = await emit(personas.alpha, "project", personas.alpha.pk, "test.after_idle", {})
        ids: list[int] = []
        while event.pk not in ids:
            ids += [int(i) for i in IDS.findall(await communicator.receive_from(timeout=10))]
        await communicator.disconnect()
    async_to_sync(scenario)()


def test_a_consumer_that_dies_leaves_no_poller_behind(personas):
    from channels.layers import get_channel_layer

    from runtime_app.services import event_group

    cookie = session_cookie(personas.member)

    def pollers() -> list[asyncio.Task]:
        return [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "EventConsumer._poll"]

    async def scenario():
        communicator = connect(f"/ws/events/project/{personas.alpha.pk}/", cookie)
        assert (await communicator.connect())[0]
        assert len(pollers()) == 1
        # A message no handler takes kills the consumer, as a failing channel layer would.
        await get_channel_layer().group_send(event_group(personas.alpha.pk), {"type": "no.such.handler"})
        with pytest.raises(ValueError, match="No handler"):
            await communicator.wait(timeout=10)
        await asyncio.sleep(0)
        assert pollers() == []
    async_to_sync(scenario)()

