"""How long something has taken, said one way on every page and in every CLI line."""

from __future__ import annotations


def clock_text(seconds: float) -> str:
    """"45 s", "12 min 5 s", "3 h 20 min" for people (whole seconds; never negative)."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
