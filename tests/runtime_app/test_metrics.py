"""A metric is measured by the runtime (`runtime:` names) or read from structured output only,
and only after a successful run."""

from __future__ import annotations

import pytest

from runtime_app.metrics import metric_read, metric_source
from runtime_app.models import Receipt
from runtime_app.sandbox import run


@pytest.fixture
def tree(data_dir):
    path = data_dir / "worktrees" / "eval_001"
    path.mkdir(parents=True)
    return path


def test_the_last_json_line_of_stdout_gives_the_metric(tree):
    script = 'echo "warming up"; echo \'{"runtime": 0.25, "runs": 5}\''
    receipt = run(script, cwd=tree, timeout=30, isolation="off")
    reading = metric_read(receipt, "runtime")
    assert reading.value == 0.25 and reading.source == "last line of stdout"


def test_a_metrics_file_wins_over_stdout(tree):
    metrics = tree / ".crucible-metrics.json"
    receipt = run(f'echo \'{{"runtime": 0.001}}\' ; echo \'{{"runtime": 2.5}}\' > {metrics}', cwd=tree,
                  timeout=30, isolation="off")
    reading = metric_read(receipt, "runtime", metrics)
    assert reading.value == 2.5 and reading.source == "metrics file"


@pytest.mark.parametrize(("content", "reason"), [
    (b"not json", "not JSON"),
    (b"[1, 2]", "not an object"),
    (b'{"runtime": true}', "not a finite number"),
    (b'{"runtime": Infinity}', "not a finite number"),
])
def test_a_bad_metrics_file_gives_no_metric_and_a_reason(tree, content, reason):
    metrics = tree / "m.json"
    metrics.write_bytes(content)
    receipt = run(["true"], cwd=tree, timeout=30, isolation="off")
    reading = metric_read(receipt, "runtime", metrics)
    assert not reading.counted and reason in reading.reason


def test_a_symlinked_metrics_file_is_not_followed(tree, tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text('{"runtime": 0.1}')
    (tree / "m.json").symlink_to(target)
    receipt = run(["true"], cwd=tree, timeout=30, isolation="off")
    assert metric_read(receipt, "runtime", tree / "m.json").value is None


def test_a_timed_out_command_has_no_metric_even_if_it_printed_one(tree):
    receipt = run('echo \'{"runtime": 0.1}\'; sleep 30', cwd=tree, timeout=0.3, isolation="off")
    reading = metric_read(receipt, "runtime")
    assert reading.value is None and "timed out" in reading.reason


def test_no_output_at_all_is_no_metric(tree):
    reading = metric_read(run(["true"], cwd=tree, timeout=30, isolation="off"), "runtime")
    assert reading.value is None and "printed nothing" in reading.reason


# --- measured by the runtime ------------------------------------------------------------------------

# What a command printed about itself: a runtime metric never reads it.
FORGED = '{"wall_seconds": 0.001, "cpu_seconds": 0.001, "max_rss_kib": 1, "runtime:wall_seconds": 0.001}'


def receipt(**fields) -> Receipt:
    """A finished command's receipt as the sandbox records it (exit 0 unless told)."""
    return Receipt(**{"exit_code": 0, "duration_seconds": 1.5, "stdout_excerpt": FORGED + "\n",
                      "rusage": {"user_cpu_seconds": 0.25, "sys_cpu_seconds": 0.5, "max_rss_kib": 20480,
                                 "measured_by": "cgroup"}, **fields})


def test_wall_seconds_is_the_receipts_duration_not_what_the_command_printed():
    reading = metric_read(receipt(), "runtime:wall_seconds")
    assert (reading.value, reading.source, reading.reason) == (1.5, "runtime", "measured by the runtime")
    assert not reading.reported


def test_cpu_seconds_is_user_plus_system_time_and_says_how_it_was_measured():
    reading = metric_read(receipt(), "runtime:cpu_seconds")
    assert (reading.value, reading.source) == (0.75, "runtime")
    assert reading.reason == "measured by the runtime (cgroup)" and not reading.reported


def test_max_rss_kib_is_the_peak_memory_the_runtime_measured():
    done = receipt(rusage={"max_rss_kib": 20480, "measured_by": "rusage"})
    reading = metric_read(done, "runtime:max_rss_kib")
    assert (reading.value, reading.source) == (20480.0, "runtime")
    assert reading.reason == "measured by the runtime (rusage)"


@pytest.mark.parametrize(("metric", "rusage"), [
    ("runtime:cpu_seconds", {"user_cpu_seconds": 0.25, "sys_cpu_seconds": None, "max_rss_kib": 10}),
    ("runtime:max_rss_kib", {"user_cpu_seconds": 0.25, "sys_cpu_seconds": 0.5, "max_rss_kib": None}),
    ("runtime:max_rss_kib", {}),
])
def test_a_figure_the_runtime_could_not_measure_is_no_metric_and_says_so(metric, rusage):
    reading = metric_read(receipt(rusage=rusage), metric)
    name = metric.removeprefix("runtime:")
    assert reading.value is None
    assert reading.reason == f"the runtime could not measure {name} for this command"


def test_a_runtime_name_the_runtime_does_not_measure_is_no_metric():
    reading = metric_read(receipt(), "runtime:gpu_seconds")
    assert reading.value is None
    assert reading.reason == "'runtime:gpu_seconds' is not a metric the runtime measures"


@pytest.mark.parametrize("failed", [{"exit_code": 1}, {"timed_out": True}, {"signal": 9}])
def test_a_runtime_metric_counts_only_after_exit_0(failed):
    for metric in ("runtime:wall_seconds", "runtime:cpu_seconds", "runtime:max_rss_kib"):
        reading = metric_read(receipt(**failed), metric)
        assert reading.value is None and "a metric only counts after exit 0" in reading.reason


def test_a_real_command_gets_its_cpu_time_and_peak_memory_measured(tree):
    busy = ("import time; block = bytearray(64 << 20); end = time.process_time() + 0.3\n"
            "while time.process_time() < end: pass\nprint('{\"cpu_seconds\": 0}')")
    done = run(["python3", "-c", busy], cwd=tree, timeout=60, isolation="off")
    wall, cpu, rss = (metric_read(done, f"runtime:{name}").value
                      for name in ("wall_seconds", "cpu_seconds", "max_rss_kib"))
    assert cpu >= 0.3 and wall >= cpu * 0.9  # a single thread cannot use more CPU than wall time
    assert rss >= 64 * 1024


# --- the report descriptor --------------------------------------------------------------------

DESCRIPTOR_WRITE = "import os; os.write(int(os.environ['CRUCIBLE_REPORT_FD']), b'{\"accuracy\": 0.75}')"


def test_a_figure_of_another_kind_is_read_from_the_report_descriptor_only(tree, tmp_path):
    report, metrics = tmp_path / "report.json", tmp_path / "metrics.json"
    # Stdout and the metrics file say 1.0; only what came through the descriptor counts.
    metrics.write_text('{"accuracy": 1.0}')
    script = DESCRIPTOR_WRITE + "; print('{\"accuracy\": 1.0}')"
    receipt = run(["python3", "-c", script], cwd=tree, timeout=30, isolation="off", report_file=report)
    reading = metric_read(receipt, "accuracy", metrics, report_file=report, descriptor_only=True)
    assert reading.value == 0.75 and reading.source == "report descriptor"
    assert "report descriptor (CRUCIBLE_REPORT_FD)" in reading.reason


def test_a_figure_printed_or_written_to_the_metrics_file_is_not_a_descriptor_report(tree, tmp_path):
    report, metrics = tmp_path / "report.json", tmp_path / "metrics.json"
    metrics.write_text('{"accuracy": 1.0}')
    receipt = run("echo '{\"accuracy\": 1.0}'", cwd=tree, timeout=30, isolation="off", report_file=report)
    reading = metric_read(receipt, "accuracy", metrics, report_file=report, descriptor_only=True)
    assert reading.value is None
    assert "wrote nothing to its report descriptor" in reading.reason
    assert "never from stdout or $CRUCIBLE_METRICS_FILE" in reading.reason


def test_a_time_figure_may_come_through_the_descriptor_before_the_metrics_file(tree, tmp_path):
    report, metrics = tmp_path / "report.json", tmp_path / "metrics.json"
    metrics.write_text('{"accuracy": 1.0}')
    receipt = run(["python3", "-c", DESCRIPTOR_WRITE], cwd=tree, timeout=30, isolation="off",
                  report_file=report)
    assert metric_read(receipt, "accuracy", metrics, report_file=report).value == 0.75
    assert metric_read(receipt, "accuracy", metrics, report_file=tmp_path / "none.json").value == 1.0


@pytest.mark.parametrize(("reported", "words"), [
    (None, "reported by the score command (forgeable by code it runs)"),
    ("time_ms", "reported by the score command, checked against the runtime's wall and CPU time"),
    ("memory_kib", "reported by the score command, checked against the runtime's peak memory"),
    ("other", "reported through the runtime's report descriptor (CRUCIBLE_REPORT_FD), which the "
              "candidate's code does not hold"),
])
def test_the_label_says_how_a_reported_figure_reaches_the_runtime(reported, words):
    assert metric_source("median_runtime_ms", reported) == words
    assert metric_source("runtime:cpu_seconds", reported) == "runtime"
