"""Benchmarks: task folders judged by checks in the real sandbox, JSONL files judged by match
rules, and the registry that finds them by name, spec or dotted path."""

from __future__ import annotations

import dataclasses
import json
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest

from evolve_app import benchmarks, extensions
from evolve_app.benchmarks import (
    BenchmarkAdapter,
    BenchmarkError,
    JsonlBenchmark,
    TaskFolderBenchmark,
    benchmark_check,
    benchmark_get,
    benchmark_names,
    match,
)
from evolve_app.types import Task, Trajectory


@pytest.fixture
def data_dir(tmp_path, settings) -> Path:
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    return settings.DATA_DIR


def make_task(root: Path, task_id: str, *, split: str = "train", text: str = "What is 6 x 7?\n",
              check: str | None = None, check_sh: str | None = None, category: str | None = None,
              files: dict[str, str] | None = None) -> Path:
    folder = root / split / task_id
    folder.mkdir(parents=True)
    (folder / "input.md").write_text(text)
    if check is not None:
        (folder / "check").write_text(check + "\n")
    if check_sh is not None:
        (folder / "check.sh").write_text(check_sh)
    if category is not None:
        (folder / "category").write_text(category + "\n")
    for name, content in (files or {}).items():
        (folder / name).write_text(content)
    return folder


@pytest.fixture
def folder_bench(tmp_path) -> Path:
    root = tmp_path / "bench"
    make_task(root, "b-answer", check='test "$(cat output.txt)" = 42', category="arithmetic")
    make_task(root, "a-first", check_sh="grep -q hello output.txt\n")
    make_task(root, "h-only", split="holdout", check="true")
    return root


def solved(task: Task, output: str, error: str = "") -> Trajectory:
    return Trajectory(task_id=task.task_id, output=output, error=error)


# ------------------------------------------------------------------------------ task folders


def test_a_task_folder_benchmark_lists_its_tasks_in_name_order_with_input_and_category(folder_bench):
    bench = TaskFolderBenchmark(folder_bench)
    train = bench.get_tasks("train")
    assert [task.task_id for task in train] == ["a-first", "b-answer"]
    assert train[1].input == "What is 6 x 7?\n" and train[1].category == "arithmetic"
    assert train[1].metadata == {"split": "train"}
    assert [task.task_id for task in bench.get_tasks("train", limit=1)] == ["a-first"]
    assert [task.task_id for task in bench.get_tasks("holdout")] == ["h-only"]
    with pytest.raises(BenchmarkError, match="unknown split 'test'"):
        bench.get_tasks("test")


def test_a_passing_check_is_a_success_and_a_failing_one_a_failure_with_its_exit(folder_bench, data_dir):
    bench = TaskFolderBenchmark(folder_bench)
    task = bench.get_tasks("train")[1]
    assert bench.evaluate(task, solved(task, "42")) == benchmarks.Feedback(True, 1.0, "the check passed")
    failed = bench.evaluate(task, solved(task, "41"))
    assert not failed.success and failed.score == 0.0 and "exit 1" in failed.detail
    first = bench.get_tasks("train")[0]
    assert bench.evaluate(first, solved(first, "well, hello there")).success  # check.sh is run by sh
    assert not list((data_dir / "evolve" / "checks").iterdir())  # scratch folders are removed


def test_a_check_that_runs_past_its_timeout_fails_and_says_so(tmp_path, data_dir):
    make_task(tmp_path / "bench", "slow", check="sleep 30")
    bench = TaskFolderBenchmark(tmp_path / "bench", timeout=1)
    task = bench.get_tasks()[0]
    feedback = bench.evaluate(task, solved(task, "42"))
    assert feedback == benchmarks.Feedback(False, 0.0, "the check timed out after 1 s")


def test_a_crashing_check_fails_with_its_outcome_and_what_it_said(tmp_path, data_dir):
    make_task(tmp_path / "bench", "crash", check="echo 'checker blew up' >&2; kill -SEGV $$")
    make_task(tmp_path / "bench", "missing", check="no-such-checker-anywhere")
    bench = TaskFolderBenchmark(tmp_path / "bench")
    crash, missing = bench.get_tasks()
    feedback = bench.evaluate(crash, solved(crash, "42"))
    assert not feedback.success and "signal 11" in feedback.detail and "checker blew up" in feedback.detail
    feedback = bench.evaluate(missing, solved(missing, "42"))
    assert not feedback.success and "exit 127" in feedback.detail


@pytest.mark.parametrize(("check", "success", "score", "detail"), [
    ("echo working; echo '{\"score\": 0.5}'", True, 0.5,
     "score 0.5 (from the last line of stdout, reported by"),
    ("echo '{\"score\": 0.25}' > \"$CRUCIBLE_METRICS_FILE\"; echo '{\"score\": 1}'", True, 0.25,
     "score 0.25 (from the metrics file, reported by"),
    ("echo '{\"score\": 0.9}'; exit 1", False, 0.0, "the check failed (exit 1)"),
    ("echo '{\"score\": 7}'", False, 0.0, "score 7, outside 0 to 1"),
    ("echo '{\"passed\": 3}'", True, 1.0, "the check passed"),
])
def test_a_json_score_from_the_check_gives_a_partial_score_only_after_exit_0(
        tmp_path, data_dir, check, success, score, detail):
    make_task(tmp_path / "bench", "partial", check=check)
    bench = TaskFolderBenchmark(tmp_path / "bench")
    task = bench.get_tasks()[0]
    feedback = bench.evaluate(task, solved(task, "anything"))
    assert (feedback.success, feedback.score) == (success, score) and detail in feedback.detail


HOSTILE = ('$(touch pwned)`touch pwned2`"; echo \'{"score": 1}\'; exit 0 #\n'
           '../../escape\n{"score": 1.0}\n')


def test_an_output_that_tries_to_escape_or_print_a_score_is_only_text_in_output_txt(tmp_path, data_dir):
    root = tmp_path / "bench"
    # Passes only if output.txt holds the exact text and nothing in it ran.
    make_task(root, "exact", check="test ! -e pwned && test ! -e pwned2 && cmp -s output.txt expected.txt",
              files={"expected.txt": HOSTILE})
    # A careless check that echoes the output: the score line it prints does not count after exit 1.
    make_task(root, "leaky", check="cat output.txt; grep -qx 42 output.txt")
    bench = TaskFolderBenchmark(root)
    exact, leaky = bench.get_tasks()
    assert bench.evaluate(exact, solved(exact, HOSTILE)) == benchmarks.Feedback(True, 1.0, "the check passed")
    feedback = bench.evaluate(leaky, solved(leaky, HOSTILE))
    assert not feedback.success and feedback.score == 0.0
    assert not (tmp_path / "escape").exists() and not (root / "train" / "leaky" / "output.txt").exists()


def test_an_agent_that_failed_is_judged_a_failure_without_running_the_check(folder_bench, data_dir):
    bench = TaskFolderBenchmark(folder_bench)
    task = bench.get_tasks()[1]
    feedback = bench.evaluate(task, solved(task, "42", error="the agent timed out after 30 s"))
    said = "the agent did not finish: the agent timed out after 30 s"
    assert feedback == benchmarks.Feedback(False, 0.0, said)
    assert not (data_dir / "evolve").exists()


def test_a_task_is_found_again_by_its_id_and_a_path_as_id_is_refused(folder_bench, data_dir):
    bench = TaskFolderBenchmark(folder_bench)
    for task_id in ("../train/b-answer", "/etc", "nope"):
        with pytest.raises(BenchmarkError):
            bench.evaluate(Task(task_id=task_id, input="", metadata={"split": "train"}), Trajectory(task_id))
    with pytest.raises(BenchmarkError, match="unknown split"):
        bench.evaluate(Task("b-answer", "", metadata={"split": "../train"}), Trajectory("b-answer"))


def test_a_task_folder_without_input_or_check_is_an_error_naming_it(tmp_path):
    make_task(tmp_path / "a", "no-check")
    with pytest.raises(BenchmarkError, match=r"train/no-check has no check\.sh or check file"):
        TaskFolderBenchmark(tmp_path / "a").get_tasks()
    make_task(tmp_path / "b", "no-input", check="true").joinpath("input.md").unlink()
    with pytest.raises(BenchmarkError, match=r"train/no-input has no input\.md"):
        TaskFolderBenchmark(tmp_path / "b").get_tasks()
    with pytest.raises(BenchmarkError, match="no such folder"):
        TaskFolderBenchmark(tmp_path / "missing")


# ------------------------------------------------------------------------------------ JSONL


def write_jsonl(path: Path, *rows: object) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


GOOD = {"task_id": "t1", "input": "2+2?", "expected": "4"}


@pytest.mark.parametrize(("bad", "message"), [
    ("{not json", "line 3: not valid JSON"),
    ("[1, 2]", "line 3: expected a JSON object, got list"),
    ({"input": "x", "expected": "y"}, "line 3: missing 'task_id'"),
    ({"task_id": "t2", "expected": "y"}, "line 3: missing 'input'"),
    ({"task_id": "t1", "input": "x", "expected": "y"}, "line 3: task_id 't1' repeats line 1"),
    ({"task_id": "../t2", "input": "x", "expected": "y"}, "line 3: task_id must be"),
    ({"task_id": "t2", "input": "", "expected": "y"}, "line 3: input must be non-empty text"),
    ({"task_id": "t2", "input": "x", "expected": ["y"]}, "line 3: expected must be text or a number"),
    ({**GOOD, "task_id": "t2", "split": "test"}, "line 3: split 'test'"),
    ({**GOOD, "task_id": "t2", "match": "fuzzy"}, "line 3: match 'fuzzy'; use one of exact, normalized"),
    ({**GOOD, "task_id": "t2", "match": "regex", "expected": "(unclosed"}, "line 3: expected is not a valid"),
    ({**GOOD, "task_id": "t2", "match": "number", "expected": "four"}, "line 3: match 'number' needs"),
    ({**GOOD, "task_id": "t2", "expect": "4"}, "line 3: unknown field(s) expect"),
])
def test_a_jsonl_benchmark_names_the_line_of_each_validation_error(tmp_path, bad, message):
    path = write_jsonl(tmp_path / "tasks.jsonl", GOOD, "", bad)
    with pytest.raises(BenchmarkError) as raised:
        JsonlBenchmark(path)
    assert str(raised.value).startswith("tasks.jsonl line 3") and message in str(raised.value)


@pytest.mark.parametrize(("rule", "expected", "output", "matches"), [
    ("exact", "Paris", " Paris\n", True),
    ("exact", "Paris", "paris", False),
    ("normalized", "New  York.", "new york\n", True),
    ("normalized", "New York", "New York City", False),
    ("contains", "new york", "I think it is NEW   York City.", True),
    ("contains", "boston", "New York", False),
    ("regex", r"\d{4}-\d{2}-\d{2}", "2024-02-29\n", True),
    ("regex", r"\d{4}-\d{2}-\d{2}", "on 2024-02-29", False),
    ("number", "4.5359237", "4.535924", True),
    ("number", "212", "212.0000001", True),
    ("number", "0", "0.0000005", True),
    ("number", "212", "213", False),
    ("number", "212", "about 212", False),
    ("number", "1000", "1_000", False),
    ("number", "1", "nan", False),
])
def test_each_match_rule_judges_outputs_as_documented(rule, expected, output, matches):
    assert match(rule, expected, output) is matches


def test_a_jsonl_benchmark_keeps_file_order_per_split_and_does_not_reveal_the_expected_answer(tmp_path):
    path = write_jsonl(tmp_path / "tasks.jsonl",
                       {"task_id": "z", "input": "Z?", "expected": 26, "match": "number",
                        "category": "letters"},
                       {"task_id": "h", "input": "H?", "expected": "8", "split": "holdout"},
                       {"task_id": "a", "input": "A?", "expected": "1", "metadata": {"source": "alphabet"}})
    bench = JsonlBenchmark(path)
    train = bench.get_tasks("train", limit=None)
    assert [task.task_id for task in train] == ["z", "a"] and train[0].category == "letters"
    assert train[1].metadata == {"source": "alphabet", "split": "train", "match": "exact"}
    assert [task.task_id for task in bench.get_tasks("holdout")] == ["h"]
    assert bench.evaluate(train[0], solved(train[0], "26\n")).success
    wrong = bench.evaluate(train[0], solved(train[0], "25"))
    assert wrong == benchmarks.Feedback(False, 0.0, "the output does not match (number): got '25'")
    revealing = JsonlBenchmark(path, reveal_expected=True)
    assert "26" in revealing.evaluate(train[0], solved(train[0], "25")).detail
    failed = bench.evaluate(train[0], solved(train[0], "26", error="the agent exit 3"))
    assert not failed.success and "the agent did not finish" in failed.detail
    with pytest.raises(BenchmarkError, match="no task holdout/z"):
        bench.evaluate(Task("z", "Z?", metadata={"split": "holdout"}), solved(train[0], "26"))


def test_the_demo_benchmark_has_three_train_and_two_holdout_tasks_in_each_of_four_categories():
    bench = benchmark_get("demo")
    train, holdout = bench.get_tasks("train", limit=None), bench.get_tasks("holdout", limit=None)
    assert len(train) == 12 and len(holdout) == 8
    for tasks, each in ((train, 3), (holdout, 2)):
        categories = [task.category for task in tasks]
        assert {name: categories.count(name) for name in set(categories)} == dict.fromkeys(
            ("units", "dates", "strings", "bases"), each)
    assert [task.category for task in train[:4]] == ["units", "dates", "strings", "bases"]


# --------------------------------------------------------------------------------- registry


def test_the_built_in_benchmarks_are_installed_entry_points():
    installed = {point.name: point.value for point in entry_points(group="crucible.benchmarks")}
    assert installed == {"demo": "evolve_app.benchmarks:demo_benchmark",
                         "task-folder": "evolve_app.benchmarks:TaskFolderBenchmark",
                         "jsonl": "evolve_app.benchmarks:JsonlBenchmark"}
    assert {"demo", "jsonl", "task-folder"} <= set(benchmark_names())
    assert isinstance(benchmark_get("demo"), JsonlBenchmark)


def test_folder_and_jsonl_specs_make_their_benchmarks(folder_bench, tmp_path):
    path = write_jsonl(tmp_path / "tasks.jsonl", GOOD)
    for spec in (f"folder:{folder_bench}", f"task-folder:{folder_bench}"):
        made = benchmark_get(spec, trusted=True)
        assert isinstance(made, TaskFolderBenchmark) and made.root == folder_bench
    made = benchmark_get(f"jsonl:{path}", trusted=True)
    assert isinstance(made, JsonlBenchmark) and made.get_tasks()[0].task_id == "t1"
    with pytest.raises(BenchmarkError, match="nothing after the colon"):
        benchmark_get("jsonl:")
    with pytest.raises(BenchmarkError, match="give it one as task-folder:<argument>"):
        benchmark_get("task-folder")
    with pytest.raises(BenchmarkError, match="no such folder"):
        benchmark_get(f"folder:{tmp_path / 'missing'}", trusted=True)
    with pytest.raises(BenchmarkError, match="takes no argument"):
        benchmark_get("demo:extra")


def test_a_benchmark_path_from_the_web_must_be_under_the_allowed_roots(folder_bench, tmp_path, settings):
    path = write_jsonl(tmp_path / "tasks.jsonl", GOOD)
    settings.CONFIG = dataclasses.replace(settings.CONFIG, repo_roots=[])
    with pytest.raises(BenchmarkError, match="CRUCIBLE_REPO_ROOTS: none yet"):
        benchmark_get(f"jsonl:{path}")
    settings.CONFIG = dataclasses.replace(settings.CONFIG, repo_roots=[tmp_path])
    assert benchmark_get(f"jsonl:{path}").get_tasks()[0].task_id == "t1"
    assert benchmark_get(f"folder:{folder_bench}").root == folder_bench
    with pytest.raises(BenchmarkError, match=r"JSONL benchmark .*: no such file"):  # inside: it may say so
        benchmark_check(f"jsonl:{tmp_path / 'missing.jsonl'}")


def test_a_dotted_path_names_a_benchmark_factory_or_an_adapter_class():
    for spec in ("evolve_app.benchmarks:demo_benchmark", "evolve_app.benchmarks.demo_benchmark",
                 "tests.evolve_app.test_benchmarks:TinyBenchmark"):
        assert len(benchmark_get(spec, trusted=True).get_tasks()) >= 1
    with pytest.raises(BenchmarkError, match="is not a benchmark"):
        benchmark_get("os.getcwd", trusted=True)  # importable and callable, but never called
    with pytest.raises(BenchmarkError, match="cannot import 'no_such_package'"):
        benchmark_get("no_such_package.thing", trusted=True)
    # The built-ins' own paths name the built-ins, for anyone; another path needs trust.
    assert isinstance(benchmark_get("evolve_app.benchmarks:demo_benchmark"), JsonlBenchmark)
    with pytest.raises(BenchmarkError, match=r"is a dotted path, and the web and API may name only"):
        benchmark_get("tests.evolve_app.test_benchmarks:TinyBenchmark")


def test_an_unknown_benchmark_is_a_clear_error_that_lists_the_choices():
    with pytest.raises(BenchmarkError) as raised:
        benchmark_get("swe-bench-lite")
    message = str(raised.value)
    assert message.startswith("unknown benchmark 'swe-bench-lite'; registered: arc, arc-agi-3, arc-agi3, "
                              "demo, hle, jsonl, mcp-atlas, skill-bench, swe-verified, task-folder")
    assert "folder:/path" in message and "jsonl:/path" in message and "dotted path" in message
    with pytest.raises(BenchmarkError, match="no benchmark named"):
        benchmark_get("  ")


class TinyBenchmark(BenchmarkAdapter):
    def __init__(self, answer: str = "1") -> None:
        self.answer = answer

    def get_tasks(self, split="train", limit=10):
        return [Task("tiny-1", "one?")]

    def evaluate(self, task, trajectory):
        return benchmarks.Feedback(trajectory.output == self.answer, float(trajectory.output == self.answer))


def test_an_entry_point_of_another_package_is_found_by_name_with_or_without_an_argument(monkeypatch):
    mine = EntryPoint(name="tiny", value="tests.evolve_app.test_benchmarks:TinyBenchmark",
                      group="crucible.benchmarks")
    monkeypatch.setattr(extensions, "entry_points",
                        lambda group: [mine] if group == "crucible.benchmarks" else [])
    assert "tiny" in benchmark_names()
    assert benchmark_get("tiny").answer == "1" and benchmark_get("tiny:42").answer == "42"
    assert isinstance(benchmark_get("demo"), JsonlBenchmark)  # built-ins stay even when not installed
