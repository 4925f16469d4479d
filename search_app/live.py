"""What a search page receives with its live events: the run summary, funnel and plot, and the
rows of the candidates the events name (the baseline's too), each as an out-of-band swap of the
same partial the page rendered, so sort, filter and scroll stay as the viewer left them.

A page rendered before the search started has no funnel, plot or table to swap into: the batch
that carries `search.started` sends the whole run card instead, which brings them."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from django.core.cache import cache
from django.template.loader import render_to_string

from runtime_app import access
from search_app import presenters
from search_app.models import Candidate, Search

if TYPE_CHECKING:
    from runtime_app.models import Event
    from search_app.selectors import User


def search_live_fragments(user: User, search_pk: int, events: list[Event]) -> list[str]:
    """Rendered once per batch of events and role pair, then shared by every viewer in this
    process: fifty people watching one search cost one render, not fifty."""
    search = Search.objects.select_related("project").filter(pk=search_pk).first()
    if search is None:  # deleted while watched: nothing left to render
        return []
    role = access.role_in(user, search.project)
    can_operate = access.role_allows(role, access.OPERATOR)
    can_approve = access.role_allows(role, access.APPROVER)
    # Its author may be refused an approval others may make: the author renders apart.
    author = search.created_by_id == user.pk
    key = (f"crucible:live:search:{search_pk}:{events[0].pk}-{events[-1].pk}:"
           f"{can_operate:d}{can_approve:d}{author:d}")
    # get_or_set returns the rendered list: None only when the default is None
    return cast("list[str]", cache.get_or_set(
        key, lambda: _render(search_pk, events, can_operate, can_approve, user), 30))


def named_candidates(events: list[Event]) -> set[str]:
    """The candidate ids a batch of events names: one (`candidate_id`) or many (`candidate_ids`)."""
    named: set[str] = set()
    for event in events:
        payload = event.payload if isinstance(event.payload, dict) else {}
        if isinstance(payload.get("candidate_id"), str):
            named.add(payload["candidate_id"])
        named.update(cid for cid in payload.get("candidate_ids") or () if isinstance(cid, str))
    return named


def _render(search_pk: int, events: list[Event], can_operate: bool, can_approve: bool,
            user: User) -> list[str]:
    search = Search.objects.filter(pk=search_pk).select_related("project").first()
    if search is None:
        return []
    context = {**presenters.run_card(search, user, can_operate=can_operate, can_approve=can_approve),
               "oob": True}
    if any(event.kind == "search.started" for event in events):
        return [render_to_string("search_app/_run.html", {
            **context, "oob": False, "run_oob": True, **presenters.candidate_table(search)})]
    parts = "".join(render_to_string(name, context) for name in (
        "search_app/_run_summary.html", "search_app/_funnel.html", "search_app/_plot.html",
        "search_app/_search_status_oob.html"))
    rows = Candidate.objects.filter(search=search, candidate_id__in=named_candidates(events)).defer("patch")
    return [parts, "".join(render_to_string("search_app/_candidate_row.html", {**context, "c": candidate})
                           for candidate in rows.order_by("number"))]
