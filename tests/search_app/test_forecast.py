"""The forecast before launch: planned counts from the spec, cost and wall time from the price
table and the repository's past searches' receipts."""

from __future__ import annotations

import json

import pytest

from runtime_app.models import Receipt
from runtime_app.prices import Price, cost_microusd, price_table, usd_text
from search_app import services
from search_app.forecast import (
    ASSUMED_WRITER_USAGE,
    History,
    RunPosition,
    Span,
    StepSample,
    forecast,
    lanes_used,
    pace_of,
    time_left,
)
from search_app.models import Search, SearchRun, Step
from search_app.selectors import forecast_history, search_forecast, spec_forecast
from search_app.spec import SearchSpec, spec_validate
from tests.fakes.anthropic_server import FakeAnthropic
from tests.search_app.runs import GATE, SCORE, frozen, plan_repo, run_inline, spec_text

SECOND_GATE = "python -c 'pass'"


def make_spec(*, gates: int = 1, comparison: str = "", max_trials: int | None = None, llm: bool = False,
              **options) -> SearchSpec:
    text = spec_text(**options, **({"comparison": comparison} if comparison else {}))
    if gates == 2:
        text = text.replace(f"commands = [{json.dumps(GATE)}]",
                            f"commands = [{json.dumps(GATE)}, {json.dumps(SECOND_GATE)}]")
    extra = f"\nmax_trials = {max_trials}" if max_trials else ""
    text = text.replace('metric = "value"', 'metric = "value"' + extra)
    if llm:
        text = text.replace('provider = "command"\ncommand = "python scripts/writer.py"',
                            'provider = "anthropic"\nmodel = "fake-sonnet"')
    report = spec_validate(text)
    assert report.valid, report.errors
    return report.spec


def counts(plan) -> tuple:
    return (plan.survivors, plan.writer_steps, plan.gate_runs, plan.trial_runs)


# ---- counts


def test_a_simple_absolute_spec_has_exact_counts_in_every_round():
    spec = make_spec(population=4, rounds=[4, 2, 1], trials=3, comparison="absolute")
    plan = forecast(spec, History())
    assert [counts(r) for r in plan.rounds] == [
        (4, Span(4, 4), Span(5, 5), Span(15, 15)),  # the baseline's gate and 4 candidates'; 5 × 3 trials
        (2, Span(0, 0), Span(0, 0), Span(9, 9)),
        (1, Span(0, 0), Span(0, 0), Span(6, 6)),
    ]
    # One replay if the winner's passes, up to three: the gate again, winner and baseline × 3 blocks.
    replay = (plan.replays, plan.replay_gate_runs, plan.replay_trial_runs)
    assert replay == (Span(1, 3), Span(1, 3), Span(6, 18))
    assert (plan.writer_steps, plan.gate_runs, plan.trial_runs) == (Span(4, 4), Span(6, 8), Span(36, 48))
    assert plan.writer_steps.text == "4" and plan.gate_runs.text == "6–8"


def test_paired_scoring_plans_adaptive_blocks_up_to_the_ceiling():
    spec = make_spec(population=4, rounds=[4, 2, 1], trials=3, max_trials=7)
    plan = forecast(spec, History())
    assert [r.trial_runs for r in plan.rounds] == [Span(15, 35), Span(9, 21), Span(6, 14)]
    # Without max_trials the ceiling is 3 × trials.
    default = forecast(make_spec(population=4, rounds=[4, 1], trials=2), History())
    assert [r.trial_runs for r in default.rounds] == [Span(10, 30), Span(4, 12)]


def test_gates_of_a_candidate_that_fails_early_make_a_range():
    plan = forecast(make_spec(population=3, rounds=[3, 1], gates=2), History())
    # The baseline's 2, then each candidate between its first gate and both.
    assert plan.rounds[0].gate_runs == Span(2 + 3, 2 + 3 * 2)
    assert plan.replay_gate_runs == Span(2, 6)


def test_refinement_runs_each_promoted_writer_again_and_its_gates_when_it_changed_the_patch():
    plan = forecast(make_spec(population=4, rounds=[4, 2, 1], gates=2, refine=True), History())
    assert [r.writer_steps for r in plan.rounds] == [Span(4, 4), Span(2, 2), Span(1, 1)]
    assert [r.gate_runs for r in plan.rounds] == [Span(6, 10), Span(0, 4), Span(0, 2)]
    assert plan.writer_steps == Span(7, 7)
    assert any("Refinements are planned" in note for note in plan.notes)


# ---- cost


def test_command_writers_have_no_forecast_cost_and_say_why():
    plan = forecast(make_spec(population=2, rounds=[2, 1]), History())
    assert plan.writer_kind == "command" and plan.cost_microusd is None and plan.cost_text == "unknown"
    assert "Command writers report no cost" in plan.cost_source


def test_llm_writers_cost_what_past_writer_steps_cost_on_average():
    history = History(searches=2, writer_searches=2, writer_steps=10, writer_calls=40,
                      writer_cost_microusd=250_000, writer_tokens=1_000_000)
    spec = make_spec(population=4, rounds=[4, 2, 1], refine=True, llm=True)
    plan = forecast(spec, history, model="fake-sonnet")
    # 7 writer steps at 25,000 µUSD, 100,000 tokens and 4 model calls each.
    assert plan.cost_microusd == Span(175_000, 175_000) and plan.cost_text == "about $0.17"
    assert plan.tokens == Span(700_000, 700_000) and plan.model_calls == Span(28, 28)
    assert "mean of 10 writer steps' model-call receipts in 2 past searches" in plan.cost_source
    assert plan.warnings == ()


def test_without_history_llm_writers_are_priced_by_the_table_and_a_stated_assumption():
    price = price_table()[1]["claude-sonnet-4"]
    spec = make_spec(population=4, rounds=[4, 1], llm=True)
    plan = forecast(spec, History(), price=price, price_label="claude-sonnet-4", model="claude-sonnet-4-5")
    per_writer = cost_microusd(price, ASSUMED_WRITER_USAGE)
    assert plan.cost_microusd == Span(4 * per_writer, 4 * per_writer)
    assert "an assumed 235,000 tokens per writer step" in plan.cost_source
    unpriced = forecast(spec, History(), price=None, model="my-own-model")
    assert unpriced.cost_microusd is None and "lists no price for my-own-model" in unpriced.cost_source


def test_a_cost_or_token_use_above_the_budget_warns():
    price = Price(input=3, output=15, cache_write=3.75, cache_read=0.3)
    per_writer = cost_microusd(price, ASSUMED_WRITER_USAGE)
    over = make_spec(population=4, rounds=[4, 1], llm=True,
                     budget=f"[budget]\nmax_cost_microusd = {per_writer * 3}\n")
    plan = forecast(over, History(), price=price)
    assert plan.budget_cost_microusd == per_writer * 3
    assert plan.warnings == (f"The expected cost ({usd_text(4 * per_writer)}) exceeds the budget "
                             f"({usd_text(3 * per_writer)}): admission stops before a writer could exceed "
                             "it, so some candidates are not written.",)
    ceiling = "[budget]\nmax_tokens = 1000000\n"
    # 235,000 assumed tokens per writer: four fit in a million, five do not.
    four = make_spec(population=4, rounds=[4, 1], llm=True, budget=ceiling)
    assert forecast(four, History(), price=price).warnings == ()
    five = make_spec(population=5, rounds=[5, 1], llm=True, budget=ceiling)
    assert forecast(five, History(), price=price).warnings[0].startswith(
        "The expected token use (1,175,000 tokens) exceeds the budget (1,000,000 tokens)")
    assert forecast(make_spec(population=4, rounds=[4, 1], llm=True), History(), price=price).warnings == ()


# ---- wall time


def _past(kind: str, seconds: float, round_index: int = 0, trials: int = 0) -> StepSample:
    return StepSample(kind=kind, round=round_index, state="done", seconds=seconds, trials=trials)


# A past search's steps: writers of 10 s, evaluations of 3 s (a 1 s gate in a fresh sandbox and tree),
# a measurement of 10 trial runs in 20 s (2 s each, for a 0.5 s score), a replay of 12 s, a review of 15 s.
PAST_STEPS = (_past("generate", 10.0), _past("generate", 10.0), _past("evaluate", 3.0),
              _past("evaluate", 3.0), _past("measure", 20.0, trials=10), _past("replay", 12.0, 1, trials=4),
              _past("review", 15.0, 1))


def test_the_wall_time_before_launch_comes_from_past_steps_and_includes_their_overhead():
    spec = make_spec(population=4, rounds=[4, 1], concurrency=2, trials=2, comparison="absolute")
    receipts = {"gate_seconds": {GATE: (1.0,)}, "trial_seconds": {SCORE: (0.5,)}}
    plan = forecast(spec, History(searches=1, writer_searches=1, writer_seconds=(10.0, 10.0),
                                  steps=PAST_STEPS, **receipts))
    # Nothing done yet, timed by `time_left`'s work model at the past steps' medians: round 0, two
    # waves of writers (20 s), the baseline's and four evaluations in three waves (9 s), 5 × 2
    # trial runs of 2 s (20 s); round 1, 2 × 2 trial runs (8 s); a replay (12 s) and a review (15 s).
    assert plan.wall_typical_seconds == pytest.approx(20 + 9 + 20 + 8 + 12 + 15)
    assert plan.wall_seconds is not None and plan.wall_seconds.low < 84 < plan.wall_seconds.high
    assert plan.wall_text.startswith("about 84 s (")
    # The commands' receipts alone (a 1 s gate, a 0.5 s trial) leave out the steps' overhead.
    receipts_only = forecast(spec, History(searches=1, writer_searches=1, writer_seconds=(10.0, 10.0),
                                           **receipts))
    assert receipts_only.wall_typical_seconds is not None
    assert receipts_only.wall_typical_seconds < plan.wall_typical_seconds
    assert "trial 2.0 s (over 10 trial runs)" in plan.wall_source
    assert "receipts only" not in plan.wall_source
    # Each round's share, and the rest (the replay and review) is outside the rounds.
    assert plan.rounds[1].wall_seconds is not None and plan.rounds[0].wall_seconds is not None
    assert plan.replay_wall_seconds is not None
    assert (plan.rounds[0].wall_seconds.low + plan.rounds[1].wall_seconds.low + plan.replay_wall_seconds.low
            == pytest.approx(plan.wall_seconds.low))
    assert plan.as_dict()["wall_typical_seconds"] == pytest.approx(84)


def test_a_kind_with_no_past_step_falls_back_to_its_commands_receipts_and_says_so():
    spec = make_spec(population=4, rounds=[4, 1], concurrency=2, trials=2, comparison="absolute")
    writers_only = (_past("generate", 10.0), _past("generate", 10.0))
    plan = forecast(spec, History(searches=1, writer_searches=1, writer_seconds=(10.0, 10.0),
                                  steps=writers_only, gate_seconds={GATE: (1.0,)},
                                  trial_seconds={SCORE: (0.5,)}))
    assert plan.wall_seconds is not None
    assert "gate run 1.0 s (the gate commands' receipts only: no past gate step" in plan.wall_source
    assert "trial 0.5 s (the score command's receipts only: no past measurement step" in plan.wall_source
    assert "(some from other commands)" not in plan.wall_source
    # A review is counted as a writer step until one is timed, and says so.
    assert "review 10 s (counted as writer steps until one is timed)" in plan.wall_source


def test_gate_durations_of_other_commands_are_used_and_labelled():
    spec = make_spec(population=2, rounds=[2, 1])
    history = History(searches=1, writer_searches=1, writer_seconds=(1.0,),
                      gate_seconds={"make lint": (4.0,)}, trial_seconds={SCORE: (1.0,)})
    plan = forecast(spec, history)
    assert plan.wall_seconds is not None and "(some from other commands)" in plan.wall_source


def test_without_history_the_wall_time_is_unknown_and_the_timeouts_bound_it():
    spec = make_spec(population=2, rounds=[2, 1], trials=1, gate_timeout=60)
    plan = forecast(spec, History())
    assert plan.wall_seconds is None and plan.wall_text == "unknown"
    assert plan.wall_source == "Unknown: no finished search of this repository yet."
    # One wave of (30 min writer + 60 s gate); trials of 900 s: (2 + 1) × 3 and (1 + 1) × 3;
    # three replays of (60 s gate + 2 × 3 × 900 s): a replay runs enough blocks to decide at its
    # confidence (two at 0.5), though the spec asks for one trial, and while it cannot tell the
    # winner from the baseline, more up to the ceiling (three).
    assert plan.wall_ceiling_seconds == 1860 + 9 * 900 + 6 * 900 + 3 * (60 + 2 * 3 * 900)
    assert "running to its timeout" in plan.wall_ceiling_source
    assert plan.wall_ceiling_text == "worst case 8.8 h, from the spec's timeouts"
    others = forecast(spec, History(searches=3, gate_seconds={GATE: (1.0,)}, trial_seconds={SCORE: (1.0,)}))
    assert others.wall_seconds is None
    assert others.wall_source == ("Unknown: 3 past searches of this repository recorded no writer step "
                                  "with command.")


# ---- history, read from real receipts


@pytest.mark.django_db(transaction=True)
def test_history_comes_from_the_receipts_of_a_finished_search_of_the_same_repository(
        personas, finished, django_assert_max_num_queries):
    done, _, repo = finished
    again = services.search_freeze(personas.owner, personas.alpha,
                                   spec_text(population=2, rounds=[2, 1], name="again"), "HEAD",
                                   repository_path=str(repo))
    with django_assert_max_num_queries(7):
        history = forecast_history(personas.alpha.pk, again.repository_path, "command",
                                   again.requested_model_id, exclude_pk=again.pk)
    assert (history.searches, history.writer_searches) == (1, 1)
    writers = Step.objects.filter(search=done, kind="generate", state="done")
    assert sorted(history.writer_seconds) == sorted(
        (s.finished_at - s.started_at).total_seconds() for s in writers)
    gates = Receipt.objects.filter(kind="command", label__contains=" gate ")
    trials = Receipt.objects.filter(kind="command", label__contains=" trial ")
    assert gates.exists() and trials.exists()
    assert sorted(history.gate_seconds[GATE]) == sorted(r.duration_seconds for r in gates)
    assert sorted(history.trial_seconds[SCORE]) == sorted(r.duration_seconds for r in trials)
    assert history.writer_calls == 0  # command writers make no model calls the runtime sees

    plan = search_forecast(again)
    assert plan.history_searches == 1 and plan.wall_seconds is not None
    # Timed by the finished search's steps: its measurements' wall time over their trial runs.
    measured = Step.objects.filter(search=done, kind="measure", state="done")
    runs = sum(len(s.plan["members"]) * (s.plan["blocks"][1] - s.plan["blocks"][0]) for s in measured)
    assert runs and f"over {runs} trial runs" in plan.wall_source
    assert "receipts only" not in plan.wall_source
    assert len(history.steps) == Step.objects.filter(search=done, state__in=("done", "failed")).count()
    # The finished search's own forecast does not read itself; nothing was started by forecasting.
    assert search_forecast(done).history_searches == 0
    assert not SearchRun.objects.filter(search=again).exists()


@pytest.mark.django_db(transaction=True)
def test_history_is_read_only_from_the_same_project_and_repository(personas, finished, tmp_path):
    _, _, repo = finished
    elsewhere = plan_repo(tmp_path / "other", {})
    spec = make_spec(population=2, rounds=[2, 1])
    assert spec_forecast(spec, personas.alpha.pk, str(repo)).history_searches == 1
    assert spec_forecast(spec, personas.beta.pk, str(repo)).history_searches == 0
    assert spec_forecast(spec, personas.alpha.pk, str(elsewhere)).history_searches == 0
    assert Search.objects.count() == 1  # forecasting a spec freezes nothing


@pytest.mark.django_db(transaction=True)
def test_llm_cost_history_comes_from_the_writers_model_call_receipts(personas, tmp_path, monkeypatch,
                                                                      data_dir):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-forecast-0123456789")
    edit = {"path": "code/answer.py", "content": "def answer():\n    return 7\n"}
    llm = spec_text(population=2, rounds=[2, 1]).replace(
        'provider = "command"\ncommand = "python scripts/writer.py"',
        'provider = "anthropic"\nmodel = "fake-sonnet"')
    repo = plan_repo(tmp_path / "repo", {})
    with FakeAnthropic(plan={"cand_001": edit, "cand_002": edit}) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        done = services.search_freeze(personas.owner, personas.alpha, llm, "HEAD", repository_path=str(repo))
        assert run_inline(personas, done).status == "finished"
    calls = Receipt.objects.filter(kind="llm_call", label__contains=" writer call ")
    steps = Step.objects.filter(search=done, kind="generate").count()
    spent = sum(call.cost_microusd or 0 for call in calls)
    assert calls.count() >= 2 and spent > 0

    again = services.search_freeze(personas.owner, personas.alpha, llm.replace("plan-search", "again"),
                                   "HEAD", repository_path=str(repo))
    plan = search_forecast(again)
    assert plan.cost_microusd.low == plan.cost_microusd.high == pytest.approx(2 * spent / steps)
    assert plan.model_calls.low == pytest.approx(2 * calls.count() / steps)
    assert "model-call receipts in 1 past search of this repository with anthropic" in plan.cost_source
    # The reviewer's calls are not a writer's.
    assert Receipt.objects.filter(kind="llm_call", label__contains="reviewer").exists()


@pytest.mark.django_db(transaction=True)
def test_command_writers_are_forecast_from_the_same_command_only(personas, finished, tmp_path):
    _, _, repo = finished
    other = spec_text(population=2, rounds=[2, 1]).replace("scripts/writer.py", "scripts/writer.py --v2")
    search = frozen(personas, tmp_path, {}, population=2, rounds=[2, 1])
    assert search_forecast(search).history_searches == 0  # a new repository
    plan = spec_forecast(spec_validate(other).spec, personas.alpha.pk, str(repo))
    assert plan.history_searches == 1 and plan.wall_seconds is None
    assert "recorded no writer step with command python scripts/writer.py --v2" in plan.wall_source


# ---- time left while a search runs: measured on its own finished steps


def _done(kind: str, seconds: float, round_index: int = 0, trials: int = 0) -> StepSample:
    return StepSample(kind=kind, round=round_index, state="done", seconds=seconds, trials=trials)


def test_before_any_step_finished_the_time_left_says_it_is_estimating():
    spec = make_spec(population=4, rounds=[4, 1], trials=3, comparison="absolute")
    left = time_left(spec, RunPosition(phase="rounds", round_index=0, queued=4, survivors=4), [])
    assert left.text.startswith("estimating…") and "writer step" in left.text
    assert left.worst_case_text.startswith("worst case ")
    assert left.worst_case_text.endswith("from the spec's timeouts")
    assert left.as_dict()["untimed"] == ["generate", "evaluate", "trial", "review"]


def test_a_kind_not_timed_yet_gives_only_a_lower_bound_labelled_as_such():
    spec = make_spec(population=4, rounds=[4, 1], trials=3, comparison="absolute")
    steps = [_done("generate", 20.0), _done("generate", 20.0),
             StepSample(kind="generate", round=0, state="pending"), StepSample(kind="generate", round=0,
                                                                               state="pending")]
    left = time_left(spec, RunPosition(phase="rounds", round_index=0, queued=0, survivors=4), steps, lanes=2)
    assert left.text.startswith("at least ") and "no gate run or trial timed yet" in left.text
    assert left.low >= 20  # one more wave of two writers at least


def _round_one_measuring(extra: list[StepSample]) -> list[StepSample]:
    writers = [_done("generate", 30.0 + i) for i in range(4)]
    gates = [_done("evaluate", 5.0 + i % 2) for i in range(5)]
    # Round 0: the baseline and four candidates, three blocks each: 15 trial runs of 2 s.
    return [*writers, *gates, _done("measure", 30.0, trials=15), *extra]


def test_the_time_left_narrows_as_steps_finish():
    spec = make_spec(population=4, rounds=[4, 2, 1], trials=3, comparison="absolute")
    early = time_left(spec, RunPosition(phase="rounds", round_index=1, queued=0, survivors=2),
                      _round_one_measuring([StepSample(kind="measure", round=1, state="pending", trials=9)]))
    later = time_left(spec, RunPosition(phase="rounds", round_index=2, queued=0, survivors=1),
                      _round_one_measuring([_done("measure", 18.0, 1, trials=9),
                                            StepSample(kind="measure", round=2, state="pending", trials=6)]))
    replaying = time_left(spec, RunPosition(phase="review", round_index=2, queued=0, survivors=1),
                          _round_one_measuring([_done("measure", 18.0, 1, trials=9),
                                                _done("measure", 12.0, 2, trials=6),
                                                _done("replay", 20.0, 2, trials=6),
                                                StepSample(kind="review", round=2, state="pending")]))
    assert not early.untimed and not later.untimed and not replaying.untimed
    # Round 1's blocks measured: less is left and more of it is timed, so the range closes in.
    assert later.high - later.low < early.high - early.low and later.low < early.low
    assert early.mid > later.mid > replaying.mid > 0
    # In review the high end still allows for the replays a rejecting review would bring.
    assert replaying.low <= 33 <= replaying.high
    # Round 1's 9 trial runs of 2 s, round 2's 6, a replay's gates (5 s) and 6 trial runs, and a
    # review, counted as a writer step (31.5 s) until one is timed, and saying so.
    assert early.mid == pytest.approx(9 * 2 + 6 * 2 + 5 + 6 * 2 + 31.5)
    assert "reviews counted as writer steps until one is timed" in early.text
    assert "trial 2.0 s (over 15 trial runs)" in early.basis_text


def test_more_steps_of_a_kind_narrow_its_pace():
    one, sixteen = pace_of([10.0], "x"), pace_of([10.0] * 16, "x")
    assert one is not None and sixteen is not None
    assert (one.low, one.high) == (5.0, 20.0)
    assert sixteen.high - sixteen.low < (one.high - one.low) / 3


def test_the_time_left_has_no_absurd_upper_bound_but_the_labelled_worst_case():
    spec = make_spec(population=8, rounds=[8, 2, 1], trials=3, comparison="absolute", concurrency=4)
    steps = [_done("generate", 10.0) for _ in range(4)] + [
        StepSample(kind="generate", round=0, state="running", seconds=4.0) for _ in range(4)]
    left = time_left(spec, RunPosition(phase="rounds", round_index=0, queued=0, survivors=8),
                     [*steps, _done("evaluate", 3.0), _done("measure", 10.0, trials=5)], lanes=4)
    assert not left.untimed
    assert left.high < 4 * left.mid and left.high < left.worst_case / 20
    assert "left (" in left.text and " h" not in left.text


def test_steps_running_now_count_only_what_is_left_of_them():
    spec = make_spec(population=2, rounds=[2, 1], trials=1, comparison="absolute", concurrency=2)
    timed = [_done("generate", 60.0), _done("evaluate", 1.0), _done("measure", 3.0, trials=3)]
    position = RunPosition(phase="rounds", round_index=0, queued=0, survivors=2)
    fresh = time_left(spec, position, [*timed, StepSample(kind="generate", round=0, state="running",
                                                          seconds=1.0)])
    nearly = time_left(spec, position, [*timed, StepSample(kind="generate", round=0, state="running",
                                                           seconds=55.0)])
    assert fresh.mid - nearly.mid == pytest.approx(54.0)


def test_the_steps_seen_at_once_set_the_lanes():
    steps = [StepSample("generate", 0, "done", 10.0, started=0.0),
             StepSample("generate", 0, "done", 10.0, started=1.0),
             StepSample("generate", 0, "done", 10.0, started=20.0)]
    assert lanes_used(steps) == 2 and lanes_used([]) == 1
