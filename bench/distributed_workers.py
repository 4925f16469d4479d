"""One search run by a distributed Crucible with 1 worker and with 2 workers, side by side in one run.

    DATABASE_URL=postgres://… REDIS_URL=redis://… .venv/bin/python bench/distributed_workers.py [--keep]

**What runs.** As in tests/search_app/test_distributed.py: a Daphne web node (serves the search's
baseline over git smart HTTP), a Celery beat (steps-reconcile every 5 s), and real Celery worker
processes (`--pool prefork --concurrency 4`, each with its own `--hostname`). Each worker has its
own CRUCIBLE_DATA_DIR and runs in its own mount namespace in which an empty tmpfs covers the
directory holding the repository, so it fetches the baseline from the web node (CRUCIBLE_GIT_URL)
into its mirror; when `unshare --uts` works it also has its own UTS hostname, so the host part of
Step.lease_owner (`celery@HOST:PID`) tells the workers apart (otherwise the PID's process group
does). All processes share PostgreSQL (DATABASE_URL) and Redis (REDIS_URL, the broker); this
process's own Django setup (migrate, freeze, polling) uses the same database. Without either, or if
one does not answer, the bench says why and exits 0.

**The search.** bench/search_orchestration.py's spec: population 16, rounds [16, 4, 1], every
writer, gate and score command sleeps 0.2 s, 3 trials, `comparison = "absolute"`, concurrency 8
(so 1 worker's 4 slots limit it, 2 workers' 8 do not). Its scores are cksums of the candidate ids,
so both lanes must pick the same winner.

**Lanes**, one after another: `1 worker`, then `2 workers`. Each lane has fresh workers with fresh
data dirs (so each fetches its mirror anew) and its own search (a new name in a new project); the
web node and beat are shared. A lane's wall time runs from sending the first `search_drive` task
to the search's run being terminal (polled every 50 ms), the workers already ready and idle.

**Printed:** each lane's wall time and the ratio (1 worker / 2 workers), its outcome and winner,
the steps each worker ran (Step.lease_owner), whether each worker fetched a mirror, and the CPU
count with the load average before and after each lane. On a 2-core machine, 2 workers (8 pool
processes plus their sandboxes) compete for the same cores: they need not be faster.

Temp data (repository, data dirs, logs) go to a `crucible-bench-…` dir in the system temp dir,
removed at the end unless `--keep`. Every process group started is killed at the end, on Ctrl-C
and on SIGTERM. Rows written to the database (a user, two projects, their searches) are left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _search_setup import REPO_ROOT, bench_temp, django_setup, keep_requested
from search_orchestration import make_repo, spec

POPULATION, ROUNDS, SLEEP, TRIALS, CONCURRENCY = 16, [16, 4, 1], 0.2, 3, 8
WORKER_CONCURRENCY = 4
LANES = {"1 worker": ["a"], "2 workers": ["a", "b"]}
SECRET = "distributed-bench-secret-" + uuid.uuid4().hex  # shared by web node and workers (fetch tokens)
TIMEOUT = 900


def interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


# ----------------------------------------------------------------------------- services


def service_problem() -> str:
    """Why PostgreSQL or Redis cannot be used ("" when both answer)."""
    database, broker = os.environ.get("DATABASE_URL", ""), os.environ.get("REDIS_URL", "")
    if not database.startswith(("postgres://", "postgresql://")):
        return f"DATABASE_URL must name a PostgreSQL database (got {database or 'nothing'})"
    if not broker.startswith(("redis://", "rediss://")):
        return f"REDIS_URL must name a Redis database (got {broker or 'nothing'})"
    try:
        import psycopg

        psycopg.connect(database, connect_timeout=3).close()
    except Exception as error:
        return f"PostgreSQL at DATABASE_URL does not answer ({type(error).__name__}: {error})"
    try:
        import redis

        redis.Redis.from_url(broker, socket_connect_timeout=2, socket_timeout=2).ping()
    except Exception as error:
        return f"Redis at REDIS_URL does not answer ({type(error).__name__}: {error})"
    return ""


# ------------------------------------------------------- namespaces (from test_distributed.py)


def in_hidden_namespace(repos: Path, argv: list[str], hostname: str = "") -> list[str]:
    """argv in a private mount namespace in which an empty tmpfs covers `repos`; with `hostname`,
    also in its own UTS namespace under that hostname."""
    if not hostname:
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount -t tmpfs tmpfs "$0" && exec "$@"', str(repos), *argv]
    return ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs tmpfs "$0" && hostname "$1" && shift && exec "$@"', str(repos), hostname, *argv]


def namespaces_work(repos: Path) -> str | None:
    """None if a process can be given a view without `repos`' contents, else why not."""
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    probe = next(repos.iterdir())
    done = subprocess.run(in_hidden_namespace(repos, ["test", "!", "-e", str(probe)]),
                          capture_output=True, text=True)
    if done.returncode != 0:
        return f"cannot hide a directory in a mount namespace: {done.stderr.strip() or done.returncode}"
    return None


def uts_works(repos: Path) -> bool:
    done = subprocess.run(in_hidden_namespace(repos, ["hostname"], hostname="dbench-probe"),
                          capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip() == "dbench-probe"


# ------------------------------------------------------------------------------ processes


@dataclass
class Group:
    """Every process group this bench started, killed at the end whatever happens."""

    processes: list[subprocess.Popen] = field(default_factory=list)

    def start(self, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        with log.open("wb") as out:
            process = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process

    def stop(self, process: subprocess.Popen, grace: float = 10) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)  # the main process: a warm shutdown of its pool
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the pool and sandboxes left in the group
        process.wait(30)

    def stop_all(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(30)


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(DJANGO_SETTINGS_MODULE="crucible.settings", CRUCIBLE_SECRET_KEY=SECRET, **extra)
    return env


def wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the web node exited with {process.returncode}:\n{log.read_text()[-2000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the web node did not listen on port {port} in {timeout:.0f} s")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Worker:
    name: str
    host: str  # its UTS hostname, "" when it shares this machine's
    data: Path
    log: Path
    process: subprocess.Popen


def start_worker(group: Group, temp: Path, repos: Path, web_url: str, lane_tag: str, name: str,
                 uts: bool) -> Worker:
    data = temp / f"worker-{lane_tag}-{name}"
    data.mkdir()
    host = f"dbench-{lane_tag}-{name}" if uts else ""
    argv = [sys.executable, "-m", "celery", "-A", "crucible", "worker", "--loglevel", "INFO",
            "--pool", "prefork", "--concurrency", str(WORKER_CONCURRENCY), "--without-mingle",
            "--without-gossip", "--hostname", f"dbench-{lane_tag}-{name}-{uuid.uuid4().hex[:6]}@%h"]
    log = temp / f"worker-{lane_tag}-{name}.log"
    process = group.start(in_hidden_namespace(repos, argv, hostname=host), log,
                          child_env(CRUCIBLE_DATA_DIR=str(data), CRUCIBLE_GIT_URL=web_url))
    return Worker(name, host, data, log, process)


def wait_ready(workers: list[Worker], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    for worker in workers:
        while b" ready." not in worker.log.read_bytes():
            if worker.process.poll() is not None or time.monotonic() > deadline:
                tail = worker.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"worker {worker.name} did not become ready:\n{tail}")
            time.sleep(0.2)
    time.sleep(1)  # the pools' children finish starting


# ---------------------------------------------------------------------------------- lanes


@dataclass
class LaneResult:
    wall: float
    outcome: str
    steps: int
    by_worker: Counter
    mirrored: dict[str, bool]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]


def owner_of(lease_owner: str, workers: list[Worker]) -> str:
    """The worker that ran a step: by the host part of `celery@HOST:PID`, else by the PID's group."""
    host, _, pid = lease_owner.partition("@")[2].rpartition(":")
    for worker in workers:
        if worker.host and worker.host == host:
            return worker.name
    with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
        group = os.getpgid(int(pid))
        for worker in workers:
            if group == worker.process.pid:
                return worker.name
    return f"other ({lease_owner or 'none'})"


def run_lane(group: Group, temp: Path, repos: Path, web_url: str, user: Any, lane: str, names: list[str],
             uts: bool, run_tag: str) -> LaneResult:
    from crucible.celery import app
    from runtime_app.models import Project, ProjectMembership
    from search_app import services
    from search_app.models import SearchRun, Step

    lane_tag = f"{len(names)}w"
    workers = [start_worker(group, temp, repos, web_url, lane_tag, name, uts) for name in names]
    search = None
    try:
        wait_ready(workers)
        project = Project.objects.create(name=f"dbench-{run_tag}-{lane_tag}", created_by=user)
        ProjectMembership.objects.create(project=project, user=user, role="admin")
        text = spec(f"dbench-{run_tag}-{lane_tag}", POPULATION, ROUNDS, SLEEP, TRIALS, comparison="absolute")
        assert "concurrency = 16\n" in text
        text = text.replace("concurrency = 16\n", f"concurrency = {CONCURRENCY}\n")
        repo = make_repo(repos / f"repo-{lane_tag}")
        search = services.search_freeze(user, project, text, "HEAD", repository_path=str(repo))
        services.search_start(user, search, enqueue=False)
        load_before = os.getloadavg()
        started = time.perf_counter()
        app.send_task("search_app.tasks.search_drive", args=[search.pk])
        while not SearchRun.objects.get(search=search).terminal:
            if time.perf_counter() - started > TIMEOUT:
                raise RuntimeError(f"{lane}: the search did not end in {TIMEOUT} s")
            for worker in workers:
                if worker.process.poll() is not None:
                    tail = worker.log.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"{lane}: worker {worker.name} exited with "
                                       f"{worker.process.returncode}:\n{tail}")
            time.sleep(0.05)
        wall = time.perf_counter() - started
        load_after = os.getloadavg()
        run = SearchRun.objects.get(search=search)
        outcome = run.winner.candidate_id if run.outcome == "winner" and run.winner else run.outcome
        owners = Step.objects.filter(search=search).values_list("lease_owner", flat=True)
        by_worker = Counter(owner_of(owner, workers) for owner in owners)  # before the pools stop
        mirrored = {w.name: any((w.data / "mirrors").glob("*/.git")) for w in workers}
        return LaneResult(wall, outcome, len(owners), by_worker, mirrored, load_before, load_after)
    finally:
        if search is not None:  # interrupted or failed: no other beat on this database re-drives it
            with contextlib.suppress(Exception):
                if not SearchRun.objects.get(search=search).terminal:
                    services.search_cancel(user, search)
        for worker in workers:
            group.stop(worker.process)


def loads(values: tuple[float, float, float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def main() -> None:
    problem = service_problem()
    if problem:
        print(f"distributed_workers: skipped: {problem}")
        return
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    group = Group()
    results: dict[str, LaneResult] = {}
    with bench_temp(keep_requested()) as temp:
        try:
            repos = temp / "repos"  # hidden from the workers
            repos.mkdir()
            (repos / "placeholder").write_text("the workers must not see this\n")
            why = namespaces_work(repos)
            if why:
                print(f"distributed_workers: skipped: a worker without the repository needs a private "
                      f"mount namespace: {why}")
                return
            uts = uts_works(repos)
            os.environ["CRUCIBLE_SECRET_KEY"] = SECRET
            django_setup(temp / "web-data")  # migrates DATABASE_URL's database (PostgreSQL)
            from django.contrib.auth import get_user_model
            from django.db import connection

            if connection.vendor != "postgresql":
                raise RuntimeError(f"this process's database is {connection.vendor}, not DATABASE_URL's")
            run_tag = uuid.uuid4().hex[:8]
            user = get_user_model().objects.create_superuser(f"dbench-{run_tag}",
                                                              password=uuid.uuid4().hex)
            common = child_env(CRUCIBLE_DATA_DIR=str(temp / "web-data"))
            port = free_port()
            web_log = temp / "web.log"
            web = group.start([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                               "crucible.asgi:application"], web_log, common)
            wait_for_port(port, web, web_log)
            group.start([sys.executable, "-m", "celery", "-A", "crucible", "beat", "--loglevel", "INFO",
                         "--schedule", str(temp / "beat-schedule")], temp / "beat.log", common)
            print(f"search: population {POPULATION}, rounds {ROUNDS}, every command sleeps {SLEEP:g} s, "
                  f"{TRIALS} trials, concurrency {CONCURRENCY}; workers --concurrency {WORKER_CONCURRENCY}; "
                  f"{os.cpu_count()} CPUs; workers' own UTS hostnames: {'yes' if uts else 'no'}", flush=True)
            for lane, names in LANES.items():
                results[lane] = run_lane(group, temp, repos, f"http://127.0.0.1:{port}", user, lane, names,
                                         uts, run_tag)
                print(f"{lane}: {results[lane].wall:.2f} s", flush=True)
        except KeyboardInterrupt:
            print("\ninterrupted: the lanes measured so far follow", flush=True)
        finally:
            group.stop_all()
        report(results)


def report(results: dict[str, LaneResult]) -> None:
    print(f"\n== one search, distributed (CPUs: {os.cpu_count()}, load average now {loads(os.getloadavg())})")
    for lane, result in results.items():
        ran = ", ".join(f"{name} {count}" for name, count in sorted(result.by_worker.items()))
        fetched = ", ".join(f"{name} {'yes' if done else 'NO'}" for name, done in result.mirrored.items())
        print(f"  {lane:<10} wall {result.wall:7.2f} s  outcome {result.outcome:<9} "
              f"steps {result.steps} (by worker: {ran}; mirror fetched: {fetched})")
        print(f"  {'':<10} load average 1/5/15 min before {loads(result.load_before)}, "
              f"after {loads(result.load_after)}")
    one, two = results.get("1 worker"), results.get("2 workers")
    if one and two:
        print(f"  ratio 1 worker / 2 workers: {one.wall / two.wall:.2f}x "
              f"({'2 workers faster' if two.wall < one.wall else '2 workers not faster'})")
        same = one.outcome == two.outcome
        print(f"  winners: {one.outcome} and {two.outcome}: {'the same' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
