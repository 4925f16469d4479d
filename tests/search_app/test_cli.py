"""`manage.py search …` run as a real subprocess: the same messages as spec_validate."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runtime_app import access
from runtime_app.models import Project, ProjectMembership, Repository
from search_app.freeze import freeze_inputs
from search_app.models import Search
from search_app.reference import spec_reference_markdown
from search_app.spec import RESULTS_WARNING, spec_validate
from tests.gitrepo import baseline_repo, seed_runnable
from tests.helpers import REPO_ROOT, make_user, subprocess_env
from tests.search_app.test_freeze import GOLDEN_BASELINE_COMMIT, WITH_EVIDENCE

SPECS = Path(__file__).parent / "specs"
SEED_PATH = SPECS / "seed_example.toml"


def search(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "search", *args],
        cwd=REPO_ROOT, env=subprocess_env(), input=stdin, capture_output=True, timeout=120,
    )


def lines(output: bytes) -> list[str]:
    return output.decode().splitlines()


def expected_lines(label: str, data: bytes) -> list[str]:
    return [f"{label}:{error}" for error in spec_validate(data).errors]


# --- validate -------------------------------------------------------------------------------


def test_validate_prints_a_summary_of_a_valid_spec_and_exits_0():
    done = search("validate", str(SEED_PATH))
    assert done.returncode == 0, done.stderr
    printed = lines(done.stdout)
    assert max(len(line) for line in printed) <= 100  # long lines wrap, indented under their label
    assert printed[:9] == [
        f"{SEED_PATH}: valid",
        "  name        speed-up-certificate",
        "  rounds      32 → 8 → 3 → 1 (population 32, concurrency 16)",
        "  worker      deepseek deepseek-v4-flash, effort high",
        "  budget      $5.00, 10,000,000 tokens",
        "  gates       2 commands",
        "  score       minimize median_runtime_ms over 5 trials",
        "              reported by the score command, checked against the runtime's wall and CPU time",
        "  selection   pareto, diverse",
    ]
    # the seed declares no `score.results`
    assert " ".join(" ".join(printed[9:]).split()) == f"warning {RESULTS_WARNING}"
    assert done.stderr == b""


def test_validate_warns_only_when_nothing_checks_correctness_while_the_score_runs():
    printed = lines(search("validate", str(SEED_PATH)).stdout)
    warning = next(n for n, line in enumerate(printed) if line.startswith("  warning"))
    assert printed[warning].startswith("  warning     nothing checks correctness while the score runs")
    assert all(line.startswith(" " * 14) for line in printed[warning + 1:])  # wrapped under its label
    demo = search("validate", str(REPO_ROOT / "search_app" / "spec_templates" / "demo-scripted.toml"))
    assert demo.returncode == 0 and "warning" not in demo.stdout.decode()


def test_validate_says_the_runtime_measures_a_runtime_metric():
    done = search("validate", str(REPO_ROOT / "search_app" / "spec_templates" / "demo-scripted.toml"))
    assert done.returncode == 0, done.stderr
    printed = lines(done.stdout)
    score = printed.index("  score       minimize runtime:cpu_seconds over 3 trials")
    assert printed[score + 1].strip() == "measured by the runtime, from outside the score command"


@pytest.mark.parametrize(
    "name",
    ["unknown-key-top-level", "integration-policy-auto-merge", "toml-syntax-double-equals", "not-utf8",
     "population-too-small"],
)
def test_validate_prints_the_same_errors_as_spec_validate_and_exits_1(name):
    path = SPECS / "invalid" / f"{name}.toml"
    done = search("validate", str(path))
    assert done.returncode == 1
    printed = lines(done.stdout)
    errors = spec_validate(path.read_bytes()).errors
    assert printed == expected_lines(str(path), path.read_bytes())
    assert [line.removeprefix(f"{path}:") for line in printed] == [str(error) for error in errors]
    count = len(errors)
    assert lines(done.stderr) == [f"{path}: {count} error{'s' if count != 1 else ''}"]


def test_validate_lists_every_error_of_a_spec_with_several_problems(tmp_path):
    spec = tmp_path / "broken.toml"
    spec.write_text(
        SEED_PATH.read_text()
        .replace("concurrency = 16", "concurrency = 17")
        .replace("trials = 5", "trails = 5")
        .replace('policy = "pareto"', 'policy = "best"')
    )
    done = search("validate", str(spec))
    assert done.returncode == 1
    assert lines(done.stdout) == [
        f"{spec}:5:1 concurrency: invalid value; expected a number less than or equal to 16",
        f"{spec}:32:1 score.trails: unknown key `trails`; expected one of command, metric, direction, "
        "trials, tie_breakers, timeout_seconds, replay_tolerance, comparison, confidence, max_trials, "
        "reported, read_paths, results (did you mean `trials`?)",
        f"{spec}:36:1 selection.policy: invalid value; expected 'pareto' or 'ordered'",
    ]


def test_validate_reads_standard_input_for_a_dash():
    broken = SEED_PATH.read_bytes().replace(b"trials = 5", b"trials = 50")
    done = search("validate", "-", stdin=broken)
    assert done.returncode == 1
    assert lines(done.stdout) == expected_lines("<stdin>", broken)
    assert lines(done.stdout) == [
        "<stdin>:32:1 score.trials: invalid value; expected a number less than or equal to 25"
    ]
    assert search("validate", "-", stdin=SEED_PATH.read_bytes()).returncode == 0


def test_validate_shows_control_characters_from_a_spec_escaped_on_one_line(tmp_path):
    spec = tmp_path / "escape.toml"
    spec.write_text(SEED_PATH.read_text() + '\n"\\u001b[2J\\nfake" = 1\n')
    done = search("validate", str(spec))
    assert done.returncode == 1
    [line] = lines(done.stdout)
    assert line.startswith(f"{spec}:39:1 selection.\\x1b[2J\\x0afake: unknown key `\\x1b[2J\\x0afake`")
    assert b"\x1b" not in done.stdout


def test_validate_a_missing_file_says_so_and_exits_2(tmp_path):
    missing = tmp_path / "missing.toml"
    done = search("validate", str(missing))
    assert done.returncode == 2
    assert lines(done.stderr) == [f"{missing}: cannot read the spec: No such file or directory"]
    assert done.stdout == b""


def test_validate_a_directory_says_so_and_exits_2(tmp_path):
    done = search("validate", str(tmp_path))
    assert done.returncode == 2
    assert lines(done.stderr) == [f"{tmp_path}: cannot read the spec: Is a directory"]


def test_validate_without_a_file_is_a_usage_error():
    done = search("validate")
    assert done.returncode == 2
    assert b"the following arguments are required: file" in done.stderr


# --- freeze ---------------------------------------------------------------------------------


@pytest.fixture
def spec_file(tmp_path) -> Path:
    path = tmp_path / "speed-up.toml"
    path.write_text(seed_runnable(WITH_EVIDENCE))  # the seed's own commands cannot start in baseline_repo
    return path


@pytest.mark.django_db(transaction=True)
def test_freeze_registers_the_repository_and_prints_the_frozen_ids(demo, spec_file, tmp_path):
    repo = baseline_repo(tmp_path / "certificate")
    expected = freeze_inputs(spec_file.read_text(), str(repo), "v1")
    done = search("freeze", str(spec_file), "--repo", str(repo), "--ref", "v1")
    assert done.returncode == 0, done.stderr.decode()
    assert lines(done.stdout) == [
        f"search id        {expected.search_id}",
        f"preregistration  {expected.preregistration_hash}",
        f"baseline commit  {GOLDEN_BASELINE_COMMIT} (v1)",
        "candidates       32 in 2 batches of up to 16",
    ]
    # Frozen all the same, with the warning on stderr: its spec declares no `score.results`.
    assert f"warning: {RESULTS_WARNING}" in done.stderr.decode()
    frozen = Search.objects.get()
    assert (frozen.search_id, frozen.project, frozen.created_by.username) == (
        expected.search_id, demo, "admin")
    assert frozen.repository == Repository.objects.get(project=demo, path=str(repo))
    again = search("freeze", str(spec_file), "--repo", str(repo), "--ref", GOLDEN_BASELINE_COMMIT)
    assert again.returncode == 0
    assert lines(again.stdout)[0] == f"search id        {expected.search_id}"
    assert Search.objects.count() == 1 and Repository.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_freeze_names_another_project_and_user(spec_file, tmp_path):
    owner = make_user("ada")
    project = Project.objects.create(name="certificates", created_by=owner)
    ProjectMembership.objects.create(project=project, user=owner, role=access.OPERATOR)
    repo = baseline_repo(tmp_path / "certificate")
    done = search("freeze", str(spec_file), "--repo", str(repo), "--ref", "main",
                  "--project", "certificates", "--user", "ada")
    assert done.returncode == 0, done.stderr.decode()
    assert Search.objects.get().project == project


@pytest.mark.django_db(transaction=True)
def test_freeze_of_an_invalid_spec_prints_its_errors_on_stderr_and_exits_1(demo, tmp_path):
    repo = baseline_repo(tmp_path / "certificate")
    path = SPECS / "invalid" / "score-trials-26.toml"
    done = search("freeze", str(path), "--repo", str(repo), "--ref", "v1")
    assert done.returncode == 1
    assert lines(done.stderr) == expected_lines(str(path), path.read_bytes())
    assert done.stdout == b""
    assert not Search.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_freeze_of_a_dirty_baseline_prints_one_line_and_exits_1(demo, spec_file, tmp_path):
    repo = baseline_repo(tmp_path / "certificate")
    (repo / "README.md").write_text("edited\n")
    done = search("freeze", str(spec_file), "--repo", str(repo), "--ref", "v1")
    assert done.returncode == 1
    assert lines(done.stderr) == [
        f"{repo}: the baseline is dirty — uncommitted changes to README.md; commit or stash them first"
    ]
    assert not Search.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_freeze_reports_every_problem_one_per_line(demo, tmp_path):
    repo = baseline_repo(tmp_path / "certificate")
    (repo / "README.md").write_text("edited\n")
    spec = tmp_path / "spec.toml"
    spec.write_text(SEED_PATH.read_text() + '\n[evidence]\nfiles = ["docs", "gone.md"]\n')
    done = search("freeze", str(spec), "--repo", str(repo), "--ref", "v1")
    assert done.returncode == 1
    assert lines(done.stderr)[1:] == [
        "evidence.files: docs: a directory; list its files at 6d8d2e79a0eb",
        "evidence.files: gone.md: no such file at 6d8d2e79a0eb",
    ]


@pytest.mark.django_db(transaction=True)
def test_freeze_at_an_unknown_ref_names_it(demo, spec_file, tmp_path):
    repo = baseline_repo(tmp_path / "certificate")
    done = search("freeze", str(spec_file), "--repo", str(repo), "--ref", "nightly")
    assert done.returncode == 1
    assert lines(done.stderr) == ["nightly: no branch, tag or commit by that name"]


@pytest.mark.django_db(transaction=True)
def test_freeze_of_a_path_that_is_not_a_repository_says_so(demo, spec_file, tmp_path):
    done = search("freeze", str(spec_file), "--repo", str(tmp_path), "--ref", "main")
    assert done.returncode == 1
    assert lines(done.stderr) == [f"{tmp_path}: not a git repository (no .git here)"]
    assert not Repository.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_freeze_without_the_project_or_user_says_which_is_missing(demo, spec_file, tmp_path):
    repo = baseline_repo(tmp_path / "certificate")
    no_project = search("freeze", str(spec_file), "--repo", str(repo), "--ref", "v1", "--project", "nope")
    assert no_project.returncode == 1
    assert lines(no_project.stderr) == [
        "no project named 'nope': create it first (`manage.py crucible_setup` makes `demo`) or pass --project"
    ]
    no_user = search("freeze", str(spec_file), "--repo", str(repo), "--ref", "v1", "--user", "ghost")
    assert no_user.returncode == 1
    assert lines(no_user.stderr) == ["no user named 'ghost': pass --user with an existing account"]


@pytest.mark.django_db(transaction=True)
def test_freeze_by_a_viewer_is_refused(demo, spec_file, tmp_path):
    viewer = make_user("vera")
    ProjectMembership.objects.create(project=demo, user=viewer)
    repo = baseline_repo(tmp_path / "certificate")
    done = search("freeze", str(spec_file), "--repo", str(repo), "--ref", "v1", "--user", "vera")
    assert done.returncode == 1
    assert lines(done.stderr) == ["vera: This needs the operator role in demo (yours is viewer)."]
    assert not Search.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_freeze_of_an_unreadable_file_exits_2(demo, tmp_path):
    missing = tmp_path / "none.toml"
    done = search("freeze", str(missing), "--repo", str(tmp_path), "--ref", "v1")
    assert done.returncode == 2
    assert lines(done.stderr) == [f"{missing}: cannot read the spec: No such file or directory"]


# --- the outcome table (search status, and the end of search run) ----------------------------


def outcome_table(metric: str = "median_runtime_ms", llm_cost: int = 0, **candidate: Any) -> str:
    """The table as `search status` prints it for a finished search, whitespace folded."""
    from rich.console import Console

    from search_app.management.commands.search import _outcome_table

    row = {"candidate_id": "cand_001", "state": "winner", "round_reached": 1, "gates_passed": 2,
           "score": 0.41, "figure": "0.41× [0.38, 0.44]", "spread": 0.03, "diff_lines": 12,
           "cost_microusd": 0, "receipts": [7, 8],
           "reason": "won round 1", **candidate}
    report = {"search_id": "search-0123456789abcdef", "name": "speed-up", "status": "finished",
              "outcome": "winner", "winner": "cand_001", "winner_status": None, "reason": "cand_001 won.",
              "review": None, "metric": metric, "candidates": [row],
              "llm": {"calls": 3 if llm_cost else 0, "cost_microusd": llm_cost, "cache_hit_ratio": 0.5}}
    console = Console(file=io.StringIO(), width=200)
    console.print(_outcome_table(report))
    return " ".join(console.file.getvalue().split())


def test_the_outcome_table_says_a_reported_score_is_forgeable_by_code_the_command_runs():
    assert "score: median_runtime_ms, reported by the score command (forgeable by code it runs)" in \
        outcome_table("median_runtime_ms")


def test_the_outcome_table_says_the_runtime_measured_a_runtime_metric():
    text = outcome_table("runtime:cpu_seconds")
    assert "score: runtime:cpu_seconds, measured by the runtime, from outside the score command" in text
    assert "forgeable" not in text


def test_the_outcome_table_shows_each_figure_with_its_interval_as_the_pages_do():
    assert "0.41× [0.38, 0.44]" in outcome_table()


def test_the_outcome_table_shows_costs_in_dollars_as_the_pages_do():
    text = outcome_table(llm_cost=350, cost_microusd=1_250_000)
    assert "$1.25" in text and "Model calls: 3, $0.00035," in text
    assert "µUSD" not in text and "1250000" not in text
    assert "$" not in outcome_table(cost_microusd=0)  # no cost, no figure, as on the candidate table


# --- reference ------------------------------------------------------------------------------


def test_reference_prints_the_generated_markdown():
    done = search("reference")
    assert done.returncode == 0
    assert done.stdout.decode() == spec_reference_markdown()


def test_reference_write_writes_the_file_it_is_given(tmp_path):
    target = tmp_path / "reference.md"
    done = search("reference", "--write", str(target))
    assert done.returncode == 0
    assert lines(done.stdout) == [f"wrote {target}"]
    assert target.read_text() == spec_reference_markdown()
