"""Evolution runs survive their worker: a lease held while a run works, handed on by the
reconciler when it passes (the worker died) or when a queued run's message never arrived."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from evolve_app import services
from evolve_app.models import Cycle, EvolutionRun

pytestmark = pytest.mark.django_db(transaction=True)


def started(personas, agent, cycles: int = 1) -> EvolutionRun:
    return services.evolution_run_start(personas.owner, agent, engine="textbook", cycles=cycles,
                                        enqueue=False)


def test_a_run_whose_worker_died_is_handed_on_and_finishes(personas, demo_agent):
    run = started(personas, demo_agent, cycles=2)
    # A worker claimed it, then died: its lease ran out and nobody renews it.
    assert services.evolution_run_claim(run.pk, "dead-worker")
    EvolutionRun.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert services.evolution_runs_reconcile() == [run.pk]
    assert services.evolution_runs_reconcile() == []  # handed on once per lease, not every beat
    finished = services.evolution_run_execute(run.pk, owner="second-worker")
    assert finished.status == "finished", finished.reason
    assert finished.attempts == 2 and finished.lease_owner == "second-worker"
    assert Cycle.objects.filter(run=run).count() == 2


def test_a_run_a_live_worker_holds_is_neither_handed_on_nor_run_twice(personas, demo_agent):
    run = started(personas, demo_agent)
    assert services.evolution_run_claim(run.pk, "live-worker")
    assert services.evolution_runs_reconcile() == []
    again = services.evolution_run_execute(run.pk, owner="duplicate-message")
    assert again.status == "running" and again.lease_owner == "live-worker"
    assert not Cycle.objects.filter(run=run).exists()


def test_a_queued_run_whose_message_was_lost_is_sent_again_after_a_lease(personas, demo_agent, settings):
    run = started(personas, demo_agent)
    EvolutionRun.objects.filter(pk=run.pk).update(enqueued_at=timezone.now())
    assert services.evolution_runs_reconcile() == []  # its message may still be on its way
    lease = settings.CONFIG.step_lease_seconds
    EvolutionRun.objects.filter(pk=run.pk).update(enqueued_at=timezone.now() - timedelta(seconds=lease + 1))
    assert services.evolution_runs_reconcile() == [run.pk]


def test_a_run_that_lost_three_workers_fails_with_the_reason(personas, demo_agent):
    run = started(personas, demo_agent)
    for owner in ("one", "two", "three"):
        EvolutionRun.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        assert services.evolution_run_claim(run.pk, owner)
    EvolutionRun.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert services.evolution_runs_reconcile() == []
    run.refresh_from_db()
    assert run.status == "failed" and "worker was lost 3 times" in run.reason
