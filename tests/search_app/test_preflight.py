"""A command that cannot start is refused before anything runs, with the reason; one that still
fails to start at run time stops the search after the first failure.

The repositories live under /tmp (pytest's tmp_path), where a quick experiment naturally goes,
and every command runs in the real sandbox (bubblewrap here)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from runtime_app.models import Event, Receipt
from runtime_app.services import repository_register
from search_app import services
from search_app.freeze import freeze_inputs
from search_app.models import Candidate, Step
from search_app.preflight import Invocation, invocations, preflight_problems, start_failure
from tests.gitrepo import git, repo_create
from tests.helpers import REPO_ROOT, login, subprocess_env, text_of
from tests.search_app.hostspecs import roots, spec
from tests.search_app.runs import WRITER, plan_repo, run_inline
from tests.search_app.test_freeze import GOLDEN_SEARCH_ID, WITH_EVIDENCE

DB = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tools(tmp_path) -> Path:
    """A scripted writer kept outside the repository, under /tmp, as in the issue."""
    folder = tmp_path / "tools"
    folder.mkdir()
    (folder / "writer.py").write_text(WRITER)
    return folder


def refused(personas, text: str, repo: Path) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    return caught.value.messages


# --- parsing command lines ----------------------------------------------------------------------


@pytest.mark.parametrize(("line", "expected"), [
    ("python x.py", [Invocation("python", "x.py")]),
    ("A=1 B=2 python3 -u -W ignore bench.py --n 3", [Invocation("python3", "bench.py")]),
    ("python -m pytest -q && python -c 'import x; y'", [Invocation("python"), Invocation("python")]),
    ("./run.sh 2>/dev/null | tee out; echo done", [Invocation("./run.sh"), Invocation("tee")]),
    ("timeout 10 env X=1 nice -n 5 bash -e scripts/s.sh", [Invocation("bash", "scripts/s.sh")]),
    ("bash -ec 'exit 0'", [Invocation("bash")]),
    ("cd code && python ../scripts/x.py", [Invocation("python", "../scripts/x.py", "code")]),
    ('cd "$HOME" && python x.py', [Invocation("python", "x.py", None)]),
    ("node --require ts-node/register x.ts", [Invocation("node", "x.ts")]),
    ("perl -I lib t.pl || ruby -e 'p 1'", [Invocation("perl", "t.pl"), Invocation("ruby")]),
    ("command -v tool || true", []),
])
def test_each_simple_command_of_a_line_gives_its_program_and_script(line, expected):
    assert invocations(line) == expected


@pytest.mark.parametrize("line", [
    "if true; then python x.py; fi", "echo $(python x.py)", "for f in *.py; do python $f; done",
    "python 'unclosed", "(cd sub && make)", "cat <<EOF\nx\nEOF",
])
def test_a_line_beyond_the_parser_is_not_checked_rather_than_refused(line):
    assert invocations(line) is None


# --- refused at freeze ----------------------------------------------------------------------------


@DB
def test_a_writer_script_outside_the_tree_and_undeclared_is_refused_at_freeze(personas, tmp_path, tools,
                                                                              data_dir):
    repo = plan_repo(tmp_path / "repo", {"cand_001": 5})
    assert str(repo).startswith("/tmp/") and str(tools).startswith("/tmp/")
    command = f"python {tools}/writer.py"
    assert refused(personas, spec(writer=command), repo) == [
        f"worker.command `{command}`: {tools}/writer.py is not visible inside the sandbox: sandboxed "
        "commands get a private /tmp; move it under the repository or declare it in worker.read_paths "
        "(under CRUCIBLE_READ_ROOTS)"]


@DB
def test_a_script_in_the_repository_named_by_its_host_path_is_told_to_be_named_relative_to_the_tree(
    personas, tmp_path, data_dir
):
    repo = plan_repo(tmp_path / "repo", {"cand_001": 5})
    writer, gate = f"python {repo}/scripts/writer.py", f"cd code && python {repo}/scripts/gone.py"
    commit = git(repo, "rev-parse", "HEAD")[:12]
    assert refused(personas, spec(writer=writer, gates=(gate,)), repo) == [
        f"worker.command `{writer}`: {repo}/scripts/writer.py is inside the repository on the host, which "
        "commands never see: they run in their own tree of it; name it relative to the tree "
        "(`python scripts/writer.py`)",
        f"hard_gates.commands[0] `{gate}`: {repo}/scripts/gone.py is inside the repository on the host, "
        "which commands never see: they run in their own tree of it; name it relative to the tree "
        f"(`cd code && python ../scripts/gone.py`); scripts/gone.py is not in the baseline tree ({commit}) "
        "or among the hidden evaluator files; commit it, or fix the path"]


@DB
def test_a_declared_writer_script_runs_under_bubblewrap_and_the_search_gets_a_candidate(
    personas, tmp_path, tools, data_dir, settings
):
    roots(settings, read_roots=[tools])
    repo = plan_repo(tmp_path / "repo", {"cand_001": 5, "cand_002": 3})
    registered = repository_register(personas.owner, personas.alpha, str(repo), trusted=True)
    text = spec(writer=f"python {tools}/writer.py", worker=f"read_paths = [{json.dumps(str(tools))}]")
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository=registered)
    writer_sha = hashlib.sha256(WRITER.encode()).hexdigest()
    assert search.hashed_inputs["evidence"]["read_paths"] == [
        {"path": str(tools), "files": [{"path": "writer.py", "sha256": writer_sha, "size": len(WRITER)}]}]
    run = run_inline(personas, search)
    assert (run.outcome, run.winner.candidate_id) == ("winner", "cand_001")
    writers = Receipt.objects.filter(label__endswith="writer")
    assert writers.count() == 2 and {w.isolation for w in writers} == {"bubblewrap"}
    assert all(w.exit_code == 0 for w in writers)
    # Each receipt lists what was mounted: the declared path, read-only, where the command names it.
    declared = {"source": str(tools), "target": str(tools), "mode": "ro"}
    assert all(declared in writer.detail["sandbox"]["mounts"] for writer in writers)


@DB
def test_a_declared_path_without_read_roots_is_refused_naming_the_setting(personas, tmp_path, tools,
                                                                         data_dir, settings):
    roots(settings, read_roots=[])
    repo = plan_repo(tmp_path / "repo", {})
    text = spec(writer=f"python {tools}/writer.py", worker=f"read_paths = [{json.dumps(str(tools))}]")
    assert refused(personas, text, repo) == [
        f"spec 11:1 worker.read_paths[0]: {tools}: no host paths are allowed here: an administrator sets "
        "CRUCIBLE_READ_ROOTS (comma-separated absolute directories) to allow them"]


@DB
def test_a_missing_interpreter_is_refused_at_freeze(personas, tmp_path, data_dir):
    repo = plan_repo(tmp_path / "repo", {})
    assert refused(personas, spec(writer="python9 scripts/writer.py"), repo) == [
        "worker.command `python9 scripts/writer.py`: `python9` is not on the PATH inside the sandbox; fix "
        "the name, install it in the toolchain (/usr/bin), or give its absolute path and declare it in "
        "worker.read_paths (under CRUCIBLE_READ_ROOTS)"]


@DB
def test_a_gate_script_missing_from_the_baseline_or_not_executable_is_refused_at_freeze(
    personas, tmp_path, data_dir
):
    repo = plan_repo(tmp_path / "repo", {})
    problems = refused(personas, spec(gates=("python scripts/gone.py", "./scripts/writer.py")), repo)
    commit = git(repo, "rev-parse", "HEAD")[:12]
    assert problems == [
        f"hard_gates.commands[0] `python scripts/gone.py`: scripts/gone.py is not in the baseline tree "
        f"({commit}) or among the hidden evaluator files; commit it, or fix the path",
        "hard_gates.commands[1] `./scripts/writer.py`: ./scripts/writer.py: is not executable in the "
        "baseline (git mode 100644); commit it with `chmod +x`, or run it through its interpreter "
        "(`sh x.sh`, `python x.py`)"]


@DB
def test_a_program_whose_shebang_interpreter_is_missing_is_refused(personas, tmp_path, data_dir):
    repo = repo_create(tmp_path / "repo", {"code/answer.py": "def answer():\n    return 2\n",
                                           "bench.sh": "#!/usr/bin/env python9\nprint(1)\n",
                                           "scripts/writer.py": WRITER, "plan.json": "{}"},
                       executable=("bench.sh",))
    [problem] = refused(personas, spec(score="./bench.sh"), repo)
    assert problem == ("score.command `./bench.sh`: ./bench.sh: its `#!` interpreter `python9` is not on the "
                       "PATH inside the sandbox")


@DB
def test_a_script_that_is_a_hidden_evaluator_file_is_not_refused(personas, tmp_path, data_dir):
    repo = plan_repo(tmp_path / "repo", {})
    text = spec(gates=("python tests/hidden_gate.py",), evaluator='"tests/hidden_gate.py" = "print(1)\\n"')
    assert services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))


@DB
def test_the_seed_is_refused_where_its_commands_cannot_start(personas, tmp_path, data_dir):
    from tests.gitrepo import baseline_repo

    repo = baseline_repo(tmp_path / "certificate")
    assert freeze_inputs(WITH_EVIDENCE, str(repo), "v1").search_id == GOLDEN_SEARCH_ID  # the id stays
    with pytest.raises(ValidationError) as caught:
        services.search_freeze(personas.owner, personas.alpha, WITH_EVIDENCE, "v1", repository_path=str(repo))
    assert [message.split(":")[0] for message in caught.value.messages] == [
        "hard_gates.commands[0] `PYTHONWARNINGS=error python certificate.py`", "score.command `./scripts/"
        "benchmark_candidate.sh`"]


def test_read_paths_left_empty_keep_every_search_id(tmp_path):
    from tests.gitrepo import baseline_repo

    repo = baseline_repo(tmp_path / "certificate")
    text = WITH_EVIDENCE.replace('write_roots = ["code"]', 'write_roots = ["code"]\nread_paths = []').replace(
        "trials = 5", "trials = 5\nread_paths = []").replace(
        "forbid_test_changes = true", "forbid_test_changes = true\nread_paths = []")
    assert text.count("read_paths = []") == 3
    assert freeze_inputs(text, str(repo), "v1").search_id == GOLDEN_SEARCH_ID


@DB
def test_gate_and_score_read_paths_are_hashed_into_the_evaluator_record(tmp_path, settings):
    bench = tmp_path / "bench"
    (bench / "data").mkdir(parents=True)
    (bench / "data" / "input.txt").write_text("42\n")
    (bench / "harness.py").write_text("print(1)\n")
    (bench / "link").symlink_to("data/input.txt")
    roots(settings, read_roots=[bench])
    repo = plan_repo(tmp_path / "repo", {})
    gate = f"python {bench}/harness.py"
    text = spec(gates=(gate,), hard_gates=f"read_paths = [{json.dumps(str(bench / 'harness.py'))}]",
                score_extra=f"read_paths = [{json.dumps(str(bench))}]")
    frozen = freeze_inputs(text, str(repo), "HEAD")
    records = frozen.evaluator["read_paths"]
    assert records["hard_gates"] == [{"path": str(bench / "harness.py"), "size": 9,
                                      "sha256": hashlib.sha256(b"print(1)\n").hexdigest()}]
    assert [item["path"] for item in records["score"][0]["files"]] == ["data/input.txt", "harness.py", "link"]
    assert records["score"][0]["files"][2] == {"path": "link", "symlink": "data/input.txt"}
    assert "read_paths" not in frozen.evidence
    (bench / "data" / "input.txt").write_text("43\n")
    assert freeze_inputs(text, str(repo), "HEAD").evaluator_hash != frozen.evaluator_hash


@DB
def test_a_read_path_changed_since_freeze_is_refused_at_start(personas, tmp_path, data_dir, settings):
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "harness.py").write_text("print(1)\n")
    roots(settings, read_roots=[bench])
    repo = plan_repo(tmp_path / "repo", {})
    text = spec(gates=(f"python {bench}/harness.py",), hard_gates=f"read_paths = [{json.dumps(str(bench))}]")
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    (bench / "harness.py").write_text("print(2)\n")
    with pytest.raises(ValidationError) as caught:
        services.search_start(personas.owner, search, enqueue=False)
    assert caught.value.messages == [f"hard_gates.read_paths: {bench} changed since the search was frozen "
                                     "(harness.py changed); freeze the spec again"]
    assert not Step.objects.exists()


@DB
def test_a_declared_script_removed_before_start_is_refused_at_start(personas, tmp_path, tools, data_dir,
                                                                     settings):
    roots(settings, read_roots=[tools])
    repo = plan_repo(tmp_path / "repo", {})
    text = spec(writer=f"python {tools}/writer.py", worker=f"read_paths = [{json.dumps(str(tools))}]")
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    (tools / "writer.py").unlink()
    with pytest.raises(ValidationError) as caught:
        services.search_start(personas.owner, search, enqueue=False)
    assert f"worker.command `python {tools}/writer.py`: {tools}/writer.py does not exist on this host" in \
        caught.value.messages[0]
    assert not search.candidates.exists()


# --- where the repository is --------------------------------------------------------------------


@DB
@pytest.mark.parametrize("place", ["tmp", "data dir"])
def test_a_repository_under_tmp_or_in_the_data_dir_is_accepted(personas, tmp_path, data_dir, place):
    # Its git dir is bound after the private /tmp, and through the stage where the sandbox user
    # cannot reach it (a 0700 data dir, a home): the demo repository lives in the data dir.
    repo = plan_repo((tmp_path if place == "tmp" else data_dir / "demo-repos") / "repo", {"cand_001": 5})
    frozen = freeze_inputs(spec(), str(repo), "HEAD")
    assert preflight_problems(frozen.spec, str(repo), frozen.baseline_commit) == []
    assert services.search_freeze(personas.owner, personas.alpha, spec(), "HEAD", repository_path=str(repo))


@DB
def test_a_linked_worktree_is_refused_at_freeze_naming_the_checkout_that_holds_its_git_dir(
    personas, tmp_path, data_dir
):
    main = plan_repo(tmp_path / "main", {"cand_001": 5})
    linked = tmp_path / "linked"
    git(main, "worktree", "add", "--detach", str(linked))
    assert refused(personas, spec(), linked) == [
        f"{linked}: the repository's git dir {main}/.git cannot be shown inside the sandbox (sandboxed "
        f"commands get a private /tmp): its .git is a file pointing there, and commands are shown only "
        f"{linked}/.git; register {main}, the checkout that holds it, instead"]
    assert services.search_freeze(personas.owner, personas.alpha, spec(), "HEAD", repository_path=str(main))


@DB
def test_a_repository_gone_from_the_host_is_refused_at_freeze_and_at_start(personas, tmp_path, data_dir):
    repo = plan_repo(tmp_path / "repo", {"cand_001": 5})
    assert refused(personas, spec(), tmp_path / "nowhere") == [f"{tmp_path / 'nowhere'}: no such directory"]
    search = services.search_freeze(personas.owner, personas.alpha, spec(), "HEAD", repository_path=str(repo))
    repo.rename(tmp_path / "moved")
    with pytest.raises(ValidationError) as caught:
        services.search_start(personas.owner, search, enqueue=False)
    assert caught.value.messages == [
        f"{repo}: no such directory on this host, so there is no repository to show commands; put the "
        "repository back there, or freeze the spec again against where it is now"]
    assert not Step.objects.exists()


# --- at run time ----------------------------------------------------------------------------------

DELETING_WRITER = '''import json, os, pathlib, sys
sys.stdin.read()
what = json.loads(pathlib.Path("plan.json").read_text()).get(os.environ["CRUCIBLE_CANDIDATE_ID"])
pathlib.Path("code/answer.py").write_text(f"def answer():\\n    return {what['value']}\\n")
if what.get("delete"):
    os.remove("code/check.py")
if what.get("fake"):  # candidate code that prints a start failure it did not have
    pathlib.Path("code/check.py").write_text(
        "import sys\\nsys.stderr.write('/bin/sh: 1: python: not found\\\\n')\\nsys.exit(127)\\n")
'''


@DB
def test_a_gate_naming_a_script_the_patch_deletes_eliminates_that_candidate_and_the_search_goes_on(
    personas, tmp_path, data_dir
):
    plan = {"cand_001": {"value": 9, "delete": True}, "cand_002": {"value": 8, "fake": True},
            "cand_003": {"value": 5}}
    repo = repo_create(tmp_path / "repo", {
        "code/answer.py": "def answer():\n    return 2\n",
        "code/check.py": "import sys\nsys.path.insert(0, 'code')\nimport answer\n"
                         "assert answer.answer() > 0\n",
        "scripts/writer.py": DELETING_WRITER, "plan.json": json.dumps(plan)})
    text = spec(gates=("python code/check.py",), population=3, rounds=(3, 1), concurrency=1)
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    run = run_inline(personas, search)
    assert (run.outcome, run.winner.candidate_id) == ("winner", "cand_003")
    deleted = Candidate.objects.get(search=search, candidate_id="cand_001")
    assert deleted.state == "eliminated"
    assert "hard_gates.commands[0] `python code/check.py`: code/check.py is in the baseline but not " \
           "runnable in this candidate's tree (No such file or directory): its patch deletes or breaks it" \
           in deleted.reason
    faked = Candidate.objects.get(search=search, candidate_id="cand_002")  # printing it stops nothing
    assert faked.state == "eliminated" and "exit 127" in faked.reason
    assert not Event.objects.filter(kind="search.spec_failure").exists()


@DB
def test_a_command_that_fails_to_start_at_run_time_stops_the_search_after_the_first_failure(
    personas, tmp_path, tools, data_dir, settings
):
    roots(settings, read_roots=[tools])
    repo = plan_repo(tmp_path / "repo", {f"cand_00{n}": n for n in range(1, 5)})
    command = f"python {tools}/writer.py"
    text = spec(writer=command, worker=f"read_paths = [{json.dumps(str(tools / 'writer.py'))}]",
                population=4, rounds=(4, 1), concurrency=1)
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    (tools / "writer.py").unlink()  # after every check: gone from the host while the search runs
    run = services.search_run_inline(search)
    assert (run.status, run.outcome) == ("finished", "NONE")
    assert run.reason.startswith(f"stopped: worker.command `{command}` cannot start: ")
    assert f"{tools}/writer.py" in run.reason and "worker.read_paths" in run.reason
    assert Receipt.objects.filter(label__endswith="writer").count() == 1  # not every candidate into the wall
    assert Event.objects.filter(kind="search.spec_failure").count() == 1
    states = dict(search.candidates.exclude(number=0).values_list("candidate_id", "state"))
    assert states == {"cand_001": "cancelled", "cand_002": "cancelled", "cand_003": "cancelled",
                      "cand_004": "cancelled"}
    page = text_of(login(personas.owner).get(f"/searches/{search.search_id}/"))
    head = page.split('id="run-summary"')[1][:2000]
    assert "The search stopped: a command of its spec cannot start." in head and f"`{command}`" in head
    status = subprocess.run([sys.executable, "manage.py", "search", "status", search.search_id, "--user",
                             "owner"], cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, timeout=120)
    shown = status.stdout.decode()  # its first line, wrapped to 100 columns
    assert shown.startswith("stopped: a command of the spec cannot start — worker.command")
    assert command in " ".join(shown.split("\n\n")[0].split())


@DB
def test_search_run_shows_a_run_time_start_failure_at_the_top(demo, tmp_path, data_dir):
    repo = plan_repo(tmp_path / "repo", {"cand_001": 5, "cand_002": 6})
    gate = 'cd "$PWD/code" && python ../scripts/gone.py'  # beyond the parser: checked only when it runs
    path = tmp_path / "spec.toml"
    path.write_text(spec(gates=(gate,)))
    done = subprocess.run([sys.executable, "manage.py", "search", "run", str(path), "--repo", str(repo)],
                          cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode().splitlines()
    top = next(index for index, line in enumerate(out) if line.startswith("stopped:"))
    table = next(index for index, line in enumerate(out) if "host-paths: failed (" in line)  # its one status
    assert top < table
    shown = " ".join(" ".join(out[top:table]).split())
    assert f"hard_gates.commands[0] `{gate}` cannot start: ../scripts/gone.py: No such file or directory " \
           "inside the sandbox" in shown


# --- the classifier -----------------------------------------------------------------------------------


def receipt(exit_code: int | None, stderr: str = "", error: str = "") -> Receipt:
    return Receipt(exit_code=exit_code, stderr_excerpt=stderr, error=error, timed_out=False)


def test_a_command_refused_by_the_sandbox_is_the_specs_failure():
    failure = start_failure(receipt(None, error="CRUCIBLE_SANDBOX=required and bubblewrap is not installed"),
                            "score.command", "python bench.py", lambda path: True)
    assert failure.spec and "could not start: CRUCIBLE_SANDBOX=required" in failure.message


@pytest.mark.django_db
def test_a_missing_program_is_the_specs_failure_only_when_the_runtime_confirms_it():
    missing = start_failure(receipt(127, "/bin/sh: 1: python9: not found\n"), "worker.command",
                            "python9 w.py", lambda path: False)
    assert missing.spec and missing.message.startswith("worker.command `python9 w.py` cannot start: python9: "
                                                       "not found inside the sandbox")
    assert start_failure(receipt(127, "/bin/sh: 1: python: not found\n"), "worker.command", "python w.py",
                         lambda path: False) is None  # python is there: a claim, not a fact


def test_something_the_command_ran_in_turn_is_not_a_start_failure():
    assert start_failure(receipt(127, "/bin/sh: 1: make: not found\n"), "hard_gates.commands[0]",
                         "sh scripts/build.sh", lambda path: True) is None
    assert start_failure(receipt(1, "boom"), "score.command", "python bench.py", lambda path: True) is None
    assert start_failure(receipt(0), "score.command", "python9 bench.py", lambda path: False) is None


@DB
def test_a_score_command_that_cannot_start_stops_the_search_at_its_first_trial(personas, tmp_path, data_dir):
    repo = plan_repo(tmp_path / "repo", {"cand_001": 5, "cand_002": 6})
    score = 'cd "$PWD" && python scripts/score_gone.py'  # beyond the parser: checked only when it runs
    search = services.search_freeze(personas.owner, personas.alpha, spec(score=score), "HEAD",
                                    repository_path=str(repo))
    run = run_inline(personas, search)
    assert (run.status, run.outcome) == ("finished", "NONE")
    assert run.reason.startswith(f"stopped: score.command `{score}` cannot start: scripts/score_gone.py: No "
                                 "such file or directory inside the sandbox")
    assert Receipt.objects.filter(label__contains="trial").count() == 1
