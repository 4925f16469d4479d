"""Running a search end to end: real repositories, real sandboxed commands, real receipts.

Each test freezes a spec against a small repository whose scripted writer follows a plan
(tests/search_app/runs.py), runs the search in this process with the same services the
workers use, and checks the outcome and the reason every candidate fell.
"""

from __future__ import annotations

import threading
import time

import pytest

from runtime_app.models import Event, Receipt
from search_app import services
from search_app.models import Candidate, SearchRun, Step
from search_app.step_result import StepResult
from tests.search_app.hostspecs import roots
from tests.search_app.runs import fates, frozen, run_inline

pytestmark = pytest.mark.django_db(transaction=True)



def most_steps_at_once(search) -> int:
    """The largest number of steps whose [started, finished] intervals overlap."""
    edges = []
    for started, finished in Step.objects.filter(search=search).values_list("started_at", "finished_at"):
        edges += [(started, 1), (finished, -1)]
    live = peak = 0
    for _, change in sorted(edges, key=lambda edge: (edge[0], edge[1])):
        live += change
        peak = max(peak, live)
    return peak


def test_the_best_candidate_wins_and_every_other_says_why(personas, tmp_path, data_dir):
    plan = {"cand_001": 5, "cand_002": 9, "cand_003": "broken", "cand_004": "nothing", "cand_005": "tests",
            "cand_006": 7}
    search = frozen(personas, tmp_path, plan, population=6, rounds=[6, 2, 1])
    run = run_inline(personas, search)
    assert (run.status, run.outcome, run.winner.candidate_id) == ("finished", "winner", "cand_002")
    fate = fates(search)
    assert fate["cand_002"][0] == "winner" and "awaiting human approval" in fate["cand_002"][1]
    assert fate["cand_003"] == ("eliminated", fate["cand_003"][1]) and "gate 1" in fate["cand_003"][1]
    assert "changed nothing" in fate["cand_004"][1]
    assert "patch refused at policy" in fate["cand_005"][1] and "tests/test_answer.py" in fate["cand_005"][1]
    assert "not in the best 2" in fate["cand_001"][1]  # 5 < 7 and 9
    assert "round 1" in fate["cand_006"][1] and "not in the best 1" in fate["cand_006"][1]
    winner = search.candidates.get(candidate_id="cand_002")
    assert winner.trials == {"0": [9.0, 9.0], "1": [9.0, 9.0], "2": [9.0, 9.0]}
    assert winner.score_absolute == 9.0
    # Its figure is the median of its per-block ratios to the baseline, with its interval.
    assert (winner.score, winner.score_low, winner.score_high) == (4.5, 4.5, 4.5)
    assert "2.5× baseline [2.5, 2.5] at 50 %): not in the best 2" in fate["cand_001"][1]  # reasons show it
    assert search.reviews.get().verdict == "approve"
    baseline = search.candidates.get(number=0)
    assert (baseline.score, baseline.score_absolute) == (1.0, 2.0)  # measured in every block
    # Every command left a receipt on its candidate; no step is left unfinished.
    assert Receipt.objects.filter(subject_type="candidate", subject_id=winner.pk, kind="command").count() >= 8
    assert not Step.objects.filter(search=search, state__in=("pending", "running")).exists()
    assert most_steps_at_once(search) <= 4  # the spec's concurrency
    events = Event.objects.filter(subject_type="search", subject_id=search.pk)
    kinds = set(events.values_list("kind", flat=True))
    assert {"search.started", "candidate.updated", "search.round_closed", "search.finished"} <= kinds


def test_when_every_candidate_fails_the_outcome_is_none_with_each_reason(personas, tmp_path, data_dir):
    search = frozen(personas, tmp_path, {"cand_001": "broken", "cand_002": "nothing", "cand_003": "tests"},
                    population=3, rounds=[3, 1])
    run = run_inline(personas, search)
    assert run.outcome == "NONE" and run.winner is None and "no candidate survived round 0" in run.reason
    assert all(state == "eliminated" and reason for cid, (state, reason) in fates(search).items()
               if cid != "baseline")


def test_a_candidate_no_better_than_the_baseline_is_eliminated(personas, tmp_path, data_dir):
    search = frozen(personas, tmp_path, {"cand_001": 1, "cand_002": 3}, population=2, rounds=[2, 1])
    run = run_inline(personas, search)
    assert run.winner.candidate_id == "cand_002"
    reason = fates(search)["cand_001"][1]
    assert "0.5× baseline [0.5, 0.5] at 50 %: not clearly better than the baseline" in reason


def test_with_absolute_comparison_a_candidate_no_better_than_the_baseline_s_median_is_eliminated(
    personas, tmp_path, data_dir
):
    search = frozen(personas, tmp_path, {"cand_001": 1, "cand_002": 3}, population=2, rounds=[2, 1],
                    comparison="absolute")
    run = run_inline(personas, search)
    assert run.winner.candidate_id == "cand_002" and run.winner.score == 3.0
    assert "not better than the baseline's 2" in fates(search)["cand_001"][1]


def test_a_gate_that_hangs_times_out_and_the_search_goes_on(personas, tmp_path, data_dir):
    search = frozen(personas, tmp_path, {"cand_001": "hang", "cand_002": 4}, population=2, rounds=[2, 1],
                    gate_timeout=2)
    run = run_inline(personas, search)
    assert run.winner.candidate_id == "cand_002"
    reason = fates(search)["cand_001"][1]
    assert "gate 1" in reason and "timed out" in reason
    hung = Receipt.objects.get(subject_type="candidate", label="cand_001 r0 evaluate gate 1")
    assert hung.timed_out and hung.duration_seconds < 30


def flag_file(settings, tmp_path):
    """A file outside the tree that the candidate's code reads: a read path the gates and the score
    command are shown read-only (evaluation commands see no repository git dir)."""
    flag = tmp_path / "flags" / "replay-flag"
    flag.parent.mkdir()
    flag.write_text("50")
    roots(settings, read_roots=[flag.parent])
    return flag


def test_a_winner_that_fails_replay_hands_over_to_the_next_candidate(personas, tmp_path, data_dir, settings):
    flag = flag_file(settings, tmp_path)
    search = frozen(personas, tmp_path, {"cand_001": {"file": str(flag)}, "cand_002": 20},
                    repo_name="flagged", population=2, rounds=[2, 1], read_paths=(str(flag),))
    services.search_start(personas.owner, search, enqueue=False)
    while SearchRun.objects.get(search=search).phase == "rounds":
        for step_pk in services.search_advance(search.pk):
            if Step.objects.get(pk=step_pk).kind != "replay":
                services.step_execute(step_pk, "test")
    assert search.candidates.get(candidate_id="cand_001").score_absolute == 50.0
    flag.write_text("3")  # the provisional winner's score collapses before its replay
    run = services.search_run_inline(search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002"
    assert run.replayed == ["cand_001", "cand_002"]
    assert "replay failed" in fates(search)["cand_001"][1]
    assert "replay passed" in search.candidates.get(candidate_id="cand_002").reason


@pytest.mark.parametrize("replay_tolerance, replayed", [(0.25, "cand_002"), (0.5, "cand_001")])
def test_the_spec_s_replay_tolerance_decides_how_far_a_replayed_score_may_move(
    personas, tmp_path, data_dir, settings, replay_tolerance, replayed
):
    flag = flag_file(settings, tmp_path)
    search = frozen(personas, tmp_path, {"cand_001": {"file": str(flag)}, "cand_002": 20},
                    repo_name="flagged", population=2, rounds=[2, 1], replay_tolerance=replay_tolerance,
                    comparison="absolute", read_paths=(str(flag),))
    services.search_start(personas.owner, search, enqueue=False)
    while SearchRun.objects.get(search=search).phase == "rounds":
        for step_pk in services.search_advance(search.pk):
            if Step.objects.get(pk=step_pk).kind != "replay":
                services.step_execute(step_pk, "test")
    flag.write_text("30")  # 40% lower: outside a 0.25 band around 50, inside a 0.5 band
    run = services.search_run_inline(search)
    assert run.outcome == "winner" and run.winner.candidate_id == replayed
    band = f"{50 * replay_tolerance:g}"
    expected = f"replay passed: replayed median 30 is within {band} of 50" if replayed == "cand_001" \
        else f"replay failed: replayed median 30 moved more than {band} from 50"
    replay = Step.objects.get(search=search, kind="replay", candidate__candidate_id="cand_001")
    assert replay.result["why"] == expected


def test_budget_exhaustion_stops_admission_and_spent_never_exceeds_the_budget(personas, tmp_path, data_dir):
    plan = {f"cand_00{n}": {"value": n + 2, "cost": 300} for n in range(1, 7)}
    search = frozen(personas, tmp_path, plan, population=6, rounds=[6, 1], concurrency=2,
                    budget="[budget]\nmax_cost_microusd = 1000\n")
    run = run_inline(personas, search)
    assert run.spent_cost_microusd <= 1000 and run.reserved_cost_microusd == 0
    not_admitted = search.candidates.filter(state="not_admitted")
    assert not_admitted.exists() and "budget" in not_admitted.first().reason
    written = search.candidates.exclude(state="not_admitted").exclude(number=0)
    assert run.spent_cost_microusd == 300 * written.count()
    assert run.outcome == "winner"  # the admitted ones still compete
    assert Event.objects.filter(kind="search.budget_exhausted", subject_id=search.pk).exists()


def test_cancelling_stops_running_writers_and_their_receipts_say_so(personas, tmp_path, data_dir):
    plan = {"cand_001": "sleep", "cand_002": "sleep"}
    search = frozen(personas, tmp_path, plan, population=2, rounds=[2, 1])
    services.search_start(personas.owner, search, enqueue=False)
    result = {}
    runner = threading.Thread(target=lambda: result.setdefault("run", services.search_run_inline(search)))
    runner.start()
    deadline = time.monotonic() + 30
    while Step.objects.filter(search=search, kind="generate", state="running").count() != 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    services.search_cancel(personas.owner, search)
    runner.join(60)
    assert not runner.is_alive()
    run = result["run"]
    assert run.status == "cancelled" and run.reason == "cancelled by a person"
    writers = Receipt.objects.filter(subject_type="candidate", label__endswith="writer")
    assert writers.count() == 2 and all(r.outcome == "cancelled" for r in writers)
    assert all(r.duration_seconds < 30 for r in writers)
    assert set(Candidate.objects.filter(search=search).exclude(number=0).values_list("state", flat=True)) == {
        "cancelled"}


def test_promotions_created_at_once_still_run_at_most_concurrency_steps(personas, tmp_path, data_dir):
    plan = {f"cand_00{n}": n + 2 for n in range(1, 9)}
    search = frozen(personas, tmp_path, plan, population=8, rounds=[8, 6, 1], concurrency=2, refine=True)
    services.search_start(personas.owner, search, enqueue=False)
    while SearchRun.objects.get(search=search).round_index == 0:
        for step_pk in services.search_advance(search.pk):
            if Step.objects.get(pk=step_pk).round == 0:
                services.step_execute(step_pk, "test")
    # Every promoted candidate's writer refines at once: six steps, two slots.
    assert Step.objects.filter(search=search, kind="generate", round=1, state="pending").count() == 6
    ready = services.search_advance(search.pk)
    assert len(ready) == 2
    for step_pk in ready:  # two other workers now hold them
        services.step_claim(step_pk, "elsewhere")
    assert services.search_advance(search.pk) == []  # six pending, but no free slot
    Step.objects.filter(pk__in=ready).update(state="pending", attempts=0, lease_owner="")
    run = services.search_run_inline(search)
    assert run.winner.candidate_id == "cand_008" and most_steps_at_once(search) <= 2


def test_a_done_step_is_never_run_again(personas, tmp_path, data_dir):
    search = frozen(personas, tmp_path, {"cand_001": 3}, population=2, rounds=[2, 1])
    run_inline(personas, search)
    step = Step.objects.filter(search=search, state="done").first()
    receipts = Receipt.objects.count()
    assert services.step_execute(step.pk, "another-worker") is False
    assert Receipt.objects.count() == receipts


def test_a_step_whose_worker_vanished_is_taken_over_and_the_late_result_is_refused(
    personas, tmp_path, data_dir, settings
):
    import dataclasses

    settings.CONFIG = dataclasses.replace(settings.CONFIG, step_lease_seconds=3)
    search = frozen(personas, tmp_path, {"cand_001": 3}, population=2, rounds=[2, 1])
    services.search_start(personas.owner, search, enqueue=False)
    step_pk = services.search_advance(search.pk)[0]
    assert services.step_claim(step_pk, "ghost") is not None  # a worker that then dies
    assert services.step_claim(step_pk, "other") is None  # its lease still holds
    Step.objects.filter(pk=step_pk).update(lease_expires_at="2000-01-01T00:00:00Z")
    services.steps_reconcile()
    assert Step.objects.get(pk=step_pk).state == "pending"
    run = services.search_run_inline(search)
    assert run.outcome == "winner"
    step = Step.objects.get(pk=step_pk)
    assert step.state == "done" and step.attempts == 2
    # the ghost's result
    assert services.steps._step_record(step_pk, "ghost", StepResult(error="late")) is False
    assert Step.objects.get(pk=step_pk).state == "done"


def test_a_pending_step_whose_message_was_lost_is_handed_over_again_after_a_lease(
    personas, tmp_path, data_dir, settings, monkeypatch
):
    from datetime import timedelta

    from django.utils import timezone

    from search_app import tasks

    search = frozen(personas, tmp_path, {"cand_001": 3}, population=2, rounds=[2, 1])
    services.search_start(personas.owner, search, enqueue=False)
    # The broker as the beat sees it: drives run here at once; step messages are only counted.
    sent = []
    monkeypatch.setattr(tasks.search_drive, "delay", tasks.search_drive)
    monkeypatch.setattr(tasks.step_run, "delay", sent.append)
    tasks.search_drive(search.pk)
    handed = list(sent)
    assert handed and Step.objects.filter(pk__in=handed, state="pending").count() == len(handed)
    # Every message is lost: no worker claims anything. Within a lease it may still be on its way.
    tasks.steps_reconcile()
    assert sent == handed
    lost = handed[0]
    lease = settings.CONFIG.step_lease_seconds
    Step.objects.filter(pk=lost).update(enqueued_at=timezone.now() - timedelta(seconds=lease + 1))
    tasks.steps_reconcile()
    assert sent == [*handed, lost]  # the reconciler's drive sends it again, and only it
    tasks.steps_reconcile()
    assert sent == [*handed, lost]  # once per lease, not on every beat
    assert services.step_execute(lost, "a-worker-that-got-it") is True
    assert Step.objects.get(pk=lost).state == "done"


def test_a_step_that_lost_three_workers_fails_its_candidate(personas, tmp_path, data_dir):
    search = frozen(personas, tmp_path, {"cand_001": 3}, population=2, rounds=[2, 1])
    services.search_start(personas.owner, search, enqueue=False)
    services.search_advance(search.pk)
    step = Step.objects.get(search=search, kind="generate", candidate__candidate_id="cand_001")
    Step.objects.filter(pk=step.pk).update(state="running", attempts=3, lease_owner="ghost",
                                           lease_expires_at="2000-01-01T00:00:00Z")
    services.steps_reconcile()
    assert Step.objects.get(pk=step.pk).state == "failed"
    assert "lost its worker 3 times" in Candidate.objects.get(pk=step.candidate_id).reason


def test_a_writer_that_lost_three_workers_hands_its_budget_reservation_back(personas, tmp_path, data_dir):
    search = frozen(personas, tmp_path, {"cand_001": 3}, population=2, rounds=[2, 1], concurrency=2,
                    budget="[budget]\nmax_cost_microusd = 1000\n")
    services.search_start(personas.owner, search, enqueue=False)
    services.search_advance(search.pk)
    # Both writers are live (the baseline's evaluation waits for them); each reserved 1000 / 2.
    assert SearchRun.objects.get(search=search).reserved_cost_microusd == 1000
    step = Step.objects.get(search=search, kind="generate", candidate__candidate_id="cand_001")
    Step.objects.filter(pk=step.pk).update(state="running", attempts=3, lease_owner="ghost",
                                           lease_expires_at="2000-01-01T00:00:00Z")
    services.steps_reconcile()
    assert SearchRun.objects.get(search=search).reserved_cost_microusd == 500


def test_starting_twice_changes_nothing(personas, tmp_path, data_dir):
    search = frozen(personas, tmp_path, {"cand_001": 3}, population=2, rounds=[2, 1])
    first = services.search_start(personas.owner, search, enqueue=False)
    again = services.search_start(personas.owner, search, enqueue=False)
    # No step yet: the planner admits the writers (the baseline's evaluation waits for them).
    assert first.pk == again.pk and search.candidates.count() == 3 and search.steps.count() == 0


def test_the_writer_prompt_prefix_is_identical_for_every_candidate(personas, tmp_path, data_dir):
    from search_app.execution import search_spec, writer_prompt

    search = frozen(personas, tmp_path, {}, population=3, rounds=[3, 1])
    spec = search_spec(search)
    prompts = [writer_prompt(search, spec, f"cand_00{n}", 0) for n in (1, 2, 3)]
    prefixes = {prompt.rsplit("---", 1)[0] for prompt in prompts}
    assert len(prefixes) == 1 and all(p.rstrip().endswith(f"You are cand_00{n}.") for n, p in
                                      zip((1, 2, 3), prompts, strict=True))


def test_a_pareto_search_keeps_the_trade_offs_and_replays_the_best_score(personas, tmp_path, data_dir):
    search = frozen(personas, tmp_path, {"cand_001": 5, "cand_002": 9, "cand_003": 7, "cand_004": 9},
                    population=4, rounds=[4, 2, 1], policy="pareto")
    run = run_inline(personas, search)
    fate = fates(search)
    # cand_002 and cand_004 wrote the same patch: one copy goes on, the other is collapsed.
    assert run.winner.candidate_id in ("cand_002", "cand_004")
    twin = "cand_004" if run.winner.candidate_id == "cand_002" else "cand_002"
    assert "identical patch" in fate[twin][1]
    assert "Pareto front" in search.candidates.get(candidate_id="cand_003").reason
