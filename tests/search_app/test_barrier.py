"""Hidden files never coexist with a running writer of the same search.

No evaluation tree receives the hidden evaluator files until every writer of the round has ended
(the baseline's evaluation included), a refinement writer starts only once every command that saw
hidden files has ended and no tree holding them is left on disk, and a worker that cannot renew
its lease stops its commands before anyone may count them as ended. Concurrent sandboxes always
share some channel (locks on a file every sandbox sees, CPU time): the last test is that channel,
as an attacker would use it.
"""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest
from django.core.exceptions import ValidationError
from django.db import OperationalError

from runtime_app.models import Event, Receipt
from runtime_app.worktrees import worktrees_root
from search_app import services
from search_app.models import SearchRun, Step
from search_app.services import steps
from search_app.step_result import StepResult
from tests.gitrepo import repo_create
from tests.search_app.runs import frozen, plan_repo, spec_text
from tests.search_app.test_revision import _changes_requested, _finished

pytestmark = pytest.mark.django_db(transaction=True)

LIVE = ("pending", "running")
HIDDEN = '"tests/test_hidden.py" = "def test_hidden():\\n    assert True  # hidden-marker-5521\\n"\n'


def hidden_trees(search) -> list[str]:
    """This host's trees (and parked records) of `search` that hold hidden files: all but writers'."""
    root = worktrees_root()
    names = [path.name for path in root.glob(f"{search.search_id}-*")] if root.exists() else []
    return sorted(name for name in names if "-write-" not in name)


def barrier_holds(search) -> None:
    """While a writer step of the search is live, no other step is, and no evaluation of its round
    exists."""
    writers = search.steps.filter(kind="generate", state__in=LIVE)
    if writers.exists():
        assert not search.steps.filter(state__in=LIVE).exclude(kind="generate").exists(), \
            list(search.steps.filter(state__in=LIVE).values_list("kind", "round"))
        rounds = set(writers.values_list("round", flat=True))
        assert not search.steps.filter(kind="evaluate", round__in=rounds).exists()


def drive_last_ready_first(search) -> SearchRun:
    """Run the search one step at a time, always the last ready one (so earlier writers wait while
    later ones end), checking the barrier after every planner call and, before every writer, that
    no tree with hidden files is on this host."""
    while True:
        ready = services.search_advance(search.pk)
        barrier_holds(search)
        run = SearchRun.objects.get(search=search)
        if run.terminal:
            return run
        assert ready, (run.phase, run.round_index)
        step = Step.objects.get(pk=ready[-1])
        if step.kind == Step.Kind.GENERATE:
            assert hidden_trees(search) == [], step
        services.step_execute(step.pk, "test-worker")


def events(search, kind: str) -> list[str]:
    return [event.payload["message"] for event in
            Event.objects.filter(subject_type="search", subject_id=search.pk, kind=kind)]


def test_no_evaluation_exists_while_any_writer_of_round_0_may_run_the_baseline_s_included(
    personas, tmp_path, data_dir
):
    search = frozen(personas, tmp_path, {"cand_001": 5, "cand_002": 9, "cand_003": 7}, population=3,
                    rounds=[3, 1], concurrency=2)
    services.search_start(personas.owner, search, enqueue=False)
    assert not search.steps.exists()  # the baseline's evaluation waits for the writers too
    first = services.search_advance(search.pk)
    assert [Step.objects.get(pk=pk).kind for pk in first] == ["generate", "generate"]
    services.step_execute(first[0], "test-worker")  # cand_001's writer ends; cand_002's still runs
    services.search_advance(search.pk)
    assert not search.steps.filter(kind="evaluate").exists()
    # A writer whose worker vanished (its lease expired) is still live until it is run again.
    services.step_claim(first[1], "ghost")
    Step.objects.filter(pk=first[1]).update(lease_expires_at="2000-01-01T00:00:00Z")
    services.steps_reconcile()
    services.search_advance(search.pk)
    assert not search.steps.filter(kind="evaluate").exists()
    run = drive_last_ready_first(search)
    assert run.winner.candidate_id == "cand_002"
    evaluations = search.steps.filter(kind="evaluate").order_by("id")
    writers_ended = max(search.steps.filter(kind="generate").values_list("finished_at", flat=True))
    assert evaluations.first().candidate.candidate_id == "baseline"
    assert all(step.created_at >= writers_ended for step in evaluations)
    assert events(search, "search.barrier") == [
        "round 0: evaluations start when every writer of round 0 has ended (no hidden evaluator file "
        "exists while a writer of this search runs)"]
    assert events(search, "search.evaluating") == ["round 0: every writer of round 0 has ended; "
                                                   "evaluations start"]


def test_refinement_writers_run_with_no_hidden_file_on_disk_and_their_evaluations_wait_for_all_of_them(
    personas, tmp_path, data_dir
):
    plan = {"cand_001": {"value": 5, "refined": 6}, "cand_002": {"value": 9, "refined": 10},
            "cand_003": {"value": 7, "refined": 8}}
    search = frozen(personas, tmp_path, plan, population=3, rounds=[3, 2, 1], concurrency=3, refine=True)
    services.search_start(personas.owner, search, enqueue=False)
    run = drive_last_ready_first(search)
    assert run.winner.candidate_id == "cand_002" and run.winner.patch_round == 1
    assert search.steps.filter(kind="generate", round__gt=0).count() == 3  # two in round 1, one in 2
    assert [message.split(":")[0] for message in events(search, "search.barrier")] == [
        "round 0", "round 1", "round 2"]
    # Nothing was parked across a round boundary: every trial tree was checked out for its step.
    assert not any(step.result.get("trees_parked_before") for step in search.steps.filter(kind="measure"))
    assert hidden_trees(search) == []


def test_a_winner_goes_back_to_its_writer_only_once_every_step_of_its_search_has_ended(
    personas, approver, tmp_path, data_dir
):
    search, winner = _finished(personas, tmp_path, 12)
    _changes_requested(search, winner, approver, personas)
    trials = search.steps.filter(kind="measure").first()
    Step.objects.filter(pk=trials.pk).update(state="running")  # its worker is still at it somewhere
    with pytest.raises(ValidationError, match="still running"):
        services.search_revise(personas.member, search, enqueue=False)
    Step.objects.filter(pk=trials.pk).update(state="done")
    services.search_revise(personas.member, search, enqueue=False)
    run = drive_last_ready_first(search)
    assert bytes(run.winner.patch).count(b"return 12") == 1
    revision = search.steps.get(kind="generate", plan__revision=1)
    gates = search.steps.get(kind="replay", plan__revision=1)
    assert gates.created_at >= revision.finished_at


def test_a_worker_that_cannot_renew_its_lease_stops_its_command_and_records_nothing(
    personas, tmp_path, data_dir, settings, monkeypatch
):
    """Its lease will expire and the step be taken over (the writer counted as ended, the barrier
    opened): the command must not outlive the lease."""
    settings.CONFIG = dataclasses.replace(settings.CONFIG, step_lease_seconds=3)
    search = frozen(personas, tmp_path, {"cand_001": 3}, population=2, rounds=[2, 1])
    services.search_start(personas.owner, search, enqueue=False)
    step_pk = services.search_advance(search.pk)[0]
    stopped = threading.Event()

    def writer(step, context, cancel):  # a writer that would run until someone stops it
        if cancel.wait(120):
            stopped.set()
        return StepResult(cancelled=True)

    def database_gone(step_pk, owner):
        raise OperationalError("the database is unreachable")

    monkeypatch.setitem(steps._HANDLERS, Step.Kind.GENERATE, dataclasses.replace(
        steps._HANDLERS[Step.Kind.GENERATE], work=writer))
    monkeypatch.setattr(steps, "_lease_renew", database_gone)
    assert services.step_execute(step_pk, "partitioned") is False
    assert stopped.is_set()
    step = Step.objects.get(pk=step_pk)
    assert (step.state, step.lease_owner) == ("running", "partitioned")  # taken back once it expires


def test_on_a_real_run_no_command_with_hidden_files_overlaps_a_writer(personas, tmp_path, data_dir):
    plan = {"cand_001": {"value": 5, "refined": 6}, "cand_002": {"value": 9, "delay": 1},
            "cand_003": {"value": 7, "refined": "broken"}}
    repo = plan_repo(tmp_path / "repo", plan)
    text = spec_text(population=3, rounds=[3, 2, 1], concurrency=3, refine=True)
    text += "\n[evaluator.files]\n" + HIDDEN
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    run = services.search_run_inline(search)
    assert run.outcome == "winner"
    receipts = Receipt.objects.filter(subject_type="candidate", subject_id__in=search.candidates.values("pk"))
    writers = [r for r in receipts if r.kind == "command" and r.label.endswith(" writer")]
    # Trees with hidden files: built by an apply that is not a writer's or the reviewer's, run in by
    # gates and trials.
    judged = [r for r in receipts
              if (r.kind == "apply" and "refine" not in r.label and "review" not in r.label)
              or (r.kind == "command" and (" gate " in r.label or " trial " in r.label))]
    assert len(writers) >= 5 and len(judged) >= 10
    for writer in writers:
        for other in judged:
            assert other.started_at >= writer.finished_at or other.finished_at <= writer.started_at, (
                f"{other.label} ({other.started_at}–{other.finished_at}) overlaps {writer.label} "
                f"({writer.started_at}–{writer.finished_at})")


# ------------------------------------------------------------------ the attack: a lock channel

# Importing it in a command whose tree holds the hidden test (a gate) encodes that file's bytes
# as POSIX read locks on a file every sandbox sees with the same inode (the standard library's
# os.py): byte i with value b is a lock on offset BASE + 512 i + b, and a lock at BASE - 512 says
# "complete". It holds them for a while, then passes.
LOCKING_ANSWER = r'''import fcntl, os, time
BASE = 1 << 30
_hidden = os.path.join(os.getcwd(), "tests", "test_hidden.py")
if os.path.exists(_hidden):
    _fd = os.open(os.__file__, os.O_RDONLY)
    for _i, _b in enumerate(open(_hidden, "rb").read()):
        fcntl.lockf(_fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, BASE + _i * 512 + _b)
    fcntl.lockf(_fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, BASE - 512)
    time.sleep(10)


def answer():
    return 5
'''

# cand_001 hands in the locking code at once; cand_002 (still writing) asks the same file who
# holds which locks (F_GETLK) for up to 20 s, and hands in whatever it decoded.
LOCK_WRITER = r'''import fcntl, os, pathlib, struct, sys, time
sys.stdin.read()
if os.environ["CRUCIBLE_CANDIDATE_ID"] == "cand_001":
    pathlib.Path("code/answer.py").write_text(pathlib.Path("scripts/locking_answer.txt").read_text())
    sys.exit(0)
BASE = 1 << 30
fd = os.open(os.__file__, os.O_RDONLY)

def held(start, length):
    got = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, start, length, 0))
    kind, _, at, _, _ = struct.unpack("hhqqi4x", got)
    return None if kind == fcntl.F_UNLCK else at

found = b""
deadline = time.monotonic() + 20
while time.monotonic() < deadline and not found:
    if held(BASE - 512, 1) is not None:
        i = 0
        while (at := held(BASE + i * 512, 512)) is not None:
            found += bytes([at - BASE - i * 512])
            i += 1
    time.sleep(0.05)
pathlib.Path("code/leak.txt").write_bytes(found or b"nothing came through\n")
'''

GATE = "python -c \"import sys; sys.path.insert(0, 'code'); import answer\""


def test_a_gate_cannot_pass_the_hidden_test_to_a_writer_still_running_through_locks_on_a_shared_file(
    personas, tmp_path, data_dir
):
    repo = repo_create(tmp_path / "repo", {
        "code/answer.py": "def answer():\n    return 2\n",
        "tests/test_answer.py": "def test_answer():\n    assert True\n",
        "scripts/writer.py": LOCK_WRITER,
        "scripts/locking_answer.txt": LOCKING_ANSWER,
    })
    spec = f'''name = "lock-channel"
objective = "Make answer() return more"
population = 2
rounds = [2, 1]
concurrency = 2

[worker]
provider = "command"
command = "python scripts/writer.py"
write_roots = ["code"]

[hard_gates]
commands = [{json.dumps(GATE)}]
protected_paths = ["tests", "scripts"]
timeout_seconds = 60

[score]
command = "python -c pass"
metric = "runtime:wall_seconds"
direction = "minimize"
trials = 1
comparison = "absolute"

[evaluator.files]
{HIDDEN}'''
    search = services.search_freeze(personas.owner, personas.alpha, spec, "HEAD", repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    services.search_run_inline(search)
    leaker = search.candidates.get(candidate_id="cand_002")
    assert b"leak.txt" in bytes(leaker.patch)  # it wrote what came through
    assert b"hidden-marker-5521" not in bytes(leaker.patch)
    assert b"nothing came through" in bytes(leaker.patch)
    # The locking code did run with the hidden test, in its gates (its evaluation's, and its replay's
    # if the noise of the wall times made it a finalist), once the writers had ended.
    gates = Receipt.objects.filter(subject_type="candidate", subject_id=search.candidates.get(
        candidate_id="cand_001").pk, label__contains=" gate 1")
    assert gates and all(gate.succeeded for gate in gates)
