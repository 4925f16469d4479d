"""Small display filters shared by the pages: money in micro-USD, short commit ids, a multiplication."""

from __future__ import annotations

import re
from typing import Any

from django import template
from django.utils.html import conditional_escape
from django.utils.safestring import SafeString, mark_safe

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


_INLINE_CODE = re.compile(r"`([^`\n]+)`")


@register.filter(is_safe=True)
def inline_code(text: Any) -> SafeString:
    """Plain text whose `backticked` spans read as code, not as raw backticks; the rest escaped."""
    escaped = str(conditional_escape(text))
    return mark_safe(_INLINE_CODE.sub(r"<code>\1</code>", escaped))  # noqa: S308 (escaped above)
