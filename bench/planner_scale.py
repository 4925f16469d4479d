"""The planner's cost over a whole search, at growing populations.

    .venv/bin/python bench/planner_scale.py [--populations 32 128 512]

For each population, a search with trivial commands (rounds P → P/8 → 1, 16 live steps) runs to
its end in this process (`search_run_inline`); every call of `services.search_advance` is timed
and its queries counted. An incremental planner costs the same per call at any population, so
its total grows linearly with the population (the number of calls); one that reloads the whole
search on every call grows quadratically. Temp data lives under tempfile.mkdtemp().
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _search_setup import django_setup, operator_and_project
from search_orchestration import make_repo
from search_orchestration import spec as orchestration_spec


def spec(name: str, population: int) -> str:
    """Every writer writes its own id, the score is that id's checksum: no command sleeps."""
    return orchestration_spec(name, population, [population, max(population // 8, 2), 1], 0, 2)


def planner_scale(user, project, repo: Path, population: int) -> dict:
    """Run one search; return its wall time and the planner's calls, seconds and queries."""
    from django.db import connection

    from search_app import services

    advance = services.search_advance
    calls: list[tuple[float, int, bool]] = []

    def timed(search_pk: int) -> list[int]:
        queries, locked = [0], [False]

        def count(execute, sql, params, many, context):
            queries[0] += 1
            locked[0] = locked[0] or sql.startswith("BEGIN")  # the call took the write lock
            return execute(sql, params, many, context)

        began = time.perf_counter()
        with connection.execute_wrapper(count):
            ready = advance(search_pk)
        calls.append((time.perf_counter() - began, queries[0], locked[0]))
        return ready

    search = services.search_freeze(user, project, spec(f"planner-{population}", population), "HEAD",
                                    repository_path=str(repo))
    services.search_start(user, search, enqueue=False)
    services.search_advance = timed
    began = time.perf_counter()
    try:
        run = services.search_run_inline(search)
    finally:
        services.search_advance = advance
    wall = time.perf_counter() - began
    total = sum(seconds for seconds, _, _ in calls)
    return {"population": population, "outcome": run.outcome, "steps": search.steps.count(), "wall": wall,
            "calls": len(calls), "planner": total, "mean_ms": total / len(calls) * 1000,
            "mean_queries": sum(q for _, q, _ in calls) / len(calls),
            "max_queries": max(q for _, q, _ in calls), "locked": sum(lock for _, _, lock in calls)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--populations", type=int, nargs="+", default=[32, 128, 512])
    args = parser.parse_args()
    temp = Path(tempfile.mkdtemp(prefix="crucible-bench-planner-"))
    django_setup(temp / "data")
    user, project = operator_and_project()
    repo = make_repo(temp / "repo")
    print(f"planner cost over a whole search (data in {temp})")
    for population in args.populations:
        r = planner_scale(user, project, repo, population)
        print(f"population {r['population']:4d}: {r['steps']:5d} steps, wall {r['wall']:6.1f} s, "
              f"planner {r['planner']:6.2f} s in {r['calls']:5d} calls "
              f"({r['planner'] / r['wall']:.0%} of wall; "
              f"mean {r['mean_ms']:.2f} ms and {r['mean_queries']:.1f} queries per call, max "
              f"{r['max_queries']}); {r['locked']} calls took the write lock; outcome {r['outcome']}")


if __name__ == "__main__":
    main()
