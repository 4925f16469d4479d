"""Selection: which scored candidates go on to the next round, and why each did or did not.

Pure functions over plain values, so every rule is tested without a database.

- `ordered`: sort by the spec's `ordering` keys (cost-first by default), then its
  `tie_breakers`, then the candidate id.
- `pareto`: non-dominated fronts over (score, cost, diff lines); inside a front, with
  `retain_diversity`, the candidates with the largest crowding distance first (the ends of
  the front and the loneliest points, so distinct trade-offs survive), then score, then the
  tie-breakers; without it, score then the tie-breakers.
- `retain_diversity` also collapses identical patches to their earliest-admitted copy, whatever
  the ranks (admission already groups them; this holds if any reach selection).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial


@dataclass(frozen=True)
class Entry:
    candidate_id: str
    score: float
    cost_microusd: int = 0
    tokens: int = 0
    diff_lines: int = 0
    runtime_seconds: float = 0.0
    patch_sha256: str = ""
    admitted: tuple[int, int] = (0, 0)  # when its patch was admitted: (round, candidate number)


@dataclass(frozen=True)
class Decision:
    candidate_id: str
    promoted: bool
    rank: int  # 1 = best
    reason: str
    duplicate_of: str = ""


def is_better(score: float, than: float, direction: str) -> bool:
    """Whether `score` beats `than` in the spec's score direction ("minimize" or "maximize")."""
    return score < than if direction == "minimize" else score > than


def _key(entry: Entry, name: str, direction: str) -> float:
    if name == "score":
        return entry.score if direction == "minimize" else -entry.score
    if name == "runtime":
        return entry.runtime_seconds
    return float(getattr(entry, name))


def _sort_key(entry: Entry, names: Sequence[str], direction: str) -> tuple:
    return (*(_key(entry, name, direction) for name in names), entry.candidate_id)


def dominates(a: Entry, b: Entry, direction: str) -> bool:
    objectives = ("score", "cost_microusd", "diff_lines")
    left = [_key(a, name, direction) for name in objectives]
    right = [_key(b, name, direction) for name in objectives]
    return all(x <= y for x, y in zip(left, right, strict=True)) and left != right


def pareto_fronts(entries: Sequence[Entry], direction: str) -> list[list[Entry]]:
    """Non-dominated sorting: front 1 is dominated by nobody, front 2 only by front 1 …"""
    remaining = list(entries)
    fronts = []
    while remaining:
        front = [e for e in remaining if not any(dominates(o, e, direction) for o in remaining)]
        fronts.append(front)
        remaining = [e for e in remaining if e not in front]
    return fronts


def crowding(front: Sequence[Entry], direction: str) -> dict[str, float]:
    """NSGA-II crowding distance of each member of one front (infinite at the ends)."""
    distance = {entry.candidate_id: 0.0 for entry in front}
    if len(front) <= 2:
        return {cid: math.inf for cid in distance}
    for name in ("score", "cost_microusd", "diff_lines"):
        ordered = sorted(front, key=partial(_sort_key, names=(name,), direction=direction))
        low, high = _key(ordered[0], name, direction), _key(ordered[-1], name, direction)
        distance[ordered[0].candidate_id] = distance[ordered[-1].candidate_id] = math.inf
        if high == low:
            continue
        for before, entry, after in zip(ordered, ordered[1:], ordered[2:], strict=False):
            gap = (_key(after, name, direction) - _key(before, name, direction)) / (high - low)
            distance[entry.candidate_id] += gap
    return distance


def rank(
    entries: Sequence[Entry], *, direction: str, policy: str, ordering: Sequence[str],
    tie_breakers: Sequence[str], retain_diversity: bool,
) -> list[tuple[Entry, str]]:
    """Every entry, best first, with the words that explain its place."""
    if policy == "ordered":
        names = [*ordering, *(t for t in tie_breakers if t not in ordering)]
        ordered = sorted(entries, key=lambda e: _sort_key(e, names, direction))
        return [(entry, f"ordered by {', '.join(names)}") for entry in ordered]
    ranked: list[tuple[Entry, str]] = []
    for number, front in enumerate(pareto_fronts(entries, direction), start=1):
        names = ["score", *(t for t in tie_breakers if t != "score")]
        if retain_diversity:
            spread = crowding(front, direction)
            front = sorted(front, key=lambda e: (-spread[e.candidate_id], *_sort_key(e, names, direction)))
        else:
            front = sorted(front, key=lambda e: _sort_key(e, names, direction))
        ranked.extend((entry, f"Pareto front {number} of score, cost and diff lines") for entry in front)
    return ranked


def select(
    entries: Sequence[Entry], keep: int, *, direction: str, policy: str, ordering: Sequence[str],
    tie_breakers: Sequence[str], retain_diversity: bool, labels: dict[str, str] | None = None,
) -> list[Decision]:
    """Promote the best `keep` entries; every entry gets a decision with its rank and reason.
    `labels` describe an entry's score in its reason (its interval) instead of the bare number."""
    ranked = rank(entries, direction=direction, policy=policy, ordering=ordering,
                  tie_breakers=tie_breakers, retain_diversity=retain_diversity)
    decisions: list[Decision] = []
    # Each patch is credited to its earliest-admitted copy: a rank can be noise, an admission is not.
    credited: dict[str, str] = {}
    for entry in sorted(entries, key=lambda e: (e.admitted, e.candidate_id), reverse=True):
        credited[entry.patch_sha256] = entry.candidate_id
    promoted = 0
    for position, (entry, why) in enumerate(ranked, start=1):
        original = credited.get(entry.patch_sha256) if entry.patch_sha256 else None
        if retain_diversity and original and original != entry.candidate_id:
            decisions.append(Decision(entry.candidate_id, False, position,
                                      f"identical patch to {original}, which was admitted first", original))
            continue
        score = (labels or {}).get(entry.candidate_id) or f"score {entry.score:g}"
        if promoted < keep:
            promoted += 1
            decisions.append(Decision(entry.candidate_id, True, position,
                                      f"rank {position} of {len(ranked)} ({why}; {score}): kept"))
        else:
            decisions.append(Decision(entry.candidate_id, False, position,
                                      f"rank {position} of {len(ranked)} ({why}; {score}): "
                                      f"not in the best {keep}"))
    return decisions
