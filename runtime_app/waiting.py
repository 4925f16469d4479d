""""Waiting for you": what the signed-in person can act on now, per project.

Apps register a provider (`waiting_register`) that answers the items of theirs a user may act on,
only in projects the user can see, and the event kinds that can change that answer; the home
page and GET /api/waiting read `waiting_for`, and the home page's socket sends the list again
after a batch of events of those kinds (runtime_app.consumers), so it updates without a reload.
runtime_app imports neither app: they register in their AppConfig.ready()."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.template.loader import render_to_string


class WaitingKind:
    """What the person is asked to do, in the words the page and the API use."""

    APPROVE = "approve"  # a winner awaits their approval
    MERGE = "merge"  # an approved winner they may merge
    THREAD = "reply"  # a review thread mentions or involves them and has a reply they have not answered
    CHANGES_REQUESTED = "changes requested"  # a winner of their search got a request for changes
    FAILED = "failed"  # a search of theirs failed or came out NONE recently
    REVIEW = "review"  # an evolution run holds a change for their review

    ORDER = (APPROVE, REVIEW, MERGE, CHANGES_REQUESTED, THREAD, FAILED)


@dataclass
class WaitingItem:
    kind: str
    project_id: int
    project: str
    title: str
    url: str
    detail: str = ""
    status: str = ""  # the subject's status label (runtime_app/status.py)
    when: datetime | None = None
    key: str = ""  # stable per item, for element ids and tests

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "project_id": self.project_id, "project": self.project,
                "title": self.title, "url": self.url, "detail": self.detail, "status": self.status,
                "when": self.when, "key": self.key}


@dataclass
class WaitingProject:
    project_id: int
    project: str
    items: list[WaitingItem] = field(default_factory=list)


WaitingProvider = Callable[[Any], list[WaitingItem]]
_PROVIDERS: dict[str, WaitingProvider] = {}
_KINDS: dict[str, tuple[str, ...]] = {}


def waiting_register(name: str, provider: WaitingProvider, event_kinds: tuple[str, ...]) -> None:
    """`provider(user)` answers the items; an event whose kind starts with one of `event_kinds`
    may change them."""
    _PROVIDERS[name] = provider
    _KINDS[name] = event_kinds


# Membership and role changes change what anyone may act on, whichever app holds the items.
MEMBERSHIP_EVENT_KINDS = ("project.member", "membership.", "project.role")


def waiting_for(user: Any) -> list[WaitingItem]:
    """Every item the user may act on, most pressing kind first, newest first within a kind."""
    if not (user.is_authenticated and user.is_active):
        return []
    items = [item for name in sorted(_PROVIDERS) for item in _PROVIDERS[name](user)]
    items.sort(key=lambda item: item.when.timestamp() if item.when else 0, reverse=True)
    items.sort(key=lambda item: WaitingKind.ORDER.index(item.kind) if item.kind in WaitingKind.ORDER
               else len(WaitingKind.ORDER))
    return items


def waiting_by_project(items: list[WaitingItem]) -> list[WaitingProject]:
    """The items grouped per project (projects by name), each keeping its order."""
    groups: dict[int, WaitingProject] = {}
    for item in items:
        groups.setdefault(item.project_id, WaitingProject(item.project_id, item.project)).items.append(item)
    return sorted(groups.values(), key=lambda group: group.project.lower())


def waiting_changed_by(events: list[Any]) -> bool:
    """Whether a batch of events may change anyone's waiting list."""
    prefixes = tuple(prefix for kinds in _KINDS.values() for prefix in kinds) + MEMBERSHIP_EVENT_KINDS
    return any(str(event.kind).startswith(prefixes) for event in events)


def waiting_context(user: Any) -> dict[str, Any]:
    items = waiting_for(user)
    return {"waiting_projects": waiting_by_project(items), "waiting_count": len(items)}


def waiting_fragment(user: Any) -> str:
    """The home page's "Waiting for you" card as an out-of-band swap."""
    return render_to_string("runtime_app/_waiting.html", {**waiting_context(user), "oob": True})
