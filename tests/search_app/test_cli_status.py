"""`manage.py search status` lists searches and shows one in 100 columns with its page and the
next command; notification emails never land in a command's output (`--json` stays one document)."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model
from django.core.mail import get_connection, send_mail
from django.core.management import call_command

from runtime_app.selectors import page_url
from search_app import services
from search_app.models import Approval
from tests.helpers import REPO_ROOT, subprocess_env
from tests.search_app.runs import frozen, plan_repo, spec_text

pytestmark = pytest.mark.django_db(transaction=True)


def status(*args: str, user: str = "owner") -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("search", "status", *args, "--user", user, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def two_searches(finished, personas, tmp_path):
    """The finished search (winner cand_002, awaiting approval) and a newer one frozen, not started."""
    search, winner, _ = finished
    waiting = frozen(personas, tmp_path, {"cand_001": 3}, name="later-search", population=2, rounds=[2, 1])
    return search, winner, waiting


def test_status_without_an_id_lists_the_searches_one_can_see_newest_first(two_searches):
    search, _, waiting = two_searches
    out, _ = status()
    rows = out.splitlines()
    assert all(word in rows[0] for word in ("id", "project", "status", "round/phase", "winner", "started"))
    listed = [row.split()[0] for row in rows[2:] if row.startswith("search-")]
    assert listed == [waiting.search_id, search.search_id]
    assert "not started" in rows[2] and "alpha" in rows[2]
    assert "awaiting approval" in " ".join(rows[3:]) and "cand_002" in rows[3]  # the one status of the pages
    assert max(len(row) for row in rows) <= 100


def test_status_filters_the_list_and_prints_it_as_one_json_document(two_searches, personas):
    search, _, waiting = two_searches
    out, _ = status("--status", "finished")
    assert search.search_id in out and waiting.search_id not in out
    out, _ = status("--outcome", "undecided", "--limit", "5")
    assert waiting.search_id in out and search.search_id not in out
    out, _ = status("--limit", "1")
    assert waiting.search_id in out and search.search_id not in out and "1 of 2 searches" in out
    assert "No searches match these filters." in status("--mine", user="member")[0]
    assert "No searches yet." in status(user="outsider")[0]  # project alpha's are not theirs to see
    listed = json.loads(status("--json")[0])
    assert [item["search_id"] for item in listed] == [waiting.search_id, search.search_id]
    assert listed[1]["winner"] == "cand_002" and listed[1]["status"] == "awaiting approval (0 of 1 approval)"
    assert listed[1]["url"] == page_url(f"/searches/{search.search_id}/")
    with pytest.raises(SystemExit):
        status("--project", "beta")  # the owner is no member of beta


def test_status_of_a_finished_search_fits_100_columns_and_ends_with_its_page_and_the_next_command(
        two_searches, approver):
    search, winner, _ = two_searches
    out, _ = status(search.search_id)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    assert f"page: {page_url(f'/searches/{search.search_id}/')}" in lines
    assert lines[-2:] == [f"  manage.py search approve {search.search_id} cand_002 \\",
                          f"      --patch-sha256 {winner.patch_sha256}"]
    services.approval_record(approver, winner, Approval.Decision.APPROVE, winner.patch_sha256, "")
    out, _ = status(search.search_id)
    assert out.splitlines()[-1] == f"  manage.py search merge {search.search_id}"
    assert "approved (1 of 1 approval; ready to merge) — winner cand_002" in " ".join(out.split())


def test_the_console_email_backend_logs_an_email_and_writes_nothing_to_standard_output(capsys, caplog):
    connection = get_connection("runtime_app.mail.LogEmailBackend")
    with caplog.at_level(logging.INFO, logger="crucible.mail"):
        send_mail("[Crucible] a winner waits", "Open http://host/searches/x/", "crucible@localhost",
                  ["ada@example.com"], connection=connection)
    assert capsys.readouterr().out == ""
    assert "email to ada@example.com from crucible@localhost: [Crucible] a winner waits" in caplog.text
    assert "http://host/searches/x/" in caplog.text


def test_run_json_stays_one_document_when_a_notification_email_is_sent(demo, tmp_path):
    get_user_model().objects.filter(username="admin").update(email="admin@example.com")
    repo = plan_repo(tmp_path / "repo", {"cand_001": 5})
    spec = tmp_path / "spec.toml"
    spec.write_text(spec_text(population=2, rounds=[2, 1]))
    data = tmp_path / "data"
    command = [sys.executable, "manage.py", "search", "run", str(spec), "--repo", str(repo), "--json"]
    done = subprocess.run(command, cwd=REPO_ROOT, env=subprocess_env(CRUCIBLE_DATA_DIR=str(data),
                                                             CRUCIBLE_EMAIL_BACKEND="console"),
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)  # one document: no email inside it
    assert report["winner"] == "cand_001"
    assert "1 notification email logged to" in done.stderr.decode()
    mail = (data / "logs" / "mail.log").read_text()
    assert "email to admin@example.com" in mail and f"/searches/{report['search_id']}/" in mail
