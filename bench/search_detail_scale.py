"""Server time of the search detail page at 32, 256 and 1,000 candidates, measured side by side in one run.

    .venv/bin/python bench/search_detail_scale.py [--requests 15]

What it times: a GET of `/searches/<search_id>/` (the whole page) and of
`/searches/<search_id>/run/` (the run card with the candidate table, which the page polls
while a search runs), through Django's test Client logged in as a superuser: URL routing,
middleware, the view's queries and the template, in this process, with no network.

How: a temp data dir with a fresh SQLite database. For each size, a spec of that population
is frozen through `search_app.services.search_freeze` against a tiny real git repository (so
the search's hashes, batches and records are real), and its finished run is then written
directly with the ORM in bulk, as a real run of that size would leave it: a `baseline`
(candidate 0), candidates in mixed fates (not admitted for budget, a writer that changed
nothing, a patch refused by the change policy, a failed gate, an unreadable trial, a score no
better than the baseline, a duplicate patch, below the cut of a round) with their reasons,
trials for every round reached, one winner; a few receipts per candidate
(`subject_type="candidate"`: the writer's LLM call with tokens and cost, patch extract,
policy, apply, gate, trials), their steps, a review, and about three search events per
candidate. Every (size, URL) pair is requested once to warm up, then REQUESTS times,
round-robin, so all sizes see the same machine load; it prints the median and min of each,
the query count and SQL time (inside cursor.execute) of one extra request under
CaptureQueriesContext, the response size, and the ratio 1000/32 of the medians (goal: below 3).

The script knows the URLs only, not the page's markup, so it survives the page's rework.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import random
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

from _search_setup import bench_temp, django_setup, operator_and_project
from search_orchestration import make_repo, spec

SIZES = (32, 256, 1000)
REQUESTS = 15
# Settings this script chooses itself: SQLite in the temp dir, no Redis, no debug.
CONTROLLED = ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL", "CRUCIBLE_DATA_DIR",
              "CRUCIBLE_DEBUG", "CRUCIBLE_ALLOWED_HOSTS")


def spec_text(population: int) -> str:
    rounds = [population, max(population // 10, 8), 3, 1]
    return spec(f"detail-{population}", population, rounds, sleep=0, trials=3)


def build(user, project, repo: Path, population: int, rng: random.Random):
    """Freeze a search of this population, then write a finished run of it in bulk."""
    from django.db import transaction
    from django.utils import timezone

    from runtime_app.models import Event, Receipt
    from search_app import services
    from search_app.execution import search_spec
    from search_app.models import Candidate, Review, SearchRun, Step

    search = services.search_freeze(user, project, spec_text(population), "HEAD", repository_path=str(repo))
    rounds = search_spec(search).rounds
    now = timezone.now()
    with transaction.atomic():
        baseline_trials = [round(rng.gauss(100, 2), 3) for _ in range(3)]
        baseline = Candidate(
            search=search, candidate_id="baseline", number=0, batch=0, state="alive", round_reached=0,
            gates_passed=1, score=statistics.median(baseline_trials),
            spread=max(baseline_trials) - min(baseline_trials), trials={"0": baseline_trials},
            runtime_seconds=0.4, reason="the unchanged baseline, for comparison",
        )
        candidates = [baseline]
        for batch, ids in enumerate(search.candidate_batches):
            for candidate_id in ids:
                candidates.append(Candidate(search=search, candidate_id=candidate_id,
                                            number=int(candidate_id.split("_")[1]), batch=batch))
        others = candidates[1:]
        fates = _fates(len(others), rng)
        plans = [_plan(c, fate, baseline.score, rng) for c, fate in zip(others, fates, strict=True)]
        # Rounds: participants ranked by score; the best rounds[r + 1] go on. Model instances
        # without a pk are unhashable, so candidates are keyed by candidate_id until saved.
        participants = [c for c, p in zip(others, plans, strict=True) if p["fate"] == "scored"]
        copies = rng.sample(participants, max(1, len(participants) // 20))
        copied = {c.candidate_id for c in copies}
        duplicate_of: dict[str, str] = {}
        for candidate in copies:
            original = rng.choice([c for c in participants if c.candidate_id not in copied])
            duplicate_of[candidate.candidate_id] = original.candidate_id
            candidate.patch, candidate.patch_sha256 = original.patch, original.patch_sha256
            candidate.trials = {"0": [round(v + rng.gauss(0, 0.5), 3) for v in original.trials["0"]]}
            candidate.score = statistics.median(candidate.trials["0"])
            candidate.state = "eliminated"
            candidate.reason = f"round 0: same patch as {original.candidate_id}, collapsed as a duplicate"
        participants = [c for c in participants if c.candidate_id not in copied]
        rankings: dict[str, list[str]] = {}
        for round_index in range(len(rounds)):
            ranked = sorted(participants, key=lambda c: -c.score)
            rankings[str(round_index)] = [c.candidate_id for c in ranked]
            last = round_index == len(rounds) - 1
            keep = 1 if last else rounds[round_index + 1]
            for rank, candidate in enumerate(ranked, 1):
                if rank > keep:
                    candidate.state = "eliminated"
                    candidate.reason = (f"round {round_index}: rank {rank} of {len(ranked)}, "
                                        f"below the cut of {keep}")
                elif not last:
                    candidate.reason = f"round {round_index}: rank {rank} of {len(ranked)}, goes on"
                    trials = [round(candidate.score + rng.gauss(0, 2), 3) for _ in range(3)]
                    candidate.trials = {**candidate.trials, str(round_index + 1): trials}
                    candidate.round_reached = round_index + 1
                    candidate.score = statistics.median(trials)
                    candidate.spread = max(trials) - min(trials)
            participants = ranked[:keep]
        winner = participants[0]
        winner.state = "winner"
        winner.reason = "winner: replay passed; reviewer says approve; awaiting human approval"
        Candidate.objects.bulk_create(candidates)
        if any(c.pk is None for c in candidates):
            raise RuntimeError("bulk_create did not return primary keys (SQLite older than 3.35?)")
        by_id = {c.candidate_id: c for c in candidates}
        for candidate_id, original_id in duplicate_of.items():
            by_id[candidate_id].duplicate_of = by_id[original_id]

        receipts, owners = [], []
        for candidate, plan in zip(others, plans, strict=True):
            for kind, label, extra in _receipt_rows(candidate, plan):
                receipts.append(Receipt(
                    project=project, kind=kind, subject_type="candidate", subject_id=candidate.pk,
                    label=f"{candidate.candidate_id} {label}", argv=["sh", "-c", label], cwd=".",
                    started_at=now, finished_at=now + timedelta(seconds=0.2), duration_seconds=0.2,
                    exit_code=extra.pop("exit_code", 0), isolation="bubblewrap",
                    stdout_excerpt=extra.pop("stdout", ""), **extra,
                ))
                owners.append((candidate, label))
        review_receipt = Receipt(project=project, kind="review", subject_type="candidate",
                                 subject_id=winner.pk, label=f"{winner.candidate_id} review",
                                 started_at=now, finished_at=now, duration_seconds=1.0)
        receipts.append(review_receipt)
        Receipt.objects.bulk_create(receipts, batch_size=500)
        first_failure = {}
        for receipt, (candidate, _label) in zip(receipts, owners, strict=False):
            if receipt.exit_code:
                first_failure.setdefault(candidate.pk, receipt.pk)
        for candidate in others:
            if "{receipt}" in candidate.reason:
                candidate.reason = candidate.reason.format(receipt=first_failure.get(candidate.pk, 0))
        Candidate.objects.bulk_update(others, ["reason", "duplicate_of"], batch_size=500)

        steps = [Step(search=search, candidate=baseline, kind="evaluate", round=0, state="done", attempts=1)]
        for candidate, plan in zip(others, plans, strict=True):
            if plan["fate"] == "not_admitted":
                continue
            steps.append(Step(search=search, candidate=candidate, kind="generate", round=0, state="done",
                              attempts=1, result={"diff_lines": candidate.diff_lines}))
            for round_index in range(candidate.round_reached + 1):  # -1: never evaluated
                steps.append(Step(search=search, candidate=candidate, kind="evaluate", round=round_index,
                                  state="done", attempts=1, result={"score": candidate.score}))
        last_round = len(rounds) - 1
        steps.append(Step(search=search, candidate=winner, kind="replay", round=last_round, state="done",
                          attempts=1, result={"passed": True, "why": "replay passed: within the noise band",
                                              "score": winner.score, "receipts": []}))
        steps.append(Step(search=search, candidate=winner, kind="review", round=last_round, state="done",
                          attempts=1))
        Step.objects.bulk_create(steps, batch_size=500)
        Review.objects.create(search=search, candidate=winner, verdict="approve", findings=[],
                              reviewer="bench reviewer", receipt=review_receipt)

        spent_cost = sum(c.cost_microusd for c in others)
        spent_tokens = sum(c.tokens for c in others)
        SearchRun.objects.create(
            search=search, status="finished", outcome="winner", winner=winner, reason=winner.reason,
            phase="done", round_index=last_round, rankings=rankings, replayed=[winner.candidate_id],
            spent_cost_microusd=spent_cost, spent_tokens=spent_tokens, started_by=user, finished_at=now,
        )
        started = f"{search.name} started: {population} candidates, rounds {rounds}"
        events = [Event(project=project, subject_type="search", subject_id=search.pk, kind="search.started",
                        payload={"message": started})]
        for candidate in others:
            messages = [f"wrote a patch of {candidate.diff_lines} lines", candidate.reason]
            if candidate.score is not None:
                messages.insert(1, f"round {candidate.round_reached}: score {candidate.score:g}")
            events.extend(
                Event(project=project, subject_type="search", subject_id=search.pk, kind="candidate.updated",
                      payload={"message": f"{candidate.candidate_id}: {message}",
                               "candidate_id": candidate.candidate_id, "state": candidate.state})
                for message in messages
            )
        finished = {"message": f"{search.name}: winner {winner.candidate_id}", "outcome": "winner"}
        events.append(Event(project=project, subject_type="search", subject_id=search.pk,
                            kind="search.finished", payload=finished))
        Event.objects.bulk_create(events, batch_size=500)
    counts = {}
    for candidate in candidates[1:]:
        counts[candidate.state] = counts.get(candidate.state, 0) + 1
    return search, len(receipts), len(events), counts


FATES = (("not_admitted", 0.02), ("writer", 0.04), ("policy", 0.04), ("gate", 0.15), ("trial", 0.03),
         ("not_better", 0.14))


def _fates(count: int, rng: random.Random) -> list[str]:
    fates = []
    for name, share in FATES:
        fates += [name] * max(1, round(count * share))
    fates += ["scored"] * (count - len(fates))
    rng.shuffle(fates)
    return fates


def _plan(candidate, fate: str, baseline_score: float, rng: random.Random) -> dict:
    """Fill in one candidate's fields for its fate; return what its receipts need."""
    candidate.state = "eliminated"
    if fate == "not_admitted":
        candidate.state = "not_admitted"
        candidate.reason = "not admitted: the budget cannot cover another writer (spent 4980000 µUSD)"
        return {"fate": fate}
    tokens_in, tokens_out = rng.randint(6000, 14000), rng.randint(400, 2500)
    candidate.tokens = tokens_in + tokens_out
    candidate.cost_microusd = tokens_in * 3 + tokens_out * 15
    plan = {"fate": fate, "input_tokens": tokens_in, "output_tokens": tokens_out}
    if fate == "writer":
        candidate.reason = "the writer (completed) changed nothing"
        return plan
    candidate.diff_lines = rng.randint(2, 180)
    # A patch as long as its diff: the run report loads every candidate's row, patch included.
    added = "".join(f"+    value_{n} = compute({candidate.number}, {n})  # step {n}\n"
                    for n in range(candidate.diff_lines - 1))
    candidate.patch = (f"--- a/code/id.txt\n+++ b/code/id.txt\n@@ -1 +1,{candidate.diff_lines} @@\n"
                       f"-baseline\n+{candidate.candidate_id}\n{added}").encode()
    candidate.patch_sha256 = hashlib.sha256(candidate.patch).hexdigest()
    extra = rng.randint(0, 3)
    candidate.files = ["code/id.txt", *(f"code/mod_{rng.randint(0, 40)}.py" for _ in range(extra))]
    if fate == "policy":
        candidate.reason = "patch refused at policy: it writes README, outside the write roots code/"
        return plan
    candidate.round_reached = 0
    if fate == "gate":
        candidate.reason = "round 0: gate 1 `true` failed (receipt #{receipt})"
        return plan
    candidate.gates_passed = 1
    if fate == "trial":
        candidate.reason = "round 0: trial 2: the output has no number at `v` (receipt #{receipt})"
        return plan
    better = fate != "not_better"
    centre = baseline_score + abs(rng.gauss(8, 6)) if better else baseline_score - abs(rng.gauss(3, 2))
    trials = [round(centre + rng.gauss(0, 2), 3) for _ in range(3)]
    candidate.trials = {"0": trials}
    candidate.score = statistics.median(trials)
    candidate.spread = max(trials) - min(trials)
    candidate.runtime_seconds = round(rng.uniform(0.3, 2.5), 3)
    if fate == "not_better" and candidate.score > baseline_score:
        candidate.score = baseline_score - 0.5
    if fate == "not_better":
        candidate.reason = (f"round 0: score {candidate.score:g} is not better than the baseline's "
                            f"{baseline_score:g}")
    else:
        candidate.state = "alive"
    return plan


def _receipt_rows(candidate, plan: dict):
    fate = plan["fate"]
    if fate == "not_admitted":
        return
    yield "llm_call", "writer turn 1", {
        "requested_model": "claude-sonnet", "resolved_model": "claude-sonnet-4-5",
        "input_tokens": plan["input_tokens"] // 10, "cache_read_tokens": plan["input_tokens"] * 9 // 10,
        "cache_write_tokens": 0, "output_tokens": plan["output_tokens"],
        "cost_microusd": candidate.cost_microusd, "exit_code": None,
    }
    yield "extract", "extract", {}
    if fate == "writer":
        return
    yield "policy", "policy", {"exit_code": 1} if fate == "policy" else {}
    if fate == "policy":
        return
    yield "apply", "round 0 apply", {}
    yield "command", "round 0 gate 1", {"exit_code": 1} if fate == "gate" else {}
    if fate == "gate":
        return
    if fate == "trial":
        yield "command", "round 0 trial 1", {"stdout": '{"v": 101.2}\n'}
        yield "command", "round 0 trial 2", {"exit_code": 1, "stdout": "no output"}
        return
    for round_key, values in sorted(candidate.trials.items(), key=lambda item: int(item[0])):
        for number, value in enumerate(values, 1):
            yield "command", f"round {round_key} trial {number}", {"stdout": f'{{"v": {value}}}\n'}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=REQUESTS, help="timed requests per page and size")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args()
    for name in CONTROLLED:
        os.environ.pop(name, None)
    started = time.monotonic()
    with bench_temp(args.keep) as temp:
        data_dir = Path(temp) / "data"
        django_setup(data_dir)
        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext

        user, project = operator_and_project()
        repo = make_repo(Path(temp) / "repo")
        rng = random.Random(20261204)
        pages: list[tuple[int, str, str]] = []
        for size in SIZES:
            build_started = time.perf_counter()
            search, receipts, events, counts = build(user, project, repo, size, rng)
            print(f"built {search.search_id}: {size} candidates + baseline "
                  f"({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))}), {receipts} receipts, "
                  f"{events} events in {time.perf_counter() - build_started:.1f} s", flush=True)
            pages.append((size, "page", f"/searches/{search.search_id}/"))
            pages.append((size, "run", f"/searches/{search.search_id}/run/"))

        client = Client(HTTP_HOST="127.0.0.1")  # the default ALLOWED_HOSTS
        client.force_login(user)

        def get(url: str):
            response = client.get(url)
            if response.status_code != 200:
                raise RuntimeError(f"GET {url}: {response.status_code}\n{response.content[:2000]!r}")
            return response

        sql_seconds = [0.0]

        def timed(execute, sql, params, many, context):
            begin = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                sql_seconds[0] += time.perf_counter() - begin

        facts = {}
        for size, name, url in pages:  # warm-up, and the one request whose queries are counted
            get(url)
            sql_seconds[0] = 0.0
            with CaptureQueriesContext(connection) as queries, connection.execute_wrapper(timed):
                response = get(url)
            facts[size, name] = (len(queries.captured_queries), sql_seconds[0] * 1000, len(response.content))
        print(f"warm; {args.requests} timed requests per page and size, round-robin …", flush=True)
        times: dict[tuple[int, str], list[float]] = {(size, name): [] for size, name, _ in pages}
        for turn in range(args.requests):
            shift = turn % len(pages)
            for size, name, url in pages[shift:] + pages[:shift]:
                begin = time.perf_counter()
                get(url)
                times[size, name].append((time.perf_counter() - begin) * 1000)

    elapsed = time.monotonic() - started
    print()
    print(f"Search detail at scale, server time per GET through the test Client, median of {args.requests} "
          f"({os.cpu_count()} cores, Python {platform.python_version()}, SQLite; {elapsed:.0f} s run)")
    print(f"{'page':<28} {'candidates':>10} {'median ms':>10} {'min ms':>8} {'queries':>8} {'SQL ms':>7} "
          f"{'KiB':>7}")
    labels = {"page": "/searches/<id>/", "run": "/searches/<id>/run/"}
    for name in ("page", "run"):
        for size in SIZES:
            values = times[size, name]
            queries, sql_ms, size_bytes = facts[size, name]
            print(f"{labels[name]:<28} {size:>10} {statistics.median(values):>10.1f} {min(values):>8.1f} "
                  f"{queries:>8} {sql_ms:>7.1f} {size_bytes / 1024:>7.0f}")
    for name in ("page", "run"):
        small, large = statistics.median(times[SIZES[0], name]), statistics.median(times[SIZES[-1], name])
        grown = facts[SIZES[-1], name][0] - facts[SIZES[0], name][0]
        verdict = "below" if large / small < 3 else "ABOVE"
        print(f"ratio {SIZES[-1]}/{SIZES[0]} {labels[name]}: {large / small:.2f}× "
              f"({verdict} the goal of 3×); queries {'constant' if grown == 0 else f'grow by {grown}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
