"""Hostile candidates: commands and patches that try to escape, cheat or exhaust the host.

Each case asserts containment and a clear receipt. Commands run under bubblewrap (a
failure in CI if it cannot start, a skip locally) and with rlimits only; without
bubblewrap the network and outside-write cases are not blocked, and the receipt says
`rlimits-only`, which is what these tests check for that mode.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import uuid
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from runtime_app import sandbox, services
from runtime_app.git import GitError
from runtime_app.metrics import metric_read
from runtime_app.policy import PolicyRules
from runtime_app.sandbox import RLIMITS_ONLY, Limits, run
from runtime_app.worktrees import patch_extract, worktree_create, worktree_remove
from tests.conftest import service_missing
from tests.gitrepo import git

GIB = 1 << 30


@pytest.fixture
def worktree(repo, v1) -> Path:
    path = worktree_create(repo, v1, f"cand_{uuid.uuid4().hex[:6]}")
    yield path
    if path.exists():
        worktree_remove(repo, path)


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path("/proc", entry, "cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


# ---------------------------------------------------------------------------------- commands


def test_a_fork_bomb_is_capped_and_killed_with_nothing_left(worktree, mode):
    if sandbox.pids_cgroup_parent() is None and os.geteuid() == 0:
        service_missing("no writable pids cgroup and running as root: a fork bomb cannot be capped here")
    marker = f"bomb{uuid.uuid4().hex[:8]}"
    receipt = run(["/bin/bash", "-c", "b(){ b | b & }; b; sleep 2", marker], cwd=worktree, timeout=10,
                  isolation=mode, limits=Limits(processes=64))
    assert "Resource temporarily unavailable" in receipt.stderr_excerpt  # the cap bound, forks failed
    assert receipt.detail["stray_processes_killed"] >= 1  # the bomb was still running when it ended
    if "peak_processes" in receipt.detail:
        assert receipt.detail["peak_processes"] <= 64
    assert receipt.duration_seconds < 30
    assert _processes_with(marker) == []


def test_an_infinite_loop_is_stopped_at_its_timeout(worktree, mode):
    receipt = run("while :; do :; done", cwd=worktree, timeout=1, isolation=mode)
    assert receipt.timed_out and receipt.signal == 9 and receipt.outcome == "timed out"
    assert 1 <= receipt.duration_seconds < 15


def test_a_gigabyte_of_output_is_counted_and_hashed_but_not_kept(worktree, mode):
    receipt = run(["head", "-c", str(GIB), "/dev/zero"], cwd=worktree, timeout=120, isolation=mode)
    assert receipt.succeeded and receipt.stdout_bytes == GIB
    assert receipt.stdout_sha256 == "49bc20df15e412a64472421e13fe86ff1c5165e18b2afccf160d4dc19fe68a14"
    assert len(receipt.stdout_excerpt) < Limits().output_bytes + 100


def test_a_memory_balloon_hits_the_address_space_limit(worktree, mode):
    receipt = run([sys.executable, "-c", "b = bytearray(4 << 30)"], cwd=worktree, timeout=60,
                  isolation=mode, limits=Limits(address_space_bytes=1 << 30))
    assert receipt.exit_code == 1 and "MemoryError" in receipt.stderr_excerpt


def test_writing_outside_the_worktree_is_blocked_by_bubblewrap(worktree, mode):
    # Under the project's var/ but outside the data dir: a real, writable host directory.
    outside = Path(django_settings.BASE_DIR, "var", f"escape-{uuid.uuid4().hex[:8]}")
    outside.mkdir(parents=True)
    try:
        receipt = run(f"echo pwned > {outside}/pwned; echo pwned > /etc/crucible-pwned", cwd=worktree,
                      timeout=30, isolation=mode)
        if mode == "required":
            assert receipt.exit_code != 0 and "Read-only file system" in receipt.stderr_excerpt
            assert not (outside / "pwned").exists() and not Path("/etc/crucible-pwned").exists()
        else:
            assert receipt.isolation == RLIMITS_ONLY
            assert (outside / "pwned").exists()  # the weakness the receipt owns up to
    finally:
        shutil.rmtree(outside)
        Path("/etc/crucible-pwned").unlink(missing_ok=True)


def test_the_server_home_data_dir_and_checkout_cannot_be_read_under_bubblewrap(worktree, mode, data_dir):
    sentinel = Path.home() / f".crucible-sandbox-test-{uuid.uuid4().hex[:8]}"
    sentinel.write_text("home secret\n")
    (data_dir / "secret_key").write_text("data secret\n")
    checkout = Path(django_settings.BASE_DIR)
    try:
        receipt = run(f"cat {sentinel}; cat {data_dir}/secret_key; ls -A {Path.home()}/.ssh; "
                      f"head -c 9 {checkout}/pyproject.toml", cwd=worktree, timeout=30, isolation=mode)
    finally:
        sentinel.unlink()
    if mode == "required":
        assert "secret" not in receipt.stdout_excerpt and "[build-sy" not in receipt.stdout_excerpt
        assert receipt.stderr_excerpt.count("No such file or directory") == 4
    else:
        assert receipt.isolation == RLIMITS_ONLY and "home secret" in receipt.stdout_excerpt


def test_a_network_socket_cannot_reach_anything_under_bubblewrap(worktree, mode):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), 3); print('connected')"
        receipt = run([sys.executable, "-c", code], cwd=worktree, timeout=30, isolation=mode)
        listener.setblocking(False)
        try:
            listener.accept()[0].close()
            reached = True
        except BlockingIOError:
            reached = False
    if mode == "required":
        assert receipt.exit_code == 1 and "connected" not in receipt.stdout_excerpt
        assert "Error" in receipt.stderr_excerpt and not reached
    else:
        assert receipt.isolation == RLIMITS_ONLY and receipt.stdout_excerpt == "connected\n" and reached


@pytest.mark.parametrize(("script", "reason"), [
    ('echo \'{"runtime": 0.0001}\'; echo "ALL TESTS PASSED"; exit 1', "exit 1"),
    ("echo 'runtime: 0.0001 (best ever)'", "not a JSON object"),
    ('echo \'{"runtime": "0.0001"}\'', "not a finite number"),
    ('echo \'{"runtime": NaN}\'', "not a finite number"),
    ("echo '{\"score\": 1}'", "no metric 'runtime'"),
])
def test_a_printed_fake_score_never_counts(worktree, script, reason):
    receipt = run(script, cwd=worktree, timeout=30, isolation="off")
    reading = metric_read(receipt, "runtime")
    assert reading.value is None and reason in reading.reason


def test_background_processes_are_killed_when_the_command_ends(worktree, mode):
    marker = f"{4000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 997}"
    script = f"sleep {marker} & setsid sleep {marker} & nohup sleep {marker} >/dev/null 2>&1 & echo left"
    receipt = run(script, cwd=worktree, timeout=60, isolation=mode)
    assert receipt.succeeded and receipt.stdout_excerpt == "left\n"
    assert receipt.duration_seconds < 20  # did not wait on the pipe the sleeps hold
    assert _processes_with(f"sleep\0{marker}") == []


def test_deleting_the_worktree_is_contained_and_the_runtime_reports_it(repo, worktree, mode):
    receipt = run(f"rm -rf {worktree}/* {worktree}/.git; rm -rf {worktree}; ls -A {worktree} | wc -l",
                  cwd=worktree, timeout=30, isolation=mode)
    assert receipt.exit_code == 0
    assert repo.joinpath(".git").is_dir() and git(repo, "status", "--porcelain") == ""
    with pytest.raises(GitError, match=r"not a git worktree|does not exist"):
        patch_extract(worktree)
    worktree_remove(repo, worktree)
    assert not worktree.exists()


# ----------------------------------------------------------------------------------- patches


RULES = PolicyRules(write_roots=("src/",), protected_paths=("scripts/",), score_script="scripts/bench.sh")


def _admit(repo, v1, patch_text: bytes):
    return services.patch_admit(repo, v1, patch_text, f"eval_{uuid.uuid4().hex[:6]}", RULES)


def _candidate_patch(repo, v1, edit) -> bytes:
    """Let a 'candidate' edit a real worktree, then extract its patch as the runtime does."""
    candidate = worktree_create(repo, v1, f"cand_{uuid.uuid4().hex[:6]}")
    try:
        edit(candidate)
        return patch_extract(candidate).text
    finally:
        worktree_remove(repo, candidate)


@pytest.mark.django_db
def test_a_patch_adding_a_symlink_and_writing_through_it_is_refused_and_writes_nothing(repo, v1, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    text = (
        "diff --git a/src/link b/src/link\nnew file mode 120000\nindex 0000000..1111111\n--- /dev/null\n"
        f"+++ b/src/link\n@@ -0,0 +1 @@\n+{outside}\n\\ No newline at end of file\n"
        "diff --git a/src/link/pwned b/src/link/pwned\nnew file mode 100644\nindex 0000000..2222222\n"
        "--- /dev/null\n+++ b/src/link/pwned\n@@ -0,0 +1 @@\n+pwned\n"
    ).encode()
    worktree, receipt = _admit(repo, v1, text)
    assert worktree is None and receipt.outcome == "rejected"
    assert receipt.detail["stage"] == "apply" and "link" in receipt.detail["reason"]
    assert list(outside.iterdir()) == []


@pytest.mark.django_db
def test_a_symlink_alone_is_refused_by_the_policy(repo, v1):
    text = _candidate_patch(repo, v1, lambda wt: (wt / "src").mkdir(exist_ok=True)
                            or os.symlink("/etc/passwd", wt / "src" / "passwd"))
    worktree, receipt = _admit(repo, v1, text)
    assert worktree is None and receipt.detail["stage"] == "policy"
    assert any(v["path"] == "src/passwd" and "symlink" in v["reason"] for v in receipt.detail["violations"])


@pytest.mark.django_db
def test_a_patch_to_git_hooks_is_refused_and_no_hook_appears(repo, v1):
    text = (
        b"diff --git a/.git/hooks/post-checkout b/.git/hooks/post-checkout\nnew file mode 100755\n"
        b"index 0000000..3333333\n--- /dev/null\n+++ b/.git/hooks/post-checkout\n@@ -0,0 +1,2 @@\n"
        b"+#!/bin/sh\n+touch /tmp/crucible-hook-ran\n"
    )
    worktree, receipt = _admit(repo, v1, text)
    assert worktree is None and receipt.outcome == "rejected"
    assert not (repo / ".git" / "hooks" / "post-checkout").exists()
    assert not Path("/tmp/crucible-hook-ran").exists()


@pytest.mark.django_db
def test_a_patch_renaming_a_test_file_is_refused_naming_both_paths(repo, v1):
    def rename(wt: Path) -> None:
        git(wt, "mv", "tests/test_certificate.py", "tests/test_renamed.py")

    worktree, receipt = _admit(repo, v1, _candidate_patch(repo, v1, rename))
    assert worktree is None and receipt.detail["stage"] == "policy"
    paths = {violation["path"] for violation in receipt.detail["violations"]}
    assert {"tests/test_certificate.py", "tests/test_renamed.py"} <= paths


@pytest.mark.django_db
def test_a_patch_adding_conftest_is_refused(repo, v1):
    def add(wt: Path) -> None:
        (wt / "src").mkdir(exist_ok=True)
        (wt / "src" / "conftest.py").write_text("import pytest\n")

    worktree, receipt = _admit(repo, v1, _candidate_patch(repo, v1, add))
    assert worktree is None
    assert any(v["path"] == "src/conftest.py" for v in receipt.detail["violations"])


@pytest.mark.django_db
def test_a_crlf_patch_inside_the_write_roots_is_admitted_byte_for_byte(repo, v1):
    def add(wt: Path) -> None:
        (wt / "src").mkdir(exist_ok=True)
        (wt / "src" / "windows.txt").write_bytes(b"one\r\ntwo\r\n")

    worktree, receipt = _admit(repo, v1, _candidate_patch(repo, v1, add))
    assert receipt.outcome == "admitted" and receipt.succeeded
    assert (worktree / "src" / "windows.txt").read_bytes() == b"one\r\ntwo\r\n"
    worktree_remove(repo, worktree)


@pytest.mark.django_db
def test_a_binary_file_is_refused_with_a_receipt(repo, v1):
    def add(wt: Path) -> None:
        (wt / "src").mkdir(exist_ok=True)
        (wt / "src" / "blob.bin").write_bytes(bytes(range(256)) * 4)

    worktree, receipt = _admit(repo, v1, _candidate_patch(repo, v1, add))
    assert worktree is None
    assert any(v["path"] == "src/blob.bin" and "binary" in v["reason"] for v in receipt.detail["violations"])


@pytest.mark.django_db
def test_a_huge_hunk_is_refused_as_oversized_and_the_receipt_keeps_only_a_summary(repo, v1):
    def add(wt: Path) -> None:
        (wt / "src").mkdir(exist_ok=True)
        (wt / "src" / "huge.py").write_text("x = 1\n" * 400_000)

    text = _candidate_patch(repo, v1, add)
    assert len(text) > 2_000_000
    worktree, receipt = _admit(repo, v1, text)
    assert worktree is None
    assert any(v["path"] == "src/huge.py" and "large" in v["reason"] for v in receipt.detail["violations"])
    assert receipt.detail["diff_lines"] == 400_000 and len(str(receipt.as_dict())) < 10_000
