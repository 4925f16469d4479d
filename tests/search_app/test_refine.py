"""`worker.refine`: promoted candidates' writers revise their own patch in every later round.

Real repositories and sandboxed writers (tests/search_app/runs.py); the search runs in this
process through the services the workers use.
"""

from __future__ import annotations

import pytest

from runtime_app.models import Event, Receipt
from search_app.models import Step
from search_app.selectors import search_run_report
from tests.helpers import login, text_of
from tests.search_app.runs import fates, frozen, run_inline

pytestmark = pytest.mark.django_db(transaction=True)


def writer_lines(candidate) -> list[str]:
    receipts = Receipt.objects.filter(subject_type="candidate", subject_id=candidate.pk,
                                      label__contains="writer")
    return [r.stdout_excerpt.splitlines()[0] for r in receipts.order_by("id")]


def test_a_refining_writer_replaces_its_patch_at_the_rounds_effort_and_the_gates_run_again(
    personas, tmp_path, data_dir
):
    plan = {"cand_001": {"value": 5, "refined": 9}, "cand_002": 7, "cand_003": 3}
    search = frozen(personas, tmp_path, plan, population=3, rounds=[3, 2, 1], refine=True,
                    effort='["low", "high", "high"]')
    run = run_inline(personas, search)
    assert (run.outcome, run.winner.candidate_id) == ("winner", "cand_001")
    winner = search.candidates.get(candidate_id="cand_001")
    assert b"+    return 9" in bytes(winner.patch) and winner.patch_round == 1
    reported = {c["candidate_id"]: c for c in search_run_report(search)["candidates"]}
    assert (reported["cand_001"]["patch_round"], reported["cand_002"]["patch_round"]) == (1, 0)
    # Round 0 wrote 5; round 1's writer, told its score, made it 9; round 2's kept it.
    assert writer_lines(winner) == ["round 0 effort low previous -", "round 1 effort high previous 5",
                                    "round 2 effort high previous 9"]
    assert winner.trials == {"0": [5.0, 5.0], "1": [9.0, 9.0], "2": [9.0, 9.0]}
    labels = list(Receipt.objects.filter(subject_type="candidate", subject_id=winner.pk)
                  .values_list("label", flat=True))
    assert "cand_001 r1 evaluate gate 1" in labels  # the new patch passes the gates again
    assert "cand_001 r2 evaluate gate 1" not in labels  # an unchanged patch is only re-scored
    replay = Step.objects.get(search=search, kind="replay", candidate=winner)
    assert replay.result["passed"] and "replayed 4.5× baseline" in replay.result["why"]
    messages = list(Event.objects.filter(subject_type="search", subject_id=search.pk)
                    .values_list("payload__message", flat=True))
    assert "cand_001: round 1: its writer refined its patch (2 lines); gates run again" in messages
    assert "cand_002: round 1: its writer kept its patch" in messages
    prompt = Step.objects.get(search=search, candidate=winner, kind="generate", round=1).result["refining"]
    assert "It scored 5 on value (maximize; the baseline scored 2)" in prompt
    # The candidate page shows each refinement's own prompt part.
    html = text_of(login(personas.member).get(f"/searches/{search.search_id}/candidates/cand_001/"))
    assert "Round 1 refinement" in html and "Round 2 refinement" in html
    assert "Your patch from round 0 is already applied in your working directory. It scored 5" in html


def test_a_refinement_that_breaks_the_build_eliminates_the_candidate_in_that_round(
    personas, tmp_path, data_dir
):
    plan = {"cand_001": {"value": 9, "refined": "broken"}, "cand_002": 5, "cand_003": 3}
    search = frozen(personas, tmp_path, plan, population=3, rounds=[3, 2, 1], refine=True)
    run = run_inline(personas, search)
    assert (run.outcome, run.winner.candidate_id) == ("winner", "cand_002")
    state, reason = fates(search)["cand_001"]
    assert state == "eliminated" and reason.startswith("round 1: gate 1")


def test_a_refinement_that_undoes_everything_keeps_the_earlier_patch(personas, tmp_path, data_dir):
    plan = {"cand_001": {"value": 9, "refined": "revert"}, "cand_002": 5}
    search = frozen(personas, tmp_path, plan, population=2, rounds=[2, 1], refine=True)
    run = run_inline(personas, search)
    assert (run.outcome, run.winner.candidate_id) == ("winner", "cand_001")
    winner = search.candidates.get(candidate_id="cand_001")
    assert b"+    return 9" in bytes(winner.patch) and winner.patch_round == 0
    messages = list(Event.objects.filter(subject_type="search", subject_id=search.pk)
                    .values_list("payload__message", flat=True))
    assert any(m.startswith("cand_001: round 1: refinement failed (the writer (passed) changed nothing)")
               and m.endswith("keeps its round 0 patch") for m in messages)


def test_without_room_in_the_budget_a_promoted_patch_is_scored_as_it_is(personas, tmp_path, data_dir):
    plan = {"cand_001": {"value": 9, "cost": 1500}, "cand_002": {"value": 5, "cost": 1500}}
    search = frozen(personas, tmp_path, plan, population=2, rounds=[2, 1], concurrency=2, refine=True,
                    budget="[budget]\nmax_cost_microusd = 4000\n")
    run = run_inline(personas, search)
    assert (run.outcome, run.winner.candidate_id) == ("winner", "cand_001")
    assert not Step.objects.filter(search=search, kind="generate", round__gt=0).exists()
    assert run.spent_cost_microusd == 3000 and run.reserved_cost_microusd == 0
    messages = list(Event.objects.filter(subject_type="search", subject_id=search.pk)
                    .values_list("payload__message", flat=True))
    assert "cand_001: promoted to round 1; not refined: the budget cannot cover another writer" in messages


def test_without_refine_writers_run_only_in_round_0(personas, tmp_path, data_dir):
    plan = {"cand_001": {"value": 5, "refined": 9}, "cand_002": 3}
    search = frozen(personas, tmp_path, plan, population=2, rounds=[2, 1])
    run = run_inline(personas, search)
    assert (run.outcome, run.winner.candidate_id) == ("winner", "cand_001")
    assert set(Step.objects.filter(search=search, kind="generate").values_list("round", flat=True)) == {0}
    assert b"+    return 5" in bytes(search.candidates.get(candidate_id="cand_001").patch)


def test_a_refinement_that_lost_three_workers_keeps_the_earlier_patch(personas, tmp_path, data_dir):
    from search_app import services

    plan = {"cand_001": {"value": 9, "refined": 4}, "cand_002": 5}
    search = frozen(personas, tmp_path, plan, population=2, rounds=[2, 1], refine=True)
    services.search_start(personas.owner, search, enqueue=False)
    for _ in range(100):  # drive it by hand until round 1's refinements exist
        ready = services.search_advance(search.pk)
        if Step.objects.filter(search=search, kind="generate", round=1).exists():
            break
        for step_pk in ready:
            services.step_execute(step_pk, "test")
    step = Step.objects.get(search=search, kind="generate", round=1, candidate__candidate_id="cand_001")
    Step.objects.filter(pk=step.pk).update(state="running", attempts=3, lease_owner="ghost",
                                           lease_expires_at="2000-01-01T00:00:00Z")
    services.steps_reconcile()
    run = services.search_run_inline(search)
    assert (run.outcome, run.winner.candidate_id) == ("winner", "cand_001")
    assert b"+    return 9" in bytes(search.candidates.get(candidate_id="cand_001").patch)
    messages = Event.objects.filter(subject_type="search", subject_id=search.pk).values_list(
        "payload__message", flat=True)
    assert ("cand_001: round 1: refinement failed (generate step lost its worker 3 times); keeps its "
            "round 0 patch") in list(messages)


def test_a_thread_on_a_patch_its_writer_then_refines_is_marked_outdated(personas, tmp_path, data_dir):
    """A reviewer comments on cand_001's round-0 line while the search runs; its writer refines the
    patch in round 1, so the thread is outdated against the new patch (kept, with the old text),
    and a thread started on the new patch is not."""
    from search_app import services
    from search_app.diffs import diff_new_line_texts
    from search_app.selectors import candidate_threads

    plan = {"cand_001": {"value": 5, "refined": 9}, "cand_002": 3}
    search = frozen(personas, tmp_path, plan, population=2, rounds=[2, 1], refine=True)
    commented: list = []

    def comment_on_the_first_patch(run) -> None:
        candidate = search.candidates.get(candidate_id="cand_001")
        if commented or not candidate.patch:
            return
        assert candidate.patch_round == 0  # round 0's patch: its refinement comes rounds later
        path = candidate.files[0]
        texts = diff_new_line_texts(bytes(candidate.patch).decode(), path)
        line = next(number for number, text in texts.items() if "return 5" in text)
        commented.append(services.comment_add(personas.member, candidate, "Why 5?", path=path, line=line))

    services.search_start(personas.owner, search, enqueue=False)
    run = services.search_run_inline(search, progress=comment_on_the_first_patch)
    winner = search.candidates.get(candidate_id="cand_001")
    assert (run.winner_id, winner.patch_round) == (winner.pk, 1) and b"return 9" in bytes(winner.patch)
    [thread] = candidate_threads(winner)
    assert thread["outdated"] and "return 5" in thread["comment"].line_text
    fresh = services.comment_add(personas.member, winner, "And 9?", path=thread["comment"].path,
                                 line=thread["comment"].line)
    assert [t["outdated"] for t in candidate_threads(winner)] == [True, False] and fresh.pk
