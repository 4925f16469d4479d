"""One way for a view to answer htmx: the partial for a swap, the whole page otherwise."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers
from django_htmx.http import push_url as htmx_push_url
from django_htmx.middleware import HtmxDetails


def wants_partial(request: HttpRequest) -> bool:
    """An htmx swap asks for a fragment; a boosted link or a history restore needs the whole page."""
    htmx: HtmxDetails | None = getattr(request, "htmx", None)
    return htmx is not None and bool(htmx) and not htmx.boosted and not htmx.history_restore_request


def for_htmx(
    request: HttpRequest,
    *,
    page: str,
    partial: str,
    context: Mapping[str, Any],
    push_url: str | None = None,
    page_context: Callable[[], Mapping[str, Any]] | None = None,
    status: int = 200,
) -> HttpResponse:
    """Render `partial` for an htmx swap (pushing `push_url` to the address bar), else `page`.

    `page_context` adds what only the whole page needs (forms, menus), so a swap does not build it.
    Either answer varies on HX-Request, so a cache never serves a fragment as a page.
    """
    if wants_partial(request):
        response = render(request, partial, dict(context), status=status)
        if push_url:
            htmx_push_url(response, push_url)
    else:
        full = {**context, **(page_context() if page_context else {})}
        response = render(request, page, full, status=status)
    patch_vary_headers(response, ["HX-Request"])
    return response
