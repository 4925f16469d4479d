"""The sandbox runs real commands as real subprocesses and describes each in a receipt.

Most tests run twice: under bubblewrap (skipped locally when it cannot start, a failure in
CI) and with rlimits only. tests/runtime_app/test_hostile.py holds the hostile commands.
"""

from __future__ import annotations

import hashlib
import os
import selectors
import shutil
import stat
import sys
import tempfile
import threading
import types
import uuid
from pathlib import Path

import pytest

from runtime_app import sandbox
from runtime_app.sandbox import BUBBLEWRAP, RLIMITS_ONLY, Limits, SandboxError, run
from tests.helpers import service_missing


@pytest.fixture
def no_bubblewrap(monkeypatch) -> None:
    """A PATH where `bwrap` is a program that cannot start, as on a host without user namespaces.
    It lies where the unprivileged sandbox user can run it (tmp_path is private to root)."""
    bin_dir = Path(tempfile.mkdtemp(prefix="crucible-no-bwrap-"))
    bin_dir.chmod(0o755)
    fake = bin_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    sandbox.bubblewrap_probe.cache_clear()
    yield
    sandbox.bubblewrap_probe.cache_clear()
    shutil.rmtree(bin_dir)


def test_a_command_s_exit_code_output_and_timing_are_in_its_receipt(tree, mode):
    receipt = run("echo out; echo err >&2; exit 3", cwd=tree, timeout=30, isolation=mode)
    assert receipt.exit_code == 3 and receipt.signal is None and not receipt.timed_out
    assert receipt.stdout_excerpt == "out\n" and receipt.stderr_excerpt == "err\n"
    assert receipt.stdout_bytes == 4 and receipt.stdout_sha256 == hashlib.sha256(b"out\n").hexdigest()
    assert receipt.argv == ["/bin/sh", "-c", "echo out; echo err >&2; exit 3"]
    assert receipt.isolation == (BUBBLEWRAP if mode == "required" else RLIMITS_ONLY)
    assert receipt.finished_at >= receipt.started_at and receipt.duration_seconds > 0
    assert receipt.rusage["user_cpu_seconds"] is not None and receipt.rusage["max_rss_kib"] > 0
    assert receipt.outcome == "exit 3" and not receipt.succeeded


def test_output_that_arrives_as_the_command_is_reaped_is_kept(monkeypatch):
    """On a loaded host the reader can be descheduled between a select that found nothing and
    its look at `stop`: the command writes its one line and exits, the runtime reaps it and sets
    `stop`, all in that gap. The line is still in the pipe and must reach the receipt."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    process = types.SimpleNamespace(stdout=os.fdopen(out_r, "rb"), stderr=os.fdopen(err_r, "rb"))
    captures = {out_r: sandbox._Capture(1 << 16), err_r: sandbox._Capture(1 << 16)}
    stop = threading.Event()

    class DescheduledReader(selectors.DefaultSelector):
        gap_taken = False

        def select(self, timeout=None):
            if not self.gap_taken:  # this select found nothing; then, before the reader looks:
                self.gap_taken = True
                os.write(out_w, b'{"value": 5}\n')
                os.close(out_w)
                os.close(err_w)
                stop.set()
                return []
            return super().select(timeout)

    monkeypatch.setattr(sandbox.selectors, "DefaultSelector", DescheduledReader)
    sandbox._pump(process, captures, stop)
    process.stdout.close()
    process.stderr.close()
    assert captures[out_r].excerpt([]) == '{"value": 5}\n'


def test_an_argv_list_runs_without_a_shell(tree, mode):
    receipt = run(["printf", "%s|", "a b", "$HOME", ";rm"], cwd=tree, timeout=30, isolation=mode)
    assert receipt.succeeded and receipt.stdout_excerpt == "a b|$HOME|;rm|"


def test_the_command_runs_in_its_cwd_and_may_write_its_tree(tree, mode):
    (tree / "sub").mkdir()
    receipt = run("pwd; echo made > ../made.txt", cwd=tree / "sub", tree=tree, timeout=30, isolation=mode)
    assert receipt.succeeded, receipt.stderr_excerpt
    assert receipt.stdout_excerpt.strip() == str((tree / "sub").resolve())
    assert receipt.cwd == "sub"
    assert (tree / "made.txt").read_text() == "made\n"


def test_stdin_reaches_the_command(tree, mode):
    prompt = "line one\nline two\n" * 5000
    receipt = run(["wc", "-l"], cwd=tree, timeout=30, isolation=mode, stdin=prompt.encode())
    assert receipt.stdout_excerpt.strip() == "10000"


def test_a_command_that_ignores_its_stdin_does_not_hang_the_runtime(tree, mode):
    receipt = run(["true"], cwd=tree, timeout=30, isolation=mode, stdin=b"x" * (4 << 20))
    assert receipt.succeeded and receipt.duration_seconds < 30


def test_the_environment_is_the_allow_list_plus_declared_names(tree, mode, monkeypatch):
    monkeypatch.setenv("SERVER_ONLY_SETTING", "should-not-pass")
    receipt = run("env | sort", cwd=tree, timeout=30, isolation=mode,
                  env={"CRUCIBLE_CANDIDATE_ID": "cand_001", "FEATURE": "on"})
    names = {line.split("=", 1)[0] for line in receipt.stdout_excerpt.splitlines()}
    # sh itself adds PWD (and bubblewrap nothing); everything else comes from the allow-list.
    expected = {"PATH", "LANG", "HOME", "TMPDIR", "CRUCIBLE_CANDIDATE_ID", "FEATURE"}
    assert names - {"PWD", "SHLVL", "_"} == expected
    assert receipt.env_names == sorted(expected)
    assert "should-not-pass" not in receipt.stdout_excerpt


def test_home_is_a_fresh_private_directory(tree, mode):
    receipt = run('echo "$HOME"; ls -A "$HOME" | wc -l; touch "$HOME/x"', cwd=tree, timeout=30,
                  isolation=mode)
    home, count = receipt.stdout_excerpt.split()
    assert receipt.succeeded and count == "0"
    assert home != str(Path.home())
    if mode == "required":  # bubblewrap: HOME is on the run's private /tmp, a tmpfs gone with the run
        assert home == sandbox.SANDBOX_HOME
    else:  # rlimits only: HOME is a folder of the run's scratch, removed after the run
        assert not Path(home).exists()


@pytest.mark.parametrize("name", [
    "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "GITHUB_TOKEN",
    "DB_PASSWORD", "DATABASE_URL", "REDIS_URL", "my_token", "SSH_PRIVATE_FILE", "SESSION_ID",
    "CRUCIBLE_SECRET_KEY", "HF_HOME", "SENTRY_DSN",
])
def test_names_that_look_like_secrets_never_pass_even_when_declared(tree, name):
    receipt = run("env", cwd=tree, timeout=30, isolation="off", env={name: "value-of-the-secret"})
    assert "value-of-the-secret" not in receipt.stdout_excerpt
    assert receipt.env_refused == [name] and name not in receipt.env_names


def test_the_server_s_provider_keys_never_reach_a_command(tree, mode, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-0123456789abcdef")
    receipt = run("env; cat /proc/self/environ", cwd=tree, timeout=30, isolation=mode)
    assert "ANTHROPIC" not in receipt.stdout_excerpt and "sk-ant" not in receipt.stdout_excerpt


def test_declared_and_server_secret_values_are_redacted_from_output_and_argv(
    tree, mode, monkeypatch, settings
):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-abcdefghijkl")
    command = f"echo sk-openai-abcdefghijkl; echo hunter2-secret >&2; echo {settings.SECRET_KEY}"
    receipt = run(command, cwd=tree, timeout=30, isolation=mode, redact_values=["hunter2-secret"])
    recorded = " ".join([*receipt.argv, receipt.stdout_excerpt, receipt.stderr_excerpt])
    for secret in ("sk-openai-abcdefghijkl", "hunter2-secret", settings.SECRET_KEY):
        assert secret not in recorded
    assert receipt.stdout_excerpt.count("[redacted]") == 2 and receipt.stderr_excerpt == "[redacted]\n"


def test_output_beyond_the_cap_keeps_its_head_and_tail_and_hashes_every_byte(tree, mode):
    script = "seq 1 200000"
    receipt = run(script, cwd=tree, timeout=60, isolation=mode, limits=Limits(output_bytes=1000))
    expected = "".join(f"{n}\n" for n in range(1, 200001)).encode()
    assert receipt.stdout_bytes == len(expected)
    assert receipt.stdout_sha256 == hashlib.sha256(expected).hexdigest()
    assert receipt.stdout_excerpt.startswith("1\n2\n3\n")
    assert receipt.stdout_excerpt.endswith("199999\n200000\n")
    assert f"{len(expected) - 1000:,} bytes not kept" in receipt.stdout_excerpt
    assert len(receipt.stdout_excerpt) < 1100


def test_a_timeout_kills_the_whole_process_group_and_says_so(tree, mode):
    receipt = run("sleep 60 & sleep 60; echo never", cwd=tree, timeout=0.5, isolation=mode)
    assert receipt.timed_out and receipt.signal == 9 and receipt.exit_code is None
    assert receipt.outcome == "timed out" and "never" not in receipt.stdout_excerpt
    assert receipt.duration_seconds < 10


def test_a_command_killed_by_a_signal_reports_the_signal(tree, mode):
    receipt = run("kill -SEGV $$", cwd=tree, timeout=30, isolation=mode)
    assert receipt.signal == 11 and not receipt.succeeded
    assert receipt.outcome == "killed by signal 11"


def test_the_cpu_limit_stops_a_busy_loop_before_its_timeout(tree, mode):
    receipt = run("while :; do :; done", cwd=tree, timeout=60, isolation=mode, limits=Limits(cpu_seconds=1))
    assert not receipt.timed_out and receipt.signal in (9, 24)  # SIGKILL or SIGXCPU
    assert receipt.duration_seconds < 30


def test_the_file_size_limit_stops_a_huge_file(tree, mode):
    receipt = run("head -c 5000000 /dev/zero > big", cwd=tree, timeout=30, isolation=mode,
                  limits=Limits(file_size_bytes=1_000_000))
    assert not receipt.succeeded
    assert (tree / "big").stat().st_size <= 1_000_000


def test_the_open_files_limit_binds(tree, mode):
    code = "import os\nfds = []\ntry:\n    while True: fds.append(os.open('/dev/null', 0))\n" \
           "except OSError as e: print(len(fds), e.strerror)"
    receipt = run([sys.executable, "-c", code], cwd=tree, timeout=30, isolation=mode,
                  limits=Limits(open_files=64))
    count, reason = receipt.stdout_excerpt.split(" ", 1)
    assert int(count) < 64 and "Too many open files" in reason


def test_the_limits_in_force_are_recorded(tree, mode):
    limits = Limits(cpu_seconds=7, address_space_bytes=1 << 31, processes=99)
    receipt = run(["true"], cwd=tree, timeout=12.5, isolation=mode, limits=limits)
    assert receipt.limits["cpu_seconds"] == 7 and receipt.limits["processes"] == 99
    assert receipt.limits["timeout_seconds"] == 12.5
    assert receipt.limits["processes_enforced_by"] in ("pids-cgroup", "rlimit")


def test_a_missing_program_is_a_clear_failed_receipt(tree, mode):
    receipt = run(["no-such-program-anywhere"], cwd=tree, timeout=30, isolation=mode)
    assert receipt.exit_code in (126, 127)
    assert "no-such-program-anywhere" in receipt.stderr_excerpt


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"command": []}, "empty"),
    ({"command": ["echo", "a\0b"]}, "NUL"),
    ({"timeout": 0}, "timeout"),
    ({"timeout": 10**6}, "timeout"),
    ({"isolation": "maybe"}, "isolation"),
    ({"env": {"BAD NAME": "x"}}, "not a valid variable name"),
    ({"env": {"OK": 3}}, "text"),
])
def test_bad_arguments_are_refused_before_anything_runs(tree, kwargs, message):
    options = {"command": ["true"], "cwd": tree, "timeout": 10, **kwargs}
    with pytest.raises(SandboxError, match=message):
        run(options.pop("command"), **options)


def test_a_cwd_outside_the_tree_is_refused(tree, tmp_path):
    with pytest.raises(SandboxError, match="outside the tree"):
        run(["true"], cwd=tmp_path, tree=tree, timeout=10)
    with pytest.raises(SandboxError, match="does not exist"):
        run(["true"], cwd=tree / "missing", tree=tree, timeout=10)


@pytest.mark.parametrize("bad", [{"cpu_seconds": 0}, {"processes": -1}, {"output_bytes": "1k"}])
def test_limits_must_be_positive_whole_numbers(bad):
    with pytest.raises(SandboxError, match="whole number"):
        Limits(**bad)


def test_required_refuses_to_run_when_bubblewrap_cannot_start(tree, no_bubblewrap):
    with pytest.raises(SandboxError, match=r"CRUCIBLE_SANDBOX=required.*No permissions"):
        run(["touch", "ran"], cwd=tree, timeout=10, isolation="required")
    assert not (tree / "ran").exists()


def test_preferred_falls_back_to_rlimits_only_and_the_receipt_says_so(tree, no_bubblewrap):
    receipt = run(["true"], cwd=tree, timeout=10, isolation="preferred")
    assert receipt.succeeded and receipt.isolation == RLIMITS_ONLY


def test_the_setting_chooses_the_isolation_when_the_caller_does_not(tree, settings):
    import dataclasses

    settings.CONFIG = dataclasses.replace(settings.CONFIG, sandbox="off")
    assert run(["true"], cwd=tree, timeout=10).isolation == RLIMITS_ONLY


def test_bubblewrap_gives_no_capabilities_and_its_own_pid_namespace(tree):
    available, reason = sandbox.bubblewrap_probe()
    if not available:
        service_missing(reason)
    receipt = run("grep CapEff /proc/self/status; echo $$; ls /proc | grep -c '^[0-9]'", cwd=tree,
                  timeout=30, isolation="required")
    cap_line, pid, visible = receipt.stdout_excerpt.split("\n")[:3]
    assert cap_line.split()[1] == "0000000000000000"
    assert int(pid) < 10 and int(visible) < 10  # sees only its own few processes


def test_artifacts_are_described_by_size_and_hash(tree):
    (tree / "report.json").write_bytes(b'{"ok": true}')
    assert sandbox.artifact_describe(tree, "report.json") == {
        "path": "report.json", "size": 12, "sha256": hashlib.sha256(b'{"ok": true}').hexdigest(),
    }


def test_no_temporary_home_or_cgroup_is_left_behind(tree, mode):
    before = set(os.listdir("/tmp"))
    run(["true"], cwd=tree, timeout=10, isolation=mode)
    assert not {name for name in set(os.listdir("/tmp")) - before if name.startswith("crucible-home-")}
    parent = sandbox.pids_cgroup_parent()
    if parent is not None:
        assert not [p for p in parent.iterdir() if p.name.startswith(f"run-{os.getpid()}-")]


def test_a_command_that_leaves_nothing_running_is_never_said_to_leave_strays(tree, mode, data_dir):
    # bubblewrap reports its command's exit before its own init has gone; in about 1 run in 5 the
    # init used to be counted, so 30 runs show it.
    if sandbox.pids_cgroup_parent() is None:
        service_missing("no pids cgroup here: strays are not counted")
    receipts = [run(["true"], cwd=tree, timeout=30, isolation=mode) for _ in range(30)]
    assert [receipt.detail.get("stray_processes_killed", 0) for receipt in receipts] == [0] * 30
    scratch = data_dir / "sandbox"
    assert not scratch.exists() or not list(scratch.iterdir())  # each run's scratch went with it


def test_git_works_in_a_worktree_whose_repository_is_made_readable(repo, v1, mode):
    from runtime_app.worktrees import worktree_create

    worktree = worktree_create(repo, v1, "cand_git")
    receipt = run("git log -1 --format=%H; git status --porcelain; echo x > new.txt; git status --porcelain",
                  cwd=worktree, timeout=30, isolation=mode, readable=[repo / ".git"])
    assert receipt.succeeded, receipt.stderr_excerpt
    assert receipt.stdout_excerpt.split() == [v1, "??", "new.txt"]


def test_setting_cancel_stops_the_command_and_the_receipt_says_cancelled(tree, mode):
    import threading

    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    receipt = run("sleep 60", cwd=tree, timeout=60, isolation=mode, cancel=cancel)
    assert receipt.detail["cancelled"] and receipt.outcome == "cancelled" and not receipt.succeeded
    assert receipt.duration_seconds < 10 and not receipt.timed_out


def test_a_read_only_tree_cannot_be_written_under_bubblewrap(tree):
    available, reason = sandbox.bubblewrap_probe()
    if not available:
        service_missing(reason)
    receipt = run("cat README; echo x > README", cwd=tree, timeout=30, isolation="required", writable=False)
    assert receipt.stdout_excerpt == "hello\n" and receipt.exit_code != 0
    assert (tree / "README").read_text() == "hello\n" and receipt.detail["read_only"] == "bubblewrap"


def test_pytest_in_a_worktree_under_the_default_data_dir_does_not_take_crucible_s_config(settings):
    """The default data dir (`var/`) lies inside Crucible's checkout; under bubblewrap pytest
    walking up from such a worktree must not find Crucible's pyproject.toml (nor load its settings)."""
    available, reason = sandbox.bubblewrap_probe()
    if not available:
        service_missing(reason)
    settings.DATA_DIR = Path(settings.BASE_DIR, "var", f"sandbox-{uuid.uuid4().hex[:8]}")
    tree = settings.DATA_DIR / "worktrees" / "cand_001"
    (tree / "tests").mkdir(parents=True)
    (tree / "tests" / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    try:
        receipt = run("python -m pytest -p no:cacheprovider tests", cwd=tree, timeout=120,
                      isolation="required")
    finally:
        shutil.rmtree(settings.DATA_DIR)
    assert receipt.succeeded, receipt.stderr_excerpt + receipt.stdout_excerpt
    assert f"rootdir: {tree}\n" in receipt.stdout_excerpt and "configfile" not in receipt.stdout_excerpt


# ------------------------------------------------------------------- a trial's results, handed back


def test_the_whole_stdout_reaches_a_stdout_file_beyond_the_receipt_s_excerpt(tree, mode, tmp_path):
    target = tmp_path / "stdout"
    receipt = run("seq 1 20000", cwd=tree, timeout=30, isolation=mode, fresh=True, stdout_file=target,
                  limits=Limits(output_bytes=1000))
    assert "bytes not kept" in receipt.stdout_excerpt
    assert target.read_bytes() == b"".join(f"{n}\n".encode() for n in range(1, 20001))
    assert receipt.detail["stdout_file"] == "whole"
    assert hashlib.sha256(target.read_bytes()).hexdigest() == receipt.stdout_sha256


def test_a_stdout_file_is_cut_at_the_results_limit_and_the_receipt_says_so(tree, mode, tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "RESULTS_LIMIT", 1000)
    target = tmp_path / "stdout"
    receipt = run("seq 1 20000", cwd=tree, timeout=30, isolation=mode, stdout_file=target)
    assert target.read_bytes() == b"".join(f"{n}\n".encode() for n in range(1, 20001))[:1000]
    assert receipt.detail["stdout_file"] == "cut at 1,000 bytes"


def test_results_files_written_in_a_fresh_tree_reach_the_runtime_and_the_tree_stays_pristine(
        tree, mode, tmp_path):
    wanted = {"out/deep/result.json": tmp_path / "a", "README": tmp_path / "b", "never.txt": tmp_path / "c"}
    script = ("mkdir -p out/deep; echo '{\"answer\": 42}' > out/deep/result.json; cat README; "
              "echo appended >> README")
    receipt = run(script, cwd=tree, timeout=30, isolation=mode, fresh=True, results_files=wanted)
    assert receipt.succeeded, receipt.stderr_excerpt
    assert receipt.stdout_excerpt == "hello\n"  # the tree's own file is there to be read
    assert (tmp_path / "a").read_text() == '{"answer": 42}\n'
    assert (tmp_path / "b").read_text() == "hello\nappended\n"
    assert not (tmp_path / "c").exists()
    assert receipt.detail["results_files"] == {"out/deep/result.json": "written", "README": "written",
                                               "never.txt": "not written"}
    assert not (tree / "out").exists() and (tree / "README").read_text() == "hello\n"


def test_a_results_file_is_never_read_through_a_link_a_pipe_or_beyond_its_limit(
        tree, mode, tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "RESULTS_LIMIT", 100)
    wanted = {"link": tmp_path / "link", "fifo": tmp_path / "fifo", "big": tmp_path / "big"}
    # Under bubblewrap each is a bound file: it cannot be replaced (the command sees EBUSY).
    script = "ln -sf /etc/passwd link; rm -f fifo; mkfifo fifo; seq 1 1000 > big; exit 0"
    receipt = run(script, cwd=tree, timeout=30, isolation=mode, fresh=True, results_files=wanted)
    said = receipt.detail["results_files"]
    assert said["link"] == said["fifo"] == "not written"
    assert said["big"] == "cut at 100 bytes" and len((tmp_path / "big").read_bytes()) == 101
    assert not (tmp_path / "link").exists() and not (tmp_path / "fifo").exists()


@pytest.mark.parametrize("bad", ["/etc/passwd", "../out", ".git/config", ""])
def test_a_results_file_outside_the_tree_is_refused_before_anything_runs(tree, bad, tmp_path):
    with pytest.raises(SandboxError, match="results file"):
        run(["true"], cwd=tree, timeout=10, isolation="off", fresh=True, results_files={bad: tmp_path / "x"})


def test_a_run_that_asks_for_no_results_keeps_its_receipt_as_it_was(tree, mode):
    receipt = run(["true"], cwd=tree, timeout=10, isolation=mode, fresh=True)
    assert "stdout_file" not in receipt.detail and "results_files" not in receipt.detail
# --- the report descriptor (docs/sandbox.md, the score contract) --------------------------------

REPORTER = """import json, os, subprocess, sys
fd = int(os.environ["CRUCIBLE_REPORT_FD"])
if sys.argv[1:] == ["child"]:  # the evaluator pattern: candidate code only in a child
    forged = "import os; os.write(%d, b'1.0')" % fd
    child = subprocess.run([sys.executable, "-c", forged], capture_output=True, text=True)
    print("child:", child.returncode, child.stderr.strip().splitlines()[-1])
os.write(fd, json.dumps({"accuracy": 0.5}).encode())
"""


@pytest.mark.parametrize("fresh", [False, True])
def test_the_report_descriptor_reaches_the_command_s_own_process_and_what_it_writes_is_kept(
        tree, mode, tmp_path, fresh):
    (tree / "report.py").write_text(REPORTER)
    report = tmp_path / "report.json"
    receipt = run([sys.executable, "report.py"], cwd=tree, timeout=30, isolation=mode, report_file=report,
                  fresh=fresh)
    assert receipt.succeeded, receipt.stderr_excerpt
    assert "CRUCIBLE_REPORT_FD" in receipt.env_names
    assert report.read_text() == '{"accuracy": 0.5}'
    assert receipt.detail["report_descriptor"] == "written"


def test_a_child_started_with_subprocess_cannot_write_to_the_report_descriptor(tree, mode, tmp_path):
    (tree / "report.py").write_text(REPORTER)
    report = tmp_path / "report.json"
    receipt = run([sys.executable, "report.py", "child"], cwd=tree, timeout=30, isolation=mode,
                  report_file=report)
    assert receipt.succeeded, receipt.stderr_excerpt
    assert "child: 1 OSError: [Errno 9] Bad file descriptor" in receipt.stdout_excerpt
    assert report.read_text() == '{"accuracy": 0.5}'


def test_a_command_that_writes_nothing_to_the_report_descriptor_leaves_no_report(tree, mode, tmp_path):
    report = tmp_path / "report.json"
    report.write_text("stale")
    receipt = run("echo '{\"accuracy\": 1}'", cwd=tree, timeout=30, isolation=mode, report_file=report)
    assert receipt.succeeded and not report.exists()
    assert receipt.detail["report_descriptor"] == "not written"


def test_a_report_beyond_1_mib_is_not_read_and_the_writer_never_blocks(tree, mode, tmp_path):
    report = tmp_path / "report.json"
    script = "import os; os.write(int(os.environ['CRUCIBLE_REPORT_FD']), b'x' * (2 << 20))"
    receipt = run([sys.executable, "-c", script], cwd=tree, timeout=30, isolation=mode, report_file=report)
    assert receipt.succeeded and not receipt.timed_out and not report.exists()
    assert receipt.detail["report_descriptor"] == "more than 1 MiB (not read)"


def test_without_a_report_file_the_command_gets_no_descriptor(tree, mode):
    receipt = run("env", cwd=tree, timeout=30, isolation=mode)
    assert "CRUCIBLE_REPORT_FD" not in receipt.stdout_excerpt and "report_descriptor" not in receipt.detail
