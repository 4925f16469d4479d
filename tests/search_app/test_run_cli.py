"""`manage.py search run|status|receipts|cancel` as real subprocesses, and the demo search.

The demo test runs the scripted-writer demo exactly as a user would after `make run`
(`manage.py search run search_app/spec_templates/demo-scripted.toml --repo …`) and checks
that the runtime picks the fast correct candidate and explains every other fate.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from runtime_app.metrics import DESCRIPTOR_LABEL
from runtime_app.models import Repository
from runtime_app.selectors import page_url
from search_app.models import Search, SearchRun
from search_app.spec import RESULTS_WARNING
from tests.helpers import REPO_ROOT, subprocess_env
from tests.search_app.runs import plan_repo, spec_text

pytestmark = pytest.mark.django_db(transaction=True)
DEMO_SPEC = REPO_ROOT / "search_app" / "spec_templates" / "demo-scripted.toml"


def search(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", "search", *args], cwd=REPO_ROOT,
                          env=subprocess_env(), capture_output=True, timeout=timeout)


def test_run_prints_the_outcome_and_status_and_receipts_agree(demo, tmp_path):
    repo = plan_repo(tmp_path / "repo", {"cand_001": 5, "cand_002": 9, "cand_003": "broken"})
    spec = tmp_path / "spec.toml"
    spec.write_text(spec_text(population=3, rounds=[3, 1]))
    done = search("run", str(spec), "--repo", str(repo), "--json")
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)
    assert f"Started {report['search_id']}: http" in done.stderr.decode()  # stdout stays JSON
    # Its spec declares no `score.results`: the JSON says so, and so does stderr.
    assert report["warnings"] == [RESULTS_WARNING]
    assert f"warning: {RESULTS_WARNING}" in " ".join(done.stderr.decode().split())
    assert (report["status"], report["outcome"], report["winner"]) == ("finished", "winner", "cand_002")
    by_id = {c["candidate_id"]: c for c in report["candidates"]}
    assert "gate 1" in by_id["cand_003"]["reason"] and by_id["cand_002"]["receipts"]
    # Its score command prints the metric, so every score says code it ran could have forged it.
    assert (report["metric"], report["metric_source"]) == ("value", DESCRIPTOR_LABEL)
    assert {c["metric_source"] for c in report["candidates"]} == {DESCRIPTOR_LABEL}

    status = json.loads(search("status", report["search_id"], "--json").stdout)
    assert (status["winner"], status["metric_source"]) == ("cand_002", DESCRIPTOR_LABEL)
    table = search("status", report["search_id"]).stdout.decode()
    assert (f"{report['search_id']} plan-search: awaiting approval (0 of 1 approval) — winner cand_002"
            in " ".join(table.split()))
    assert f"score: value, {DESCRIPTOR_LABEL}" in " ".join(table.split())
    receipts = search("receipts", report["search_id"], "--candidate", "cand_002").stdout.decode().splitlines()
    assert len(receipts) == len(by_id["cand_002"]["receipts"])
    assert any("cand_002 writer" in line for line in receipts)
    assert all(line.split()[1] == "cand_002" for line in receipts)
    # Cancelling a finished search changes nothing and says so.
    assert search("cancel", report["search_id"]).stdout.decode().strip().endswith(
        "awaiting approval (0 of 1 approval)")


def test_the_live_display_ends_with_the_outcome_table(demo, tmp_path):
    repo = plan_repo(tmp_path / "repo", {"cand_001": 4})
    spec = tmp_path / "spec.toml"
    spec.write_text(spec_text(population=2, rounds=[2, 1]))
    done = search("run", str(spec), "--repo", str(repo))
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    search_id = Search.objects.get().search_id
    assert out.splitlines()[0] == f"Started {search_id}: " + page_url(f"/searches/{search_id}/")
    # Its spec declares no `score.results`; the warning wraps to fit 100 columns.
    assert " ".join(out.split("\n", 1)[1].split()).startswith(f"warning: {RESULTS_WARNING}")
    assert "awaiting approval (0 of 1 approval) — winner cand_001" in " ".join(out.split())
    assert "changed nothing" in " ".join(out.split())
    assert max(len(line) for line in out.splitlines()) <= 100  # piped: the table fits 100 columns
    # The summary ends with the page and the command that approves the winner's exact patch.
    sha = Search.objects.get().candidates.get(candidate_id="cand_001").patch_sha256
    assert f"page: {page_url(f'/searches/{search_id}/')}" in out
    assert out.rstrip().endswith(f"manage.py search approve {search_id} cand_001 \\\n"
                                 f"      --patch-sha256 {sha}")
    assert f"score: value, {DESCRIPTOR_LABEL}" in " ".join(out.split())


@pytest.mark.parametrize("action", ["status", "receipts", "cancel"])
def test_an_unknown_search_is_one_line_and_exit_1(demo, action):
    done = search(action, "search-0000000000000000")
    assert done.returncode == 1
    assert done.stderr.decode().strip() == "no search 'search-0000000000000000' that admin can see"


def test_the_demo_picks_the_fast_correct_candidate_and_explains_every_other(demo, tmp_path, settings):
    from runtime_app.management.commands.crucible_setup import Command

    settings.DATA_DIR = tmp_path
    repo = Command()._demo_repository()
    done = search("run", str(DEMO_SPEC), "--repo", str(repo), "--json", timeout=600)
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)
    fate = {c["candidate_id"]: c for c in report["candidates"]}
    fates = "\n".join(f"{c['candidate_id']}: {c['reason']}" for c in report["candidates"])
    # cand_001 and cand_011 wrote the same sieve: evaluated once, credited to the earlier one.
    assert report["outcome"] == "winner" and report["winner"] == "cand_001", fates
    assert "identical patch to cand_001" in fate["cand_011"]["reason"]
    assert "gate 1 `python certificate.py`" in fate["cand_003"]["reason"]  # faster but wrong
    assert "patch refused at policy" in fate["cand_004"]["reason"]  # touches the tests
    assert "not clearly better than the baseline" in fate["cand_005"]["reason"]  # slower
    assert "gate 1" in fate["cand_006"]["reason"]  # breaks the build
    assert "gate 2" in fate["cand_008"]["reason"]  # hard-coded answer, caught by a hidden test
    assert "changed nothing" in fate["cand_010"]["reason"]
    # The fake score cand_007 prints was never read as a score; printed beside the result, it
    # makes its trial's results differ from the baseline's, and that eliminates it.
    fake = fate["cand_007"]
    assert "its results differ from the baseline's in the same block" in fake["reason"], fates
    assert 'stdout line 1: baseline `{\'bound\': 20000' in fake["reason"], fates
    assert report["warnings"] == []
    assert report["review"]["verdict"] == "approve"


def test_a_dry_run_prints_the_forecast_and_freezes_and_starts_nothing(demo, tmp_path):
    repo = plan_repo(tmp_path / "repo", {"cand_001": 5})
    spec = tmp_path / "spec.toml"
    spec.write_text(spec_text(population=3, rounds=[3, 1]))
    done = search("run", str(spec), "--repo", str(repo), "--dry-run")
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    assert out.startswith("plan-search: forecast — nothing was started\n")
    # 3 writers; the baseline's gate, 3 candidates' and 1–3 replays'; trials in 2 blocks (up to 6).
    assert re.search(r"^  0 +3 +3 +4 +8–24$", out, re.M), out
    assert re.search(r"^  all +3 +5–7 +16–72$", out, re.M), out
    assert "Command writers report no cost" in out and "no finished search of this repository yet" in out
    assert not Search.objects.exists() and not SearchRun.objects.exists() and not Repository.objects.exists()
    as_json = json.loads(search("run", str(spec), "--repo", str(repo), "--dry-run", "--json").stdout)
    assert as_json["search_id"] is None and as_json["trial_runs"] == {"low": 16, "high": 72}
    missing = search("run", str(spec), "--dry-run")
    assert missing.returncode == 1 and "give the repository with --repo PATH" in missing.stderr.decode()


def test_a_dry_run_of_a_frozen_search_reads_the_repositorys_finished_searches(demo, tmp_path):
    repo = plan_repo(tmp_path / "repo", {"cand_001": 5})
    spec = tmp_path / "spec.toml"
    spec.write_text(spec_text(population=2, rounds=[2, 1]))
    assert search("run", str(spec), "--repo", str(repo), "--json").returncode == 0
    spec.write_text(spec_text(population=2, rounds=[2, 1], name="again"))
    frozen = search("freeze", str(spec), "--repo", str(repo), "--ref", "HEAD").stdout.decode()
    search_id = frozen.split()[2]
    done = search("run", search_id, "--dry-run")
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    assert out.startswith(f"again {search_id}: forecast — nothing was started\n")
    assert "From 1 past search of this repository, each step's measured wall time" in out
    assert not SearchRun.objects.filter(search__search_id=search_id).exists()
    assert search("run", "search-0000000000000000", "--dry-run").returncode == 1
    # Without --dry-run the frozen search runs here to its outcome.
    ran = json.loads(search("run", search_id, "--json").stdout)
    assert (ran["search_id"], ran["status"], ran["winner"]) == (search_id, "finished", "cand_001")
