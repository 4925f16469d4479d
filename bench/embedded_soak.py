"""Soak the embedded mode: steady searches, evolution cycles and page views for a long while
through a real `manage.py serve` (SQLite, the filesystem broker), beside a bounded background
load, and report what a team keeping it open all day would notice.

    .venv/bin/python bench/embedded_soak.py [--minutes 120] [--load 1]

How: a temp data dir, `manage.py migrate` and `crucible_setup` (the demo project, repository,
specs and agent, as `make run` makes them), then `manage.py serve` on a free port. This
process shares the data dir and, as an operator would from the web, keeps one search of the
scripted demo spec (search_app/spec_templates/demo-scripted.toml, a new name each time)
and one evolution run of the demo agent (engine textbook, benchmark demo, 2 cycles) going:
each is started through the services, so the worker inside serve does the work through the
broker. A logged-in client views a page every second (home, searches, the current search and
its candidates, agents, the agent), and `--load` processes spin beside it all.

At the end no new work starts; the last search is given up to 10 minutes to finish, then serve
is stopped with Ctrl-C. It prints: restarts of the worker and web server (serve's log; goal 0),
unrecoverable worker errors, lost steps (steps failed for losing their worker, and steps of a
finished search left pending or running; goal 0), broker messages set aside, searches and
evolution cycles completed, and the median and p95 page time.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from _search_setup import REPO_ROOT, free_port, served_data_prepare, wait_for_port

PASSWORD = "soak-Admin-password-1"
BUSY = "while True: pass"
DRAIN_SECONDS = 600


class Browser:
    """A logged-in client of the web server, timing each page."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        self.times: list[float] = []
        self.failures: list[str] = []

    def login(self, username: str, password: str) -> None:
        with self.opener.open(f"{self.base}/login/", timeout=30) as response:
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', response.read().decode())[1]
        data = urllib.parse.urlencode({"username": username, "password": password,
                                       "csrfmiddlewaretoken": token}).encode()
        request = urllib.request.Request(f"{self.base}/login/", data=data,  # noqa: S310  (http://127.0.0.1)
                                         headers={"Referer": f"{self.base}/login/"})
        with self.opener.open(request, timeout=30) as response:
            if "/login/" in response.geturl():
                raise SystemExit("could not log in to the soak's server")

    def view(self, path: str) -> None:
        started = time.perf_counter()
        try:
            with self.opener.open(f"{self.base}{path}", timeout=60) as response:
                response.read()
                status = response.status
        except OSError as error:  # HTTPError, refused, timed out
            self.failures.append(f"{path}: {error}")
            return
        self.times.append(time.perf_counter() - started)
        if status != 200 or "/login/" in response.geturl():
            self.failures.append(f"{path}: {status} {response.geturl()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=120.0)
    parser.add_argument("--load", type=int, default=1, help="busy processes beside the soak")
    parser.add_argument("--evolve-every", type=float, default=3.0, help="minutes between evolution runs")
    parser.add_argument("--keep", action="store_true", help="keep the data dir and serve's log")
    options = parser.parse_args()
    temp = Path(tempfile.mkdtemp(prefix="crucible-bench-soak-"))
    try:
        soak(temp, options.minutes, options.load, options.evolve_every * 60)
    finally:
        if options.keep:
            print(f"kept {temp}")
        else:
            shutil.rmtree(temp, ignore_errors=True)


def soak(temp: Path, minutes: float, load: int, evolve_every: float) -> None:
    data, env, manage = served_data_prepare(temp, PASSWORD)
    from django.contrib.auth import get_user_model

    from evolve_app.models import Agent, Cycle, EvolutionRun
    from evolve_app.services import evolution_run_start
    from runtime_app.models import Project
    from search_app import services
    from search_app.models import SearchRun, Step

    admin = get_user_model().objects.get(username="admin")
    project = Project.objects.get(name="demo")
    repository = project.repositories.get()
    agent = Agent.objects.get(project=project)
    template = (REPO_ROOT / "search_app" / "spec_templates" / "demo-scripted.toml").read_text()

    port = free_port()
    log_path = temp / "serve.log"
    log = log_path.open("wb")
    serve = subprocess.Popen([*manage, "serve", "--port", str(port)], cwd=REPO_ROOT, env=env,
                             stdout=log, stderr=subprocess.STDOUT)
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(load)]
    searches: list = []
    started = time.monotonic()
    try:
        wait_for_port(port, serve)
        browser = Browser(f"http://127.0.0.1:{port}")
        browser.login("admin", PASSWORD)
        deadline = started + minutes * 60
        next_report, next_evolution = started + 60, started
        while time.monotonic() < deadline:
            if serve.poll() is not None:
                print(f"serve exited with {serve.returncode}", flush=True)
                break
            current = searches[-1] if searches else None
            if current is None or SearchRun.objects.get(search=current).status == "finished":
                name = f"soak-{len(searches) + 1}"
                spec = template.replace('name = "demo-speed-up-scripted"', f'name = "{name}"')
                current = services.search_freeze(admin, project, spec, "HEAD", repository=repository)
                services.search_start(admin, current)
                searches.append(current)
            if time.monotonic() >= next_evolution and not EvolutionRun.objects.filter(
                    agent=agent, status__in=("queued", "running")).exists():
                evolution_run_start(admin, agent, benchmark="demo", engine="textbook", cycles=2)
                next_evolution = time.monotonic() + evolve_every
            for path in ("/", "/searches/", f"/searches/{current.search_id}/",
                         f"/searches/{current.search_id}/candidates/", "/agents/", f"/agents/{agent.pk}/"):
                browser.view(path)
                time.sleep(1)
            if time.monotonic() >= next_report:
                next_report += 60
                print(f"{(time.monotonic() - started) / 60:5.1f} min: {len(searches)} searches started, "
                      f"{Cycle.objects.count()} cycles, {len(browser.times)} pages", flush=True)
        drain_until = time.monotonic() + DRAIN_SECONDS
        while (searches and time.monotonic() < drain_until and serve.poll() is None
               and SearchRun.objects.get(search=searches[-1]).status != "finished"):
            time.sleep(2)
    finally:
        for process in busy:
            process.kill()
            process.wait()
        if serve.poll() is None:
            serve.send_signal(signal.SIGINT)
            try:
                serve.wait(timeout=60)
            except subprocess.TimeoutExpired:
                serve.kill()
                serve.wait()
        log.close()
    elapsed = (time.monotonic() - started) / 60
    output = log_path.read_text(errors="replace")
    restarts = {who: output.count(f"Restarted the {who}") for who in ("worker", "web server")}
    finished = SearchRun.objects.filter(search__in=searches, status="finished")
    lost = (Step.objects.filter(error__startswith="lost its worker").count()
            + Step.objects.filter(search__run__in=finished, state__in=("pending", "running")).count())
    set_aside = len(list((data / "broker" / "quarantine").glob("*")))
    times = sorted(browser.times)
    p95 = times[max(0, round(0.95 * len(times)) - 1)] if times else float("nan")
    print(f"{elapsed:.0f} min soak (load {load}): worker restarts {restarts['worker']}, web restarts "
          f"{restarts['web server']}, unrecoverable worker errors {output.count('Unrecoverable error')}, "
          f"lost steps {lost}, broker messages set aside {set_aside}; searches finished {finished.count()} "
          f"of {len(searches)} ({finished.filter(outcome='winner').count()} with a winner), evolution "
          f"cycles {Cycle.objects.count()} in {EvolutionRun.objects.count()} runs; pages {len(times)}, "
          f"median {statistics.median(times) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, "
          f"failed {len(browser.failures)}")
    for failure in browser.failures[:10]:
        print("  page failed:", failure)
    if serve.returncode not in (0, None):
        print(output[-3000:])


if __name__ == "__main__":
    main()
