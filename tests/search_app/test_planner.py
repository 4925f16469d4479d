"""The planner (services.search_advance) is incremental: a steady-state call costs the same number
of queries at population 8 as at 64, never reads a patch or a step's result, and takes the write
lock only when it has something to write."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from search_app import selectors, services, tasks
from search_app.models import SearchRun
from tests.search_app.runs import frozen

pytestmark = pytest.mark.django_db(transaction=True)

BIG_COLUMNS = ('"search_app_candidate"."patch"', '"search_app_step"."result"')
WRITES = ("BEGIN", "INSERT", "UPDATE", "DELETE", "SAVEPOINT")


def mid_round(personas, tmp_path, population: int):
    """A started search whose first four writers ran for real (concurrency 4)."""
    plan = {f"cand_{n:03d}": 10 + n for n in range(1, population + 1)}
    search = frozen(personas, tmp_path, plan, population=population, rounds=[population, 1], concurrency=4)
    services.search_start(personas.owner, search, enqueue=False)
    ready = services.search_advance(search.pk)
    assert len(ready) == 4
    for step_pk in ready:
        assert services.step_execute(step_pk, "test-worker")
    return search


def planner_call(search) -> tuple[list[int], list[str]]:
    with CaptureQueriesContext(connection) as queries:
        ready = services.search_advance(search.pk)
    return ready, [query["sql"] for query in queries.captured_queries]


def test_a_steady_state_planner_call_costs_the_same_at_any_population(personas, tmp_path, data_dir):
    calls = {}
    for population in (8, 64):
        search = mid_round(personas, tmp_path, population)
        admitting = planner_call(search)  # four more writers (no evaluation while writers run)
        idle = planner_call(search)  # every slot is taken: nothing to write
        steps = search.steps.order_by("id")
        assert [(s.kind, s.candidate.candidate_id) for s in steps][4:] == [
            ("generate", "cand_005"), ("generate", "cand_006"), ("generate", "cand_007"),
            ("generate", "cand_008")]
        assert len(admitting[0]) == 4 and idle[0] == admitting[0]
        calls[population] = (admitting[1], idle[1])
    for small, large in zip(calls[8], calls[64], strict=True):
        assert len(small) == len(large), "\n".join(large)
    for sql in [sql for pair in calls.values() for call in pair for sql in call]:
        assert not any(column in sql for column in BIG_COLUMNS), sql
    idle_writes = [sql for sql in calls[64][1] if sql.lstrip().upper().startswith(WRITES)]
    assert not idle_writes, "a planner call with nothing to do takes no write lock"


def test_a_completion_plans_in_place_only_when_no_drive_is_pending(personas, tmp_path, data_dir, monkeypatch):
    search = frozen(personas, tmp_path, {"cand_001": 4}, population=2, rounds=[2, 1])
    services.search_start(personas.owner, search, enqueue=False)
    services.search_advance(search.pk)
    step = search.steps.first()
    planned: list[int] = []
    monkeypatch.setattr(services, "step_execute", lambda step_pk, owner: True)
    monkeypatch.setattr(services, "search_advance", lambda search_pk: planned.append(search_pk) or [])
    monkeypatch.setattr(tasks.search_drive, "delay", lambda search_pk: pytest.fail("no drive is queued"))
    queued = timezone.now()
    SearchRun.objects.filter(search=search).update(drive_enqueued_at=queued)
    tasks.step_run(step.pk)  # a queued drive has not started: it will plan for this completion too
    assert planned == []
    tasks.search_drive(search.pk)  # it starts: the next completion plans itself
    tasks.step_run(step.pk)
    assert planned == [search.pk, search.pk]
    # A drive whose message was lost holds the mark for a lease at most.
    SearchRun.objects.filter(search=search).update(drive_enqueued_at=queued - timedelta(hours=1))
    tasks.step_run(step.pk)
    assert planned == [search.pk] * 3
    assert SearchRun.objects.get(search=search).drive_enqueued_at is None


def test_a_worker_runs_the_next_ready_step_itself_and_queues_the_rest(personas, tmp_path, data_dir,
                                                                      monkeypatch):
    search = frozen(personas, tmp_path, {"cand_001": 4}, population=2, rounds=[2, 1])
    services.search_start(personas.owner, search, enqueue=False)
    services.search_advance(search.pk)
    first = search.steps.order_by("id").first().pk
    ran: list[int] = []
    queued: list[int] = []
    plans = iter([[first + 1, first + 2], [first + 3], []])
    monkeypatch.setattr(services, "step_execute", lambda step_pk, owner: ran.append(step_pk) or True)
    monkeypatch.setattr(services, "search_advance", lambda search_pk: next(plans))
    monkeypatch.setattr(services, "steps_enqueue_mark", lambda step_pks: step_pks)
    monkeypatch.setattr(selectors, "step_search_pk", lambda step_pk: search.pk)
    monkeypatch.setattr(tasks.step_run, "delay", queued.append)
    tasks.step_run(first)
    assert ran == [first, first + 1, first + 3] and queued == [first + 2]


def test_a_chain_of_steps_hands_its_slot_back_after_a_while(personas, tmp_path, data_dir, monkeypatch):
    search = frozen(personas, tmp_path, {"cand_001": 4}, population=2, rounds=[2, 1])
    services.search_start(personas.owner, search, enqueue=False)
    services.search_advance(search.pk)
    first = search.steps.order_by("id").first().pk
    ran: list[int] = []
    queued: list[int] = []
    monkeypatch.setattr(services, "step_execute", lambda step_pk, owner: ran.append(step_pk) or True)
    monkeypatch.setattr(services, "search_advance", lambda search_pk: [first + len(ran)])
    monkeypatch.setattr(services, "steps_enqueue_mark", lambda step_pks: step_pks)
    monkeypatch.setattr(selectors, "step_search_pk", lambda step_pk: search.pk)
    monkeypatch.setattr(tasks.step_run, "delay", queued.append)
    tasks.step_run(first)
    assert len(ran) == tasks.CHAIN_STEPS and queued == [first + tasks.CHAIN_STEPS]


def test_workers_carry_a_search_across_its_rounds_without_waiting_for_the_beat(personas, tmp_path, data_dir,
                                                                               monkeypatch):
    """A round's last measure ends: the worker closes the round and runs the next round's first
    step itself. Without the second pass the search stalled there until the beat's next drive."""
    search = frozen(personas, tmp_path, {"cand_001": 5, "cand_002": 9, "cand_003": 7}, population=3,
                    rounds=[3, 2, 1])
    services.search_start(personas.owner, search, enqueue=False)
    queued: list[int] = []
    monkeypatch.setattr(tasks.step_run, "delay", queued.append)
    monkeypatch.setattr(tasks.search_drive, "delay", lambda search_pk: pytest.fail("no drive is queued"))
    tasks.search_drive(search.pk)  # the first drive, as search_start sends it
    while queued:
        tasks.step_run(queued.pop(0))
    run = SearchRun.objects.get(search=search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002", (run.status, run.phase)
    assert search.steps.filter(kind="measure").values_list("round", flat=True).distinct().count() == 3
