"""Trials on the evaluation trees already checked out: an evaluation whose gates pass parks its
pristine tree on its host for the round's trials, and a round's trial trees wait there for the
next round's. Nothing runs in a parked tree, a parked tree is taken only for the exact patch and
baseline it holds, and none outlives its search."""

from __future__ import annotations

import hashlib
import json
import threading
import time

import pytest

from runtime_app.models import Receipt
from runtime_app.worktrees import worktrees_root
from search_app import execution, services
from search_app.models import SearchRun, Step
from tests.gitrepo import repo_create
from tests.search_app.runs import frozen, run_inline, spec_text

pytestmark = pytest.mark.django_db(transaction=True)


def left_behind(search) -> list[str]:
    root = worktrees_root()
    return sorted(path.name for path in root.glob(f"{search.search_id}-*")) if root.exists() else []


def test_trials_run_on_the_trees_the_evaluations_checked_out_and_no_tree_outlives_the_search(
    personas, tmp_path, data_dir
):
    search = frozen(personas, tmp_path, {"cand_001": 5, "cand_002": 9, "cand_003": 7}, population=3,
                    rounds=[3, 2, 1])
    run = run_inline(personas, search)
    assert run.winner.candidate_id == "cand_002"
    measures = {step.round: step for step in Step.objects.filter(search=search, kind="measure", part=0)}
    # Round 0: every member's tree is the one its evaluation checked out; round 1: the round 0 trees.
    assert measures[0].result["trees_parked_before"] == ["baseline", "cand_001", "cand_002", "cand_003"]
    assert measures[1].result["trees_parked_before"] == ["baseline", "cand_002", "cand_003"]
    applies = Receipt.objects.filter(kind="apply", subject_type="candidate",
                                     subject_id__in=search.candidates.values("pk"))
    # One apply per evaluation, one for the replay's own clean checkout (its gates' tree, which its
    # trials take too) and its baseline's, one for the review: no tree was checked out a second time.
    assert sorted(applies.values_list("label", flat=True)) == sorted([
        "baseline r0 evaluate apply", "cand_001 r0 evaluate apply", "cand_002 r0 evaluate apply",
        "cand_003 r0 evaluate apply", "cand_002 replay apply", "baseline r2 apply",
        *[label for label in applies.values_list("label", flat=True) if "review" in label]])
    assert left_behind(search) == []


HOSTILE_WRITER = '''import os, pathlib
code = pathlib.Path("code/answer.py")
if os.environ["CRUCIBLE_CANDIDATE_ID"] == "cand_001":
    # The honest answer is 3; the first command to import it (the gate) rewrites the file to 1000
    # and leaves a mark, hoping the trials that follow run on the tree it wrote to.
    code.write_text(
        "import pathlib\\n"
        "here = pathlib.Path(__file__)\\n"
        "if not (here.parent / 'planted').exists():\\n"
        "    here.write_text('def answer():\\\\n    return 1000\\\\n')\\n"
        "    (here.parent / 'planted').write_text('gate')\\n"
        "def answer():\\n    return 3\\n")
else:
    code.write_text("def answer():\\n    return 4\\n")
'''


def test_a_gate_that_rewrites_its_tree_cannot_forge_the_trials_that_take_that_tree(
    personas, tmp_path, data_dir
):
    repo = repo_create(tmp_path / "hostile", {
        "code/answer.py": "def answer():\n    return 2\n",
        "tests/test_answer.py": "def test_answer():\n    assert True\n",
        "scripts/writer.py": HOSTILE_WRITER,
        "plan.json": "{}",
    })
    search = services.search_freeze(personas.owner, personas.alpha, spec_text(population=2, rounds=[2, 1]),
                                    "HEAD", repository_path=str(repo))
    run = run_inline(personas, search)
    measure = Step.objects.get(search=search, kind="measure", round=0, part=0)
    assert "cand_001" in measure.result["trees_parked_before"]  # the trials took the gate's tree
    assert measure.result["values"]["cand_001"] == {"0": 3.0, "1": 3.0}  # ... as it was checked out
    assert run.winner.candidate_id == "cand_002"
    assert left_behind(search) == []


@pytest.fixture
def measuring(personas, tmp_path, data_dir):
    """A started search, its cand_001 with a patch, a round 0 measure step and a tree parked for it."""
    search = frozen(personas, tmp_path, {"cand_001": 5}, population=2, rounds=[2, 1])
    services.search_start(personas.owner, search, enqueue=False)
    member = search.candidates.get(candidate_id="cand_001")
    member.patch = b"diff --git a/code/answer.py b/code/answer.py\n"
    member.save()
    step = Step.objects.create(search=search, candidate=search.candidates.get(number=0), kind="measure",
                               round=0, plan={"members": ["cand_001"], "blocks": [0, 1]})
    tree = worktrees_root() / f"{search.search_id}-cand_001-evaluate-r0"
    tree.mkdir(parents=True)
    digest = hashlib.sha256(bytes(member.patch)).hexdigest()
    assert execution._tree_park(step, "cand_001", tree, ["tests/test_answer.py"], digest, None)
    return step, member, tree


def test_a_parked_tree_is_taken_for_the_patch_and_baseline_it_holds(measuring):
    step, member, tree = measuring
    parked = execution._tree_parked(step, member)
    assert parked is not None and parked.tree == tree and parked.read_only == ["tests/test_answer.py"]


@pytest.mark.parametrize("change", ["another patch", "another baseline", "a later round", "two rounds back",
                                    "a damaged record", "another candidate's record", "a link for a tree"])
def test_a_parked_tree_is_never_taken_for_anything_else(measuring, change, tmp_path):
    step, member, tree = measuring
    record = tree.with_name(tree.name + execution.PARKED_SUFFIX)
    data = json.loads(record.read_text())
    if change == "another patch":
        member.patch = b"diff --git a/code/other.py b/code/other.py\n"
    elif change == "another baseline":
        step.search.baseline_commit = "0" * 40
    elif change == "a later round":
        record.write_text(json.dumps({**data, "round": 1}))
    elif change == "two rounds back":  # what a host's sweep may be removing at this very moment
        step.round = 2
    elif change == "a damaged record":
        record.write_text('{"round": 0, "patch_sha256": ')
    elif change == "another candidate's record":
        record.write_text(json.dumps({**data, "candidate": "cand_002"}))
    else:
        tree.rmdir()
        (tmp_path / "elsewhere").mkdir()
        tree.symlink_to(tmp_path / "elsewhere")
    assert execution._tree_parked(step, member) is None


def test_a_search_that_ends_removes_the_trees_parked_on_this_host(personas, tmp_path, data_dir):
    search = frozen(personas, tmp_path, {"cand_001": 5, "cand_002": "hang"}, population=2, rounds=[2, 1])
    services.search_start(personas.owner, search, enqueue=False)
    runner = threading.Thread(target=lambda: services.search_run_inline(search))
    runner.start()
    deadline = time.monotonic() + 60
    # The baseline's (or cand_001's) evaluation passes its gate and parks its tree while cand_002's
    # gate hangs.
    while not any(name.endswith(execution.PARKED_SUFFIX) for name in left_behind(search)):
        assert time.monotonic() < deadline, left_behind(search)
        time.sleep(0.1)
    services.search_cancel(personas.owner, search)
    runner.join(60)
    assert not runner.is_alive()
    assert left_behind(search) == []


@pytest.mark.parametrize(("status", "round_index", "kept"), [
    ("running", 0, True), ("running", 1, True), ("running", 2, False), ("cancelling", 0, False),
    ("finished", 0, False), ("cancelled", 0, False)])
def test_a_host_s_sweep_removes_the_trees_no_trial_will_take(measuring, status, round_index, kept):
    step, _, tree = measuring
    SearchRun.objects.filter(search=step.search).update(status=status, round_index=round_index)
    execution.parked_trees_sweep()
    assert tree.is_dir() is kept
    assert tree.with_name(tree.name + execution.PARKED_SUFFIX).exists() is kept


def test_the_sweep_removes_a_tree_whose_search_is_gone(measuring):
    step, _, tree = measuring
    step.search.delete()
    assert execution.parked_trees_sweep() == 1
    assert not tree.exists()


@pytest.mark.parametrize("phase", ["replay", "review", "revise"])
def test_once_the_rounds_are_over_a_host_s_sweep_removes_every_parked_tree(measuring, phase):
    """Only a round's trials take a parked tree; a revision's writer never runs beside one."""
    step, _, tree = measuring
    SearchRun.objects.filter(search=step.search).update(status="running", phase=phase)
    assert execution.parked_trees_sweep() == 1
    assert not tree.exists()


def test_a_search_whose_writers_refine_keeps_no_parked_tree(personas, tmp_path, data_dir):
    """Its later rounds start with writers: no tree with hidden files may wait for them on any host."""
    search = frozen(personas, tmp_path, {"cand_001": 5}, population=2, rounds=[2, 1], refine=True)
    services.search_start(personas.owner, search, enqueue=False)
    step = Step.objects.create(search=search, candidate=search.candidates.get(number=0), kind="measure",
                               round=0, plan={"members": ["cand_001"], "blocks": [0, 1]})
    tree = worktrees_root() / f"{search.search_id}-cand_001-evaluate-r0"
    tree.mkdir(parents=True)
    assert execution._tree_park(step, "cand_001", tree, [], "0" * 64, None)
    assert not execution.trees_park(execution.search_spec(search))
    assert execution.parked_trees_sweep() == 1
    assert not tree.exists()
