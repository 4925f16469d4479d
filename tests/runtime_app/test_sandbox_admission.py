"""How a bubblewrap run is started cheaply without giving anything up: it is admitted to its
cgroups from outside while bubblewrap waits at its block fd, and its stage is mounted by this
worker's stager (runtime_app.sandbox_stager) instead of by three processes per run.

Each test is a command that would gain something if the guarantee were dropped."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest

from runtime_app import sandbox
from runtime_app.sandbox import Limits, run
from tests.helpers import service_missing


@pytest.fixture(autouse=True)
def bubblewrap() -> None:
    if not sandbox.bubblewrap_probe()[0]:
        service_missing("bubblewrap cannot start here")


def _stage_slots() -> list[str]:
    """What this worker's stager has mounted in its base, seen from inside its namespace."""
    stager = sandbox._stagers.get(os.getpid())
    if not isinstance(stager, sandbox._Stager) or not stager.alive():
        return []
    # Releases are not answered; a request that is (staging nothing) comes after them in order.
    stager.ask({"run": "settle", "binds": [], "overlays": []})
    done = subprocess.run(["nsenter", f"--mount={stager.namespace}", "ls", "-A", stager.base],
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_the_command_holds_no_descriptor_but_its_three_streams(tree):
    # It used to hold the run's cgroup.procs files open (it joined its accounting cgroups itself).
    receipt = run(["/bin/sh", "-c", "cd /proc/self/fd && echo *"], cwd=tree, timeout=30, isolation="required")
    assert receipt.exit_code == 0, receipt.stderr_excerpt
    # The shell's own `cd` handle on the folder it lists is the one more it may show.
    assert set(receipt.stdout_excerpt.split()) <= {"0", "1", "2", "3"}, receipt.stdout_excerpt
    assert len(receipt.stdout_excerpt.split()) <= 4


def test_the_command_and_all_it_starts_are_counted_in_its_own_cgroups(tree):
    if not sandbox.cgroup_parents():
        service_missing("no cgroups here")
    busy = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"
    receipt = run(["/bin/sh", "-c", f"({busy}) & ({busy}) & wait"], cwd=tree, timeout=120,
                  isolation="required")
    assert receipt.exit_code == 0, receipt.stderr_excerpt
    assert receipt.rusage["measured_by"] == "cgroup"
    # Two background children each spin; a count of the shell alone would be near zero.
    assert receipt.rusage["user_cpu_seconds"] + receipt.rusage["sys_cpu_seconds"] > 0.05
    assert receipt.detail["peak_processes"] >= 3


def test_a_process_left_running_by_one_command_is_killed_and_not_in_the_next(tree):
    if sandbox.pids_cgroup_parent() is None:
        service_missing("no pids cgroup here")
    first = run(["/bin/sh", "-c", "setsid sleep 300 >/dev/null 2>&1 < /dev/null & echo started"], cwd=tree,
                timeout=30, isolation="required")
    # (Whether the runtime or the pid namespace's end kills it first is a race: what holds is below.)
    assert first.exit_code == 0 and first.stdout_excerpt == "started\n"
    second = run(["/bin/sh", "-c", "ps -e -o comm= 2>/dev/null || ls /proc"], cwd=tree, timeout=30,
                 isolation="required")
    assert "sleep" not in second.stdout_excerpt
    assert not [line for line in subprocess.run(["ps", "-eo", "user=,args="], capture_output=True, text=True,
                                                check=True).stdout.splitlines()
                if line.split()[0] in ("nobody", "65534") and "sleep 300" in line]


def test_memory_filled_by_one_command_is_not_charged_to_the_next(tree):
    if "memory" not in sandbox.cgroup_parents() and "v2" not in sandbox.cgroup_parents():
        service_missing("no memory cgroup here")
    fill = run(["/bin/sh", "-c", "head -c 150000000 /dev/zero > /tmp/fill && echo filled"], cwd=tree,
               timeout=60, isolation="required")
    assert fill.stdout_excerpt == "filled\n" and fill.rusage["max_rss_kib"] > 100_000
    after = run(["true"], cwd=tree, timeout=30, isolation="required")
    assert after.rusage["max_rss_kib"] < 50_000  # its own peak, not the 150 MB before it


def test_a_memory_limit_still_kills_a_command_admitted_from_outside(tree):
    if "memory" not in sandbox.cgroup_parents() and "v2" not in sandbox.cgroup_parents():
        service_missing("no memory cgroup here")
    receipt = run(["/bin/sh", "-c", "head -c 400000000 /dev/zero > /dev/shm/x; head -c 400000000 /dev/zero "
                   "> /tmp/y; echo survived"], cwd=tree, timeout=60, isolation="required",
                  limits=Limits(memory_bytes=128 << 20, shm_bytes=1 << 30, tmp_bytes=1 << 30))
    assert "survived" not in receipt.stdout_excerpt and receipt.detail.get("oom_killed", 0) >= 1


def test_a_run_that_cannot_be_admitted_never_starts_its_command(tree, monkeypatch):
    if not sandbox.cgroup_parents():
        service_missing("no cgroups here")
    marker = tree / "ran"

    def refuse(self, child):
        raise OSError(13, "refused for the test")

    monkeypatch.setattr(sandbox._RunCgroups, "admit", refuse)
    with pytest.raises(sandbox.SandboxError, match="cgroups"):
        run(["/bin/sh", "-c", f"touch {marker}"], cwd=tree, timeout=30, isolation="required")
    assert not marker.exists()


def test_a_finished_run_leaves_no_slot_mounted_in_the_stager(tree):
    receipt = run(["true"], cwd=tree, timeout=30, isolation="required", fresh=True, read_only=["README"])
    assert receipt.exit_code == 0, receipt.stderr_excerpt
    if sandbox._stagers.get(os.getpid()) is None:
        service_missing("no stager here (not root, or no nsenter): each run makes its own stage")
    assert _stage_slots() == []


def test_a_command_cannot_reach_the_tree_of_a_run_staged_beside_it(data_dir):
    secret_tree = data_dir / "worktrees" / "cand_secret"
    secret_tree.mkdir(parents=True)
    (secret_tree / "hidden_test.py").write_text("SECRET = 42\n")
    prying_tree = data_dir / "worktrees" / "cand_prying"
    prying_tree.mkdir(parents=True)
    started = threading.Event()
    holder: dict = {}

    def hold() -> None:
        holder["receipt"] = run(["/bin/sh", "-c", "touch started; sleep 3"], cwd=secret_tree, timeout=30,
                                isolation="required", fresh=True)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        for _ in range(200):
            if _stage_slots() or started.wait(0.05):
                break
        stager = sandbox._stagers.get(os.getpid())
        base = stager.base if isinstance(stager, sandbox._Stager) else "/run"
        prying = run(["/bin/sh", "-c", f"cat {secret_tree}/hidden_test.py; ls -A {base}; "
                      f"grep -rs SECRET {base} /proc/1/root{base} 2>&1; true"],
                     cwd=prying_tree, timeout=30, isolation="required")
    finally:
        thread.join()
    assert "42" not in prying.stdout_excerpt and "hidden_test" not in prying.stdout_excerpt
    assert holder["receipt"].exit_code == 0


def test_a_stager_that_died_is_replaced_and_the_next_run_still_works(tree):
    run(["true"], cwd=tree, timeout=30, isolation="required")
    stager = sandbox._stagers.get(os.getpid())
    if not isinstance(stager, sandbox._Stager):
        service_missing("no stager here: each run makes its own stage")
    stager.process.kill()
    stager.process.wait()
    receipt = run(["cat", "README"], cwd=tree, timeout=30, isolation="required")
    assert receipt.exit_code == 0 and receipt.stdout_excerpt == "hello\n", receipt.stderr_excerpt
    assert sandbox._stagers[os.getpid()] is not stager


def test_without_a_stager_each_run_stages_itself_with_the_same_view(tree, monkeypatch):
    monkeypatch.setattr(sandbox, "_stager", lambda: None)
    receipt = run(["/bin/sh", "-c", "cat README; id -u; echo x > /etc/x || echo refused"], cwd=tree,
                  timeout=30, isolation="required")
    assert receipt.stdout_excerpt.splitlines()[0] == "hello"
    assert "refused" in receipt.stdout_excerpt
    if os.geteuid() == 0:
        assert receipt.stdout_excerpt.splitlines()[1] == str(sandbox.sandbox_identity()[0])


def test_a_stager_started_by_a_thread_that_ended_still_serves_the_next_run(tree):
    old = sandbox._stagers.pop(os.getpid(), None)
    if isinstance(old, sandbox._Stager):
        old.stop()
    thread = threading.Thread(target=lambda: run(["true"], cwd=tree, timeout=30, isolation="required"))
    thread.start()
    thread.join()
    stager = sandbox._stagers.get(os.getpid())
    if not isinstance(stager, sandbox._Stager):
        service_missing("no stager here: each run makes its own stage")
    receipt = run(["cat", "README"], cwd=tree, timeout=30, isolation="required")
    assert receipt.stdout_excerpt == "hello\n", receipt.stderr_excerpt
    assert sandbox._stagers[os.getpid()] is stager and stager.alive()
