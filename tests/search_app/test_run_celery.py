"""Searches driven by real Celery workers (subprocesses), including workers killed mid-search.

The kill test SIGKILLs the whole worker (main process, pool children and embedded beat) at
random points, at least five times, restarts it, and checks that the search ends with the
same outcome as an undisturbed run: no candidate lost or duplicated, every receipt that a
finished step names is present.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from runtime_app.models import Receipt
from search_app import services
from search_app.models import SearchRun, Step
from tests.helpers import REPO_ROOT, subprocess_env
from tests.search_app.runs import plan_repo, spec_text, wait_for_end

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
PLAN = {f"cand_00{n}": {"value": 10 + n, "delay": 0.8} for n in range(1, 7)}
PLAN["cand_007"] = "broken"
PLAN["cand_008"] = "nothing"


def frozen(personas, tmp_path, name: str):
    repo = plan_repo(tmp_path / f"repo-{name}", PLAN)
    text = spec_text(population=8, rounds=[8, 3, 1], concurrency=3, name=name)
    return services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))


def start_worker(tmp_path: Path, number: int, **env: str) -> subprocess.Popen:
    log = (tmp_path / f"worker-{number}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "crucible", "worker", "-B", "--loglevel", "INFO",
         "--pool", "prefork", "--concurrency", "3", "--without-mingle", "--without-gossip",
         "--schedule", str(tmp_path / f"beat-{number}"), "--hostname", f"kill-{uuid.uuid4().hex[:8]}@%h"],
        cwd=REPO_ROOT, env=subprocess_env(CRUCIBLE_STEP_LEASE_SECONDS="4", **env), stdin=subprocess.DEVNULL,
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )


def kill(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


def outcome(search) -> dict:
    return {c.candidate_id: (c.state, c.score) for c in search.candidates.all()}


def test_an_embedded_worker_runs_a_started_search_to_its_end(personas, tmp_path):
    """`make run` without Redis: the filesystem broker and a worker with embedded beat."""
    if settings.CONFIG.redis_url:
        pytest.skip("REDIS_URL is set: this run's broker is Redis (the kill test covers it)")
    search = frozen(personas, tmp_path, "embedded")
    worker = start_worker(tmp_path, 0)
    try:
        services.search_start(personas.owner, search)  # enqueues the first drive on commit
        run = wait_for_end(search)
    finally:
        kill(worker)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_006"


def test_killing_the_worker_five_times_loses_nothing_and_changes_nothing(personas, tmp_path, redis_url):
    calm = frozen(personas, tmp_path, "undisturbed")
    services.search_start(personas.owner, calm, enqueue=False)
    expected = services.search_run_inline(calm)
    assert expected.outcome == "winner"

    search = frozen(personas, tmp_path, "killed")
    # Its own Redis database, so no other worker (a developer's `make run`) takes its tasks.
    broker = redis_url.rsplit("/", 1)[0] + "/13"
    services.search_start(personas.owner, search, enqueue=False)  # the workers' beat drives it
    rng = random.Random(7)
    kills = 0
    worker = start_worker(tmp_path, 0, REDIS_URL=broker)
    try:
        while kills < 5:
            # A random moment while the worker holds a step (writing, gating or scoring).
            while not Step.objects.filter(search=search, state="running").exists():
                if SearchRun.objects.get(search=search).terminal:
                    break
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.7))
            if SearchRun.objects.get(search=search).terminal:
                break
            kill(worker)
            kills += 1
            worker = start_worker(tmp_path, kills, REDIS_URL=broker)
        run = wait_for_end(search)
    finally:
        kill(worker)
    assert kills == 5, "the search ended before the fifth kill; make it slower"
    assert (run.outcome, run.winner.candidate_id) == (expected.outcome, expected.winner.candidate_id)
    assert {cid: state for cid, (state, _) in outcome(search).items()} == {
        cid: state for cid, (state, _) in outcome(calm).items()}
    assert search.candidates.count() == 9  # eight candidates and the baseline, none added or lost
    assert Step.objects.filter(search=search).exclude(state__in=("done", "failed")).count() == 0
    retried = Step.objects.filter(search=search, attempts__gt=1)
    assert retried.exists(), "no step was interrupted; the kills missed every step"
    for step in Step.objects.filter(search=search, state="done"):
        assert Receipt.objects.filter(pk__in=step.result.get("receipts", [])).count() == len(
            step.result.get("receipts", [])), f"{step} names a receipt that is missing"
