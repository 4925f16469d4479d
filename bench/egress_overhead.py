"""Egress proxy overhead: model calls through the forwarder and runtime_app.egress against the
same calls straight to the fake provider, side by side in one run.

    .venv/bin/python bench/egress_overhead.py

One client script (standard library, one keep-alive connection, non-streaming Anthropic
Messages calls to tests/fakes/anthropic_server.py) times each call from request to the last
byte of the answer. It runs in blocks of BLOCK calls, alternating so both sides see the same
machine load:

- **direct**: the client as a plain host process, to the fake's loopback port;
- **proxy**: the client under bubblewrap (when it can start; rlimits only otherwise) with
  `egress=proxy`: its sandbox loopback → egress_forwarder.py → the proxy's Unix socket →
  the proxy (allow-list, key injection, usage, pricing, account slot, record) → the fake.

Process start-up is outside the timings. It prints the median, p90 and min of each and the
ratio of the medians.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from _search_setup import bench_temp, django_setup, keep_requested

CALLS = 200
BLOCK = 20

CLIENT = r'''
import http.client, json, sys, time
from urllib.parse import urlsplit

url = urlsplit(sys.argv[1])
count = int(sys.argv[2])
body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 256,
                   "messages": [{"role": "user", "content": "You are cand_001. " + "x" * 2000}]}).encode()
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
times = []
for _ in range(count + 1):  # the first call opens the connection: not counted
    started = time.perf_counter()
    conn.request("POST", "/v1/messages", body=body,
                 headers={"content-type": "application/json", "x-api-key": "client-key"})
    response = conn.getresponse()
    data = response.read()
    times.append(time.perf_counter() - started)
    assert response.status == 200 and json.loads(data)["type"] == "message", data[:200]
print(json.dumps(times[1:]))
'''


def main() -> None:
    with bench_temp(keep_requested()) as temp:
        root = Path(temp)
        django_setup(root / "data")
        from runtime_app import sandbox
        from runtime_app.egress import EgressProxy
        from tests.fakes.anthropic_server import FakeAnthropic

        tree = root / "data" / "worktrees" / "bench"
        tree.mkdir(parents=True)
        (tree / "client.py").write_text(CLIENT)
        available, reason = sandbox.bubblewrap_probe()
        isolation = "required" if available else "off"
        if not available:
            print(f"bubblewrap skipped ({reason}): the proxy side runs with rlimits only")
        os.environ["CRUCIBLE_BENCH_PROVIDER"] = "sk-bench-not-a-real-key"
        times: dict[str, list[float]] = {"direct": [], "proxy": []}
        with FakeAnthropic() as fake, EgressProxy("anthropic", fake.base_url,
                                                   key_variable="CRUCIBLE_BENCH_PROVIDER") as proxy:
            for _ in range(CALLS // BLOCK):
                direct = subprocess.run([sys.executable, str(tree / "client.py"), fake.base_url, str(BLOCK)],
                                        capture_output=True, text=True, check=True)
                times["direct"] += json.loads(direct.stdout)
                receipt = sandbox.run('exec python client.py "$CRUCIBLE_EGRESS_URL" ' + str(BLOCK), cwd=tree,
                                      timeout=300, isolation=isolation, egress=proxy)
                if receipt.exit_code != 0:
                    raise SystemExit(f"the sandboxed client failed: {receipt.stderr_excerpt}")
                times["proxy"] += json.loads(receipt.stdout_excerpt)
            records = proxy.records
        assert all(record["status"] == 200 and record["cost_microusd"] > 0 for record in records)
        print(f"{CALLS} calls each, in blocks of {BLOCK}, {platform.python_version()}, {os.cpu_count()} "
              f"cores, proxy side: {receipt.isolation}, load average {os.getloadavg()[0]:.1f}")
        medians = {}
        for name, values in times.items():
            values.sort()
            medians[name] = statistics.median(values)
            p90 = values[int(len(values) * 0.9) - 1]
            print(f"{name:>7}: median {medians[name] * 1000:7.2f} ms  p90 {p90 * 1000:7.2f} ms  "
                  f"min {values[0] * 1000:7.2f} ms")
        print(f"ratio proxy/direct (medians): {medians['proxy'] / medians['direct']:.2f}x, "
              f"+{(medians['proxy'] - medians['direct']) * 1000:.2f} ms per call")


if __name__ == "__main__":
    main()
