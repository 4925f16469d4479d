"""Fair measurement in real searches: blocks in the exclusive lane, adaptive blocks at a
contested cut, identical patches credited to their earliest candidate, replay by interval."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from django.conf import settings

from runtime_app.metrics import DESCRIPTOR_LABEL
from runtime_app.models import Receipt
from search_app import execution, selectors, services
from search_app.measurement import block_order
from search_app.models import SearchRun, Step
from tests.gitrepo import repo_create
from tests.helpers import login, text_of
from tests.search_app.hostspecs import roots
from tests.search_app.runs import fates, frozen, plan_repo, run_inline, spec_text, wait_for_end
from tests.search_app.test_run_celery import kill, start_worker

pytestmark = pytest.mark.django_db(transaction=True)


def _trials(search):
    return Receipt.objects.filter(subject_type="candidate", label__contains=" trial ",
                                  subject_id__in=search.candidates.values("pk"))


def test_each_block_runs_every_member_once_in_the_order_its_seed_gives(personas, tmp_path, data_dir):
    search = frozen(personas, tmp_path, {"cand_001": 5, "cand_002": 9, "cand_003": 7}, population=3,
                    rounds=[3, 1], trials=3)
    run_inline(personas, search)
    for block in range(3):
        ran = sorted(_trials(search).filter(detail__round=0, detail__block=block),
                     key=lambda receipt: receipt.detail["position"])
        members = [receipt.detail["measures"] for receipt in ran]
        assert members == block_order(search.search_id, 0, block, members)
        assert sorted(members) == ["baseline", "cand_001", "cand_002", "cand_003"]
        assert all(receipt.detail["lane"]["mode"] == "exclusive" for receipt in ran)


def test_candidates_that_cannot_be_told_apart_at_the_cut_get_more_blocks_then_the_tie_breakers_decide(
    personas, tmp_path, data_dir
):
    # Same score, different patches: one has an extra comment line (more diff lines).
    plan = {"cand_001": {"value": 6, "note": "a longer patch"}, "cand_002": 6, "cand_003": 9}
    search = frozen(personas, tmp_path, plan, population=3, rounds=[3, 2, 1], trials=2, max_trials=5)
    run = run_inline(personas, search)
    assert run.winner.candidate_id == "cand_003"
    round0 = {c.candidate_id: len(c.blocks["0"]) for c in search.candidates.all()}
    # Round 0 keeps two of three: the cut falls inside the tie of cand_001 and cand_002, which
    # get blocks up to max_trials (the baseline with them); cand_003, clearly ahead, does not.
    assert round0["cand_001"] == round0["cand_002"] == 5 and round0["cand_003"] == 2
    assert round0["baseline"] == 5
    parts = Step.objects.filter(search=search, kind="measure", round=0).order_by("part")
    assert [step.plan["blocks"] for step in parts] == [[0, 2], [2, 4], [4, 5]]
    assert all("cand_003" not in step.plan["members"] for step in parts[1:])
    reason = fates(search)["cand_001"][1]
    assert "tied with cand_002" in reason and "tie-breakers (diff_lines)" in reason
    assert "not in the best 2" not in fates(search)["cand_002"][1]  # fewer diff lines: kept


def test_clearly_separated_candidates_get_no_extra_blocks(personas, tmp_path, data_dir):
    search = frozen(personas, tmp_path, {"cand_001": 5, "cand_002": 9, "cand_003": 7}, population=3,
                    rounds=[3, 2, 1], trials=2, max_trials=6)
    run_inline(personas, search)
    assert Step.objects.filter(search=search, kind="measure").count() == 3  # one per round
    assert not Step.objects.filter(search=search, kind="measure", part__gt=0).exists()


def test_identical_patches_are_credited_to_the_earliest_candidate_whichever_finishes_first(
    personas, tmp_path, data_dir
):
    # cand_001's writer is slow, so cand_002's identical patch is ready first.
    plan = {"cand_001": {"value": 9, "delay": 3}, "cand_002": 9, "cand_003": 4}
    search = frozen(personas, tmp_path, plan, population=3, rounds=[3, 1])
    run = run_inline(personas, search)
    first, second = (search.candidates.get(candidate_id=cid) for cid in ("cand_001", "cand_002"))
    assert first.patch_sha256 == second.patch_sha256
    assert run.winner.candidate_id == "cand_001"
    assert second.state == "eliminated" and second.duplicate_of_id == first.pk
    assert second.reason.startswith("identical patch to cand_001")
    # The copy was never evaluated: no gate, no trial.
    assert not Step.objects.filter(search=search, candidate=second, kind="evaluate").exists()
    assert not _trials(search).filter(subject_id=second.pk).exists()
    assert second.score is None


# One patch for two candidates that scores 9 inside cand_001's trees and 7 elsewhere, so the copy
# cand_001's refinement makes would rank above cand_002's original if it were ever scored.
CLONE_WRITER = '''import os, pathlib, sys, time
sys.stdin.read()
CLONE = "def answer():\\n    import os\\n    return 9 if 'cand_001' in os.getcwd() else 7\\n"
cid, refining = os.environ["CRUCIBLE_CANDIDATE_ID"], os.environ.get("CRUCIBLE_REFINE") == "1"
if cid == "cand_002" and refining:
    time.sleep(2)  # cand_001's refinement lands while this writer still runs
    code = CLONE if {keep} else "def answer():\\n    return 8\\n"
elif cid == "cand_002" or (cid == "cand_001" and refining):
    code = CLONE
else:
    code = "def answer():\\n    return %d\\n" % (5 if cid == "cand_001" else 3)
pathlib.Path("code/answer.py").write_text(code)
'''


def _clone_search(personas, tmp_path, *, keep: bool):
    """cand_002 writes the clone in round 0; cand_001 writes 5, then refines to the clone in round 1
    while cand_002's writer refines (keeping the clone, or changing it to 8)."""
    repo = repo_create(tmp_path / "clone", {
        "code/answer.py": "def answer():\n    return 2\n",
        "tests/test_answer.py": "def test_answer():\n    assert True\n",
        "scripts/writer.py": CLONE_WRITER.format(keep=keep),
        "plan.json": "{}",
    })
    # The clone reads its working directory to score differently per tree: the reviewer rejects
    # that (it tells one tree from another), so here its verdict is advice; the grouping is tested.
    text = spec_text(population=3, rounds=[3, 2, 1], refine=True, review="advisory")
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    return search, run_inline(personas, search)


def test_a_refinement_reproducing_a_kept_patch_is_credited_to_its_earlier_candidate_though_it_scores_better(
    personas, tmp_path, data_dir
):
    search, run = _clone_search(personas, tmp_path, keep=True)
    copy, original = (search.candidates.get(candidate_id=cid) for cid in ("cand_001", "cand_002"))
    assert copy.patch_sha256 == original.patch_sha256 and (copy.patch_round, original.patch_round) == (1, 0)
    assert run.winner.candidate_id == "cand_002"
    assert copy.state == "eliminated" and copy.duplicate_of_id == original.pk
    assert copy.reason.startswith("identical patch to cand_002")
    # The copy was never evaluated again: no round 1 gate, no trial of its clone.
    assert not Step.objects.filter(search=search, candidate=copy, kind="evaluate", round=1).exists()
    assert not _trials(search).filter(subject_id=copy.pk, label__contains=" r1 ").exists()


def test_a_refinement_waits_for_a_refining_writer_with_its_patch_and_stands_alone_if_that_one_changes(
    personas, tmp_path, data_dir
):
    search, run = _clone_search(personas, tmp_path, keep=False)
    copy = search.candidates.get(candidate_id="cand_001")
    assert copy.duplicate_of_id is None and copy.patch_round == 1
    assert run.winner.candidate_id == "cand_001", fates(search)
    assert Step.objects.filter(search=search, candidate=copy, kind="evaluate", round=1).exists()


DRIFT_WRITER = '''import pathlib, sys
sys.stdin.read()
pathlib.Path("code/answer.py").write_text(
    "def answer():\\n    return 2 * int(open({flag!r}).read())\\n")
'''


def _drifting_search(personas, tmp_path, settings, comparison: str):
    """The baseline's answer() is a number read from a file at run time; the candidate's is
    twice it: its absolute figure moves with the file, its ratio to the baseline does not."""
    flag = tmp_path / "flags" / "drift-flag"  # a read path of the gates and the score command
    flag.parent.mkdir()
    flag.write_text("50")
    roots(settings, read_roots=[flag.parent])
    repo = repo_create(tmp_path / "drift", {
        "code/answer.py": f"def answer():\n    return int(open({str(flag)!r}).read())\n",
        "tests/test_answer.py": "def test_answer():\n    assert True\n",
        "scripts/writer.py": DRIFT_WRITER.format(flag=str(flag)),
        "plan.json": "{}",
    })
    text = spec_text(population=2, rounds=[2, 1], comparison=comparison, read_paths=(str(flag),))
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    while SearchRun.objects.get(search=search).phase == "rounds":
        for step_pk in services.search_advance(search.pk):
            if Step.objects.get(pk=step_pk).kind != "replay":
                services.step_execute(step_pk, "test")
    flag.write_text("30")  # the machine is 40% "faster" for everyone at replay time
    return services.search_run_inline(search)


def test_a_true_winner_passes_a_replay_whose_absolute_figure_drifts_with_the_baseline(
    personas, tmp_path, data_dir, settings
):
    run = _drifting_search(personas, tmp_path, settings, "paired")
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_001"
    replay = Step.objects.get(search=run.search, kind="replay")
    assert replay.result["passed"] and "replayed 2× baseline" in replay.result["why"]


def test_the_same_drift_fails_a_replay_that_compares_absolute_values(personas, tmp_path, data_dir, settings):
    run = _drifting_search(personas, tmp_path, settings, "absolute")
    assert run.outcome == "NONE"
    assert "replayed median 60 moved more than 25 from 100" in fates(run.search)["cand_001"][1]


def _one_noisy_replay_block(monkeypatch, search, candidate_id: str):
    """Once the rounds are over, the candidate's first replay trial reads a tenth of its value:
    one block of noise, as a busy machine gives (its other trials are measured as they are)."""
    real = execution.metric_read
    noisy = []

    def read(trial, metric, metrics_file, **options):
        reading = real(trial, metric, metrics_file, **options)
        replaying = SearchRun.objects.get(search=search).phase == "replay"
        if replaying and not noisy and trial.detail.get("measures") == candidate_id and reading.counted:
            noisy.append(trial.pk)
            return dataclasses.replace(reading, value=reading.value / 10)
        return reading

    monkeypatch.setattr(execution, "metric_read", read)
    return noisy


def test_a_winner_whose_replay_one_noisy_block_leaves_undecided_gets_more_blocks_and_passes(
    personas, tmp_path, data_dir, monkeypatch
):
    search = frozen(personas, tmp_path, {"cand_001": 10, "cand_002": 3}, population=2, rounds=[2, 1],
                    trials=3, confidence=0.95, max_trials=12)
    noisy = _one_noisy_replay_block(monkeypatch, search, "cand_001")
    run = run_inline(personas, search)
    assert noisy, "the replay never measured cand_001"
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_001", fates(search)
    first, more = Step.objects.filter(search=search, kind="replay").order_by("id")
    assert first.candidate.candidate_id == more.candidate.candidate_id == "cand_001"
    # Six blocks at 95 %: the noisy one is the range's low end, below the baseline's 1.
    assert first.plan["blocks"] == [0, 6] and first.result["passed"] is None
    assert "replay undecided: replayed" in first.result["why"]
    assert "not yet told apart from the baseline; 6 more block(s)" in first.result["why"]
    # Twelve: the sign test's interval leaves the one noisy block out, and it beats the baseline.
    assert more.plan["blocks"] == [6, 12] and more.plan["extends"] == first.pk
    assert more.result["passed"] and "replayed 5× baseline [5, 5]" in more.result["why"]
    # The extension ran no gates again, and the winner's evidence is both steps' receipts.
    assert not Receipt.objects.filter(pk__in=more.result["receipts"], label__contains=" gate ").exists()
    assert Receipt.objects.filter(pk__in=first.result["receipts"], label__contains=" gate ").exists()
    evidence = selectors.winner_replay(search)["receipts"]
    assert set(first.result["receipts"]) | set(more.result["receipts"]) == set(evidence)
    assert noisy[0] in evidence


def _replay_reads(monkeypatch, search, value: float) -> None:
    """Every counted replay trial of cand_001 reads `value` from now on (the baseline's read 2)."""
    real = execution.metric_read

    def read(trial, metric, metrics_file, **options):
        reading = real(trial, metric, metrics_file, **options)
        if SearchRun.objects.get(search=search).phase == "replay" and \
                trial.detail.get("measures") == "cand_001" and reading.counted:
            return dataclasses.replace(reading, value=value)
        return reading

    monkeypatch.setattr(execution, "metric_read", read)


def _won_five_times(personas, tmp_path):
    """cand_001 wins with 5x the baseline (10 against 2), cand_002 is next with 1.5x."""
    return frozen(personas, tmp_path, {"cand_001": 10, "cand_002": 3}, population=2, rounds=[2, 1],
                  trials=3, confidence=0.95, max_trials=12)


def test_a_replay_clearly_worse_than_the_baseline_gets_no_more_blocks(personas, tmp_path, data_dir,
                                                                       monkeypatch):
    search = _won_five_times(personas, tmp_path)
    _replay_reads(monkeypatch, search, 1)
    run = run_inline(personas, search)
    assert Step.objects.filter(search=search, kind="replay", candidate__candidate_id="cand_001").count() == 1
    assert "replay failed: replayed 0.5× baseline" in fates(search)["cand_001"][1]
    assert run.winner.candidate_id == "cand_002"  # the next best, replayed in its turn


def test_a_replay_within_the_drift_of_its_win_keeps_its_winner(personas, tmp_path, data_dir, monkeypatch):
    search = _won_five_times(personas, tmp_path)
    _replay_reads(monkeypatch, search, 9.6)  # 4.8x against the 5x it won with: a loaded machine's drift
    run = run_inline(personas, search)
    replay = Step.objects.get(search=search, kind="replay", candidate__candidate_id="cand_001")
    assert run.winner.candidate_id == "cand_001" and "within 10 %" in replay.result["why"]


def test_a_win_the_rounds_inflated_fails_its_replay_though_it_still_beats_the_baseline(
        personas, tmp_path, data_dir, monkeypatch):
    search = _won_five_times(personas, tmp_path)
    _replay_reads(monkeypatch, search, 6)  # 3x against the 5x it won with
    run = run_inline(personas, search)
    fate = fates(search)["cand_001"][1]
    assert run.winner.candidate_id == "cand_002", fate
    assert "replay failed" in fate and "clearly worse than it won with" in fate


def test_a_trial_never_overlaps_another_command_with_two_workers(personas, tmp_path):
    """Two searches at once, driven by two real Celery worker processes (three slots each): the
    receipts show every timing trial alone on the host, while gates and writers overlap."""
    if settings.CONFIG.redis_url:
        pytest.skip("REDIS_URL is set: this test uses the embedded broker the workers share")
    plan = {f"cand_00{n}": {"value": 10 + n, "delay": 0.5} for n in range(1, 6)}
    searches = []
    for name in ("lane-a", "lane-b"):
        repo = plan_repo(tmp_path / f"repo-{name}", plan)
        text = spec_text(population=5, rounds=[5, 2, 1], concurrency=3, name=name, trials=2)
        searches.append(services.search_freeze(personas.owner, personas.alpha, text, "HEAD",
                                               repository_path=str(repo)))
    workers = [start_worker(tmp_path, number) for number in (0, 1)]
    try:
        for search in searches:
            services.search_start(personas.owner, search)
        for search in searches:
            assert wait_for_end(search, timeout=300).outcome == "winner"
    finally:
        for worker in workers:
            kill(worker)
    # Patch applies run git on the host: they count as commands the trials must not overlap.
    commands = list(Receipt.objects.filter(kind__in=["command", "apply"]).exclude(started_at=None))
    trials = [r for r in commands if " trial " in r.label]
    assert len(trials) >= 2 * (6 * 2 + 3 * 2 + 2 * 2)
    for trial in trials:
        end = trial.started_at + timedelta(seconds=trial.duration_seconds)
        for other in commands:
            if other.pk == trial.pk:
                continue
            other_end = other.started_at + timedelta(seconds=other.duration_seconds)
            assert other_end <= trial.started_at or other.started_at >= end, (
                f"{other.label} overlaps {trial.label}")
    gates = [r for r in commands if " gate " in r.label]
    overlapping = sum(1 for a in gates for b in gates if a.pk < b.pk and a.started_at < b.finished_at
                      and b.started_at < a.finished_at)
    assert overlapping, "gates never ran side by side: the lane would be serialising everything"


def test_pages_say_who_measured_the_score_and_show_the_paired_figure(personas, tmp_path, data_dir):
    search = frozen(personas, tmp_path, {"cand_001": 5, "cand_002": 9}, population=2, rounds=[2, 1])
    run_inline(personas, search)
    client = login(personas.member)
    page = text_of(client.get(f"/searches/{search.search_id}/"))
    assert DESCRIPTOR_LABEL in page
    assert '4.5× higher <span class="muted">9</span>' in page  # cand_002: its ratio, then its median value
    candidate = text_of(client.get(f"/searches/{search.search_id}/candidates/cand_002/"))
    assert "4.5× higher" in candidate and "median 9 vs 2" in candidate and DESCRIPTOR_LABEL in candidate


def test_a_search_frozen_before_paired_blocks_runs_as_it_was_frozen(personas, tmp_path, data_dir):
    search = frozen(personas, tmp_path, {"cand_001": 5, "cand_002": 9}, population=2, rounds=[2, 1])
    search.contract = 1  # what the migration gives every search frozen before this release
    type(search).objects.filter(pk=search.pk).update(contract=1)
    run = run_inline(personas, search)
    assert run.winner.candidate_id == "cand_002"
    assert run.winner.score == 9.0 and run.winner.score_absolute == 9.0  # its median, not a ratio
    assert search.candidates.get(number=0).score == 2.0


def test_a_candidate_goes_on_only_after_enough_blocks_to_decide_at_its_confidence(
    personas, tmp_path, data_dir
):
    # Exact scores, but two blocks cannot show anything at 95 %: six can (1 - 2 * 0.5^6 > 0.95).
    search = frozen(personas, tmp_path, {"cand_001": 5, "cand_002": 1}, population=2, rounds=[2, 1],
                    trials=2, confidence=0.95)
    run = run_inline(personas, search)
    blocks = {c.candidate_id: len(c.blocks["0"]) for c in search.candidates.all()}
    assert run.winner.candidate_id == "cand_001" and blocks["cand_001"] == 6 and blocks["baseline"] == 6
    assert blocks["cand_002"] == 2  # clearly worse than the baseline already: no more blocks for it
    parts = Step.objects.filter(search=search, kind="measure", round=0).order_by("part")
    assert [step.plan["blocks"] for step in parts] == [[0, 2], [2, 6]]
    assert Step.objects.get(search=search, kind="replay").plan["blocks"] == [0, 6]
