"""LLM writers against the loopback fake Anthropic server: prompt-prefix reuse and tool-loop
overhead, measured in one run.

    .venv/bin/python bench/llm_tool_loop.py

1. **Prompt-prefix reuse:** a population-32 search of the demo repository with `anthropic`
   writers (the real SDK against tests/fakes/anthropic_server.py, which accounts cache writes
   and reads from identical prefixes as the API does). For candidates 2..32, the share of
   input tokens of their calls that were cacheable (read from the cache) is printed. The goal
   is at least 90%.
2. **Tool-loop overhead per turn:** one writer holds a 12-turn conversation (11 edits through
   the editor tool, then the end of its turn). The overhead per turn is the step's time minus
   the time spent waiting for the model (each call's receipt duration), divided by the turns:
   tool execution, receipts, prompt building and bookkeeping, without the model's latency.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from _search_setup import (
    REPO_ROOT,
    bench_temp,
    django_setup,
    freeze_and_run,
    keep_requested,
    operator_and_project,
)

SPEC = '''name = "{name}"
objective = "Make certificate() faster without changing its exact result"
population = {population}
rounds = {rounds}
concurrency = {concurrency}

[worker]
provider = "anthropic"
model = "fake-sonnet"
reasoning_effort = "off"
write_roots = ["code"]

[evidence]
files = ["certificate.py", "code/primes.py", "README.md", "tests/test_certificate.py"]
text = "primes_below(bound) must return exactly the primes below bound, in order."

[hard_gates]
commands = ["python certificate.py"]
protected_paths = ["tests", "expected_result.json", "scripts", "certificate.py"]

[score]
command = "./scripts/benchmark_candidate.sh"
metric = "median_runtime_ms"
reported = "time_ms"
trials = 1
'''

SIEVE = '''def primes_below(bound):
    flags = bytearray([1]) * bound
    flags[0:2] = b"\\x00\\x00"
    for n in range(2, int(bound ** 0.5) + 1):
        if flags[n]:
            flags[n * n :: n] = bytes(len(range(n * n, bound, n)))
    return [n for n in range(bound) if flags[n]]
'''


def multi_turn_script(turns: int):
    def script(request, candidate):
        done = sum(1 for m in request["messages"] if m["role"] == "assistant")
        if done >= turns - 1:
            return [{"type": "text", "text": "done"}]
        return [{"type": "tool_use", "id": f"toolu_{done:03d}", "name": "editor",
                 "input": {"command": "create", "path": "code/primes.py",
                           "file_text": SIEVE + f"\n# revision {done}\n"}}]
    return script


def main() -> None:
    import sys

    sys.path.insert(0, str(REPO_ROOT))
    with bench_temp(keep_requested()) as temp:
        django_setup(Path(temp) / "data")
        from runtime_app.management.commands.crucible_setup import Command
        from runtime_app.models import Receipt
        from tests.fakes.anthropic_server import FakeAnthropic

        os.environ["ANTHROPIC_API_KEY"] = "sk-bench-not-a-real-key"
        user, project = operator_and_project()
        repo = Command()._demo_repository()

        plan = {f"cand_{n:03d}": {"path": "code/primes.py", "content": SIEVE + f"\n# {n}\n"}
                for n in range(1, 33)}
        with FakeAnthropic(plan=plan) as fake:
            os.environ["ANTHROPIC_BASE_URL"] = fake.base_url
            search, run = freeze_and_run(user, project, SPEC.format(name="prefix-reuse", population=32,
                                                                    rounds=[32, 1], concurrency=16), repo)
        calls = Receipt.objects.filter(kind="llm_call", subject_type="candidate")
        by_candidate = {c.pk: c.candidate_id for c in search.candidates.all()}
        later = [c for c in calls if by_candidate[c.subject_id] != "cand_001" and "writer" in c.label]
        cached = sum(c.cache_read_tokens for c in later)
        total = sum(c.input_tokens + c.cache_read_tokens + c.cache_write_tokens for c in later)
        first_turn = [c for c in later if c.label.endswith("call 1")]
        first_cached = sum(c.cache_read_tokens for c in first_turn)
        first_total = sum(c.input_tokens + c.cache_read_tokens + c.cache_write_tokens for c in first_turn)
        writes = sum(1 for c in calls if c.cache_write_tokens)
        print(f"prefix reuse: population 32, outcome {run.outcome}, {calls.count()} calls, "
              f"{writes} of them wrote the cache")
        print(f"  candidates 2..32, first calls (the shared prefix plus the candidate's suffix): "
              f"{first_cached:,} of {first_total:,} input tokens read from the cache "
              f"= {first_cached / first_total:.1%}")
        print(f"  candidates 2..32, all writer calls (two turns each: the second also carries the tool "
              f"call and its result): {cached / total:.1%}")

        turns = 12
        with FakeAnthropic(script=multi_turn_script(turns)) as fake:
            os.environ["ANTHROPIC_BASE_URL"] = fake.base_url
            search, run = freeze_and_run(user, project, SPEC.format(name="tool-loop", population=2,
                                                                    rounds=[2, 1], concurrency=1), repo)
        step = search.steps.get(kind="generate", candidate__candidate_id="cand_001")
        receipts = Receipt.objects.filter(pk__in=step.result["receipts"])
        model_seconds = sum(r.duration_seconds for r in receipts if r.kind == "llm_call")
        step_seconds = (step.finished_at - step.started_at).total_seconds()
        n_calls = sum(1 for r in receipts if r.kind == "llm_call")
        latencies = [r.duration_seconds * 1000 for r in receipts if r.kind == "llm_call"]
        conversation = [r for r in receipts if r.kind == "llm_call"]
        read = sum(r.cache_read_tokens for r in conversation)
        whole = sum(r.input_tokens + r.cache_read_tokens + r.cache_write_tokens for r in conversation)
        print(f"tool loop: {n_calls} turns in one writer step of {step_seconds * 1000:.0f} ms; "
              f"model calls {model_seconds * 1000:.0f} ms (median {statistics.median(latencies):.1f} ms "
              f"each, the fake's round trip through the SDK)")
        overhead = (step_seconds - model_seconds) / n_calls * 1000
        print(f"  its {n_calls} calls read {read / whole:.1%} of their input tokens from the cache "
              "(the conversation's own breakpoint moves forward each turn)")
        print(f"  overhead per turn, without the model: {overhead:.1f} ms "
              f"(the step also creates and removes the worktree and extracts the patch)")


if __name__ == "__main__":
    main()
