"""The forecast before launch: the writer steps, gate runs and trial runs a search plans, and
what it is expected to cost and how long it should take.

`forecast(spec, history)` is a pure computation from the spec and what earlier searches of the
same repository left (`History`, read by `search_app.selectors.forecast_history`); the price of
the writers' model comes in the same way, so nothing here reads the database.

How a search runs, which the counts follow (docs/running-searches.md, "Forecast"):
- round 0: `population` writer steps; with `worker.refine`, every promoted candidate's writer
  runs again at the start of each later round;
- gates run once per new patch: the baseline's, each candidate's in round 0 (fewer if it fails
  early), each changed refinement's, and the winner's again at each replay;
- trials run in blocks: in round r every survivor and the baseline run once per block, for
  `score.trials` blocks, plus (paired scoring) extra blocks for candidates at the cut that cannot
  be told apart (or are ahead on too few blocks to decide), up to `score.trials_ceiling` blocks;
  each replay runs the winner and the baseline for `measurement.replay_blocks` blocks (paired:
  up to the ceiling while it cannot tell them apart);
- trials run one at a time on a host; writers and gates up to `concurrency` at once.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, TypedDict

from runtime_app.fleet import PRESETS
from runtime_app.prices import Price, Usage, cost_microusd, usd_text
from search_app.execution import REVIEW_TIMEOUT_SECONDS, WRITER_TIMEOUT_SECONDS
from search_app.measurement import MAX_REPLAYS, replay_blocks
from search_app.spec import SearchSpec

# With no past writer step of the same provider and model, one writer step is priced as this
# many tokens (about ten model calls on a 20,000-token prompt that the provider caches).
ASSUMED_WRITER_USAGE = Usage(input_tokens=20_000, output_tokens=15_000, cache_write_tokens=20_000,
                             cache_read_tokens=180_000)
_ASSUMED = ASSUMED_WRITER_USAGE
ASSUMPTION_TEXT = (f"an assumed {_ASSUMED.tokens:,} tokens per writer step ({_ASSUMED.input_tokens:,} input, "
                   f"{_ASSUMED.cache_write_tokens:,} written to and {_ASSUMED.cache_read_tokens:,} read "
                   f"from the prompt cache, {_ASSUMED.output_tokens:,} output)")
AT_MOST_NOTE = ("Counts are at most: a candidate that changes nothing, fails a gate or has a patch "
                "identical to another's runs fewer (identical patches are evaluated once).")


@dataclass(frozen=True)
class Span:
    """A planned figure as the fewest and the most it can be (equal when it is exact)."""

    low: float
    high: float

    def __add__(self, other: Span) -> Span:
        return Span(self.low + other.low, self.high + other.high)

    def __mul__(self, factor: float) -> Span:
        return Span(self.low * factor, self.high * factor)

    @property
    def exact(self) -> bool:
        return self.low == self.high

    @property
    def text(self) -> str:
        """"12" or "12–36", with thousands separators."""
        low, high = f"{round(self.low):,}", f"{round(self.high):,}"
        return low if low == high else f"{low}–{high}"

    @property
    def duration(self) -> str:
        """As a wall time: "40 s" or "4 min–8 min"."""
        return span_duration_text(self)

    def as_dict(self) -> dict[str, float]:
        return {"low": self.low, "high": self.high}


def _count(low: float, high: float | None = None) -> Span:
    return Span(low, low if high is None else high)


ZERO = _count(0)


@dataclass(frozen=True)
class History:
    """What earlier finished searches of the same repository (and project) left.

    `writer_*` come from searches with the same provider and model (or command line): writer
    step durations, and the totals of their writers' model-call receipts over `writer_steps`
    steps. Gate and trial durations are per command text, from every search read. `steps`: the
    finished steps of the searches read (writer steps only of the same provider and model), which
    time the wall-time forecast; the receipts stand in for a kind none of them timed.
    """

    searches: int = 0
    writer_searches: int = 0
    writer_seconds: tuple[float, ...] = ()
    writer_steps: int = 0
    writer_calls: int = 0
    writer_cost_microusd: int = 0
    writer_tokens: int = 0
    gate_seconds: dict[str, tuple[float, ...]] = field(default_factory=dict)
    trial_seconds: dict[str, tuple[float, ...]] = field(default_factory=dict)
    steps: tuple[StepSample, ...] = ()


@dataclass(frozen=True)
class RoundPlan:
    index: int
    survivors: int
    writer_steps: Span
    gate_runs: Span
    trial_runs: Span
    wall_seconds: Span | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"round": self.index, "survivors": self.survivors, "writer_steps": self.writer_steps.as_dict(),
                "gate_runs": self.gate_runs.as_dict(), "trial_runs": self.trial_runs.as_dict(),
                "wall_seconds": self.wall_seconds.as_dict() if self.wall_seconds else None}


@dataclass(frozen=True)
class Forecast:
    writer_kind: str  # "llm" or "command"
    provider: str
    model: str
    rounds: tuple[RoundPlan, ...]
    replays: Span
    replay_gate_runs: Span
    replay_trial_runs: Span
    writer_steps: Span
    gate_runs: Span
    trial_runs: Span
    model_calls: Span | None
    cost_microusd: Span | None
    cost_source: str
    tokens: Span | None
    budget_cost_microusd: int | None
    budget_tokens: int | None
    wall_seconds: Span | None
    wall_source: str
    wall_ceiling_seconds: float
    wall_ceiling_source: str
    history_searches: int
    notes: tuple[str, ...]
    warnings: tuple[str, ...]
    wall_typical_seconds: float | None = None  # the median paces over the fewest counts
    replay_wall_seconds: Span | None = None  # the replays and the review, after the rounds

    @property
    def cost_text(self) -> str:
        if self.cost_microusd is None:
            return "unknown"
        low, high = usd_text(self.cost_microusd.low), usd_text(self.cost_microusd.high)
        return f"about {low}" if low == high else f"about {low}–{high}"

    @property
    def budget_text(self) -> str:
        parts = []
        if self.budget_cost_microusd:
            parts.append(usd_text(self.budget_cost_microusd))
        if self.budget_tokens:
            parts.append(f"{self.budget_tokens:,} tokens")
        return ", ".join(parts) or "no ceiling"

    @property
    def wall_text(self) -> str:
        if self.wall_seconds is None:
            return "unknown"
        if self.wall_typical_seconds is None:
            return f"about {span_duration_text(self.wall_seconds)}"
        return (f"about {duration_text(self.wall_typical_seconds)} "
                f"({range_text(self.wall_seconds.low, self.wall_seconds.high)})")

    @property
    def wall_ceiling_text(self) -> str:
        # A bound from timeouts is a worst case, never a forecast: it is labelled as one.
        return f"worst case {duration_text(self.wall_ceiling_seconds)}, from the spec's timeouts"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for the API and the CLI's --json."""

        def span(value: Span | None) -> dict[str, float] | None:
            return value.as_dict() if value is not None else None

        return {
            "writer_kind": self.writer_kind, "provider": self.provider, "model": self.model,
            "rounds": [plan.as_dict() for plan in self.rounds],
            "replay": {"replays": span(self.replays), "gate_runs": span(self.replay_gate_runs),
                       "trial_runs": span(self.replay_trial_runs),
                       "wall_seconds": span(self.replay_wall_seconds)},
            "writer_steps": span(self.writer_steps), "gate_runs": span(self.gate_runs),
            "trial_runs": span(self.trial_runs), "model_calls": span(self.model_calls),
            "cost_microusd": span(self.cost_microusd), "cost_source": self.cost_source,
            "tokens": span(self.tokens),
            "budget": {"max_cost_microusd": self.budget_cost_microusd, "max_tokens": self.budget_tokens},
            "wall_seconds": span(self.wall_seconds), "wall_source": self.wall_source,
            "wall_typical_seconds": self.wall_typical_seconds,
            "wall_ceiling_seconds": self.wall_ceiling_seconds,
            "wall_ceiling_source": self.wall_ceiling_source,
            "history_searches": self.history_searches,
            "notes": list(self.notes), "warnings": list(self.warnings),
        }


def duration_text(seconds: float) -> str:
    """"0.4 s", "45 s", "12 min", "3.5 h" for people."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def span_duration_text(value: Span) -> str:
    low, high = duration_text(value.low), duration_text(value.high)
    return low if low == high else f"{low}–{high}"


# ------------------------------------------------------------------------------------ counts


class RoundCounts(TypedDict):
    """One round's plan: its survivors, and its writer steps, gate runs and trial runs."""

    survivors: int
    writers: Span
    gates: Span
    trials: Span


class Wall(TypedDict):
    """Wall seconds per round and in all."""

    rounds: list[Span]
    total: Span


def _plan_counts(spec: SearchSpec) -> tuple[list[RoundCounts], dict[str, Span]]:
    """Per round and for the replays: writer steps, gate runs (low and high per candidate) and
    trial runs."""
    gates = len(spec.hard_gates.commands)
    trials = spec.score.trials
    # Extra blocks only where paired intervals decide; `absolute` scoring runs the block plan as is.
    ceiling = spec.score.trials_ceiling if spec.score.comparison == "paired" else trials
    rounds: list[RoundCounts] = []
    for index, survivors in enumerate(spec.rounds):
        if index == 0:
            writers = _count(survivors)
            # The baseline's gates, then each candidate's: at least its first gate, at most all.
            gate_runs = _count(gates + survivors, gates + survivors * gates)
        elif spec.worker.refine:
            writers = _count(survivors)
            # Gates run again only on a refinement that changed the patch.
            gate_runs = _count(0, survivors * gates)
        else:
            writers, gate_runs = ZERO, ZERO
        trial_runs = _count((survivors + 1) * trials, (survivors + 1) * ceiling)
        rounds.append({"survivors": survivors, "writers": writers, "gates": gate_runs, "trials": trial_runs})
    replays = _count(1, MAX_REPLAYS)
    blocks = replay_blocks(trials, spec.score.trials_ceiling, spec.score.confidence,
                           paired=spec.score.comparison == "paired")
    # A paired replay that cannot yet tell the winner from the baseline gets blocks up to the ceiling.
    most = spec.score.trials_ceiling if spec.score.comparison == "paired" else blocks
    replay_trials = _count(replays.low * 2 * blocks, replays.high * 2 * max(blocks, most))
    replay = {"replays": replays, "gates": replays * gates, "trials": replay_trials}
    return rounds, replay


# ------------------------------------------------------------------------------------ history


def _writer_kind(spec: SearchSpec) -> str:
    preset = PRESETS.get(spec.worker.provider)
    # Administrators' presets are LLM providers; only the built-in `command` preset runs a command.
    return "command" if preset is not None and preset.kind == "command" else "llm"


def _searches_text(count: int) -> str:
    return f"{count} past search{'es' if count != 1 else ''} of this repository"


def forecast(
    spec: SearchSpec, history: History, *, price: Price | None = None, price_label: str = "",
    model: str = "",
) -> Forecast:
    """The plan of a search and its expected cost and wall time.

    `price` is the writers' model's price (None when the price table does not list it) and
    `price_label` names the entry and table version; `model` is the model id (or the command
    line) shown.
    """
    kind = _writer_kind(spec)
    rounds, replay = _plan_counts(spec)
    writers = sum((r["writers"] for r in rounds), ZERO)
    gate_runs = sum((r["gates"] for r in rounds), ZERO) + replay["gates"]
    trial_runs = sum((r["trials"] for r in rounds), ZERO) + replay["trials"]
    notes = [AT_MOST_NOTE]
    warnings: list[str] = []
    if spec.worker.refine:
        notes.append("Refinements are planned for every promoted candidate; one whose candidate falls "
                     "earlier, or that the budget cannot cover, is not run.")

    model_calls, tokens, cost, cost_source = _cost(spec, history, kind, writers, price, price_label, model)
    if kind == "llm":
        notes.append("An LLM writer step makes several model calls; the reviewer's calls are not counted.")
    budget_cost, budget_tokens = spec.budget.max_cost_microusd, spec.budget.max_tokens
    for figure, ceiling, what, text in ((cost, budget_cost, "cost", usd_text),
                                        (tokens, budget_tokens, "token use",
                                         lambda n: f"{round(n):,} tokens")):
        if figure is not None and ceiling and figure.high > ceiling:
            warnings.append(f"The expected {what} ({text(figure.high)}) exceeds the budget "
                            f"({text(ceiling)}): admission stops before a writer could exceed it, so some "
                            "candidates are not written.")

    plans, wall_seconds, wall_typical, replay_wall, wall_source = _wall_time(spec, history, rounds, model)
    gate_timeouts = spec.hard_gates.timeout_seconds * len(spec.hard_gates.commands)
    wall_ceiling = _wall(spec, rounds, replay, WRITER_TIMEOUT_SECONDS, gate_timeouts,
                         spec.score.timeout_seconds)
    unlimited = " (LLM writers have no clock limit: counted at that)" if kind == "llm" else ""
    ceiling_source = (f"Every step running to its timeout: {duration_text(WRITER_TIMEOUT_SECONDS)} per "
                      f"writer step{unlimited}, {spec.hard_gates.timeout_seconds} s per gate, "
                      f"{spec.score.timeout_seconds} s per trial, every count at its most.")
    return Forecast(
        writer_kind=kind, provider=spec.worker.provider, model=model, rounds=tuple(plans),
        replays=replay["replays"], replay_gate_runs=replay["gates"], replay_trial_runs=replay["trials"],
        writer_steps=writers, gate_runs=gate_runs, trial_runs=trial_runs, model_calls=model_calls,
        cost_microusd=cost, cost_source=cost_source, tokens=tokens, budget_cost_microusd=budget_cost,
        budget_tokens=budget_tokens, wall_seconds=wall_seconds, wall_source=wall_source,
        wall_ceiling_seconds=wall_ceiling["total"].high, wall_ceiling_source=ceiling_source,
        history_searches=history.searches, notes=tuple(notes), warnings=tuple(warnings),
        wall_typical_seconds=wall_typical, replay_wall_seconds=replay_wall,
    )


def _cost(spec: SearchSpec, history: History, kind: str, writers: Span, price: Price | None, price_label: str,
          model: str) -> tuple[Span | None, Span | None, Span | None, str]:
    """The writers' expected model calls, tokens and cost, and where the figures come from: past
    searches' receipts, else the price table with an assumed usage, else unknown."""
    model_calls = tokens = cost = None
    if kind == "command":
        cost_source = ("Command writers report no cost the runtime can measure (a command's own usage "
                       "line is shown, never trusted), so none is forecast.")
    elif history.writer_steps and history.writer_calls:
        per_cost = history.writer_cost_microusd / history.writer_steps
        cost = writers * per_cost
        tokens = writers * (history.writer_tokens / history.writer_steps)
        model_calls = writers * (history.writer_calls / history.writer_steps)
        cost_source = (f"{usd_text(per_cost)} per writer step: the mean of {history.writer_steps:,} writer "
                       f"step{'s' if history.writer_steps != 1 else ''}' model-call receipts in "
                       f"{_searches_text(history.writer_searches)} with {spec.worker.provider} {model}.")
    elif price is not None:
        per_cost = cost_microusd(price, ASSUMED_WRITER_USAGE)
        cost = writers * per_cost
        tokens = writers * ASSUMED_WRITER_USAGE.tokens
        cost_source = (f"{usd_text(per_cost)} per writer step: {ASSUMPTION_TEXT}, at the price table's "
                       f"{price_label or model} prices; no past search of this repository used "
                       f"{spec.worker.provider} {model}.")
    else:
        cost_source = (f"Unknown: the price table lists no price for {model or spec.worker.provider} and no "
                       "past search of this repository used it.")
    return model_calls, tokens, cost, cost_source


def _wall_time(spec: SearchSpec, history: History, rounds: list[RoundCounts],
               model: str) -> tuple[list[RoundPlan], Span | None, float | None, Span | None, str]:
    """Each round's plan with its expected wall time, the search's, and where they come from:
    `time_left`'s work model at "nothing done yet", timed by the past searches' step durations
    (each step's sandbox, tree, git and command included), a kind with no past step by its
    commands' receipts (labelled); unknown while a kind has neither."""
    paces = prelaunch_paces(spec, history)
    starts = [_left_from(spec, paces, index) for index in range(len(rounds))]
    tail = _left_from(spec, paces, None)
    total = starts[0] if starts else tail
    if not history.searches:
        return ([_round_plan(index, item, None) for index, item in enumerate(rounds)], None, None, None,
                "Unknown: no finished search of this repository yet.")
    if total.untimed:
        # A review is counted as a writer step until one is timed: no writer step, no review either.
        untimed = [kind for kind in total.untimed if not (kind == "review" and "generate" in total.untimed)]
        words = [KIND_WORDS.get(kind, kind) for kind in untimed]
        if "generate" in untimed:
            words[untimed.index("generate")] = f"writer step with {spec.worker.provider} {model}".rstrip()
        return ([_round_plan(index, item, None) for index, item in enumerate(rounds)], None, None, None,
                f"Unknown: {_searches_text(history.searches)} recorded no {' and no '.join(words)}.")
    ends = [*starts[1:], tail]
    plans = [_round_plan(index, item, Span(max(a.low - b.low, 0.0), max(a.high - b.high, 0.0)))
             for index, (item, a, b) in enumerate(zip(rounds, starts, ends, strict=True))]
    basis = "; ".join(f"{KIND_WORDS[kind]} {duration_text(pace.mid)} ({pace.source.format(n=pace.count)})"
                      for kind, pace in paces.items() if kind in total.used)
    wall_source = (f"From {_searches_text(history.searches)}, each step's measured wall time: {basis}; "
                   f"{spec.concurrency} writers or gate runs at once, trials one at a time, each round "
                   "after the last.")
    return plans, Span(total.low, total.high), total.mid, Span(tail.low, tail.high), wall_source


def prelaunch_paces(spec: SearchSpec, history: History) -> dict[str, Pace]:
    """Each kind's pace from the past searches' finished steps (`_paces`, as `time_left` reads a
    running search's); a kind no past step timed falls back to its commands' receipts, labelled."""
    gates = len(spec.hard_gates.commands)
    paces = _paces(list(history.steps), gates)
    if "generate" not in paces:
        pace = pace_of(list(history.writer_seconds), "median of {n} past writer steps")
        if pace is not None:
            paces["generate"] = pace
            if paces.get("review") is None:
                paces["review"] = replace_source(pace, "counted as writer steps: no past review")
    if paces.get("evaluate") is None or paces["evaluate"].count == 0:
        per_gate = [pace_of(list(_command_values(history.gate_seconds, command)), "")
                    for command in spec.hard_gates.commands]
        if per_gate and all(pace is not None for pace in per_gate):
            known = [pace for pace in per_gate if pace is not None]
            others = "" if all(c in history.gate_seconds for c in spec.hard_gates.commands) else \
                " (some from other commands)"
            paces["evaluate"] = Pace(sum(p.low for p in known), sum(p.mid for p in known),
                                     sum(p.high for p in known), 0,
                                     f"the gate commands' receipts only{others}: no past gate step, so "
                                     "without its sandbox and tree set-up")
    if paces.get("trial") is None or paces["trial"].count == 0:
        pace = pace_of(list(_command_values(history.trial_seconds, spec.score.command)), "")
        if pace is not None:
            others = "" if spec.score.command in history.trial_seconds else " (of other commands)"
            paces["trial"] = replace_source(pace, f"the score command's receipts only{others}: no past "
                                                  "measurement step, so without its sandbox and tree set-up")
    return paces


def _command_values(durations: dict[str, tuple[float, ...]], command: str) -> tuple[float, ...]:
    """The durations of this very command, else of any command read."""
    return durations.get(command) or tuple(value for values in durations.values() for value in values)


def _left_from(spec: SearchSpec, paces: dict[str, Pace], round_index: int | None) -> TimeLeft:
    """`time_left` at the start of round `round_index` with nothing of it done (None: at the
    replay), every step run `concurrency` at a time."""
    if round_index is None:
        position = RunPosition(phase="replay", round_index=len(spec.rounds) - 1, queued=0,
                               survivors=spec.rounds[-1] if spec.rounds else 0)
        steps: list[StepSample] = []
    else:
        survivors = spec.rounds[round_index]
        position = RunPosition(phase="rounds", round_index=round_index,
                               queued=survivors if round_index == 0 else 0, survivors=survivors)
        # A later round opens with its refinements pending (with `worker.refine`).
        steps = [StepSample(kind="generate", round=round_index, state="pending")] * (
            survivors if round_index > 0 and spec.worker.refine else 0)
    return time_left(spec, position, steps, lanes=spec.concurrency, paces=paces)


def _round_plan(index: int, item: RoundCounts, seconds: Span | None) -> RoundPlan:
    return RoundPlan(index, item["survivors"], item["writers"], item["gates"], item["trials"], seconds)


def _waves(jobs: float, concurrency: int) -> int:
    """How many rounds of `concurrency` parallel slots `jobs` equal jobs take."""
    return math.ceil(jobs / concurrency) if jobs else 0


def _wall(spec: SearchSpec, rounds: list[RoundCounts], replay: dict[str, Span], writer: float,
          gates: float, trial: float) -> Wall:
    """Wall seconds per round and in all: writers and a patch's gates in waves of `concurrency`,
    then the round's trials one at a time (the measurement lane is exclusive), round after round;
    then each replay's gates and trials, one candidate at a time."""
    per_round = []
    for index, item in enumerate(rounds):
        survivors = item["survivors"]
        if index == 0:
            # Every writer then its patch's gates; the baseline's gates fit beside them.
            parallel = Span(*[_waves(survivors, spec.concurrency) * (writer + gates)] * 2)
        elif spec.worker.refine:
            waves = _waves(survivors, spec.concurrency)
            parallel = Span(waves * writer, waves * (writer + gates))
        else:
            parallel = ZERO
        per_round.append(parallel + item["trials"] * trial)
    replays = replay["replays"] * gates + replay["trials"] * trial
    total = sum(per_round, ZERO) + replays
    return {"rounds": per_round, "total": total}


# ------------------------------------------------------------------------------------ time left
#
# While a search runs, the time it has left is forecast from ITS OWN steps: the wall durations of
# the steps that finished (per kind: writer, gates, a trial, replay, review) times the work the
# plan still implies (per round, with the lanes that run at once). The spec's timeouts give only
# the labelled worst case. See docs/running-searches.md, "Time left".

# Steps that will not run again; a cancelled step's duration says nothing of the work's length.
_ENDED = ("done", "failed", "cancelled")
_TIMED = ("done", "failed")
# What each step kind is called where the forecast explains itself.
KIND_WORDS = {"generate": "writer step", "evaluate": "gate run", "trial": "trial",
              "replay": "replay", "review": "review"}


@dataclass(frozen=True)
class StepSample:
    """One step of the search as the forecast reads it: its kind, round and state; its wall
    seconds (finished: started to finished; running: so far; pending: None); and for a measure or
    replay step, the trial runs it plans (members × blocks)."""

    kind: str
    round: int
    state: str
    seconds: float | None = None
    trials: int = 0
    started: float | None = None  # seconds since the run started, to count the lanes used at once
    trials_done: int = 0  # a running measure or replay step: its trial runs finished so far


@dataclass(frozen=True)
class RunPosition:
    """Where the run is: its phase and round, the round-0 candidates not admitted yet, the
    candidates still in the current round, and whether the baseline is measured beside them."""

    phase: str
    round_index: int
    queued: int
    survivors: int
    baseline_alive: bool = True


@dataclass(frozen=True)
class Pace:
    """One kind's measured seconds per step (per trial run for `trial`): a low and high figure
    and the median, from `count` finished steps of this search (or borrowed from another kind)."""

    low: float
    mid: float
    high: float
    count: int
    source: str


@dataclass(frozen=True)
class TimeLeft:
    low: float
    mid: float
    high: float
    worst_case: float
    untimed: tuple[str, ...]  # kinds still to run with no finished step to time them by
    basis: tuple[str, ...]   # one phrase per kind: "writer step 42 s (median of 3)"
    steps_timed: int
    borrowed: tuple[str, ...] = ()  # kinds timed, until their own steps finish, by another kind's
    used: tuple[str, ...] = ()  # the kinds the work left counts

    @property
    def text(self) -> str:
        """"about 3 min left (2–5 min)", "at least 40 s left; estimating: no trial timed yet",
        or "estimating…" before anything is timed."""
        if self.untimed:
            words = [KIND_WORDS.get(kind, kind) for kind in self.untimed]
            what = words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
            if self.high <= 0:
                return f"estimating… (no {what} timed yet)"
            return f"at least {duration_text(self.low)} left; estimating (no {what} timed yet)"
        if self.high <= 0:
            return "finishing"
        guess = f"; {' and '.join(self.borrowed)}" if self.borrowed else ""
        return f"about {duration_text(self.mid)} left ({range_text(self.low, self.high)}{guess})"

    @property
    def worst_case_text(self) -> str:
        return f"worst case {duration_text(self.worst_case)}, from the spec's timeouts"

    @property
    def basis_text(self) -> str:
        timed = f"measured on {self.steps_timed} finished step{'s' if self.steps_timed != 1 else ''} of " \
                "this search"
        return f"{timed}: {'; '.join(self.basis)}" if self.basis else timed

    def as_dict(self) -> dict[str, Any]:
        return {"low_seconds": round(self.low), "seconds": round(self.mid), "high_seconds": round(self.high),
                "worst_case_seconds": round(self.worst_case), "untimed": list(self.untimed),
                "text": self.text, "basis": self.basis_text, "worst_case": self.worst_case_text}


def range_text(low: float, high: float) -> str:
    """"2–5 min", "40 s–2 min", or one figure when both ends read the same."""
    a, b = duration_text(low), duration_text(high)
    if a == b:
        return a
    unit_a, unit_b = a.rsplit(" ", 1)[-1], b.rsplit(" ", 1)[-1]
    return f"{a.rsplit(' ', 1)[0]}–{b}" if unit_a == unit_b else f"{a}–{b}"


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    below = math.floor(at)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (at - below)


def pace_of(values: list[float], source: str) -> Pace | None:
    """The quartiles of `values`, widened while few are known (by 1/√n each way): one sample gives
    half to twice it, sixteen a quarter either way; None without any."""
    if not values:
        return None
    widen = 1 + 1 / math.sqrt(len(values))
    return Pace(low=_quantile(values, 0.25) / widen, mid=statistics.median(values),
                high=_quantile(values, 0.75) * widen, count=len(values), source=source)


def lanes_used(steps: list[StepSample]) -> int:
    """The most steps of the search that ran at once so far (1 if none ran)."""
    edges: list[tuple[float, int]] = []
    for step in steps:
        if step.started is None or step.seconds is None:
            continue
        edges += [(step.started, 1), (step.started + step.seconds, -1)]
    peak = now = 0
    for _, change in sorted(edges, key=lambda edge: (edge[0], edge[1])):
        now += change
        peak = max(peak, now)
    return max(peak, 1)


def _paces(steps: list[StepSample], gates: int = 1) -> dict[str, Pace]:
    """Each kind's pace from the finished steps; trials from measure (and replay) steps, per run."""
    timed = [s for s in steps if s.state in _TIMED and s.seconds is not None]
    paces: dict[str, Pace] = {}
    for kind in ("generate", "evaluate", "replay", "review"):
        pace = pace_of([s.seconds for s in timed if s.kind == kind and s.seconds is not None],
                       "median of {n}")
        if pace is not None:
            paces[kind] = pace
    # A measure step's wall time over its trial runs (each run counts once); a running one's so far
    # over the runs it finished, so trials are timed long before a round's blocks all ran.
    per_trial = [s.seconds / s.trials for s in timed if s.kind == "measure" and s.trials and s.seconds
                 for _ in range(s.trials)]
    per_trial += [s.seconds / s.trials_done for s in steps if s.kind == "measure" and s.state == "running"
                  and s.trials_done and s.seconds for _ in range(s.trials_done)]
    if not per_trial:  # a replay also runs gates: only a stand-in until a round's measure finished
        per_trial = [s.seconds / s.trials for s in timed if s.kind == "replay" and s.trials and s.seconds
                     for _ in range(s.trials)]
    pace = pace_of(per_trial, "over {n} trial runs")
    if pace is not None:
        paces["trial"] = pace
    if "trial" not in paces and "evaluate" in paces:
        # A trial and a gate both run one command on a fresh tree of the patch; labelled as borrowed.
        gate = paces["evaluate"]
        per = max(gates, 1)
        paces["trial"] = Pace(gate.low / per, gate.mid / per, gate.high / per, 0,
                              "counted as gate runs until one is timed")
    if "review" not in paces and "generate" in paces:
        # Both read the patch in an agent's sandbox; labelled as borrowed.
        paces["review"] = replace_source(paces["generate"], "counted as writer steps until one is timed")
    return paces


def replace_source(pace: Pace, source: str) -> Pace:
    return Pace(pace.low, pace.mid, pace.high, 0, source)


class _Work:
    """Remaining wall seconds, summed stage by stage (low, mid, high), and the untimed kinds."""

    def __init__(self, paces: dict[str, Pace]) -> None:
        self.paces = paces
        self.low = self.mid = self.high = 0.0
        self.untimed: list[str] = []
        self.used: set[str] = set()

    def add(self, kind: str, low_units: float, high_units: float, *, lanes: int = 1,
            running: tuple[float, ...] = ()) -> None:
        """`low_units`–`high_units` more steps (trial runs for `trial`) of `kind`, run `lanes` at
        a time, after the ones running now (seconds so far in `running`)."""
        if low_units <= 0 and high_units <= 0 and not running:
            return
        pace = self.paces.get(kind)
        self.used.add(kind)
        if pace is None:
            if kind not in self.untimed:
                self.untimed.append(kind)
            return
        for name, per in (("low", pace.low), ("mid", pace.mid), ("high", pace.high)):
            units = low_units if name != "high" else high_units
            # The steps running now finish first (the longest-running one soonest); the rest follow
            # in waves of `lanes`.
            now = max((max(per - seconds, 0.0) for seconds in running), default=0.0)
            waves = math.ceil(units / lanes) if units > 0 else 0
            setattr(self, name, getattr(self, name) + now + waves * per)


def time_left(spec: SearchSpec, position: RunPosition, steps: list[StepSample],
              lanes: int | None = None, paces: dict[str, Pace] | None = None) -> TimeLeft:
    """How long the search has left: what remains of its plan from `position`, timed by its own
    finished `steps`, as a range (the quartiles of each kind's durations, widened while few are
    known, over the fewest and the most steps the plan allows), and the worst case from the spec's
    timeouts. `lanes`: how many steps run at once (default: the most seen so far, up to the
    spec's concurrency). `paces`: each kind's pace when not this search's own (the forecast
    before launch times "nothing done yet" by past searches' steps)."""
    if paces is None:
        paces = _paces(steps, len(spec.hard_gates.commands))
    lanes = max(1, min(spec.concurrency, lanes or lanes_used(steps)))
    work = _Work(paces)
    gate_count = len(spec.hard_gates.commands)
    worst = 0.0
    here = position.round_index
    trials, ceiling = spec.score.trials, spec.score.trials_ceiling
    paired = spec.score.comparison == "paired"
    most_blocks = ceiling if paired else trials

    def of(kind: str, round_index: int, state: str) -> list[StepSample]:
        return [s for s in steps if s.kind == kind and s.round == round_index and s.state == state]

    if position.phase == "rounds":
        # This round: its writers (and, in round 0, the candidates not admitted yet) ...
        writers_pending = len(of("generate", here, "pending")) + (position.queued if here == 0 else 0)
        writers_running = tuple(s.seconds or 0.0 for s in of("generate", here, "running"))
        work.add("generate", writers_pending, writers_pending, lanes=lanes, running=writers_running)
        worst += math.ceil((writers_pending + len(writers_running)) / lanes) * WRITER_TIMEOUT_SECONDS
        # ... then its evaluations: each made one, each writer still to end one (in round 0 the
        # baseline's too, until it is made).
        evaluations = [s for s in steps if s.kind == "evaluate" and s.round == here]
        to_make = writers_pending + len(writers_running)
        baseline_due = 1 if here == 0 and not evaluations and position.baseline_alive else 0
        pending = len([s for s in evaluations if s.state == "pending"]) + baseline_due
        low_new = to_make if here == 0 else 0
        running = tuple(s.seconds or 0.0 for s in evaluations if s.state == "running")
        work.add("evaluate", pending + low_new, pending + to_make, lanes=lanes, running=running)
        gate_timeouts = spec.hard_gates.timeout_seconds * gate_count
        worst += math.ceil((pending + to_make + len(running)) / lanes) * gate_timeouts
        # ... then its measurement: every survivor and the baseline, `trials` blocks (paired: up to
        # the ceiling where the cut is close).
        measures = [s for s in steps if s.kind == "measure" and s.round == here]
        members = position.survivors + (1 if position.baseline_alive else 0)
        measured = any(s.state in _ENDED for s in measures)
        live = [s for s in measures if s.state in ("pending", "running")]
        planned_low = sum(max(s.trials - s.trials_done, 0) for s in live) if live else (
            0 if measured else members * trials)
        planned_high = planned_low + (members * (most_blocks - trials) if paired else 0)
        if measured and not live:
            planned_low, planned_high = 0, members * (most_blocks - trials) if paired else 0
        work.add("trial", planned_low, planned_high)
        worst += planned_high * spec.score.timeout_seconds
        after = here + 1
    else:
        after = len(spec.rounds)
    # The later rounds: refinements and their gates (with `worker.refine`), then the blocks.
    alive = position.survivors
    for index in range(after, len(spec.rounds)):
        alive = min(spec.rounds[index], alive) if alive else spec.rounds[index]
        if spec.worker.refine:
            work.add("generate", alive, alive, lanes=lanes)
            work.add("evaluate", 0, alive, lanes=lanes)
            worst += math.ceil(alive / lanes) * (WRITER_TIMEOUT_SECONDS
                                                 + spec.hard_gates.timeout_seconds * gate_count)
        members = alive + 1
        work.add("trial", members * trials, members * most_blocks)
        worst += members * most_blocks * spec.score.timeout_seconds
    # The replay (one, up to MAX_REPLAYS when a candidate fails it or its review) and the review.
    replay_trials = 2 * replay_blocks(trials, ceiling, spec.score.confidence, paired=paired)
    replays_done = len([s for s in steps if s.kind == "replay" and s.state in _ENDED])
    reviews_done = len([s for s in steps if s.kind == "review" and s.state in _ENDED])
    running_replay = tuple(s.seconds or 0.0 for s in steps if s.kind == "replay" and s.state == "running")
    running_review = tuple(s.seconds or 0.0 for s in steps if s.kind == "review" and s.state == "running")
    if position.phase in ("rounds", "replay", "review"):
        # One replay is due while the rounds run, or in the replay phase before its step exists;
        # a pending one counts itself; a finished one that passed leads to the review.
        pending_replays = len([s for s in steps if s.kind == "replay" and s.state == "pending"])
        any_replay = any(s.kind == "replay" for s in steps)
        due = position.phase == "rounds" or (position.phase == "replay" and not any_replay)
        more_replays_low = pending_replays + (1 if due else 0)
        more_replays_high = max(MAX_REPLAYS - replays_done - len(running_replay), more_replays_low)
        if "replay" in paces:
            work.add("replay", more_replays_low, more_replays_high, running=running_replay)
        else:
            # Until a replay is timed: its gates and its blocks, at the gate runs' and trials' pace.
            work.add("evaluate", more_replays_low, more_replays_high)
            work.add("trial", more_replays_low * replay_trials, more_replays_high * 2 * most_blocks)
        worst += (more_replays_high + len(running_replay)) * (
            spec.hard_gates.timeout_seconds * gate_count + 2 * most_blocks * spec.score.timeout_seconds)
        reviews_low = 1 if not running_review else 0
        reviews_high = max(MAX_REPLAYS - reviews_done - len(running_review), reviews_low)
        work.add("review", reviews_low, reviews_high, running=running_review)
        worst += (reviews_high + len(running_review)) * REVIEW_TIMEOUT_SECONDS
    basis = tuple(f"{KIND_WORDS[kind]} {duration_text(pace.mid)} "
                  f"({pace.source.format(n=pace.count)})" for kind, pace in paces.items())
    timed = len([s for s in steps if s.state in _TIMED and s.seconds is not None])
    low, mid, high = (max(value, 0.0) for value in (work.low, work.mid, work.high))
    borrowed = tuple(f"{KIND_WORDS[kind]}s {pace.source}" for kind, pace in paces.items()
                     if pace.count == 0 and kind in work.used)
    return TimeLeft(low=low, mid=max(mid, low), high=max(high, mid, low), worst_case=max(worst, high),
                    untimed=tuple(work.untimed), basis=basis, steps_timed=timed, borrowed=borrowed,
                    used=tuple(kind for kind in paces if kind in work.used))
