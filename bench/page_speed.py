"""Page times of the candidate, compare, agent and cycle pages with and without a population-32
search running beside them, measured in one run against a real `manage.py serve`.

    .venv/bin/python bench/page_speed.py [--rounds 30] [--load-seconds 600] [--keep]

How: a temp data dir, `manage.py migrate` and `crucible_setup` (the demo project, repository and
agent, whose 4-cycle evolution `make run` queues), then `manage.py serve` on a free port: Daphne
and a Celery worker as separate processes, as `make run` starts them. Once the demo evolution
has finished, the scripted demo spec (search_app/spec_templates/demo-scripted.toml) is frozen
with population 32 and rounds [32, 8, 3, 1] and started through the services, so the worker
inside serve runs its writers, gates and timed trials in the sandbox.

Under load: as soon as two of its candidates have a patch, a logged-in HTTP client requests, in
turn, a candidate page (rotating over the candidates that have a patch), the compare page of the
first two, the demo agent's page and its last cycle's page, then pauses PAUSE (a person reading,
not a load generator), again and again until the search finishes or LOAD_SECONDS pass; a sample
counts as under load only if the search was still running when it ended. Then the search is
cancelled if it still runs, the bench waits until no step runs, and the same pages are requested
ROUNDS times each (idle). Each page is requested once before each phase to warm it up. Printed per
page and phase: samples, p50, p95 and max in ms, how many took over GOAL_MS, and the ratio of the
p95s (load / idle).
Goal: p95 under load below 500 ms for every page.

Other processes on the machine load both phases alike; run it a few times and compare.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from _search_setup import REPO_ROOT, free_port, served_data_prepare, wait_for_port

PASSWORD = "page-speed-Admin-password-1"
PAGES = ("candidate", "compare", "agent", "cycle")
GOAL_MS = 500
PAUSE = 0.5  # between rounds of the four pages: a person reading, not a load generator


class Browser:
    """A logged-in client of the web server."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def login(self, username: str, password: str) -> None:
        with self.opener.open(f"{self.base}/login/", timeout=30) as response:
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', response.read().decode())[1]
        data = urllib.parse.urlencode({"username": username, "password": password,
                                       "csrfmiddlewaretoken": token}).encode()
        request = urllib.request.Request(f"{self.base}/login/", data=data,  # noqa: S310  (http://127.0.0.1)
                                         headers={"Referer": f"{self.base}/login/"})
        with self.opener.open(request, timeout=30) as response:
            if "/login/" in response.geturl():
                raise SystemExit("could not log in to the bench's server")

    def get(self, path: str) -> tuple[float, str]:
        """Seconds to the last byte of a page, and its text; a failed page stops the bench."""
        started = time.perf_counter()
        with self.opener.open(f"{self.base}{path}", timeout=120) as response:
            body = response.read()
            status, url = response.status, response.geturl()
        elapsed = time.perf_counter() - started
        if status != 200 or "/login/" in url:
            raise SystemExit(f"{path}: {status} {url}")
        return elapsed, body.decode(errors="replace")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(share * len(ordered)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="requests of each page per phase")
    parser.add_argument("--load-seconds", type=float, default=600.0, help="longest the loaded phase lasts")
    parser.add_argument("--keep", action="store_true", help="keep the data dir and serve's log")
    options = parser.parse_args()
    temp = Path(tempfile.mkdtemp(prefix="crucible-bench-pages-"))
    try:
        bench(temp, options.rounds, options.load_seconds)
    finally:
        if options.keep:
            print(f"kept {temp}")
        else:
            shutil.rmtree(temp, ignore_errors=True)


def bench(temp: Path, rounds: int, load_seconds: float) -> None:
    _, env, manage = served_data_prepare(temp, PASSWORD)
    from django.contrib.auth import get_user_model
    from django.urls import reverse

    from evolve_app.models import Agent, EvolutionRun
    from runtime_app.models import Project
    from search_app import services
    from search_app.models import Candidate, SearchRun, Step

    admin = get_user_model().objects.get(username="admin")
    project = Project.objects.get(name="demo")
    repository = project.repositories.get()
    agent = Agent.objects.get(project=project)
    template = (REPO_ROOT / "search_app" / "spec_templates" / "demo-scripted.toml").read_text()
    spec = (template.replace('name = "demo-speed-up-scripted"', 'name = "page-speed-32"')
            .replace("population = 12", "population = 32")
            .replace("rounds = [12, 4, 2, 1]", "rounds = [32, 8, 3, 1]"))

    port = free_port()
    log_path = temp / "serve.log"
    log = log_path.open("wb")
    serve = subprocess.Popen([*manage, "serve", "--port", str(port)], cwd=REPO_ROOT, env=env,
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, serve)
        browser = Browser(f"http://127.0.0.1:{port}")
        browser.login("admin", PASSWORD)
        deadline = time.monotonic() + 900
        while EvolutionRun.objects.filter(agent=agent, status__in=EvolutionRun.ACTIVE).exists():
            if time.monotonic() > deadline or serve.poll() is not None:
                raise SystemExit("the demo evolution did not finish")
            time.sleep(2)
        agent_url = reverse("agent_detail", args=[agent.pk])
        _, agent_page = browser.get(agent_url)
        cycle_urls = sorted(set(re.findall(rf"{agent_url}runs/\d+/cycles/\d+/", agent_page)))
        if not cycle_urls:
            _, run_page = browser.get(re.findall(rf"{agent_url}runs/\d+/", agent_page)[0])
            cycle_urls = sorted(set(re.findall(rf"{agent_url}runs/\d+/cycles/\d+/", run_page)))
        cycle_url = cycle_urls[-1]

        search = services.search_freeze(admin, project, spec, "HEAD", repository=repository)
        services.search_start(admin, search)
        deadline = time.monotonic() + 900
        while Candidate.objects.filter(search=search).exclude(candidate_id="baseline").exclude(
                patch_sha256="").count() < 2:
            if time.monotonic() > deadline or serve.poll() is not None:
                raise SystemExit("no two candidates wrote a patch")
            time.sleep(1)

        def urls() -> dict[str, list[str]]:
            written = list(Candidate.objects.filter(search=search).exclude(candidate_id="baseline")
                           .exclude(patch_sha256="").order_by("number")
                           .values_list("candidate_id", flat=True))
            candidate = [reverse("candidate_detail", args=[search.search_id, c]) for c in written]
            compare = reverse("search_compare", args=[search.search_id])
            return {"candidate": candidate, "compare": [f"{compare}?c={written[0]}&c={written[1]}"],
                    "agent": [agent_url], "cycle": [cycle_url]}

        def running() -> bool:
            return SearchRun.objects.get(search=search).status == SearchRun.Status.RUNNING

        def phase(loaded: bool) -> dict[str, list[float]]:
            times: dict[str, list[float]] = {page: [] for page in PAGES}
            targets = urls()
            for page in PAGES:
                browser.get(targets[page][0])
            ends = time.monotonic() + load_seconds
            index = 0
            while (time.monotonic() < ends and running()) if loaded else index < rounds:
                if index % 5 == 0:
                    targets = urls()
                for page in PAGES:
                    choices = targets[page]
                    elapsed, _ = browser.get(choices[index % len(choices)])
                    if not loaded or running():
                        times[page].append(elapsed)
                index += 1
                time.sleep(PAUSE)
            return times

        loaded_started = time.monotonic()
        loaded = phase(loaded=True)
        loaded_seconds = time.monotonic() - loaded_started
        done = Candidate.objects.filter(search=search).exclude(patch_sha256="").count()
        status = SearchRun.objects.get(search=search).status
        if status == SearchRun.Status.RUNNING:
            services.search_cancel(admin, search)
        deadline = time.monotonic() + 300
        while Step.objects.filter(search=search, state=Step.State.RUNNING).exists() or \
                SearchRun.objects.get(search=search).status == SearchRun.Status.CANCELLING:
            if time.monotonic() > deadline:
                print("the search's steps were still running after 300 s; idle figures include them")
                break
            time.sleep(1)
        time.sleep(3)
        idle = phase(loaded=False)
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGINT)
            try:
                serve.wait(timeout=60)
            except subprocess.TimeoutExpired:
                serve.kill()
                serve.wait()
        log.close()

    load_average = os.getloadavg()[0]
    print(f"page times over HTTP against manage.py serve ({os.cpu_count()} cores, load average "
          f"{load_average:.1f} at the end); loaded phase {loaded_seconds:.0f} s while a population-32 "
          f"search ran ({done} candidates had a patch when it ended, search was {status})")
    print(f"{'page':<10} {'phase':<6} {'n':>3} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'over goal':>9}")
    worst = 0.0
    for page in PAGES:
        for name, times in (("idle", idle[page]), ("load", loaded[page])):
            if not times:
                print(f"{page:<10} {name:<6}   0")
                continue
            print(f"{page:<10} {name:<6} {len(times):>3} {percentile(times, 0.5) * 1000:>8.0f} "
                  f"{percentile(times, 0.95) * 1000:>8.0f} {max(times) * 1000:>8.0f} "
                  f"{sum(t * 1000 > GOAL_MS for t in times):>9}")
        if idle[page] and loaded[page]:
            p95 = percentile(loaded[page], 0.95)
            worst = max(worst, p95)
            print(f"{page:<10} p95 load / idle = {p95 / percentile(idle[page], 0.95):.1f}")
    print(f"worst p95 under load: {worst * 1000:.0f} ms (goal: below {GOAL_MS} ms)")


if __name__ == "__main__":
    main()
