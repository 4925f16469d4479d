"""Small display filters shared by the pages: money in micro-USD, short commit ids, a multiplication."""

from __future__ import annotations

from typing import Any

from django import template

from runtime_app import presenters
from runtime_app.prices import usd_text

register = template.Library()


@register.filter
def usd(microusd: Any) -> str:
    """Micro-USD as dollars (runtime_app.prices.usd_text)."""
    try:
        return usd_text(int(microusd or 0))
    except (TypeError, ValueError):
        return ""


@register.filter
def mul(value: Any, factor: Any) -> float | str:
    try:
        return float(value) * float(factor)
    except (TypeError, ValueError):
        return ""


@register.filter
def short_sha(sha: Any) -> str:
    """A commit id or digest as its first 12 characters (runtime_app.presenters.short_sha)."""
    return presenters.short_sha(sha if isinstance(sha, str) else "")
