"""The probe bench/search_orchestration.py counts an inline search with (tests/step_costs.py):
it sees what the inline lane really calls, and a binding it misses is an error, not a zero."""

from __future__ import annotations

import subprocess

import pytest

from search_app.models import Step
from search_app.services import runs
from tests.search_app.runs import frozen, run_inline
from tests.step_costs import ProbeMissed, StepProbe

pytestmark = pytest.mark.django_db(transaction=True)

PLAN = {"cand_001": 5, "cand_002": 9, "cand_003": 7}


@pytest.fixture
def probe():
    probe = StepProbe().install()
    yield probe
    probe.uninstall()


def probed_run(personas, tmp_path, probe: StepProbe) -> dict[int, str]:
    """A population-3 search run inline under the probe: the kind of every step that ran."""
    search = frozen(personas, tmp_path, PLAN, population=3, rounds=[3, 1])
    with probe.counting():
        run = run_inline(personas, search)
    assert run.winner.candidate_id == "cand_002"
    ran = dict(Step.objects.filter(search=search, started_at__isnull=False).values_list("pk", "kind"))
    probe.steps_label(ran)
    return ran


def test_the_probe_counts_the_steps_git_processes_writes_and_planner_of_an_inline_search(
        personas, tmp_path, data_dir, probe):
    ran = probed_run(personas, tmp_path, probe)
    probe.check(ran)
    kinds = probe.by_kind()
    assert {"generate", "evaluate", "measure", "replay", "review"} <= set(kinds)
    for kind, tallies in kinds.items():
        assert len(tallies) == list(ran.values()).count(kind)
        assert all(tally.executions >= 1 and tally.transactions >= 1 for tally in tallies), kind
        assert all(tally.writes >= tally.transactions for tally in tallies), kind
    # A writer's worktree is made and read with git; an evaluation's tree may be built without a
    # process (dulwich), so for the other kinds only the cross-check with git_run holds.
    assert all(tally.git_processes >= 1 for tally in kinds["generate"])
    for kind, tallies in kinds.items():
        assert all(tally.git_processes >= tally.git_run_calls for tally in tallies), kind
    # The driver asks the planner at least once per round it closes and once more to end.
    assert len(probe.planner_calls) >= 3
    assert all(seconds > 0 for seconds in probe.planner_calls)


@pytest.mark.parametrize(("module", "name", "missed"), [
    (runs, "step_execute", "a binding of step_execute was missed"),
    (runs, "search_advance", "a binding of search_advance was missed"),
    (subprocess, "Popen", "no git process was seen"),
])
def test_a_binding_the_probe_misses_makes_its_check_fail_instead_of_printing_zeros(
        personas, tmp_path, data_dir, probe, monkeypatch, module, name, missed):
    # What the old probe did: it patched search_app.services.step_execute (and search_advance),
    # while search_run_inline calls the names imported into services/runs.py.
    wrapped = getattr(module, name)
    original = wrapped.__mro__[1] if isinstance(wrapped, type) else wrapped.__wrapped__
    monkeypatch.setattr(module, name, original)
    ran = probed_run(personas, tmp_path, probe)
    with pytest.raises(ProbeMissed, match=missed):
        probe.check(ran)
