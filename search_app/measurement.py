"""Fair measurement: interleaved blocks, paired ratios, confidence intervals and the decisions
made on them. Pure functions over plain values, so every rule is tested without a database.

- In block k every surviving candidate and the baseline run one trial, in an order shuffled by
  a seed derived from the search id, the round and k (`block_order`): deterministic, so it is
  part of what was preregistered.
- A candidate's figure is the median of its per-block ratios to the baseline's trial in the same
  block (`paired_ratios`), with a distribution-free confidence interval from the sign test
  (`median_interval`); fewer blocks than `min_blocks` decide nothing.
- Decisions read the intervals: a candidate beats the baseline when its whole interval is on the
  better side of 1; two candidates are told apart when their intervals do not overlap or, head to
  head over the blocks both ran, the interval of their per-block ratio excludes 1
  (`head_to_head`: the same blocks cancel the machine's drift, so it separates what two
  overlapping marginal intervals cannot); candidates not told apart from the best-placed member
  of their group are tied (`tie_groups`); a round's cut that falls inside a tie group is
  contested and earns more blocks for just those candidates (`contested`), and if they still
  cannot be told apart the tie-breakers decide, never the noise.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


def _rng(*parts: object) -> random.Random:
    seed = hashlib.sha256(":".join(str(part) for part in parts).encode()).digest()
    return random.Random(int.from_bytes(seed[:8], "big"))


def block_order(search_id: str, round_index: int, block: int, members: Sequence[str]) -> list[str]:
    """The order members run in block `block` of round `round_index`: a shuffle seeded by all three."""
    order = sorted(members)
    _rng("crucible-block", search_id, round_index, block).shuffle(order)
    return order


@dataclass(frozen=True)
class Interval:
    """A median and its confidence interval over `samples` values."""

    point: float
    low: float
    high: float
    confidence: float
    samples: int

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high

    @property
    def decided(self) -> bool:
        """Whether there are enough samples for an interval at its confidence at all."""
        return self.samples >= min_blocks(self.confidence)


def min_blocks(confidence: float) -> int:
    """The fewest samples whose range covers their median with at least `confidence`
    (1 − 2 · 0.5ⁿ): 6 at 95 %. Fewer samples decide nothing."""
    count = 1
    while 1 - 2 * 0.5 ** count < confidence:
        count += 1
    return count


# Replays a search makes at most before it ends without a winner (services and the forecast).
MAX_REPLAYS = 3


def replay_blocks(trials: int, ceiling: int, confidence: float, *, paired: bool) -> int:
    """Blocks a replay runs: enough for an interval at `confidence` when it is judged by one
    (paired), within the spec's ceiling; `trials` when it is judged by a band (absolute)."""
    return min(max(trials, min_blocks(confidence)), ceiling) if paired else trials


def median_interval(values: Sequence[float], confidence: float) -> Interval:
    """The median of `values` with its distribution-free confidence interval: the order
    statistics [x₍ₖ₎, x₍ₙ₋ₖ₊₁₎] of the sign test, with the largest k that keeps the coverage
    at `confidence` (no assumption about how the noise is shaped). With fewer than
    `min_blocks(confidence)` values no k does: the interval is their whole range, and it is not
    `decided`."""
    if not values:
        raise ValueError("no values to summarise")
    ordered = sorted(values)
    size = len(ordered)
    tail = (1 - confidence) / 2
    k, below = 0, 0.0
    for j in range(size):  # P(Binomial(n, 1/2) <= j)
        below += math.comb(size, j) / 2 ** size
        if below > tail:
            break
        k = j + 1
    low, high = (ordered[k - 1], ordered[size - k]) if k else (ordered[0], ordered[-1])
    return Interval(statistics.median(ordered), low, high, confidence, size)


def paired_ratios(values: Mapping[int, float], baseline: Mapping[int, float]) -> list[float]:
    """Each block's candidate value over the baseline's value in the same block (blocks where
    either is missing, or the baseline measured 0, are left out)."""
    return [values[block] / baseline[block] for block in sorted(values)
            if block in baseline and baseline[block] != 0]


def is_better(a: float, b: float, direction: str) -> bool:
    return a < b if direction == "minimize" else a > b


def beats(interval: Interval, reference: float, direction: str) -> bool:
    """Whether the whole interval lies on the better side of `reference` (1 for a paired ratio)."""
    return interval.high < reference if direction == "minimize" else interval.low > reference


# Whether two candidates (by id) can be told apart; by default, when their intervals do not overlap.
Separated = Callable[[str, str], bool]


def head_to_head(a: Mapping[int, float], b: Mapping[int, float], confidence: float) -> Interval | None:
    """The median of a's value over b's in each block both ran, with its interval; None with too
    few common blocks to decide anything. Its interval excluding 1 tells a and b apart."""
    ratios = [a[block] / b[block] for block in sorted(a) if block in b and b[block] != 0]
    if len(ratios) < min_blocks(confidence):
        return None
    return median_interval(ratios, confidence)


def tie_groups(intervals: Mapping[str, Interval], direction: str,
               separated: Separated | None = None) -> list[list[str]]:
    """Candidates best first, grouped: a group is its best remaining candidate (by point, then id)
    and every other remaining candidate not told apart from that one."""
    def key(cid: str) -> tuple[float, str]:
        point = intervals[cid].point
        return (point if direction == "minimize" else -point, cid)

    apart = separated or (lambda a, b: not intervals[a].overlaps(intervals[b]))
    remaining = sorted(intervals, key=key)
    groups = []
    while remaining:
        leader = remaining[0]
        group = [cid for cid in remaining if cid == leader or not apart(cid, leader)]
        groups.append(group)
        remaining = [cid for cid in remaining if cid not in group]
    return groups


def tied_scores(intervals: Mapping[str, Interval], direction: str,
                separated: Separated | None = None) -> dict[str, float]:
    """The score each candidate is ranked by: its group leader's point, so tied candidates rank
    equal and the tie-breakers order them."""
    return {cid: intervals[group[0]].point for group in tie_groups(intervals, direction, separated)
            for cid in group}


def contested(intervals: Mapping[str, Interval], keep: int, direction: str,
              separated: Separated | None = None) -> list[str]:
    """Candidates of a tie group that the cut after the best `keep` falls inside (some of the
    group would be kept, some not): their order is not yet known."""
    place = 0
    for group in tie_groups(intervals, direction, separated):
        if place < keep < place + len(group):
            return sorted(group)
        place += len(group)
    return []


def undecided_against(intervals: Mapping[str, Interval], reference: float, direction: str) -> list[str]:
    """Candidates whose interval contains `reference`: neither better nor worse, yet."""
    return sorted(cid for cid, interval in intervals.items() if interval.low <= reference <= interval.high)


def describe(interval: Interval, *, paired: bool) -> str:
    """`0.41× baseline [0.38, 0.44] at 95 %` (paired) or `12.3 [11.9, 12.8] at 95 %`."""
    level = f"{interval.confidence * 100:g} %"
    if paired:
        return f"{interval.point:.3g}× baseline [{interval.low:.3g}, {interval.high:.3g}] at {level}"
    return f"{interval.point:g} [{interval.low:g}, {interval.high:g}] at {level}"


# How far past the interval it won with a paired replay may land and still agree with it. A
# block's interval covers the noise within one stretch of time, not the drift between two: on a
# loaded machine the ratio of a short command moved 1.5 % between the rounds and the replay (CI,
# stop 35), enough to part two tight intervals. An inflated win moves further than this.
REPLAY_DRIFT = 0.10


def _won_with_drift(won: Interval, direction: str) -> Interval:
    """What a replay is held to: the interval it won with, widened by REPLAY_DRIFT on its worse side."""
    if direction == "minimize":
        return Interval(won.point, won.low, won.high * (1 + REPLAY_DRIFT), won.confidence, won.samples)
    return Interval(won.point, won.low / (1 + REPLAY_DRIFT), won.high, won.confidence, won.samples)


def replay_consistent(won: Interval, replayed: Interval, direction: str) -> tuple[bool, str]:
    """A paired replay passes when it still beats the baseline and is not clearly worse than
    what the candidate won with: its interval overlaps that one (widened by REPLAY_DRIFT on the
    worse side), or lies wholly on its better side (a loaded machine can shift the ratio; only a
    shift well past its win says the win was inflated)."""
    shown = f"replayed {describe(replayed, paired=True)}; won with {describe(won, paired=True)}"
    if not beats(replayed, 1.0, direction):
        return False, f"{shown}: the replay no longer beats the baseline"
    if replayed.overlaps(won):
        return True, f"{shown}: consistent"
    better = replayed.high < won.low if direction == "minimize" else replayed.low > won.high
    if better:
        return True, f"{shown}: better than it won with"
    drift = f"{REPLAY_DRIFT * 100:g} %"
    if replayed.overlaps(_won_with_drift(won, direction)):
        return True, f"{shown}: consistent (within {drift} of it, the drift a loaded machine shows)"
    return False, (f"{shown}: clearly worse than it won with (more than {drift} past its interval, "
                   "the intervals do not overlap)")


def replay_undecided(won: Interval, replayed: Interval, direction: str) -> bool:
    """A paired replay that failed only for want of blocks: its interval still holds the
    baseline (1) and overlaps what the candidate won with, so more blocks can decide it either
    way. One wholly worse than the baseline, or clearly worse than it won with, is decided."""
    holds_baseline = replayed.low <= 1.0 <= replayed.high
    return (holds_baseline and replayed.overlaps(_won_with_drift(won, direction))
            and not beats(replayed, 1.0, direction))


def revision_beats(revised: Interval, direction: str) -> tuple[bool, str]:
    """A revised patch (paired): it must still beat the baseline; there is no win of its own to
    be consistent with."""
    shown = f"the revised patch measured {describe(revised, paired=True)}"
    if beats(revised, 1.0, direction):
        return True, f"{shown}: beats the baseline"
    return False, f"{shown}: does not beat the baseline"


def revision_beats_absolute(revised: Sequence[float], baseline: Sequence[float], direction: str
                            ) -> tuple[bool, str]:
    """A revised patch (absolute): its median must be better than the baseline's, measured in
    the same blocks."""
    mine, theirs = statistics.median(revised), statistics.median(baseline)
    better = mine < theirs if direction == "minimize" else mine > theirs
    shown = f"the revised patch's median {mine:g} against the baseline's {theirs:g}"
    return better, f"{shown}: {'beats' if better else 'does not beat'} the baseline"


def replay_within_band(earlier: Sequence[float], replayed: float, tolerance: float) -> tuple[bool, str]:
    """`absolute` comparison: does a replayed median agree with the earlier trials, within their
    noise (their spread, or `tolerance` times their median, whichever is wider)?"""
    median = statistics.median(earlier)
    band = max(max(earlier) - min(earlier), abs(median) * tolerance)
    if abs(replayed - median) <= band:
        return True, f"replayed median {replayed:g} is within {band:g} of {median:g}"
    return False, f"replayed median {replayed:g} moved more than {band:g} from {median:g}"


def is_paired(contract: int, comparison: str, baseline_state: str) -> bool:
    """Whether a search compares by paired ratios now: its spec asks for it, the baseline is
    measured, and it was frozen under the paired contract (2); contract 1 runs as it was frozen."""
    return contract >= 2 and comparison == "paired" and baseline_state == "alive"


def figure_text(score: float | None, low: float | None, high: float | None, *, paired: bool) -> str:
    """A candidate's figure as pages show it: `0.41× [0.38, 0.44]` (paired) or the plain value."""
    if score is None:
        return "—"
    if not paired:
        return f"{score:g}"
    if low is None or high is None or low == high == score:
        return f"{score:.3g}×"
    return f"{score:.3g}× [{low:.3g}, {high:.3g}]"


# ------------------------------------------------------------- a reported figure, corroborated

# What one unit of a reported figure is in the runtime's own units: seconds, or KiB.
TIME_UNITS = {"time_s": 1.0, "time_ms": 1e-3, "time_us": 1e-6, "time_ns": 1e-9}
MEMORY_UNITS = {"memory_kib": 1.0, "memory_bytes": 1 / 1024}
_SHOWN = {"time_s": "s", "time_ms": "ms", "time_us": "µs", "time_ns": "ns", "memory_kib": "KiB",
          "memory_bytes": "bytes"}
# The runtime's noise a reported saving may hide in: at least this, or this share of the baseline.
TIME_TOLERANCE_SECONDS = 0.005
MEMORY_TOLERANCE_KIB = 1024
TOLERANCE_SHARE = 0.05


@dataclass(frozen=True)
class TrialFigures:
    """One trial: what the score command reported, and what the runtime measured of it (wall
    seconds from outside, CPU seconds and peak KiB of its whole process tree)."""

    reported: float
    wall: float | None = None
    cpu: float | None = None
    rss: float | None = None


def _ratio(mine: Sequence[float], theirs: Sequence[float]) -> float | None:
    base = statistics.median(theirs) if theirs else 0
    return statistics.median(mine) / base if mine and base else None


def _factor(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}×"


def _amount(value: float, kind: str) -> str:
    return f"{value:.4g} {_SHOWN[kind]}"


def report_tolerance(kind: str, baseline: Mapping[int, TrialFigures]) -> float:
    """How much of a reported saving the runtime's noise may hide (seconds or KiB): 5 ms or 5 % of
    the baseline's median wall time; 1 MiB or 5 % of its median peak memory."""
    if kind in MEMORY_UNITS:
        rss = [t.rss for t in baseline.values() if t.rss is not None]
        return max(MEMORY_TOLERANCE_KIB, TOLERANCE_SHARE * statistics.median(rss) if rss else 0)
    wall = [t.wall for t in baseline.values() if t.wall is not None]
    return max(TIME_TOLERANCE_SECONDS, TOLERANCE_SHARE * statistics.median(wall) if wall else 0)


def report_overruns(kind: str, trials: Mapping[int, TrialFigures], tolerance: float) -> str | None:
    """Why a time figure cannot be what it says: its median is more than the whole command took
    (beyond the tolerance), which no honest report of part of that command can be; None if not."""
    if kind not in TIME_UNITS:
        return None
    pairs = [(t.reported * TIME_UNITS[kind], t.wall) for t in trials.values() if t.wall is not None]
    if not pairs:
        return None
    reported, wall = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
    if reported <= wall + tolerance:
        return None
    return (f"reports {_amount(reported / TIME_UNITS[kind], kind)} a trial, but the runtime measured the "
            f"whole command at {wall * 1000:.4g} ms wall time")


def _stretch(b: TrialFigures) -> float:
    """How much the host stretched the baseline's wall time over its CPU time in one block (at
    least 1): on a loaded host a region timed with a wall clock takes longer than the CPU time it
    used, the baseline's as much as anyone's, and the candidate's code cannot reach that figure."""
    return max(1.0, b.wall / b.cpu) if b.wall and b.cpu else 1.0


def report_contradicted(kind: str, candidate: Mapping[int, TrialFigures],
                        baseline: Mapping[int, TrialFigures], confidence: float) -> str | None:
    """Whether the runtime's own measurement contradicts a reported time or memory figure, and how.

    In each block both ran, the saving the candidate claims over the baseline (converted to
    seconds or KiB) less the saving the runtime measured is what the report does not explain.
    Memory: peak memory saved; the report is contradicted when the lower end of the confidence
    interval of the median of that is above the tolerance (`report_tolerance`). Time: CPU time
    saved, stretched by the baseline's own wall/CPU ratio in that block (`_stretch`), and wall
    time saved; the report is contradicted when the interval's lower end for CPU time is above the
    tolerance and so is the median for wall time (with no CPU figures, the interval's lower end
    for wall time decides). A saving that fixed start-up cost and noise can hide stays within the
    tolerance and is taken, and one that is simply absent from the runtime's figures is not. A
    time figure larger than the whole command took is contradicted too. None when the report stands."""
    if kind not in TIME_UNITS and kind not in MEMORY_UNITS:
        return None
    tolerance = report_tolerance(kind, baseline)
    overrun = report_overruns(kind, candidate, tolerance)
    if overrun:
        return f"{overrun}: a report of part of that command cannot be larger than the whole of it"
    blocks = sorted(block for block in candidate if block in baseline)
    if not blocks:
        return None
    memory = kind in MEMORY_UNITS
    scale = MEMORY_UNITS[kind] if memory else TIME_UNITS[kind]
    claimed: list[float] = []
    unexplained: dict[str, list[float]] = {"rss": [], "cpu": [], "wall": []}
    for block in blocks:
        b, c = baseline[block], candidate[block]
        claim = (b.reported - c.reported) * scale
        claimed.append(claim)
        if memory and b.rss is not None and c.rss is not None:
            unexplained["rss"].append(claim - (b.rss - c.rss))
        if not memory and b.cpu is not None and c.cpu is not None:
            unexplained["cpu"].append(claim - (b.cpu - c.cpu) * _stretch(b))
        if not memory and b.wall is not None and c.wall is not None:
            unexplained["wall"].append(claim - (b.wall - c.wall))
    if memory:
        if not unexplained["rss"] or median_interval(unexplained["rss"], confidence).low <= tolerance:
            return None
        missing_point = statistics.median(unexplained["rss"])
    else:
        cpu, wall = unexplained["cpu"], unexplained["wall"]
        if not cpu and not wall:
            return None
        # CPU time is the steady witness; wall time speaks for savings that are not CPU (threads,
        # less waiting), by its median: one block's start-up noise must not excuse a forger.
        if cpu and median_interval(cpu, confidence).low <= tolerance:
            return None
        if wall and (statistics.median(wall) if cpu else median_interval(wall, confidence).low) <= tolerance:
            return None
        missing_point = min(statistics.median(values) for values in (cpu, wall) if values)
    mine = [candidate[b].reported for b in blocks]
    theirs = [baseline[b].reported for b in blocks]
    said = (f"reports {_factor(_ratio(mine, theirs))} the baseline "
            f"({_amount(statistics.median(mine), kind)} vs {_amount(statistics.median(theirs), kind)})")
    if memory:
        rss = _ratio([candidate[b].rss or 0 for b in blocks], [baseline[b].rss or 0 for b in blocks])
        seen = f"the runtime measured {_factor(rss)} in peak memory"
        unit, shown = "KiB", 1.0
    else:
        walls = _ratio([candidate[b].wall or 0 for b in blocks], [baseline[b].wall or 0 for b in blocks])
        cpus = _ratio([candidate[b].cpu or 0 for b in blocks], [baseline[b].cpu or 0 for b in blocks])
        seen = f"the runtime measured {_factor(walls)} in wall time and {_factor(cpus)} in CPU time"
        unit, shown = "ms", 1000.0
    claim = statistics.median(claimed)
    if missing_point >= claim:
        return (f"{said}; {seen}: none of the {claim * shown:.4g} {unit} it claims to save is in the "
                "runtime's own measurement")
    return (f"{said}; {seen}: {missing_point * shown:.4g} {unit} of the {claim * shown:.4g} {unit} it claims "
            "to save are not in the runtime's own measurement")
