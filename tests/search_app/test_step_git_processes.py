"""What a step of a real tiny search costs in git processes (every process whose program is git,
counted where processes start: subprocess.Popen), and that a step resolves its frozen search once:
one look-up of its repository, one set of policy rules."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from search_app import services
from search_app.models import Step
from tests.search_app.runs import frozen, run_inline

pytestmark = pytest.mark.django_db(transaction=True)


class Counted:
    """Per step (by pk, with its kind): the git processes it started and the calls it made to
    `repository_local` and `policy_rules`, counted in the thread that runs it."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.lock = threading.Lock()
        self.kinds: dict[int, str] = {}
        self.git: Counter = Counter()
        self.calls: dict[str, Counter] = defaultdict(Counter)

    def step(self) -> int | None:
        return getattr(self.local, "step", None)


@pytest.fixture
def counted(monkeypatch) -> Counted:
    counts = Counted()
    real_popen = subprocess.Popen

    class CountingPopen(real_popen):  # type: ignore[misc,valid-type]
        def __init__(self, args, *rest, **options):
            program = args if isinstance(args, str | bytes) else (args[0] if args else "")
            if Path(str(program)).name == "git" and counts.step() is not None:
                with counts.lock:
                    counts.git[counts.step()] += 1
            super().__init__(args, *rest, **options)

    monkeypatch.setattr(subprocess, "Popen", CountingPopen)
    for name in ("repository_local", "policy_rules"):
        for module in [m for key, m in list(sys.modules.items()) if key.startswith("search_app")]:
            real = getattr(module, name, None)
            if callable(real):
                monkeypatch.setattr(module, name, _counting(counts, name, real))
    real_execute = services.step_execute

    def execute(step_pk: int, owner: str) -> bool:
        counts.kinds[step_pk] = Step.objects.get(pk=step_pk).kind
        counts.local.step = step_pk
        try:
            return real_execute(step_pk, owner)
        finally:
            counts.local.step = None

    monkeypatch.setattr(services.runs, "step_execute", execute)  # search_run_inline calls it
    return counts


def _counting(counts: Counted, name: str, real):
    def call(*args, **kwargs):
        if counts.step() is not None:
            with counts.lock:
                counts.calls[name][counts.step()] += 1
        return real(*args, **kwargs)
    return call


def per_kind(counts: Counted) -> dict[str, list[int]]:
    found: dict[str, list[int]] = defaultdict(list)
    for step_pk, kind in sorted(counts.kinds.items()):
        found[kind].append(counts.git[step_pk])
    return dict(found)


def test_each_step_kind_starts_at_most_a_few_git_processes(personas, tmp_path, data_dir, counted, capsys):
    search = frozen(personas, tmp_path, {"cand_001": 5, "cand_002": 9}, population=2, rounds=[2, 1])
    run = run_inline(personas, search)
    assert run.winner.candidate_id == "cand_002"
    git = per_kind(counted)
    with capsys.disabled():
        print(f"\ngit processes per step: {git}")
    assert set(git) == {"generate", "evaluate", "measure", "replay", "review"}
    # Before: generate 6, evaluate 6 (a patch) or 1 (the baseline), replay 13, review 6.
    assert max(git["evaluate"]) <= 3
    assert max(git["replay"]) <= 6
    assert max(git["review"]) <= 3
    assert max(git["measure"]) == 0  # the trials took the trees the evaluations parked
    assert max(git["generate"]) <= 3


def test_trials_that_build_their_trees_start_at_most_three_git_processes_a_member(
    personas, tmp_path, data_dir, counted, capsys
):
    """A search whose writers refine parks no tree: each round's trials build every member's."""
    search = frozen(personas, tmp_path, {"cand_001": 5, "cand_002": 9}, population=2, rounds=[2, 1],
                    refine=True)
    run_inline(personas, search)
    measures = [(step_pk, len(Step.objects.get(pk=step_pk).plan["members"]))
                for step_pk, kind in counted.kinds.items() if kind == "measure"]
    with capsys.disabled():
        print(f"\nmeasure steps building their trees (git processes, members): "
              f"{[(counted.git[pk], members) for pk, members in measures]}; all: {per_kind(counted)}")
    assert measures
    for step_pk, members in measures:
        assert 0 < counted.git[step_pk] <= 3 * members


def test_a_step_resolves_its_repository_and_its_policy_rules_once(personas, tmp_path, data_dir, counted):
    search = frozen(personas, tmp_path, {"cand_001": 5, "cand_002": 9}, population=2, rounds=[2, 1])
    run_inline(personas, search)
    assert set(counted.kinds.values()) == {"generate", "evaluate", "measure", "replay", "review"}
    for step_pk, kind in counted.kinds.items():
        assert counted.calls["repository_local"][step_pk] == 1, kind
        # Made when a step first judges a patch, once: a round-0 writer needs only the patch limits,
        # and a measure step whose trees were parked by its evaluations judges nothing.
        expected = {"generate": {0}, "measure": {0, 1}}.get(kind, {1})
        assert counted.calls["policy_rules"][step_pk] in expected, kind
