"""Evaluation, trial, replay and review trees are plain directories: the candidate's code runs
with its tree and declared read paths only, never the repository it was written against."""

from __future__ import annotations

import pytest

from search_app.models import Step
from tests.search_app.runs import fates, frozen, run_inline

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_candidate_s_code_cannot_read_the_repository_s_git_dir_from_its_gates_or_trials(
    personas, tmp_path, data_dir
):
    # Before, every command was shown `<repository>/.git` read-only: a candidate could read what a
    # person keeps there (other branches' objects, refs, config) or a planted file, as here.
    planted = tmp_path / "peeking" / ".git" / "planted"
    search = frozen(personas, tmp_path, {"cand_001": {"file": str(planted)}, "cand_002": 20},
                    repo_name="peeking", population=2, rounds=[2, 1])
    planted.write_text("50")
    run = run_inline(personas, search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002"
    state, reason = fates(search)["cand_001"]
    assert state == "eliminated" and "gate 1" in reason
    gate = Step.objects.get(search=search, kind="evaluate", candidate__candidate_id="cand_001")
    assert gate.result.get("eliminated")
