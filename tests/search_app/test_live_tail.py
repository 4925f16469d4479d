"""A candidate's page follows what runs for it: the live tail endpoint shows a running command's
output as it comes, then its receipt; only the project's members see it."""

from __future__ import annotations

import threading
import time

import pytest
from django.urls import reverse

from runtime_app import services as runtime_services
from runtime_app.models import Receipt
from search_app import services
from tests.helpers import login, text_of

pytestmark = pytest.mark.django_db(transaction=True)
WAIT_SECONDS = 60  # generous for a loaded machine; passing tests never wait this long
# A gate-like command: prints, waits for the test to write `go` into its tree, prints again.
SLOW = "echo checking-$((6*7)); while [ ! -e go ]; do sleep 0.05; done; echo done-$((2*50))"


def live_url(search, candidate_id: str, since: int | str = 0) -> str:
    return reverse("candidate_live_tail", args=[search.search_id, candidate_id]) + f"?since={since}"


def poll(client, url: str, wanted: str) -> str:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        response = client.get(url)
        assert response.status_code == 200
        if wanted in text_of(response):
            return text_of(response)
        time.sleep(0.1)
    pytest.fail(f"the live tail never showed {wanted!r}; last: {text_of(response)}")


@pytest.fixture
def running(personas, small_search):
    services.search_start(personas.owner, small_search, enqueue=False)
    return small_search


def test_a_running_command_s_output_shows_on_its_candidate_s_page_then_its_receipt(
    running, personas, data_dir
):
    candidate = running.candidates.get(candidate_id="cand_001")
    member = login(personas.member)
    page = text_of(member.get(reverse("candidate_detail", args=[running.search_id, "cand_001"])))
    assert 'id="live-tail"' in page and "hx-trigger" in page  # a running search's candidate is followed
    since = max(Receipt.objects.filter(subject_type="candidate", subject_id=candidate.pk)
                .values_list("pk", flat=True), default=0)
    tree = data_dir / "worktrees" / "live"
    tree.mkdir(parents=True)
    outcome: dict = {}

    def gate() -> None:
        from django.db import connection

        try:
            outcome["receipt"] = runtime_services.command_run(
                SLOW, cwd=tree, timeout=WAIT_SECONDS, project=running.project,
                subject=("candidate", candidate.pk), label="cand_001 gate 1")
        finally:
            connection.close()

    thread = threading.Thread(target=gate)
    thread.start()
    try:
        shown = poll(member, live_url(running, "cand_001", since), "checking-42")
        assert "Running now:" in shown and f"<code class=\"live-command-text\">{SLOW}</code>" in shown
        assert "cand_001 gate 1" in shown
        assert "done-100" not in shown and "hx-trigger" in shown
        # The page itself, loaded now, shows it too.
        page = text_of(member.get(reverse("candidate_detail", args=[running.search_id, "cand_001"])))
        assert "Running now:" in page
    finally:
        (tree / "go").write_text("")
        thread.join(WAIT_SECONDS)
    receipt = outcome["receipt"]
    shown = poll(member, live_url(running, "cand_001", since), f'id="receipt-{receipt.pk}"')
    assert "Running now:" not in shown and "done-100" in shown  # the receipt's own output
    assert "hx-trigger" in shown  # the search still runs: the box keeps following cand_001


def test_outsiders_and_bad_addresses_get_a_clear_answer(running, personas):
    url = live_url(running, "cand_001")
    assert login(personas.outsider).get(url).status_code == 404
    anonymous = login(personas.member)
    anonymous.logout()
    response = anonymous.get(url)
    assert response.status_code == 302 and "/login/" in response["Location"]
    member = login(personas.member)
    assert member.get(live_url(running, "cand_999")).status_code == 404
    elsewhere = live_url(running, "cand_001").replace(running.search_id, "search-nope")
    assert member.get(elsewhere).status_code == 404
    bad = member.get(live_url(running, "cand_001", "'; drop"))
    assert bad.status_code == 400 and "since must be a receipt id" in bad.content.decode()
    assert member.post(url).status_code == 405


def test_a_finished_search_s_candidate_page_does_not_poll(finished, personas):
    search, winner, _ = finished
    page = text_of(login(personas.member).get(reverse("candidate_detail", args=[search.search_id,
                                                                                winner.candidate_id])))
    assert "hx-trigger" not in page.split('id="live-tail"')[1].split(">")[0]
    response = login(personas.member).get(live_url(search, winner.candidate_id, 0))
    assert response.status_code == 200 and "hx-trigger" not in text_of(response)
