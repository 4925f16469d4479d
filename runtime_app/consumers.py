"""Live events over a websocket: autoescaped HTML fragments, resumable by last id."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.template.loader import render_to_string

from runtime_app import selectors
from runtime_app.services import event_group
from runtime_app.subjects import live_fragments
from runtime_app.waiting import waiting_changed_by, waiting_fragment

# Close codes outside 1006/1011–1013, so the htmx ws extension does not reconnect.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
BATCH = 200


class EventConsumer(AsyncWebsocketConsumer):
    """Streams every event after the client's last id: all of the user's projects
    (`/ws/events/`) or one subject (`/ws/events/<type>/<id>/`).

    Nothing is sent until the client says where it stands, with `?last_id=N` or a
    `{"type": "resume", "last_id": N}` message, so a reconnect neither skips nor repeats.
    """

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # A consumer that dies (a broken channel layer, say) never gets `disconnect`, so its
        # poller would keep querying for a socket that is gone.
        try:
            await super().__call__(scope, receive, send)
        finally:
            poller = getattr(self, "poller", None)
            if poller is not None:
                poller.cancel()

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        self.cursor: int | None = None
        self.poller: asyncio.Task | None = None
        self.joined: list[str] = []
        if self.user is None or not self.user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        kwargs = self.scope["url_route"]["kwargs"]
        self.subject: tuple[str, int] | None = (
            (kwargs["subject_type"], int(kwargs["subject_id"]))
            if "subject_type" in kwargs
            else None
        )
        project_ids = await database_sync_to_async(self._watched_project_ids)()
        if project_ids is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        for project_id in project_ids:
            group = event_group(project_id)
            await self.channel_layer.group_add(group, self.channel_name)
            self.joined.append(group)
        self.flush_lock = asyncio.Lock()
        await self.accept()
        self.poller = asyncio.create_task(self._poll())
        last_id = _query_last_id(self.scope.get("query_string", b""))
        if last_id is not None:
            self.cursor = last_id
            await self.flush()

    async def disconnect(self, code: int) -> None:
        if self.poller is not None:
            self.poller.cancel()
        for group in self.joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            message = json.loads(text_data or "")
            last_id = int(message["last_id"]) if message.get("type") == "resume" else None
        except (ValueError, TypeError, KeyError, AttributeError):
            last_id = None
        if last_id is None or last_id < 0:
            return  # not a resume message; clients send nothing else yet
        self.cursor = last_id
        await self.flush()

    async def events_nudge(self, message: dict[str, Any]) -> None:
        await self.flush()

    async def _poll(self) -> None:
        # The in-memory layer cannot carry nudges from a worker process; the timer can.
        while True:
            await asyncio.sleep(settings.EVENT_POLL_SECONDS)
            await self.flush()

    async def flush(self) -> None:
        if self.cursor is None:
            return
        async with self.flush_lock:
            while True:
                messages, last_id, allowed = await database_sync_to_async(self._render_after)(
                    self.cursor
                )
                if not allowed:
                    await self.close(code=CLOSE_FORBIDDEN)
                    return
                if last_id is None:
                    return
                for message in messages:
                    await self.send(text_data=message)
                self.cursor = last_id

    def _watched_project_ids(self) -> list[int] | None:
        if self.subject is None:
            return list(selectors.projects_for_user(self.user).values_list("pk", flat=True))
        project_id = selectors.subject_accessible_project(self.user, *self.subject)
        return None if project_id is None else [project_id]

    def _render_after(self, cursor: int) -> tuple[list[str], int | None, bool]:
        """(messages, new cursor, still allowed) — access is re-checked on every read."""
        self.user.refresh_from_db(fields=["is_active"])
        if not self.user.is_active:
            return [], None, False
        if self.subject is not None and (
            selectors.subject_accessible_project(self.user, *self.subject) is None
        ):
            return [], None, False
        events = selectors.events_for_user(
            self.user, after_id=cursor, subject=self.subject, limit=BATCH
        )
        if not events:
            return [], None, True
        html = render_to_string("runtime_app/_events_oob.html", {"events": events})
        if self.subject is not None:
            extra = live_fragments(self.user, *self.subject, events)
        else:  # the home page: its "Waiting for you" list, when these events may change it
            extra = [waiting_fragment(self.user)] if waiting_changed_by(events) else []
        # The event log goes last: it carries the page's resume point, so a socket that drops
        # mid-batch makes the page ask for this batch again rather than miss its fragments.
        return [*extra, html], events[-1].pk, True


def _query_last_id(query_string: bytes) -> int | None:
    values = parse_qs(query_string.decode("latin-1")).get("last_id")
    try:
        value = int(values[0]) if values else None
    except ValueError:
        return None
    return value if value is not None and value >= 0 else None
