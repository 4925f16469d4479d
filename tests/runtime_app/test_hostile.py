"""Hostile candidates: commands and patches that try to escape, cheat or exhaust the host.

Each case asserts containment and a clear receipt. Commands run under bubblewrap (a
failure in CI if it cannot start, a skip locally) and with rlimits only; without
bubblewrap the network and outside-write cases are not blocked, and the receipt says
`rlimits-only`, which is what these tests check for that mode.
"""

from __future__ import annotations

import dataclasses
import json
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
from runtime_app.models import Receipt
from runtime_app.policy import PolicyRules
from runtime_app.sandbox import RLIMITS_ONLY, Limits, run
from runtime_app.worktrees import patch_extract, tree_remove, worktree_create, worktree_remove
from tests.gitrepo import git
from tests.helpers import login, service_missing, text_of

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


# A bomb whose processes never give up: each child forks for ever, resting when the cap refuses
# it, so its tree is still alive when the command that started it exits (a bash bomb whose
# refused forks end its subshells can die out by itself first, and then proves nothing).
_PERSISTENT_BOMB = """
import os, sys, time
end = time.monotonic() + 2
told = False
while time.monotonic() < end:
    try:
        if os.fork() == 0:
            while True:
                try:
                    os.fork()
                except OSError:
                    time.sleep(0.05)
    except OSError as error:
        if not told:
            print(error, file=sys.stderr, flush=True)
            told = True
        time.sleep(0.05)
"""


def test_a_fork_bomb_is_capped_and_killed_with_nothing_left(worktree, mode):
    if sandbox.pids_cgroup_parent() is None and os.geteuid() == 0:
        service_missing("no writable pids cgroup and running as root: a fork bomb cannot be capped here")
    marker = f"bomb{uuid.uuid4().hex[:8]}"
    receipt = run([sys.executable, "-c", _PERSISTENT_BOMB, marker], cwd=worktree, timeout=10,
                  isolation=mode, limits=Limits(processes=64))
    assert "Resource temporarily unavailable" in receipt.stderr_excerpt  # the cap bound, forks failed
    if receipt.isolation == RLIMITS_ONLY:  # only the sandbox's kill can end what is left
        assert receipt.detail["stray_processes_killed"] >= 1
    # Under bubblewrap the command's pid namespace also ends with it: whichever kill comes first,
    # the sandbox's (and then counted) or the kernel's, nothing of the bomb is left below.
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


def _host_mounts() -> str:
    return Path("/proc/self/mountinfo").read_text()


def test_a_gigabyte_written_to_the_private_tmp_stops_at_its_size_and_the_host_keeps_nothing(worktree, mode):
    _bubblewrap_only(mode)
    mounts = _host_mounts()
    receipt = run("head -c 1073741824 /dev/zero > /tmp/fill; echo wrote $?; ls -l /tmp/fill",
                  cwd=worktree, timeout=120, isolation=mode)
    assert receipt.stdout_excerpt.startswith("wrote 1")
    assert "No space left on device" in receipt.stderr_excerpt
    written = int(receipt.stdout_excerpt.split()[6])
    assert written == Limits().tmp_bytes == 512 << 20 and receipt.limits["tmp_bytes"] == written
    assert receipt.limits["tmp_enforced_by"].startswith("tmpfs size")
    assert {"target": "/tmp", "size_bytes": written}.items() <= next(
        mount for mount in receipt.detail["sandbox"]["mounts"] if mount["target"] == "/tmp").items()
    if receipt.rusage["measured_by"] == "cgroup":  # its tmpfs pages are charged to it: at most the cap
        assert receipt.rusage["max_rss_kib"] < (written >> 10) + (128 << 10)
    assert not Path("/tmp/fill").exists() and _host_mounts() == mounts  # its tmpfs went with it


def test_shared_memory_the_root_and_dev_cannot_hold_more_than_their_caps(worktree, mode):
    _bubblewrap_only(mode)
    script = ("head -c 134217728 /dev/zero > /dev/shm/fill; echo shm $(stat -c %s /dev/shm/fill); "
              "for place in /fill /dev/fill /var /usr/fill /home; do mkdir $place 2>&1 || :; done")
    receipt = run(script, cwd=worktree, timeout=60, isolation=mode)
    assert receipt.stdout_excerpt.count("Read-only file system") == 5
    assert "No space left on device" in receipt.stderr_excerpt
    assert receipt.stdout_excerpt.startswith(f"shm {Limits().shm_bytes}\n")


def test_a_fresh_tree_takes_no_more_writes_than_its_cap_and_stays_pristine(worktree, mode):
    _bubblewrap_only(mode)
    if not sandbox.overlay_available():
        service_missing("no overlay here: a fresh tree is a copy on disk, bounded per file only")
    script = ("head -c 104857600 /dev/zero > one; echo one $?; "
              "head -c 104857600 /dev/zero > two; echo two $?; "
              "mkdir -p deep; for i in $(seq 200); do head -c 1048576 /dev/zero > deep/$i || break; done; "
              "cat one two deep/* | wc -c")
    receipt = run(script, cwd=worktree, timeout=120, isolation=mode, fresh=True,
                  limits=Limits(tree_write_bytes=128 << 20))
    lines = receipt.stdout_excerpt.split()
    assert lines[:2] == ["one", "0"] and lines[2:4] == ["two", "1"] and int(lines[4]) <= 128 << 20
    assert "No space left on device" in receipt.stderr_excerpt
    assert receipt.limits["tree_writes_enforced_by"].startswith("tmpfs size")
    assert not (worktree / "one").exists() and not (worktree / "deep").exists()


def test_the_memory_of_a_command_s_whole_tree_is_capped_where_a_memory_cgroup_can(worktree, mode):
    """Memory no rlimit counts: memfd files (never mapped), held open, 64 MiB at a time."""
    if "memory" not in sandbox.cgroup_parents() and "v2" not in sandbox.cgroup_parents():
        service_missing("no memory cgroup here: only each process's address space is capped")
    code = ("import os\nfds = []\nfor i in range(16):\n    fd = os.memfd_create(f'm{i}')\n"
            "    chunk = bytes(1 << 20)\n    for _ in range(64):\n        os.write(fd, chunk)\n"
            "    fds.append(fd)\nprint('held', len(fds) * 64, 'MiB')\n")
    receipt = run([sys.executable, "-c", code], cwd=worktree, timeout=60, isolation=mode,
                  limits=Limits(memory_bytes=256 << 20))
    assert receipt.signal == 9 and not receipt.timed_out and "held" not in receipt.stdout_excerpt
    assert receipt.detail["oom_killed"] >= 1 and receipt.limits["memory_enforced_by"] == "memory-cgroup"
    assert receipt.rusage["max_rss_kib"] <= 256 << 10


def test_a_score_command_may_write_its_metrics_file_and_nothing_beside_it(worktree, mode, tmp_path):
    _bubblewrap_only(mode)
    target = tmp_path / "metrics.json"
    script = ('echo \'{"ms": 5}\' > "$CRUCIBLE_METRICS_FILE"; dir=$(dirname "$CRUCIBLE_METRICS_FILE"); '
              'head -c 1048576 /dev/zero > "$dir/more" || echo refused; '
              'rm "$CRUCIBLE_METRICS_FILE" || echo kept')
    receipt = run(script, cwd=worktree, timeout=30, isolation=mode, fresh=True, metrics_file=target)
    assert receipt.stdout_excerpt.split() == ["refused", "kept"]
    assert receipt.detail["metrics_file"] == "written" and target.read_text() == '{"ms": 5}\n'


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


def _bubblewrap_only(mode: str) -> None:
    if mode != "required":
        pytest.skip("what bubblewrap hides; rlimits only hides nothing and its receipts say so")


def test_commands_run_as_an_unprivileged_uid_and_root_only_files_stay_unreadable(worktree, mode):
    _bubblewrap_only(mode)
    receipt = run("id -u; id -g; cat /etc/shadow; grep -c CapEff /proc/self/status", cwd=worktree, timeout=30,
                  isolation=mode)
    uid, gid = receipt.stdout_excerpt.split()[:2]
    assert uid != "0" and gid != "0"
    assert "root:" not in receipt.stdout_excerpt and "Permission denied" in receipt.stderr_excerpt
    view = receipt.detail["sandbox"]
    assert view["uid"] == int(uid) and view["network"].startswith("none")


def test_only_the_tree_the_toolchain_and_declared_paths_are_visible(worktree, mode, data_dir, tmp_path):
    _bubblewrap_only(mode)
    # Another instance's data dir beside this one, another project's repository, host services.
    other = data_dir.parent / "other-instance"
    other.mkdir()
    (other / "secret_key").write_text("another instance's key\n")
    (other / "crucible.sqlite3").write_text("another instance's database\n")
    elsewhere = tmp_path / "someone-elses-repo"
    elsewhere.mkdir()
    (elsewhere / "code.py").write_text("private = True\n")
    declared = tmp_path / "declared"
    declared.mkdir()
    (declared / "harness.py").write_text("print('harness')\n")
    script = (f"cat {other}/secret_key {other}/crucible.sqlite3 {elsewhere}/code.py; "
              f"ls /var /srv /run /home; python {declared}/harness.py")
    receipt = run(script, cwd=worktree, timeout=30, isolation=mode, readable=[declared])
    assert "another instance" not in receipt.stdout_excerpt and "private" not in receipt.stdout_excerpt
    assert receipt.stderr_excerpt.count("No such file or directory") >= 7
    assert receipt.stdout_excerpt.strip().endswith("harness")
    mounts = {item["target"]: item["mode"] for item in receipt.detail["sandbox"]["mounts"]}
    assert mounts[str(worktree)] == "rw" and mounts[str(declared)] == "ro" and "/" not in mounts


def test_host_unix_sockets_cannot_be_reached(worktree, mode):
    """A database's or a broker's socket under /run (or /var/run) would be reachable through a
    read-only bind of /: writers, gates and trials see none."""
    _bubblewrap_only(mode)
    folder = Path("/run") / f"crucible-socket-test-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o755)
    path = folder / ".s.PGSQL.5432"
    abstract = f"\0crucible-test-{uuid.uuid4().hex[:8]}"
    try:
        with socket.socket(socket.AF_UNIX) as listener, socket.socket(socket.AF_UNIX) as hidden:
            listener.bind(str(path))
            path.chmod(0o777)
            listener.listen()
            hidden.bind(abstract)
            hidden.listen()
            code = ("import socket, sys\n"
                    f"for address in ({str(path)!r}, {abstract!r}):\n"
                    "    s = socket.socket(socket.AF_UNIX)\n"
                    "    try:\n        s.connect(address); print('connected')\n"
                    "    except OSError as error:\n        print('refused', error.errno)\n")
            receipt = run([sys.executable, "-c", code], cwd=worktree, timeout=30, isolation=mode)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert receipt.succeeded, receipt.stderr_excerpt
    assert "connected" not in receipt.stdout_excerpt and receipt.stdout_excerpt.count("refused") == 2


def test_receipts_count_the_command_s_own_cpu_and_memory(worktree, mode):
    if sandbox.pids_cgroup_parent() is None:
        service_missing("no cgroups here: CPU and memory cannot be counted for the command's tree")
    code = ("import time; b = bytearray(200 << 20); end = time.process_time() + 0.4\n"
            "while time.process_time() < end: pass")
    # Run by a child of a shell, as a test suite's subprocess would be.
    receipt = run(f"{sys.executable} -c '{code}' & wait", cwd=worktree, timeout=60, isolation=mode)
    assert receipt.succeeded, receipt.stderr_excerpt
    cpu = receipt.rusage["user_cpu_seconds"] + receipt.rusage["sys_cpu_seconds"]
    assert cpu >= 0.35 and receipt.rusage["max_rss_kib"] >= 190 * 1024
    assert receipt.rusage["measured_by"] == "cgroup"


def test_a_command_on_a_fresh_tree_leaves_the_pristine_tree_as_it_was(worktree, mode):
    (worktree / "tests").mkdir(exist_ok=True)
    (worktree / "tests" / "test_x.py").write_text("def test_x():\n    assert 1\n")
    (worktree / "code.py").write_text("real = True\n")
    vandal = ("echo 'real = False' > code.py; echo planted > sitecustomize.py; rm -f README*; "
              "echo 'def test_x(): pass' > tests/test_x.py; rm -rf tests")
    first = run(vandal, cwd=worktree, timeout=30, isolation=mode, fresh=True, read_only=["tests"])
    second = run("cat code.py; ls; cat tests/test_x.py", cwd=worktree, timeout=30, isolation=mode, fresh=True)
    assert (worktree / "code.py").read_text() == "real = True\n"
    assert not (worktree / "sitecustomize.py").exists()
    assert second.stdout_excerpt.startswith("real = True\n") and "sitecustomize" not in second.stdout_excerpt
    assert "assert 1" in second.stdout_excerpt
    if mode == "required":
        assert "Read-only file system" in first.stderr_excerpt or "Permission denied" in first.stderr_excerpt
        assert "fresh" in first.detail["sandbox"]["tree"]


def test_runtime_variables_that_look_secret_still_reach_commands(worktree, mode):
    receipt = run("echo $CRUCIBLE_MAX_TOKENS", cwd=worktree, timeout=30, isolation=mode,
                  env={"CRUCIBLE_MAX_TOKENS": "12345", "MY_API_TOKEN": "sk-nope-nope"})
    assert receipt.stdout_excerpt == "12345\n" and receipt.env_refused == ["MY_API_TOKEN"]


# ----------------------------------------------------------------------------------- patches


RULES = PolicyRules(write_roots=("src/",), protected_paths=("scripts/",), score_script="scripts/bench.sh")


def _admit(repo, v1, patch_text: bytes):
    """patch_admit as a writer's refinement gets it (a worktree), checked against the plain tree an
    evaluation gets (`plain=True`): both must reach the same verdict, at the same stage, for the
    same paths."""
    plain, judged = services.patch_admit(repo, v1, patch_text, f"eval_{uuid.uuid4().hex[:6]}", RULES,
                                         plain=True)
    worktree, receipt = services.patch_admit(repo, v1, patch_text, f"eval_{uuid.uuid4().hex[:6]}", RULES)
    for name in ("verdict", "stage"):
        assert judged.detail[name] == receipt.detail[name], (name, judged.detail, receipt.detail)
    assert {v["path"] for v in judged.detail.get("violations", [])} == \
        {v["path"] for v in receipt.detail.get("violations", [])}
    if plain is not None:
        assert not (plain / ".git").exists()
        if worktree is not None:  # the same files, byte for byte
            assert _files(plain) == {path: data for path, data in _files(worktree).items()
                                     if not path.startswith(".git")}
        tree_remove(plain)
    return worktree, receipt


def _files(tree: Path) -> dict[str, bytes]:
    return {str(path.relative_to(tree)): path.read_bytes() for path in tree.rglob("*")
            if path.is_file() and not path.is_symlink()}


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


# ------------------------------------------------------------------------- forged scores and gates
#
# A real repository and a scripted writer per candidate: one honest, fast candidate among forgers
# whose real code is as slow as the baseline, and a gate-neutraliser whose code is wrong. Every
# command runs in the real sandbox; the runtime must credit what the code really does.

HOSTILE_WRITER = r'''import os, pathlib, sys
sys.stdin.read()
what = {"cand_001": "honest", "cand_002": "atexit", "cand_003": "metrics_file", "cand_004": "clock",
        "cand_005": "rewrite_script", "cand_006": "neutralise"}[os.environ["CRUCIBLE_CANDIDATE_ID"]]
SLOW = "def compute(n):\n    return sum(i * i for i in range(n))\n"
FAST = "def compute(n):\n    return (n - 1) * n * (2 * n - 1) // 6\n"
WRONG = "def compute(n):\n    return 285\n"
FORGERIES = {
    "atexit": "import atexit\natexit.register(lambda: print('{\"ms\": 0.001}', flush=True))\n",
    "metrics_file": ("import json, os\npath = os.environ.get('CRUCIBLE_METRICS_FILE')\n"
                     "if path:\n    open(path, 'w').write(json.dumps({'ms': 0.001}))\n"),
    "clock": "import time\n_ticks = iter(range(10**9))\ntime.perf_counter = lambda: next(_ticks) * 1e-9\n",
    # While a gate imports it, rewrite the protected score script that the trials run later.
    "rewrite_script": ("import pathlib\ntry:\n    pathlib.Path('scripts/bench.py').write_text("
                       "'print(\\'{\"ms\": 0.001}\\')\\n')\nexcept OSError:\n    pass\n"),
    # Imported by gate 1, weaken the tests and the hidden test that gate 2 runs.
    "neutralise": ("import pathlib\nfor test in ('tests/test_work.py', 'tests/test_hidden.py'):\n    try:\n"
                   "        pathlib.Path(test).write_text('def test_nothing():\\n    pass\\n')\n"
                   "    except OSError:\n        pass\n"),
}
code = {"honest": FAST, "neutralise": WRONG}.get(what, SLOW)
pathlib.Path("code/work.py").write_text(FORGERIES.get(what, "") + code)
'''

BENCH = r'''import json, sys, time
sys.path.insert(0, "code")
from work import compute
start = time.perf_counter()
compute(1_500_000)
print(json.dumps({"ms": (time.perf_counter() - start) * 1000}))
'''

HOSTILE_FILES = {
    "code/work.py": "def compute(n):\n    return sum(i * i for i in range(n))\n",
    "tests/test_work.py": ("import sys\nsys.path.insert(0, 'code')\nfrom work import compute\n\n"
                           "def test_small():\n    assert compute(10) == 285\n\n"
                           "def test_large():\n    assert compute(1000) == 332833500\n"),
    "scripts/bench.py": BENCH,
    "scripts/writer.py": HOSTILE_WRITER,
    "pytest.ini": "[pytest]\ntestpaths = tests\n",
}

HIDDEN_TEST = ("import sys\\nsys.path.insert(0, 'code')\\nfrom work import compute\\n\\n"
               "def test_hidden():\\n    assert compute(7) == 91\\n")


def _hostile_spec(metric: str, population: int) -> str:
    gate = "python -c \"import sys; sys.path.insert(0, 'code'); import work\""
    return f"""name = "hostile"
objective = "Make compute() faster without changing its result"
population = {population}
rounds = [{population}, 1]
concurrency = 3

[worker]
provider = "command"
command = "python scripts/writer.py"
write_roots = ["code"]

[evaluator.files]
"tests/test_hidden.py" = "{HIDDEN_TEST}"

[hard_gates]
commands = [{json.dumps(gate)}, "python -m pytest -q -p no:cacheprovider tests"]
protected_paths = ["tests", "scripts"]

[score]
command = "python scripts/bench.py"
metric = "{metric}"
{'' if metric.startswith("runtime:") else 'reported = "time_ms"'}
direction = "minimize"
trials = 2
"""


def _hostile_search(personas, tmp_path, metric: str, population: int = 6):
    from search_app import services as search_services
    from tests.gitrepo import repo_create

    repo = repo_create(tmp_path / "hostile-repo", HOSTILE_FILES)
    search = search_services.search_freeze(personas.owner, personas.alpha, _hostile_spec(metric, population),
                                           "HEAD", repository_path=str(repo))
    search_services.search_start(personas.owner, search, enqueue=False)
    outcome = search_services.search_run_inline(search)
    return outcome, {c.candidate_id: c for c in search.candidates.all()}


def _require_bubblewrap() -> None:
    available, reason = sandbox.bubblewrap_probe()
    if not available:
        service_missing(reason)


@pytest.mark.django_db(transaction=True)
def test_score_forgers_lose_to_the_honest_candidate_when_the_runtime_measures(personas, tmp_path, data_dir,
                                                                              settings):
    """atexit lines, the metrics file, a patched clock and a rewritten score script change nothing
    the runtime measures; the neutraliser's wrong code still meets the real tests."""
    _require_bubblewrap()
    settings.CONFIG = dataclasses.replace(settings.CONFIG, sandbox="required")
    outcome, candidates = _hostile_search(personas, tmp_path, "runtime:cpu_seconds")
    reasons = {cid: c.reason for cid, c in candidates.items()}
    assert outcome.outcome == "winner" and outcome.winner.candidate_id == "cand_001", reasons
    for forger in ("cand_002", "cand_003", "cand_004", "cand_005"):
        # Measured as what it is, as slow as the baseline: its forgery bought it nothing.
        assert candidates[forger].state == "eliminated" and candidates[forger].score > 0.8, reasons
    assert candidates["cand_006"].state == "eliminated" and "gate 2" in reasons["cand_006"]
    assert candidates["cand_001"].score < 0.5  # its real CPU time, against the baseline's in each block


@pytest.mark.django_db(transaction=True)
def test_a_forged_score_script_and_weakened_tests_never_reach_the_next_command(personas, tmp_path, data_dir,
                                                                              settings):
    """With a metric the score script reports, the forger that rewrote the script while a gate ran
    is still scored by the real script, and the gate-neutraliser still fails gate 2."""
    _require_bubblewrap()
    settings.CONFIG = dataclasses.replace(settings.CONFIG, sandbox="required")
    _, candidates = _hostile_search(personas, tmp_path, "ms")
    reasons = {cid: c.reason for cid, c in candidates.items()}
    assert candidates["cand_006"].state == "eliminated" and "gate 2" in reasons["cand_006"], reasons
    forged = candidates["cand_005"]
    assert forged.state == "eliminated" and forged.score_absolute and forged.score_absolute > 1, reasons
    trial = Receipt.objects.filter(subject_type="candidate", subject_id=forged.pk,
                                   label__contains=" trial ").first()
    assert trial.detail["metric_source"] == ("reported by the score command, checked against the runtime's "
                                             "measurement")
    assert "0.001" not in trial.stdout_excerpt


@pytest.mark.django_db
def test_a_receipt_page_shows_the_uid_network_and_mounts_in_force(worktree, mode, personas):
    receipt = services.command_run(["true"], cwd=worktree, timeout=30, isolation=mode, project=personas.alpha)
    page = text_of(login(personas.owner).get(f"/receipts/{receipt.pk}/"))
    view = receipt.detail["sandbox"]
    assert f"uid {view['uid']}" in page and view["network"] in page and "lane" in page
    if mode == "required":
        assert f"{len(view['mounts'])} mounts" in page and str(worktree) in page
