"""A metric is read from structured output only, and only after a successful run."""

from __future__ import annotations

import pytest

from runtime_app.metrics import metric_read
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
