"""Prompt-cache hits of Claude Code writers: one real search with population 8 whose writers are
the `claude-code` preset, and the share of their prompt tokens read from the cache.

    .venv/bin/python bench/agent_cli_cache.py

The search (the plan repository of tests/search_app/runs.py, rounds [8, 1], four live steps) runs
in this process with the runtime's sandbox (bubblewrap) and a per-step egress proxy: each writer is
the real Claude Code CLI from var/agent-clis (scripts/install_agent_clis.sh), reaching
tests/fakes/anthropic_server.py only through the proxy, which injects the key and records each
call's usage. Each candidate's CLI Reads then Edits code/answer.py (claude_code_plan_script).

It reads the writer receipts' egress records (200s) and prints calls, input, cache-write and
cache-read tokens, and the cache-hit share = cache_read / (input + cache_read + cache_write), over
all writer calls and, side by side, for the first writer's calls and for the other seven's, and for
the other seven's first calls alone: the prompt prefix the candidates share should be written once
and read by the rest. The first writer is the one whose first call found nothing cached (with four
live steps it need not be cand_001). A last line gives each call's (cache write, cache read).

The cache model is the fake's, standing in for the provider's: tools and system blocks (and
message blocks) up to the last `cache_control` marker are cached on first sight, and a later
request reads the longest prefix ending at one of its own markers that was seen before. So the
share shows what Crucible's prompt layout (and Claude Code's markers) make cacheable, not what the
provider would bill: no TTL, no minimum length, no eviction, and no look-back to an earlier turn's
marker (the API checks up to 20 blocks back), so each turn's conversation tail counts as written
again here, and the provider would likely read more.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

from _search_setup import bench_temp, django_setup, freeze_and_run, keep_requested, operator_and_project

POPULATION = 8
ROUNDS = [8, 1]
KEY = "sk-ant-bench-not-a-real-key"
TOTALS = ("input_tokens", "cache_write_tokens", "cache_read_tokens")


def share(records: list[dict]) -> tuple[int, dict[str, int], float]:
    sums = {name: sum(record.get(name, 0) for record in records) for name in TOTALS}
    prompt = sum(sums.values())
    return len(records), sums, (sums["cache_read_tokens"] / prompt if prompt else float("nan"))


def main() -> None:
    with bench_temp(keep_requested()) as temp:
        root = Path(temp)
        django_setup(root / "data")
        from runtime_app import sandbox
        from runtime_app.fleet import PRESETS
        from runtime_app.models import Receipt
        from tests.fakes.anthropic_server import FakeAnthropic, claude_code_plan_script
        from tests.search_app.runs import plan_repo, spec_text

        cli = PRESETS["claude-code"].cli_path()
        if not os.access(cli, os.X_OK):
            raise SystemExit(f"{cli} is not installed: run scripts/install_agent_clis.sh")
        available, reason = sandbox.bubblewrap_probe()
        if not available:
            raise SystemExit(f"no bubblewrap: {reason}")
        plan = {f"cand_{n:03d}": ("code/answer.py", "    return 2", f"    return {n + 2}")
                for n in range(1, POPULATION + 1)}
        spec = spec_text(population=POPULATION, rounds=ROUNDS, name="agent-cli-cache").replace(
            'provider = "command"\ncommand = "python scripts/writer.py"',
            'provider = "claude-code"\nmodel = "fake-sonnet"')
        user, project = operator_and_project()
        repo = plan_repo(root / "repo", {})
        os.environ["ANTHROPIC_API_KEY"] = KEY
        started = time.perf_counter()
        with FakeAnthropic(script=claude_code_plan_script(plan)) as fake:
            os.environ["ANTHROPIC_BASE_URL"] = fake.base_url
            _search, run = freeze_and_run(user, project, spec, repo)
        elapsed = time.perf_counter() - started
        writers = list(Receipt.objects.filter(label__endswith=" writer").order_by("pk"))
        failed = [(w.label, w.exit_code, w.error, w.stderr_excerpt[-500:])
                  for w in writers if not w.succeeded]
        if failed:
            print(f"writers that failed: {failed}")
        records = {w.label.split()[0]: [r for r in w.detail.get("egress", {}).get("records", [])
                                        if r.get("status") == 200] for w in writers}
        # The first writer is the one whose first call found nothing cached (it reached the fake
        # first and wrote the shared prefix); with four live steps that need not be cand_001.
        first_id = next((cid for cid, rs in records.items() if rs and rs[0]["cache_read_tokens"] == 0),
                        "cand_001")
        first = records.get(first_id, [])
        rest = [r for cid, rs in records.items() if cid != first_id for r in rs]
        openers = [rs[0] for cid, rs in records.items() if cid != first_id and rs]
        winner = run.winner.candidate_id if run.winner else "none"
        print(f"population {POPULATION}, rounds {ROUNDS}, {len(writers)} Claude Code writers "
              f"({writers[0].isolation if writers else '-'}, egress proxy), outcome {run.outcome} "
              f"{winner}, {elapsed:.0f} s; {platform.python_version()}, {os.cpu_count()} cores, "
              f"load average {os.getloadavg()[0]:.1f}")
        print("cache model: the fake's (tools and system blocks up to the last cache_control are "
              "cached on first sight; no look-back\nto an earlier turn's marker), standing in for "
              "the provider's: the share is what the prompt layout makes cacheable,\nnot the "
              "provider's billing")
        print(f"{'writer calls':>26} {'calls':>6} {'input':>9} {'cache write':>12} {'cache read':>11} "
              f"{'hit share':>10}")
        for name, group in (("all", [r for rs in records.values() for r in rs]),
                            (f"{first_id} (first writer)", first), (f"other {len(records) - 1}", rest),
                            (f"other {len(records) - 1}: 1st calls", openers)):
            calls, sums, hit = share(group)
            print(f"{name:>26} {calls:6d} {sums['input_tokens']:9d} {sums['cache_write_tokens']:12d} "
                  f"{sums['cache_read_tokens']:11d} {hit:10.1%}")
        print("per writer, (cache write, cache read) per call: " + "; ".join(
            f"{cid} " + " ".join(f"({r['cache_write_tokens']}, {r['cache_read_tokens']})" for r in rs)
            for cid, rs in sorted(records.items())))


if __name__ == "__main__":
    sys.exit(main())
