"""Workers that share no disk with the web node: the baseline travels over git, results via the DB.

A web node (Daphne) and two Celery workers, each with its own CRUCIBLE_DATA_DIR and inside its
own mount namespace, where a tmpfs hides the directory the repository lives in: the workers can
reach the search's repository only through CRUCIBLE_GIT_URL. Each worker also has its own UTS
namespace and host name (dist-a, dist-b), so a step's lease owner names the host that ran it and
the measurement lane (runtime_app/lane.py, whose lock is in each data dir) can be checked per host.
A separate beat process drives the search (and takes back the steps of a killed worker). The first
test runs a search to its end; the second SIGKILLs one worker while it holds a step and checks
nothing is lost.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from runtime_app.models import Receipt
from search_app import services
from search_app.models import SearchRun, Step
from tests.helpers import REPO_ROOT, free_port, service_missing, subprocess_env, wait_for_port
from tests.search_app.runs import plan_repo, spec_text, wait_for_end

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
PLAN = {f"cand_00{n}": {"value": 10 + n, "delay": 0.8} for n in range(1, 7)}
PLAN["cand_007"] = "broken"
PLAN["cand_008"] = "nothing"
# The same search with slow writers: its writers hold the lane shared for seconds at a time.
SLOW_PLAN = {cid: {**what, "delay": 3.0} if isinstance(what, dict) else what for cid, what in PLAN.items()}
SECRET = "distributed-test-secret-" + "k" * 24
LEASE_SECONDS = "4"


@dataclass
class Cluster:
    repos: Path  # hidden from the workers
    web_url: str
    workers: dict[str, subprocess.Popen] = field(default_factory=dict)
    data_dirs: dict[str, Path] = field(default_factory=dict)
    others: list[subprocess.Popen] = field(default_factory=list)


def in_hidden_namespace(repos: Path, argv: list[str], host: str) -> list[str]:
    """argv run in a private mount namespace in which an empty tmpfs covers `repos`, and in a
    private UTS namespace whose host name is `host`."""
    return ["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs tmpfs "$0" && hostname "$1" && shift && exec "$@"', str(repos), host, *argv]


def namespaces_work(repos: Path) -> str | None:
    """None if a process can be given a view without `repos`' contents and a host name of its
    own, else why not."""
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    if shutil.which("hostname") is None:
        return "hostname is not installed"
    probe = next(repos.iterdir())
    check = f'test ! -e "{probe}" && test "$(hostname)" = dist-probe'
    done = subprocess.run(in_hidden_namespace(repos, ["sh", "-c", check], "dist-probe"),
                          capture_output=True, text=True)
    if done.returncode != 0:
        return ("cannot hide a directory in a mount namespace or name a UTS namespace: "
                f"{done.stderr.strip() or done.returncode}")
    return None


def kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


@pytest.fixture
def cluster(tmp_path, redis_url, personas) -> Iterator[Cluster]:
    repos = tmp_path / "repos"
    repos.mkdir()
    (repos / "placeholder").write_text("the workers must not see this\n")
    why = namespaces_work(repos)
    if why:
        service_missing(f"a worker without the repository needs a private mount namespace: {why}")
    broker = redis_url.rsplit("/", 1)[0] + "/12"  # its own database: no other worker takes its tasks
    common = {"CRUCIBLE_SECRET_KEY": SECRET, "REDIS_URL": broker,
              "CRUCIBLE_STEP_LEASE_SECONDS": LEASE_SECONDS}
    port = free_port()
    web_log = (tmp_path / "web.log").open("wb")
    web = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "crucible.asgi:application"],
        cwd=REPO_ROOT, env=subprocess_env(**common), stdin=subprocess.DEVNULL, stdout=web_log,
        stderr=subprocess.STDOUT, start_new_session=True)
    result = Cluster(repos=repos, web_url=f"http://127.0.0.1:{port}", others=[web])
    try:
        wait_for_port(port, web, timeout=60)
        for name in ("a", "b"):
            data = tmp_path / f"worker-{name}"
            data.mkdir()
            log = (tmp_path / f"worker-{name}.log").open("wb")
            argv = [sys.executable, "-m", "celery", "-A", "crucible", "worker", "--loglevel", "INFO",
                    "--pool", "prefork", "--concurrency", "2", "--without-mingle", "--without-gossip",
                    "--hostname", f"dist-{name}-{uuid.uuid4().hex[:6]}@%h"]
            result.workers[name] = subprocess.Popen(
                in_hidden_namespace(repos, argv, f"dist-{name}"), cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env=subprocess_env(**common, CRUCIBLE_DATA_DIR=str(data), CRUCIBLE_GIT_URL=result.web_url))
            result.data_dirs[name] = data
        beat_log = (tmp_path / "beat.log").open("wb")
        result.others.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "crucible", "beat", "--loglevel", "INFO",
             "--schedule", str(tmp_path / "beat-schedule")],
            cwd=REPO_ROOT, env=subprocess_env(**common), stdin=subprocess.DEVNULL, stdout=beat_log,
            stderr=subprocess.STDOUT, start_new_session=True))
        yield result
    finally:
        for process in [*result.workers.values(), *result.others]:
            kill_group(process)


def frozen(personas, cluster: Cluster, name: str, plan: dict = PLAN):
    repo = plan_repo(cluster.repos / f"repo-{name}", plan)
    text = spec_text(population=8, rounds=[8, 3, 1], concurrency=3, name=name)
    return services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))


def mirrored(cluster: Cluster, search) -> list[str]:
    """The workers whose mirror holds the search's baseline under its fetch ref."""
    names = []
    for name, data in cluster.data_dirs.items():
        for mirror in (data / "mirrors").glob("*/"):
            ref = mirror / ".git" / "refs" / "crucible" / "searches" / str(search.pk)
            if ref.is_file() and ref.read_text().strip() == search.baseline_commit:
                names.append(name)
    return names


def assert_token_nowhere(search, cluster: Cluster, tmp_path: Path) -> None:
    """The fetch token the workers used is in no receipt, log, mirror config or step record."""
    token = hmac.new(SECRET.encode(), f"crucible-git-fetch:{search.pk}".encode(), hashlib.sha256).hexdigest()
    for receipt in Receipt.objects.all():
        text = " ".join(map(str, [receipt.argv, receipt.stdout_excerpt, receipt.stderr_excerpt,
                                  receipt.error, receipt.detail]))
        assert token not in text, f"receipt #{receipt.pk} shows the fetch token"
    for step in Step.objects.filter(search=search):
        assert token not in f"{step.result} {step.error} {step.plan}"
    for log in tmp_path.glob("*.log"):
        assert token not in log.read_text(errors="replace"), log
    for data in cluster.data_dirs.values():
        for config in data.glob("mirrors/*/.git/config"):
            assert token not in config.read_text()


def assert_complete(search, run: SearchRun) -> None:
    assert run.outcome == "winner", {c.candidate_id: (c.state, c.reason) for c in search.candidates.all()}
    assert run.winner.candidate_id == "cand_006"
    assert search.candidates.count() == 9  # eight candidates and the baseline, none added or lost
    assert Step.objects.filter(search=search).exclude(state__in=("done", "failed")).count() == 0
    for step in Step.objects.filter(search=search, state="done"):
        named = step.result.get("receipts", [])
        assert Receipt.objects.filter(pk__in=named).count() == len(named), f"{step} names a missing receipt"
    winner = run.winner
    assert bytes(winner.patch) and b"return 16" in bytes(winner.patch)  # the patch is in the DB


def step_host(step: Step) -> str:
    """The host a step's final attempt ran on: lease owners are `celery@<host>:<pid>`."""
    owner = step.lease_owner.rsplit(":", 1)[0]
    assert owner.startswith("celery@"), f"{step} has lease owner {step.lease_owner!r}"
    return owner.removeprefix("celery@")


def holds_lane(receipt: Receipt) -> str | None:
    """The lane mode a receipt's work held (runtime_app/lane.py), or None if it held none: a
    sandboxed command (kind "command", or "review" for the static reviewer) records its mode in
    detail["lane"]; a patch apply (runtime_app.services.patch_admit) holds it shared without
    recording it. Receipts of commands refused before they ran, LLM calls, merges (made by the
    web node) hold none."""
    lane = receipt.detail.get("lane")
    if isinstance(lane, dict):
        return lane["mode"]
    return "shared" if receipt.kind == "apply" else None


def receipts_by_host(*searches) -> dict[str, list[Receipt]]:
    """Each worker host's receipts: those named by the steps whose final attempt it ran."""
    named: dict[str, list[int]] = defaultdict(list)
    for step in Step.objects.filter(search__in=searches).exclude(lease_owner=""):
        named[step_host(step)] += (step.result or {}).get("receipts", [])
    return {host: list(Receipt.objects.filter(pk__in=pks).order_by("started_at"))
            for host, pks in named.items()}


def assert_lane_held_per_host(*searches) -> dict[str, tuple[int, int]]:
    """No timing trial (a score command run in the exclusive lane) overlaps in time any other
    lane-holding receipt of the same host. Returns, per host, (trials, other lane holders)."""
    seen = {}
    for host, receipts in receipts_by_host(*searches).items():
        holders = [(receipt, holds_lane(receipt)) for receipt in receipts if holds_lane(receipt)]
        trials = [receipt for receipt, mode in holders if mode == "exclusive"]
        for trial in trials:
            assert "trial block" in trial.label, f"receipt #{trial.pk} {trial.label!r} is exclusive"
            assert trial.finished_at >= trial.started_at
            for other, _ in holders:
                overlap = trial.started_at < other.finished_at and other.started_at < trial.finished_at
                if other.pk != trial.pk:
                    assert not overlap, (
                        f"on {host}, trial #{trial.pk} {trial.label!r} [{trial.started_at} .. "
                        f"{trial.finished_at}] overlaps #{other.pk} {other.kind} {other.label!r} "
                        f"[{other.started_at} .. {other.finished_at}]")
        seen[host] = (len(trials), len(holders) - len(trials))
    return seen


def test_workers_without_the_repository_run_a_search_from_their_mirrors(personas, cluster, tmp_path):
    search = frozen(personas, cluster, "mirrored")
    assert not any((data / "mirrors").exists() for data in cluster.data_dirs.values())
    services.search_start(personas.owner, search, enqueue=False)  # the beat drives it
    run = wait_for_end(search, timeout=480)
    assert_complete(search, run)
    assert mirrored(cluster, search), "no worker fetched the baseline into a mirror"
    assert_token_nowhere(search, cluster, tmp_path)
    owners = set(Step.objects.filter(search=search).values_list("lease_owner", flat=True))
    assert owners  # steps ran on the workers, not here
    lanes = assert_lane_held_per_host(search)
    print(f"per host (exclusive trials, other lane holders): {lanes}")
    # Both hosts ran steps, else the per-host lane was checked on one host only.
    assert set(lanes) == {"dist-a", "dist-b"}, lanes
    assert sum(trials for trials, _ in lanes.values()) > 0, f"no host ran a timing trial: {lanes}"
    # No worktree is left behind: a host whose parked trees' trials ran on the other host removes
    # them with its own sweep once the search has ended (crucible/celery.py).
    deadline = time.monotonic() + 60
    while left := [path for data in cluster.data_dirs.values() for path in data.glob("worktrees/*")]:
        assert time.monotonic() < deadline, f"left behind a minute after the end: {left}"
        time.sleep(0.5)


def test_a_timing_trial_runs_alone_on_its_host(personas, cluster):
    """Two searches at once, one with slow writers, so one's measurement is likely to meet the
    other's writers and gates on a host: a trial still runs alone on its host (each worker host
    has its own lane)."""
    searches = [frozen(personas, cluster, "lane-fast"), frozen(personas, cluster, "lane-slow", SLOW_PLAN)]
    for search in searches:
        services.search_start(personas.owner, search, enqueue=False)
    for search in searches:
        assert_complete(search, wait_for_end(search, timeout=480))
    lanes = assert_lane_held_per_host(*searches)
    print(f"two searches, per host (exclusive trials, other lane holders): {lanes}")
    assert set(lanes) == {"dist-a", "dist-b"}, lanes
    assert sum(trials for trials, _ in lanes.values()) > 0, f"no host ran a timing trial: {lanes}"


def test_killing_a_worker_mid_search_loses_nothing(personas, cluster):
    search = frozen(personas, cluster, "killed")
    services.search_start(personas.owner, search, enqueue=False)
    victim = cluster.workers["a"]
    deadline = time.monotonic() + 300
    held = None
    while held is None and time.monotonic() < deadline:
        assert not SearchRun.objects.get(search=search).terminal, "it ended before worker a held a step"
        for step in Step.objects.filter(search=search, state="running").exclude(lease_owner=""):
            pid = int(step.lease_owner.rsplit(":", 1)[1])
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(pid) == victim.pid:  # a pool process of worker a
                    held = step
                    break
        time.sleep(0.05)
    assert held is not None, "worker a never held a step"
    kill_group(victim)
    run = wait_for_end(search, timeout=480)
    assert_complete(search, run)
    held.refresh_from_db()
    assert held.state in ("done", "failed") and held.attempts >= 2, (held.state, held.attempts)
    assert mirrored(cluster, search)
    assert_lane_held_per_host(search)
