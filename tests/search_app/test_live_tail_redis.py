"""A candidate's page on the web node follows a command that runs on a worker on another machine:
with REDIS_URL set, the page's poll reaches the worker as a watch and the worker's output comes
back through Redis, redacted, then its receipt (through the database). The worker is a real
subprocess with its own data dir (tests/runtime_app/test_tails_redis.py)."""

from __future__ import annotations

import dataclasses

import pytest
from django.urls import reverse

from runtime_app.models import Receipt
from search_app import services
from tests.helpers import login
from tests.runtime_app.test_tails_redis import SECRET, Worker
from tests.search_app.test_live_tail import live_url, poll

pytestmark = pytest.mark.django_db(transaction=True)
# A gate-like command on the worker: prints a secret, waits for `go` in its tree, prints again.
SLOW = (f"echo checking-$((6*7)); echo 'the key is {SECRET}'; while [ ! -e go ]; do sleep 0.05; done; "
        "echo done-$((2*50))")


def test_a_command_on_a_worker_shows_on_the_web_node_s_page_then_its_receipt(
    personas, small_search, redis_url, settings, tmp_path
):
    url = redis_url.rsplit("/", 1)[0] + "/14"  # its own database, as the other Redis tests
    settings.CONFIG = dataclasses.replace(settings.CONFIG, redis_url=url)
    services.search_start(personas.owner, small_search, enqueue=False)
    candidate = small_search.candidates.get(candidate_id="cand_001")
    since = max(Receipt.objects.filter(subject_type="candidate", subject_id=candidate.pk)
                .values_list("pk", flat=True), default=0)
    member = login(personas.member)
    worker = Worker(tmp_path, url, ("candidate", candidate.pk), command=SLOW, label="cand_001 gate 1")
    try:
        shown = poll(member, live_url(small_search, "cand_001", since), "checking-42")
        assert "Running now:" in shown and "cand_001 gate 1" in shown
        assert "the key is [redacted]" in shown and SECRET not in shown and "done-100" not in shown
        assert not (worker.data_dir / "tails").exists() and not (settings.DATA_DIR / "tails").exists()
        receipt = Receipt.objects.get(pk=worker.finish())
    finally:
        worker.stop()
    shown = poll(member, live_url(small_search, "cand_001", since), f'id="receipt-{receipt.pk}"')
    assert "Running now:" not in shown and "done-100" in shown
    assert reverse("candidate_live_tail", args=[small_search.search_id, "cand_001"]) in shown
