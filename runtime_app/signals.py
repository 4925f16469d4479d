"""What the membership hooks share with services: who is acting, and the signal apps listen to.

The hooks themselves are in runtime_app.hooks (they call services, which use what is here):
whoever may no longer decide on a project's winners has their pending decisions withdrawn by
one service, which sends `approver_standing_ended` for the apps that hold decisions
(runtime_app never imports them).

The actor is the one a service names (`acting_as`), else the user of the request being
served (set by AuditActorMiddleware), else nobody: the entry then says "system".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.dispatch import Signal

_request: ContextVar[Any] = ContextVar("crucible_audit_request", default=None)
_actor: ContextVar[Any] = ContextVar("crucible_audit_actor", default=None)

# Sent inside the transaction that ends it: `user` may no longer decide on the winners of
# `project` (None: of any project). Arguments: user, project, actor (or None), reason.
approver_standing_ended = Signal()


class AuditActorMiddleware:
    """Makes the request (and so its user, read lazily) known to audit hooks while it is served."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        token = _request.set(request)
        try:
            return self.get_response(request)
        finally:
            _request.reset(token)


@contextmanager
def acting_as(actor: Any) -> Iterator[None]:
    """Within the block, hooks record `actor` as the one who made the change (a service's caller)."""
    token = _actor.set(actor)
    try:
        yield
    finally:
        _actor.reset(token)


def current_actor() -> Any:
    """The actor a service named, else the authenticated user of the request being served, or None."""
    named = _actor.get()
    if named is not None:
        return named
    user = getattr(_request.get(), "user", None)
    return user if user is not None and user.is_authenticated else None
