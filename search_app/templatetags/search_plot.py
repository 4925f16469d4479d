"""The score plot's points, built in one pass: a template loop per point would dominate the page."""

from __future__ import annotations

from typing import Any

from django import template
from django.urls import reverse
from django.utils.html import format_html, format_html_join

register = template.Library()
POINT = '<a href="{}{}/"><circle class="{}" cx="{}" cy="{}" r="5"><title>{}</title></circle></a>'


def _title(point: dict) -> str:
    """`cand_004 (alive): 0.41× [0.38, 0.44], cost $0.0012, 14 diff lines`, as the hover shows it."""
    spread = f" ± {point['spread']:.3g}" if point.get("spread") and not point.get("ratio") else ""
    diff_lines = "?" if point["diff_lines"] is None else point["diff_lines"]
    return format_html("{} ({}): {}{}, cost {}, {} diff lines", point["id"], point["state"], point["figure"],
                       spread, point["cost_text"], diff_lines)


@register.simple_tag
def plot_points(search: Any, points: list[dict]) -> str:
    """Each point a link to its candidate, with a hover title naming it and its figures."""
    base = reverse("candidate_detail", args=[search.search_id, "cand_000"])[: -len("cand_000/")]
    return format_html_join("", POINT, (
        (base, p["id"], f"point state-{p['state']}" + (" on-front" if p.get("on_front") else ""),
         p["cx"], p["cy"], _title(p))
        for p in points))
