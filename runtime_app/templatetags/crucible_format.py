"""Small display filters shared by the pages: money in micro-USD, and a multiplication."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.filter
def usd(microusd: Any) -> str:
    """Micro-USD as dollars: $1.25, or more digits for small sums ($0.000350)."""
    try:
        dollars = int(microusd or 0) / 1_000_000
    except (TypeError, ValueError):
        return ""
    return f"${dollars:,.2f}" if dollars >= 0.01 or dollars == 0 else f"${dollars:.6f}"


@register.filter
def mul(value: Any, factor: Any) -> float | str:
    try:
        return float(value) * float(factor)
    except (TypeError, ValueError):
        return ""
