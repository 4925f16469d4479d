"""A spec that cannot run is refused at freeze, naming what is missing: a script or file its gate,
score or writer commands name that the baseline commit (or a declared read path) lacks, or a key
its writers' provider needs. The editor, the API and the CLI say so before freezing too; what
may be made by an earlier step of the same command is only warned about."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.test import Client

from runtime_app.keys import provider_key_set
from runtime_app.services import api_token_create, repository_register
from search_app import services
from search_app.models import Search
from search_app.preflight import preflight_report
from search_app.spec import spec_validate
from tests.gitrepo import git
from tests.helpers import login, text_of
from tests.search_app.hostspecs import roots, spec
from tests.search_app.runs import plan_repo

pytestmark = pytest.mark.django_db
COMMAND_WRITER = 'provider = "command"\ncommand = "python scripts/writer.py"'
DEEPSEEK_WRITER = 'provider = "deepseek"\nmodel = "deepseek-v4-flash"'


@pytest.fixture
def repo(tmp_path, data_dir) -> Path:
    """code/answer.py, tests/test_answer.py, scripts/writer.py and plan.json at one commit."""
    return plan_repo(tmp_path / "repo", {})


def report(text: str, repo: Path) -> tuple[list[str], list[str]]:
    parsed = spec_validate(text).spec
    assert parsed is not None
    return preflight_report(parsed, str(repo), git(repo, "rev-parse", "HEAD"))


def refusal(personas, text: str, repo: Path) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    assert not Search.objects.exists()
    return caught.value.messages


def missing(path: str, repo: Path) -> str:
    return f"{path} is not in the baseline tree ({git(repo, 'rev-parse', 'HEAD')[:12]})"


# --- refused at freeze, naming the path ---------------------------------------------------------


def test_a_score_script_the_baseline_lacks_is_refused_naming_it(personas, repo):
    [message] = refusal(personas, spec(score="python scripts/count_failures.py"), repo)
    assert message.startswith("score.command `python scripts/count_failures.py`: ")
    assert missing("scripts/count_failures.py", repo) in message and "commit it, or fix the path" in message


def test_a_file_a_gate_names_as_an_argument_is_refused_when_the_baseline_lacks_it(personas, repo):
    gate = "python -m pytest -q -p no:cacheprovider tests/test_gone.py"
    [message] = refusal(personas, spec(gates=(gate,)), repo)
    assert message.startswith(f"hard_gates.commands[0] `{gate}`: ")
    assert missing("tests/test_gone.py", repo) in message
    # A pytest node id names its file; a file at the root with a file's suffix counts too.
    node, json_tool = "python -m pytest -q tests/test_gone.py::test_x", "python -m json.tool expected.json"
    messages = refusal(personas, spec(gates=(node, json_tool)), repo)
    assert missing("tests/test_gone.py", repo) in messages[0]
    assert missing("expected.json", repo) in messages[1]


def test_a_git_pathspec_that_matches_nothing_is_warned_about_since_the_command_passes(repo):
    gate = "git diff --exit-code -- expected.json"
    assert report(spec(gates=(gate,)), repo) == ([], [
        f"hard_gates.commands[0] `{gate}`: expected.json is not in the baseline tree, so `git` matches "
        "nothing there and this command checks nothing of it; fix the path, or commit the file"])


def test_a_writer_command_whose_script_is_missing_is_refused_naming_it(personas, repo):
    [message] = refusal(personas, spec(writer="python scripts/gone_writer.py --fast"), repo)
    assert message.startswith("worker.command `python scripts/gone_writer.py --fast`: ")
    assert missing("scripts/gone_writer.py", repo) in message


def test_what_a_gate_writes_is_gone_by_the_time_the_score_reads_it(personas, repo):
    text = spec(gates=("cp plan.json made.json",), score="python -m json.tool made.json")
    [message] = refusal(personas, text, repo)
    assert message.startswith("score.command `python -m json.tool made.json`: ")
    assert missing("made.json", repo) in message
    assert ("`cp plan.json made.json` runs before it, but each command starts from the pristine baseline "
            "tree") in message


def test_a_provider_without_its_key_is_refused_naming_the_variable(personas, repo, monkeypatch, admin_user):
    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)
    text = spec().replace(COMMAND_WRITER, DEEPSEEK_WRITER)
    [message] = refusal(personas, text, repo)
    assert message.startswith("worker.provider `deepseek`: no DEEPSEEK_API_KEY is set")
    assert "Admin → Provider keys" in message
    provider_key_set(admin_user, "DEEPSEEK_API_KEY", "sk-stored-0123456789")  # an administrator's key does
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    assert search.spec_normalized["worker"]["provider"] == "deepseek"


# --- frozen: what is there, or is not a file of the tree ----------------------------------------


def test_paths_the_baseline_has_freeze(personas, repo):
    gates = ("python -m pytest -q -p no:cacheprovider tests/ tests/test_answer.py::test_answer",
             "git diff --exit-code -- plan.json code/answer.py", "cd code && python -m py_compile answer.py")
    text = spec(gates=gates, score="python scripts/writer.py --dry-run plan.json")
    assert report(text, repo) == ([], [])
    services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))


@pytest.mark.parametrize("gate", [
    "python -c 'import json; json.load(open(\"nothing/here.json\"))'",  # inline code: one word, not a path
    "python -m pytest -q -k answer_py",  # an option's value that is no file
    "python -m pytest -q -p no:cacheprovider --junitxml reports/junit.xml",  # an output it makes
    "python scripts/writer.py -o out/result.json",
    "python scripts/writer.py code/*.py",  # a glob: only the shell knows
    "git ls-remote https://example.com/repo.git HEAD || true",  # a URL
    "python scripts/writer.py $HOME/notes.txt",  # a variable
    "git log -1 origin/main -- || true",  # a ref, not anchored in the tree
    "/usr/bin/env python -c 'pass' /etc/hostname",  # absolute paths of the host's tools and files
    "python scripts/writer.py PYTHONHASHSEED=0 example.com",  # key=value, a host name
])
def test_what_is_not_a_file_of_the_tree_is_neither_refused_nor_warned_about(repo, gate):
    assert report(spec(gates=(gate,)), repo) == ([], [])


def test_a_file_an_earlier_step_of_the_same_line_may_make_is_only_warned_about(repo):
    gates = ("cp code/answer.py code/copy.py && python code/copy.py",
             "python -m pytest -q tests/unit/test_answer.py")
    problems, warnings = report(spec(gates=gates), repo)
    assert problems == []
    assert warnings == [
        f"hard_gates.commands[0] `{gates[0]}`: code/copy.py is not in the baseline tree; an earlier part of "
        "this command must make it, or it fails",
        f"hard_gates.commands[1] `{gates[1]}`: tests/unit/test_answer.py: neither it nor its directory "
        "tests/unit/ is in the baseline tree; fix the path, unless an earlier step makes it",
    ]


def test_a_file_under_a_declared_read_path_freezes_and_one_missing_there_is_refused(
        personas, repo, tmp_path, settings):
    data = tmp_path / "shared"
    data.mkdir()
    (data / "golden.json").write_text("{}")
    roots(settings, read_roots=[data])
    declared = f"read_paths = [{json.dumps(str(data))}]"
    present = spec(gates=(f"python -m json.tool {data}/golden.json",), hard_gates=declared)
    assert report(present, repo) == ([], [])
    gone = spec(gates=(f"python -m json.tool {data}/gone.json",), hard_gates=declared)
    [message] = refusal(personas, gone, repo)
    assert f"{data}/gone.json is under {data}, declared in hard_gates.read_paths, but is not on this host" \
        in message


# --- the editor, the API and the CLI ------------------------------------------------------------


@pytest.fixture
def registered(personas, repo):
    return repository_register(personas.owner, personas.alpha, str(repo), trusted=True)


def test_the_editor_says_before_freezing_what_freeze_would_refuse(personas, registered):
    client = login(personas.owner)
    text = spec(score="python scripts/count_failures.py")
    checked = text_of(client.post("/searches/specs/validate/",
                                  {"text": text, "repository": registered.pk, "ref": "main"}))
    named = "scripts/count_failures.py is not in the baseline tree"
    assert "Freeze will refuse" in checked and named in checked
    fine = text_of(client.post("/searches/specs/validate/",
                               {"text": spec(), "repository": registered.pk, "ref": "main"}))
    assert "Can run" in fine and "Freeze will refuse" not in fine
    unchosen = text_of(client.post("/searches/specs/validate/", {"text": text}))
    assert "Freeze will refuse" not in unchosen and "Can run" not in unchosen
    frozen = client.post("/searches/specs/new/", {
        "project": personas.alpha.pk, "repository": registered.pk, "ref": "main", "title": "", "text": text,
        "action": "freeze"})
    assert frozen.status_code == 400 and named in text_of(frozen)


def test_the_api_refuses_with_a_400_naming_the_path_and_validate_says_so_first(personas, registered):
    _, plain = api_token_create(personas.owner, "tests")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {plain}")
    text = spec(score="python scripts/count_failures.py")
    checked = api.post("/api/specs/validate", {"text": text, "repository_id": registered.pk, "ref": "main"},
                       content_type="application/json").json()
    assert checked["valid"] and "scripts/count_failures.py" in checked["freeze_problems"][0]
    body = {"project_id": personas.alpha.pk, "repository_id": registered.pk, "ref": "main", "text": text}
    refused = api.post("/api/searches", body, content_type="application/json")
    assert refused.status_code == 400 and "scripts/count_failures.py is not in the baseline tree" in str(
        refused.json())
    warned = api.post("/api/searches", {**body, "text": spec(gates=("python -m pytest -q tests/unit/t.py",))},
                      content_type="application/json")
    assert warned.status_code == 201
    assert any("tests/unit/t.py: neither it nor its directory" in w for w in warned.json()["warnings"])


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("search", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.django_db(transaction=True)
def test_the_cli_refuses_to_validate_freeze_and_run_it_naming_the_path(demo, repo, tmp_path):
    path = tmp_path / "spec.toml"
    path.write_text(spec(score="python scripts/count_failures.py"))
    named = "scripts/count_failures.py is not in the baseline tree"
    code, out, err = cli("validate", str(path))
    assert code == 0 and "valid" in out  # without a repository there is nothing to check it against
    code, _, err = cli("validate", str(path), "--repo", str(repo), "--ref", "main")
    assert code == 1 and "freeze would refuse: score.command" in err and named in err
    code, _, err = cli("freeze", str(path), "--repo", str(repo), "--ref", "HEAD")
    assert code == 1 and named in err
    code, out, err = cli("run", str(path), "--repo", str(repo), "--json")
    assert code == 1 and named in err and out == ""
    assert not Search.objects.exists()
