"""What one step costs on this host: the git processes and database write transactions of each
generate and evaluate step of a small real search (the runtime's fixed cost per step)."""

from __future__ import annotations

import pytest

from search_app import services
from tests.search_app.runs import frozen, run_inline
from tests.step_costs import StepCosts, git_counted, writes_counted

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_generate_and_an_evaluate_step_start_few_git_processes(personas, tmp_path, data_dir,
                                                                  monkeypatch, capsys):
    costs = StepCosts()
    real = services.step_execute

    def counted(step_pk: int, owner: str) -> bool:
        from search_app.models import Step

        with writes_counted(costs, Step.objects.get(pk=step_pk).kind):
            return real(step_pk, owner)

    monkeypatch.setattr(services.runs, "step_execute", counted)  # search_run_inline calls it
    search = frozen(personas, tmp_path, {"cand_001": 5, "cand_002": 9}, population=2, rounds=[2, 1])
    with git_counted(costs):
        run = run_inline(personas, search)
    assert run.winner.candidate_id == "cand_002"
    with capsys.disabled():
        for kind in ("generate", "evaluate", "measure", "replay", "review"):
            print(f"\n{kind}: {costs.steps[kind]} steps, {costs.git_per_step(kind):g} git processes each "
                  f"{costs.per_step(kind)}, write transactions {costs.transactions[kind]}")
    # Before: 17 for an evaluate step with a patch (3 rev-parse, 2 apply --numstat, 3 write-tree,
    # 2 add --all, a full worktree prune), 8 for a generate step.
    for kind in ("generate", "evaluate", "measure", "review"):
        assert not {"rev-parse", "worktree prune", "diff-tree"} & set(costs.git[kind]), kind
    assert costs.git_per_step("evaluate") <= 6 and costs.git_per_step("generate") <= 6
    assert costs.git["evaluate"]["write-tree"] <= costs.steps["evaluate"]
    # Before: evaluate 4 (claim, apply, gate, record), measure 11 for 3 members in 2 blocks (a
    # transaction per apply and per trial). Now the apply goes with the first gate, and the
    # members' applies and each block's trials are one transaction each.
    assert max(costs.transactions["evaluate"]) <= 3
    assert max(costs.transactions["measure"]) <= 5  # claim, the applies, 2 blocks, record


def test_a_batch_of_receipts_is_written_even_when_its_step_then_fails(personas, tmp_path, data_dir,
                                                                      monkeypatch):
    from runtime_app.models import Receipt
    from search_app import execution
    from search_app.models import Step

    real = execution._gates

    def breaking(*args, **kwargs):
        real(*args, **kwargs)
        raise RuntimeError("the worker broke after its gates")

    monkeypatch.setattr(execution, "_gates", breaking)
    search = frozen(personas, tmp_path, {"cand_001": 5, "cand_002": 9}, population=2, rounds=[2, 1])
    run_inline(personas, search)
    step = Step.objects.filter(search=search, kind="evaluate", candidate__candidate_id="cand_001").first()
    assert step.state == "failed" and "the worker broke after its gates" in step.error
    labels = list(Receipt.objects.filter(subject_type="candidate", subject_id=step.candidate_id)
                  .values_list("label", flat=True))
    assert "cand_001 r0 evaluate apply" in labels and "cand_001 r0 evaluate gate 1" in labels
