"""One date format on every page: `2026-12-03 14:05 UTC`, whatever zone the moment came in."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from django import template
from django.utils.html import format_html

from runtime_app.clock import clock_text

register = template.Library()
MOMENT_FORMAT = "%Y-%m-%d %H:%M UTC"


@register.filter
def when(value: Any) -> str:
    """A moment as pages show it, in UTC to the minute ("" for none; a plain date as 2026-12-03).
    The exact instant stays in the <time datetime> attribute beside it."""
    if isinstance(value, datetime):
        moment = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return moment.strftime(MOMENT_FORMAT)
    if isinstance(value, date):
        return value.isoformat()
    return ""


@register.simple_tag
def ticking(seconds: Any, running: Any = False) -> str:
    """An elapsed time as `clock_text` says it; while `running`, the page's clock
    (static/js/crucible.js) moves it on each second between live updates, from this figure."""
    if seconds is None:
        return ""
    text = clock_text(float(seconds))
    if not running:
        return text
    return format_html('<span class="ticking" data-elapsed="{}">{}</span>', round(float(seconds)), text)
