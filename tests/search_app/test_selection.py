"""Selection between rounds: ordered and Pareto ranking, diversity, tie-breakers, reasons."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from search_app.selection import Entry, crowding, dominates, pareto_fronts, rank, select

ORDERED = {"direction": "minimize", "policy": "ordered", "ordering": ["cost_microusd", "score"],
           "tie_breakers": ["diff_lines"], "retain_diversity": True}
PARETO = {**ORDERED, "policy": "pareto"}


def ids(decisions, promoted=True):
    return [d.candidate_id for d in decisions if d.promoted is promoted]


FAST_DEAR = Entry("cand_001", score=1.0, cost_microusd=500)
SLOW_CHEAP = Entry("cand_002", score=5.0, cost_microusd=100)


def test_ordered_cost_first_puts_the_cheapest_ahead_of_the_fastest():
    assert ids(select([FAST_DEAR, SLOW_CHEAP], 1, **ORDERED)) == ["cand_002"]


def test_ordered_score_first_on_request():
    entries = [FAST_DEAR, SLOW_CHEAP]
    assert ids(select(entries, 1, **{**ORDERED, "ordering": ["score", "cost_microusd"]})) == ["cand_001"]


def test_maximize_prefers_higher_scores():
    entries = [Entry("cand_001", score=1.0), Entry("cand_002", score=5.0)]
    maximize = {**ORDERED, "ordering": ["score"], "direction": "maximize"}
    assert ids(select(entries, 1, **maximize)) == ["cand_002"]


def test_tie_breakers_apply_in_declared_order_then_the_candidate_id():
    entries = [Entry("cand_003", score=1.0, diff_lines=9, tokens=1),
               Entry("cand_001", score=1.0, diff_lines=9, tokens=5),
               Entry("cand_002", score=1.0, diff_lines=3, tokens=9)]
    order = [d.candidate_id for d in select(entries, 3, **{**ORDERED, "ordering": ["score"],
                                                            "tie_breakers": ["diff_lines", "tokens"]})]
    assert order == ["cand_002", "cand_003", "cand_001"]
    same = [Entry("cand_002", score=1.0), Entry("cand_001", score=1.0)]
    assert [d.candidate_id for d in select(same, 2, **ORDERED)] == ["cand_001", "cand_002"]


def test_identical_patches_collapse_to_the_earliest_admitted_copy_whichever_ranks_higher():
    # cand_001 reproduced in round 1 the patch cand_002 was admitted with in round 0, and scored better.
    entries = [Entry("cand_001", score=1.0, patch_sha256="a", admitted=(1, 1)),
               Entry("cand_002", score=2.0, patch_sha256="a", admitted=(0, 2)),
               Entry("cand_003", score=3.0, patch_sha256="b", admitted=(0, 3))]
    decisions = select(entries, 2, **{**ORDERED, "ordering": ["score"]})
    assert ids(decisions) == ["cand_002", "cand_003"]
    dropped = next(d for d in decisions if d.candidate_id == "cand_001")
    assert dropped.duplicate_of == "cand_002"
    assert dropped.reason == "identical patch to cand_002, which was admitted first"


def test_without_diversity_identical_patches_both_go_on():
    entries = [Entry("cand_001", score=2.0, patch_sha256="a"), Entry("cand_002", score=1.0, patch_sha256="a")]
    assert ids(select(entries, 2, **{**ORDERED, "ordering": ["score"], "retain_diversity": False})) == [
        "cand_002", "cand_001"]


def test_every_decision_says_its_rank_and_why():
    entries = [Entry(f"cand_00{n}", score=float(n)) for n in range(1, 5)]
    decisions = select(entries, 2, **{**ORDERED, "ordering": ["score"]})
    assert [d.rank for d in decisions] == [1, 2, 3, 4]
    assert decisions[0].reason.startswith("rank 1 of 4") and decisions[0].reason.endswith("kept")
    assert "not in the best 2" in decisions[3].reason


def test_pareto_front_one_holds_the_non_dominated_trade_offs():
    fast_big = Entry("cand_001", score=1.0, diff_lines=90)
    slow_small = Entry("cand_002", score=5.0, diff_lines=2)
    dominated = Entry("cand_003", score=6.0, diff_lines=95)
    fronts = pareto_fronts([fast_big, slow_small, dominated], "minimize")
    assert fronts == [[fast_big, slow_small], [dominated]]
    assert dominates(fast_big, dominated, "minimize") and not dominates(fast_big, slow_small, "minimize")


def test_pareto_with_diversity_keeps_the_ends_of_the_front_and_then_the_best_score():
    entries = [Entry("cand_001", score=1.0, diff_lines=90), Entry("cand_002", score=1.1, diff_lines=85),
               Entry("cand_003", score=5.0, diff_lines=2), Entry("cand_004", score=9.0, diff_lines=99)]
    decisions = select(entries, 2, **PARETO)
    assert ids(decisions) == ["cand_001", "cand_003"]  # the two ends, best score first
    assert "Pareto front 1" in decisions[0].reason


def test_crowding_is_infinite_at_the_ends_and_larger_for_lonely_points():
    front = [Entry("a", score=1, diff_lines=9), Entry("b", score=2, diff_lines=8),
             Entry("c", score=2.1, diff_lines=7.9), Entry("d", score=9, diff_lines=1)]
    distance = crowding(front, "minimize")
    assert distance["a"] == distance["d"] == float("inf")
    assert distance["c"] > distance["b"]


@given(st.lists(st.tuples(st.floats(0, 100), st.integers(0, 1000), st.integers(0, 500)),
                min_size=1, max_size=25),
       st.integers(1, 30), st.sampled_from(["pareto", "ordered"]))
def test_selection_promotes_min_keep_distinct_and_decides_every_entry(values, keep, policy):
    entries = [Entry(f"cand_{i:03d}", score=s, cost_microusd=c, diff_lines=d, patch_sha256=f"{i}")
               for i, (s, c, d) in enumerate(values)]
    decisions = select(entries, keep, **{**ORDERED, "policy": policy})
    assert sorted(d.candidate_id for d in decisions) == sorted(e.candidate_id for e in entries)
    assert len(ids(decisions)) == min(keep, len(entries))
    if policy == "pareto":  # nobody promoted is dominated by someone dropped
        kept = {d.candidate_id for d in decisions if d.promoted}
        front_one = {e.candidate_id for e in pareto_fronts(entries, "minimize")[0]}
        if len(front_one) >= keep:
            assert kept <= front_one
    ranked = rank(entries, **{**ORDERED, "policy": policy})
    assert len(ranked) == len(entries)
