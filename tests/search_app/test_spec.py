"""Spec validation: every rule reports the exact key path and line:column, all at once."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from search_app.spec import (
    MAX_SPEC_BYTES,
    SearchSpec,
    SpecError,
    key_positions,
    spec_efforts,
    spec_normalized,
    spec_summary,
    spec_validate,
)

SPECS = Path(__file__).parent / "specs"
SEED_PATH = SPECS / "seed_example.toml"
SEED = SEED_PATH.read_text()
SEED_DOCUMENT = Path(__file__).resolve().parents[3] / "shared" / "seeds" / "workflow-experimental-search.md"
INVALID = sorted((SPECS / "invalid").glob("*.toml"))
_HEAD = re.compile(r"^# (?P<kind>expect|also): (?P<path>\S+) (?P<line>\d+):(?P<column>\d+)$")


def positions(report) -> list[tuple[str, int, int]]:
    return [(e.path or "(document)", e.line, e.column) for e in report.errors]


def corpus_expectations(data: bytes) -> tuple[set[tuple[str, int, int]], str]:
    """The `# expect:` / `# also:` / `# says:` comment lines at the top of a corpus file."""
    head = data.decode("utf-8", errors="replace").split("\n")
    assert _HEAD.match(head[0]) and head[0].startswith("# expect: "), "first line is `# expect: PATH L:C`"
    expected, says = set(), ""
    for line in head:
        if not line.startswith("# "):
            break
        if match := _HEAD.match(line):
            expected.add((match["path"], int(match["line"]), int(match["column"])))
        elif line.startswith("# says: "):
            says = line.removeprefix("# says: ")
    return expected, says


def seed_toml_from_document(markdown: str) -> str:
    """The ```toml block of the seed document, whose lines are `| N | text |` table rows."""
    lines = []
    for row in markdown.splitlines():
        match = re.match(r"^\| \d+ \|(?: (.*) \|| \|)?$", row)
        assert match, row
        lines.append(match.group(1) or "")
    block = "\n".join(lines).split("```toml\n", 1)[1].split("\n```", 1)[0]
    return block + "\n"


# --- the seed -------------------------------------------------------------------------------


def test_the_seed_example_validates_unchanged():
    report = spec_validate(SEED)
    assert report.valid, [str(e) for e in report.errors]
    assert report.errors == ()
    assert report.spec.name == "speed-up-certificate"
    assert report.spec.rounds == [32, 8, 3, 1]


def test_the_seed_example_as_bytes_validates_too():
    assert spec_validate(SEED.encode()).valid


REPORTED_LINE = 'reported = "time_ms"\n'


@pytest.mark.skipif(not SEED_DOCUMENT.exists(), reason=f"{SEED_DOCUMENT} is not on this machine")
def test_the_checked_in_seed_example_is_the_seed_documents_toml_block_saying_what_its_metric_measures():
    assert seed_toml_from_document(SEED_DOCUMENT.read_text()) == SEED.replace(REPORTED_LINE, "")


def test_the_seed_documents_own_block_is_refused_until_it_says_what_its_reported_metric_measures():
    [error] = spec_validate(SEED.replace(REPORTED_LINE, "")).errors
    assert (error.path, error.line, error.column) == ("score.metric", 30, 1)
    assert "`median_runtime_ms` is a figure the score command reports about itself" in error.message
    assert 'reported = "time_ms"' in error.message and "runtime:cpu_seconds" in error.message


def test_the_seed_example_gets_every_default_filled_in():
    normalized = spec_normalized(spec_validate(SEED).spec)
    assert normalized["schema_version"] == 1
    assert normalized["evidence"] == {"files": [], "text": ""}
    assert normalized["evaluator"] == {"files": {}}
    assert normalized["hard_gates"]["timeout_seconds"] == 600
    assert normalized["score"]["timeout_seconds"] == 900
    assert normalized["selection"]["ordering"] == ["cost_microusd", "score"]
    assert normalized["worker"]["exact_files"] == []


def test_the_seed_summary_shows_the_funnel_worker_budget_gates_score_and_selection():
    summary = spec_summary(spec_validate(SEED).spec)
    assert summary["rounds"] == [32, 8, 3, 1]
    assert summary["concurrency"] == 16
    assert (summary["provider"], summary["model"]) == ("deepseek", "deepseek-v4-flash")
    assert summary["efforts"] == ["high"] * 4
    assert (summary["budget_usd"], summary["budget_tokens"]) == (5.0, 10_000_000)
    assert len(summary["gates"]) == 2
    assert summary["score"] == "minimize median_runtime_ms over 5 trials"
    assert summary["selection"] == "pareto, diverse"


# --- the corpus: one hand-written invalid spec per rule ----------------------------------------


def test_the_corpus_has_one_file_per_rule():
    assert len(INVALID) >= 70
    for path in INVALID:
        assert path.read_bytes().startswith(b"# expect: "), path.name


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_each_invalid_spec_reports_its_rule_at_the_exact_key_path_and_position(path):
    data = path.read_bytes()
    expected, says = corpus_expectations(data)
    report = spec_validate(data)
    assert not report.valid and report.spec is None
    assert set(positions(report)) == expected, [str(e) for e in report.errors]
    assert len(report.errors) == len(expected)
    assert any(says in str(error) for error in report.errors), (says, [str(e) for e in report.errors])


def test_the_corpus_covers_every_rule_of_the_issue():
    paths = {p for f in INVALID for p, _, _ in corpus_expectations(f.read_bytes())[0]}
    for path in [
        "name", "objective", "population", "rounds", "concurrency", "integration_policy",
        "schema_version", "worker", "worker.provider", "worker.model", "worker.command",
        "worker.reasoning_effort", "worker.reasoning_effort[2]", "worker.write_authority",
        "worker.write_roots", "worker.exact_files", "budget.max_cost_microusd", "budget.max_tokens",
        "evidence.files", "evaluator.files", "hard_gates.commands", "hard_gates.commands[1]",
        "hard_gates.forbid_test_changes", "hard_gates.timeout_seconds", "score.command", "score.metric",
        "score.direction", "score.trials", "score.tie_breakers", "score.tie_breakers[1]",
        "score.timeout_seconds", "selection.policy", "selection.ordering", "selection.ordering[1]",
        "selection.retain_diversity", "populaton", "worker.modle", "budget.max_cost", "evidence.file",
        "evaluator.file", "hard_gates.timeout", "score.trails", "selection.polcy", "scoring",
        "(document)",
    ]:
        assert path in paths, path


# --- rules spelled out in code ------------------------------------------------------------------


def with_lines(**replacements: str | None) -> str:
    """The seed with whole `key = value` lines replaced (key → new line; None deletes it)."""
    lines: list[str | None] = list(SEED.split("\n"))
    for key, new in replacements.items():
        index = next(i for i, line in enumerate(lines) if line and line.startswith(f"{key} ="))
        lines[index] = new
    return "\n".join(line for line in lines if line is not None)


def only_error(text: str | bytes) -> SpecError:
    report = spec_validate(text)
    assert len(report.errors) == 1, [str(e) for e in report.errors]
    return report.errors[0]


@pytest.mark.parametrize(
    ("replacements", "path", "position", "expected"),
    [
        ({"name": 'name = "Crucible"'}, "name", (1, 1), "1–96 characters of a-z 0-9 - _"),
        ({"name": 'name = "' + "x" * 97 + '"'}, "name", (1, 1), "1–96 characters of a-z 0-9 - _"),
        ({"objective": 'objective = ""'}, "objective", (2, 1), "at least 1 character(s)"),
        ({"objective": 'objective = "' + "o" * 4001 + '"'}, "objective", (2, 1), "at most 4000 characters"),
        ({"population": "population = 1001", "rounds": "rounds = [1001, 1]"}, "population", (3, 1),
         "a number less than or equal to 1000"),
        ({"rounds": "rounds = [32]"}, "rounds", (4, 1), "at least 2 item(s)"),
        ({"rounds": "rounds = [32, 1, 1]"}, "rounds", (4, 1), "strictly decreasing survivor counts"),
        ({"rounds": "rounds = [32, 9, 2]"}, "rounds", (4, 1), "a last round of 1 (one winner)"),
        ({"rounds": "rounds = [31, 9, 1]"}, "rounds", (4, 1), "rounds[0] = population = 32"),
        ({"concurrency": "concurrency = 17"}, "concurrency", (5, 1), "a number less than or equal to 16"),
        ({"population": "population = 3", "rounds": "rounds = [3, 1]", "concurrency": "concurrency = 4"},
         "concurrency", (5, 1), "concurrency ≤ population"),
        ({"integration_policy": 'integration_policy = "auto_merge"'}, "integration_policy", (6, 1),
         "only `review_only`: a winner is merged only after a person approves it"),
        ({"provider": 'provider = "anthropix"'}, "worker.provider", (9, 1),
         "one of the fleet presets: anthropic, bedrock, openai, deepseek, local, command, claude-code, "
         "codex, aider"),
        ({"model": None}, "worker.model", (8, 1), 'worker.model, e.g. "deepseek-v4-flash"'),
        ({"reasoning_effort": 'reasoning_effort = ["off", "low", "high"]'}, "worker.reasoning_effort",
         (11, 1), "one effort, or exactly one per round"),
        ({"write_roots": 'write_roots = ["C:\\\\Users\\\\x"]'}, "worker.write_roots", (13, 1),
         "a repo-relative path, not an absolute or drive path"),
        ({"write_roots": 'write_roots = ["code\\tx"]'}, "worker.write_roots", (13, 1),
         "a path without control characters"),
        ({"max_tokens": "max_tokens = 0"}, "budget.max_tokens", (17, 1), "a number greater than 0"),
        ({"forbid_test_changes": "forbid_test_changes = false"}, "hard_gates.forbid_test_changes", (24, 1),
         "`true`: weakening tests is never allowed"),
        ({"direction": 'direction = "lower"'}, "score.direction", (29, 1), "'minimize' or 'maximize'"),
        ({"trials": "trials = 26"}, "score.trials", (32, 1), "a number less than or equal to 25"),
        ({"tie_breakers": "tie_breakers = []"}, "score.tie_breakers", (33, 1), "at least 1 item(s)"),
        ({"policy": 'policy = "ordered"\nordering = ["cost_microusd", "elegance"]'},
         "selection.ordering[1]", (37, 1), "'score', 'runtime', 'diff_lines' or 'cost_microusd'"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_a_rule_breaking_value_is_reported_at_its_key(replacements, path, position, expected):
    error = only_error(with_lines(**replacements))
    assert (error.path, (error.line, error.column), error.expected) == (path, position, expected)


def test_auto_merge_is_refused_with_the_reason():
    error = only_error(with_lines(integration_policy='integration_policy = "auto_merge"'))
    assert str(error) == (
        "6:1 integration_policy: invalid value; expected only `review_only`: "
        "a winner is merged only after a person approves it"
    )


def test_a_misspelled_key_suggests_the_key_it_resembles_and_lists_the_known_ones():
    error = only_error(SEED.replace("trials = 5", "trails = 5"))
    assert (error.path, error.line, error.column) == ("score.trails", 32, 1)
    assert error.message == "unknown key `trails`"
    assert error.suggestion == "trials"
    assert error.expected.startswith("one of command, metric, direction, trials")
    assert str(error).endswith("(did you mean `trials`?)")


@pytest.mark.parametrize(
    ("table", "line", "unknown", "suggestion"),
    [
        ("", "name =", "nme", "name"),
        ("worker", "provider =", "provder", "provider"),
        ("budget", "max_tokens =", "max_tokes", "max_tokens"),
        ("hard_gates", "commands =", "comands", "commands"),
        ("score", "metric =", "metrc", "metric"),
        ("selection", "policy =", "polciy", "policy"),
    ],
)
def test_unknown_keys_are_errors_at_every_level(table, line, unknown, suggestion):
    known = line.split(" =")[0]
    text = ("\n" + SEED).replace(f"\n{known} =", f"\n{unknown} =", 1)[1:]
    errors = {e.path: e for e in spec_validate(text).errors}
    key = f"{table}.{unknown}" if table else unknown
    assert errors[key].suggestion == suggestion
    assert errors[key].message == f"unknown key `{unknown}`"


def test_every_error_is_listed_at_once():
    text = (
        SEED.replace('name = "speed-up-certificate"', 'name = "Speed Up"')
        .replace('model = "deepseek-v4-flash"', 'modle = "deepseek-v4-flash"')
        .replace("max_tokens = 10000000", "max_tokens = 0")
        .replace("trials = 5", "trials = 0")
        .replace('policy = "pareto"', 'policy = "ordered"\nordering = ["score", "score"]')
    )
    report = spec_validate(text)
    assert positions(report) == [
        ("name", 1, 1),
        ("worker.model", 8, 1),  # deepseek needs a model: the misspelled key left none
        ("worker.modle", 10, 1),
        ("budget.max_tokens", 17, 1),
        ("score.trials", 32, 1),
        ("selection.ordering", 37, 1),
    ]


def test_five_distinct_problems_report_five_errors():
    text = (
        SEED.replace('objective = "Reduce runtime without changing exact results"', 'objective = ""')
        .replace("concurrency = 16", "concurrency = 0")
        .replace('reasoning_effort = "high"', 'reasoning_effort = "maximal"')
        .replace('direction = "minimize"', 'direction = "sideways"')
        .replace("retain_diversity = true", "retain_diversity = 1")
    )
    assert positions(spec_validate(text)) == [
        ("objective", 2, 1),
        ("concurrency", 5, 1),
        ("worker.reasoning_effort", 11, 1),
        ("score.direction", 29, 1),
        ("selection.retain_diversity", 37, 1),
    ]


def test_an_empty_document_lists_every_missing_required_key():
    report = spec_validate("")
    assert positions(report) == [
        (key, 1, 1)
        for key in ["concurrency", "hard_gates", "name", "objective", "population", "rounds", "score",
                    "worker"]
    ]
    assert {e.message for e in report.errors} == {"missing required key"}


def test_a_missing_key_inside_a_table_points_at_the_table_header():
    error = only_error(SEED.replace('metric = "median_runtime_ms"\n', ""))
    assert (error.path, error.line, error.column, error.message) == (
        "score.metric", 27, 1, "missing required key"
    )


# --- TOML syntax, encoding, size ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "position", "message"),
    [
        ('name = "a"\npopulation = = 3\n', (2, 14), "not valid TOML: Invalid value"),
        ("[worker\nprovider = 1\n", (1, 8), "not valid TOML: Expected ']' at the end of a table declaration"),
        ('name = "a"\nname = "b"\n', (2, 11), "not valid TOML: Cannot overwrite a value"),
        ('objective = "open\n', (1, 18), "not valid TOML: Illegal character '\\n'"),
        ("rounds = [1, 2\nname = 3\n", (2, 1), "not valid TOML: Unclosed array"),
        ("rounds = [1,\n", (2, 1), "not valid TOML: Invalid value"),  # at the end of the document
    ],
)
def test_toml_syntax_errors_carry_line_and_column(text, position, message):
    error = only_error(text)
    assert (error.path, (error.line, error.column), error.message) == ("", position, message)
    assert error.expected == "TOML syntax"
    assert str(error).startswith(f"{position[0]}:{position[1]} (document): ")


def test_bytes_that_are_not_utf8_are_reported_where_they_start():
    error = only_error(b'name = "a"\nobjective = "caf\xe9"\n')
    assert (error.line, error.column, error.message) == (2, 17, "the spec is not UTF-8 text")


def test_a_lone_surrogate_in_text_is_reported_where_it_is():
    error = only_error(SEED.replace('metric = "', 'metric = "\ud83d'))
    assert (error.line, error.column, error.message) == (30, 11, "the spec has a lone surrogate character")


@pytest.mark.parametrize("text", ["rounds = " + "[" * 3000 + "]" * 3000, "worker = " + "{ a = " * 3000 + "1"])
def test_values_nested_thousands_deep_get_an_error_not_a_crash(text):
    error = only_error(text)
    assert (error.line, error.column, error.message) == (1, 1, "not valid TOML: values nested too deeply")


def test_a_spec_over_the_size_limit_is_refused_without_parsing():
    big = SEED + "#" * MAX_SPEC_BYTES
    assert only_error(big).message == "the spec is too large"
    assert only_error(big.encode()).message == "the spec is too large"


# --- valid variants at the boundaries ---------------------------------------------------------


@pytest.mark.parametrize(
    "replacements",
    [
        {"name": 'name = "' + "a" * 96 + '"'},
        {"name": 'name = "0-_"'},
        {"population": "population = 2", "rounds": "rounds = [2, 1]", "concurrency": "concurrency = 2"},
        {"population": "population = 1000", "rounds": "rounds = [1000, 100, 10, 1]"},
        {"concurrency": "concurrency = 1"},
        {"reasoning_effort": 'reasoning_effort = ["low", "medium", "high", "max"]'},
        {"reasoning_effort": 'reasoning_effort = "off"'},
        {"write_roots": 'exact_files = ["code/solver.py", "code/util.py"]'},
        {"write_roots": 'write_roots = ["code", "lib/fast"]\nexact_files = [".github-notes.md"]'},
        {"provider": 'provider = "command"\ncommand = "my-agent --yes"', "model": None},
        {"max_cost_microusd": None, "max_tokens": None},
        {"trials": "trials = 1"},
        {"trials": "trials = 25"},
        {"tie_breakers": 'tie_breakers = ["tokens", "score", "cost_microusd", "diff_lines"]'},
        {"direction": 'direction = "maximize"', "reported": 'reported = "other"'},
        {"metric": 'metric = "runtime:cpu_seconds"', "reported": None},
        {"policy": 'policy = "ordered"\nordering = ["score", "runtime", "diff_lines", "cost_microusd"]'},
        {"retain_diversity": "retain_diversity = false"},
        {"forbid_test_changes": None},
    ],
)
def test_values_at_the_edges_of_each_range_are_valid(replacements):
    report = spec_validate(with_lines(**replacements))
    assert report.valid, [str(e) for e in report.errors]


@pytest.mark.parametrize("kind", ["time_s", "time_ms", "time_us", "time_ns", "memory_kib", "memory_bytes",
                                  "other"])
def test_a_reported_metric_may_say_it_measures_each_kind(kind):
    report = spec_validate(with_lines(reported=f'reported = "{kind}"'))
    assert report.valid, [str(e) for e in report.errors]
    assert report.spec.score.reported == kind
    assert report.spec.score.corroborated == (kind != "other")


def test_a_reported_metric_without_reported_is_refused_with_what_to_write_instead():
    error = only_error(with_lines(reported=None))
    assert (error.path, error.line, error.column) == ("score.metric", 30, 1)
    assert error.message.startswith("`median_runtime_ms` is a figure the score command reports about itself: "
                                    'say what it measures with `reported = "time_ms"`')
    assert "runtime:wall_seconds, runtime:cpu_seconds, runtime:max_rss_kib" in error.message


def test_a_runtime_metric_may_not_say_it_is_reported():
    error = only_error(with_lines(metric='metric = "runtime:wall_seconds"'))
    assert (error.path, error.line, error.column) == ("score.reported", 31, 1)
    assert "measured by the runtime" in error.message


@pytest.mark.parametrize("kind", ["time_ms", "memory_kib"])
def test_a_time_or_memory_figure_must_be_minimized(kind):
    error = only_error(with_lines(direction='direction = "maximize"', reported=f'reported = "{kind}"'))
    assert (error.path, error.line, error.column) == ("score.direction", 29, 1)
    assert error.expected.startswith('direction = "minimize"')


def test_an_unknown_reported_kind_is_refused_at_its_key():
    error = only_error(with_lines(reported='reported = "seconds"'))
    assert (error.path, error.line) == ("score.reported", 31)


def test_a_frozen_spec_without_reported_still_reads_as_it_was_frozen():
    # The rule is the author's, not the model's: searches frozen before it re-read unchanged.
    data = tomllib.loads(with_lines(reported=None))
    assert SearchSpec.model_validate(data).score.reported is None


def test_every_optional_key_may_be_written_out_explicitly():
    text = "schema_version = 1\n" + SEED + (
        '\n[evidence]\nfiles = ["README.md", "docs/notes.md"]\ntext = "Keep the API."\n'
        '\n[evaluator.files]\n"tests/test_hidden.py" = "def test_ok():\\n    assert True\\n"\n'
    )
    text = text.replace("forbid_test_changes = true", "forbid_test_changes = true\ntimeout_seconds = 60")
    text = text.replace("trials = 5", "trials = 5\ntimeout_seconds = 120")
    report = spec_validate(text)
    assert report.valid, [str(e) for e in report.errors]
    assert report.spec.evaluator.files == {"tests/test_hidden.py": "def test_ok():\n    assert True\n"}
    assert report.spec.hard_gates.timeout_seconds == 60


def test_one_effort_applies_to_every_round_and_a_list_gives_one_per_round():
    assert spec_efforts(spec_validate(SEED).spec) == ["high", "high", "high", "high"]
    per_round = with_lines(reasoning_effort='reasoning_effort = ["low", "low", "high", "max"]')
    assert spec_efforts(spec_validate(per_round).spec) == ["low", "low", "high", "max"]


# --- where keys are ---------------------------------------------------------------------------


def test_key_positions_follow_headers_dotted_keys_and_indentation():
    text = 'name = "a"\n  [worker]\n  provider = "x"\n[score]\nsub.key = 1\n"quoted.key" = 2\n'
    found = key_positions(text)
    assert found[("name",)] == (1, 1)
    assert found[("worker",)] == (2, 3)
    assert found[("worker", "provider")] == (3, 3)
    assert found[("score", "sub", "key")] == (5, 1)
    assert found[("score", "quoted.key")] == (6, 1)


def test_key_positions_skip_lines_inside_multi_line_values():
    text = 'commands = [\n  "A=1 run",\n  """\nfake = 1\n""",\n]\nreal = 2\n'
    found = key_positions(text)
    assert ("fake",) not in found
    assert found[("real",)] == (7, 1)


def test_key_positions_end_a_string_after_an_escaped_backslash():
    text = 'paths = ["a\\\\", "[", "b"]\nreal = 2\n'
    assert key_positions(text)[("real",)] == (2, 1)


def test_line_numbers_count_only_newlines_like_toml_does():
    # U+2028 and U+0085 are legal in TOML comments; str.splitlines would count them as lines.
    text = SEED.replace("[score]", "# a comment with \u2028 and \x85 inside\n[score]")
    report = spec_validate(text.replace("trials = 5", "trials = 0"))
    assert positions(report) == [("score.trials", 33, 1)]


def test_windows_line_endings_give_the_same_positions():
    assert spec_validate(SEED.replace("\n", "\r\n")).valid
    text = SEED.replace("trials = 5", "  trials = 0").replace("\n", "\r\n")
    assert positions(spec_validate(text)) == [("score.trials", 32, 3)]


# --- results: what a trial computed, checked against the baseline's -------------------------------

METRIC_LINE = 'metric = "median_runtime_ms"'


def results_spec(results: str, *, extra: str = "") -> str:
    return SEED.replace(METRIC_LINE, f"{METRIC_LINE}\nresults = {results}") + extra


RESULTS_SEED = results_spec('"stdout"')


def test_a_spec_without_results_is_valid_with_the_warning_that_nothing_checks_correctness():
    report = spec_validate(SEED)
    assert report.valid
    assert len(report.warnings) == 1
    assert report.warnings[0].startswith("nothing checks correctness while the score runs")


def test_results_stdout_is_read_as_a_table_with_stdout_and_no_warning():
    report = spec_validate(RESULTS_SEED)
    assert report.valid and report.warnings == []
    checked = report.spec.score.results_checked
    assert (checked.stdout, checked.files, checked.tolerance) == (True, [], 0.0)


def test_a_results_table_names_files_and_a_tolerance():
    report = spec_validate(results_spec('{ stdout = true, files = ["out/result.json"], tolerance = 1e-9 }'))
    assert report.valid, [str(e) for e in report.errors]
    checked = report.spec.score.results_checked
    assert (checked.stdout, checked.files, checked.tolerance) == (True, ["out/result.json"], 1e-9)
    assert spec_normalized(report.spec)["score"]["results"] == {
        "stdout": True, "files": ["out/result.json"], "tolerance": 1e-9}


def test_a_spec_without_results_keeps_the_search_id_it_always_had():
    assert "results" not in spec_normalized(spec_validate(SEED).spec)["score"]


def results_line() -> int:
    return RESULTS_SEED.split("\n").index('results = "stdout"') + 1


@pytest.mark.parametrize(("results", "says"), [
    ('"stdin"', '"stdout", or a table'),
    ("true", '"stdout", or a table'),
    ("{}", "`stdout = true`, `files = [...]` or both"),
    ("{ stdout = false }", "`stdout = true`, `files = [...]` or both"),
    ('{ files = ["../out.txt"] }', "no `..`"),
    ('{ files = ["/etc/passwd"] }', "repo-relative"),
    ('{ files = [".git/config"] }', "outside `.git`"),
    ('{ files = ["a", "a"] }', "each path once"),
    ("{ files = [" + ", ".join(f'"f{n}"' for n in range(21)) + "] }", "at most 20"),
    ('{ stdout = true, tolerance = -1 }', "greater than or equal to 0"),
    ('{ stdout = true, tolerance = nan }', "finite number"),
    ('{ stdout = "yes" }', "bool"),
])
def test_a_bad_results_value_is_reported_at_its_line_and_column(results, says):
    error = only_error(results_spec(results))
    assert (error.line, error.column) == (results_line(), 1)
    assert error.path.startswith("score.results"), error.path
    assert says in str(error), str(error)


def test_a_misspelled_results_key_suggests_the_known_one():
    error = only_error(results_spec("{ stdout = true, tolerence = 0.1 }"))
    assert error.path == "score.results.tolerence" and error.suggestion == "tolerance"
    assert (error.line, error.column) == (results_line(), 1)


@pytest.mark.parametrize(("files", "extra", "says"), [
    ('["tests/out.txt"]', "", "is a protected path"),
    ('["scripts/benchmark_candidate.sh"]', "", "is the score script"),
    ('["bench/hidden.txt"]', '\n[evaluator.files]\n"bench/hidden.txt" = "x"\n', "is a hidden evaluator file"),
    ('["bench/hidden/x.txt"]', '\n[evaluator.files]\n"bench/hidden" = { dir = "/srv/hidden" }\n',
     "is a hidden evaluator file"),
])
def test_a_results_file_the_score_command_cannot_write_is_refused_at_its_line(files, extra, says):
    error = only_error(results_spec(f"{{ files = {files} }}", extra=extra))
    assert error.path == "score.results.files" and says in error.message, str(error)
    assert (error.line, error.column) == (results_line(), 1)
