"""Model calls through the real anthropic SDK against the loopback fake (tests/fakes/)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from runtime_app import services
from runtime_app.llm import LLMError, anthropic_call, anthropic_client
from runtime_app.models import PriceOverride, Receipt
from runtime_app.prices import Usage, cost_microusd, price_for, price_table, worst_case_microusd
from tests.fakes.anthropic_server import FakeAnthropic
from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.django_db
KEY = "sk-ant-test-secret-0123456789"
SYSTEM = [{"type": "text", "text": "Shared instructions. " * 50, "cache_control": {"type": "ephemeral"}}]


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    with FakeAnthropic(plan={"cand_001": {"path": "code/a.py", "content": "x = 1\n"}}) as server:
        yield server


def call(fake, **options):
    client = anthropic_client(fake.base_url)
    return anthropic_call(client, model="fake-sonnet", system=SYSTEM, tools=[],
                          messages=[{"role": "user", "content": "You are cand_001."}], max_tokens=1000,
                          record=lambda receipt: services.receipt_record(receipt, label="test call"),
                          **options)


def test_a_call_leaves_a_receipt_with_models_request_id_tokens_and_cost(fake):
    reply = call(fake)
    receipt = Receipt.objects.get(pk=reply.receipt.pk)
    assert receipt.kind == "llm_call" and receipt.requested_model == "fake-sonnet"
    assert receipt.resolved_model == "fake-sonnet-20261201" and receipt.request_id.startswith("req_fake_")
    assert receipt.cache_write_tokens > 0 and receipt.cache_read_tokens == 0
    price, version = price_for("fake-sonnet-20261201")
    assert receipt.price_table_version == version == price_table()[0]
    assert receipt.cost_microusd == cost_microusd(price, reply.usage) > 0
    assert fake.keys_seen() == {KEY}  # the provider gets it; nothing else does
    assert KEY not in json.dumps(receipt.as_dict())


def test_the_second_call_with_the_same_prefix_reads_the_cache(fake):
    call(fake)
    second = call(fake)
    assert second.usage.cache_read_tokens > 0 and second.usage.cache_write_tokens == 0


def test_429_is_retried_after_its_retry_after_and_the_retries_are_recorded(fake):
    fake.fail_next(("429", 1), ("529",))
    reply = call(fake)
    retries = reply.receipt.detail["retries"]
    assert len(retries) == 2 and retries[0].startswith("429") and "waited 1 s" in retries[0]
    assert retries[1].startswith("529")
    assert reply.receipt.duration_seconds >= 1.0 and len(fake.requests) == 3


def test_a_malformed_response_is_retried(fake):
    fake.fail_next(("malformed",))
    reply = call(fake)
    assert "malformed response" in reply.receipt.detail["retries"][0]


def test_a_persistent_failure_fails_the_call_with_a_receipt(fake):
    fake.fail_next(*[("529", 0)] * 6)
    with pytest.raises(LLMError, match="529 6 times") as raised:
        call(fake)
    assert raised.value.receipt.error and raised.value.receipt.exit_code is None


def test_a_cancelled_step_stops_waiting_for_a_retry(fake):
    fake.fail_next(("429", 30))
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    with pytest.raises(LLMError, match="cancelled") as raised:
        call(fake, cancel=cancel)
    assert raised.value.receipt.duration_seconds < 10


def test_an_admin_price_override_wins_and_is_named_in_the_version():
    PriceOverride.objects.create(model_prefix="fake-sonnet", input=1, output=2, cache_write=3, cache_read=4)
    price, version = price_for("fake-sonnet-20261201")
    assert (price.input, price.output) == (1, 2) and version.endswith("+override")
    assert cost_microusd(price, Usage(10, 10, 10, 10)) == 100


def test_worst_case_covers_any_real_cost():
    price, _ = price_for("claude-sonnet-4-5")
    usage = Usage(input_tokens=100, output_tokens=50, cache_write_tokens=900, cache_read_tokens=0)
    assert worst_case_microusd(price, 1000, 50) >= cost_microusd(price, usage)
    assert price_for("no-such-model")[0] is None


HOLDER = """
import django, json, os, sys, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crucible.settings")
django.setup()
from runtime_app.llm import account_slot
with account_slot("team account", int(sys.argv[1])) as held:
    started = time.time()
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    print(json.dumps([started, time.time()]), flush=True)
"""


def holders(tmp_path, count: int, limit: int, hold: float) -> list[subprocess.Popen]:
    env = {**os.environ, "CRUCIBLE_DATA_DIR": str(tmp_path)}
    return [subprocess.Popen([sys.executable, "-c", HOLDER, str(limit), str(hold)], env=env, cwd=REPO_ROOT,
                             stdout=subprocess.PIPE, text=True) for _ in range(count)]


@pytest.mark.parametrize("limit", [1, 2])
def test_calls_in_flight_per_account_are_limited_across_worker_processes(tmp_path, limit):
    processes = holders(tmp_path, 4, limit, 0.4)
    spans = [json.loads(process.communicate(timeout=60)[0].splitlines()[-1]) for process in processes]
    moments = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    in_flight = peak = 0
    for _, change in moments:
        in_flight += change
        peak = max(peak, in_flight)
    assert peak <= limit
    assert max(end for _, end in spans) - min(start for start, _ in spans) >= 0.4 * 4 / limit * 0.9


def test_a_killed_worker_frees_its_account_slot(tmp_path, settings):
    from runtime_app.llm import account_slot

    settings.DATA_DIR = tmp_path
    (holder,) = holders(tmp_path, 1, 1, 300)
    assert holder.stdout.readline().strip() == "held"
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    with account_slot("team account", 1, cancel) as held:
        assert held is False  # the slot is taken: waiting ended with the cancel
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with account_slot("team account", 1) as held:
        assert held is True
