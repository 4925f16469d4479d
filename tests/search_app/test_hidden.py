"""Hidden evaluator files from the host: read under CRUCIBLE_EVALUATOR_ROOTS at freeze, hashed
into the preregistration, snapshotted in the database, and never shown to writers."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from runtime_app.models import Receipt
from search_app import hidden, services
from search_app.execution import search_spec, writer_prompt
from search_app.freeze import FreezeError, freeze_inputs
from search_app.hidden import hidden_files
from search_app.models import HiddenFile
from search_app.spec import spec_validate
from tests.helpers import login, text_of
from tests.search_app.hostspecs import roots, spec
from tests.search_app.runs import plan_repo, run_inline

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "hidden-7f3a-value"
BINARY = bytes(range(256)) * 3
CAT_GATE = "cat hidden/value.txt && test -f hidden/tests/sub/deep.txt"


@pytest.fixture
def host(tmp_path, settings):
    """An administrator's evaluator root with a file and a directory (a binary file in it)."""
    root = tmp_path / "srv-hidden"
    (root / "tests" / "sub").mkdir(parents=True)
    (root / "value.txt").write_text(SECRET + "\n")
    (root / "tests" / "blob.bin").write_bytes(BINARY)
    (root / "tests" / "sub" / "deep.txt").write_text("deep\n")
    (root / "tests" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (root / "tests" / "run.sh").chmod(0o755)
    roots(settings, evaluator_roots=[root])
    return root


def entries(root: Path) -> str:
    return (f'"hidden/value.txt" = {{ path = {json.dumps(str(root / "value.txt"))} }}\n'
            f'"hidden/tests" = {{ dir = {json.dumps(str(root / "tests"))} }}\n')


def problems(text: str, repo: Path) -> list[str]:
    with pytest.raises(FreezeError) as caught:
        freeze_inputs(text, str(repo), "HEAD")
    return caught.value.problems


# --- freezing: read, hashed, snapshotted --------------------------------------------------------


def test_a_host_file_and_directory_are_hashed_into_the_evaluator_record_with_their_size(tmp_path, host):
    repo = plan_repo(tmp_path / "repo", {})
    frozen = freeze_inputs(spec(evaluator=entries(host)), str(repo), "HEAD")
    listed = {item["path"]: item for item in frozen.evaluator["hidden_files"]}
    assert sorted(listed) == ["hidden/tests/blob.bin", "hidden/tests/run.sh", "hidden/tests/sub/deep.txt",
                              "hidden/value.txt"]
    assert listed["hidden/value.txt"] == {
        "path": "hidden/value.txt", "sha256": hashlib.sha256((SECRET + "\n").encode()).hexdigest(),
        "size": len(SECRET) + 1, "source": str(host / "value.txt"), "mode": "100644"}
    assert listed["hidden/tests/blob.bin"]["sha256"] == hashlib.sha256(BINARY).hexdigest()
    assert listed["hidden/tests/run.sh"]["mode"] == "100755"
    assert {item.path: item.data for item in frozen.hidden}["hidden/tests/blob.bin"] == BINARY


def test_a_changed_host_file_changes_the_search_id(tmp_path, host):
    repo = plan_repo(tmp_path / "repo", {})
    before = freeze_inputs(spec(evaluator=entries(host)), str(repo), "HEAD")
    (host / "tests" / "sub" / "deep.txt").write_text("deeper\n")
    after = freeze_inputs(spec(evaluator=entries(host)), str(repo), "HEAD")
    assert after.evaluator_hash != before.evaluator_hash and after.search_id != before.search_id


def test_inline_hidden_files_keep_the_record_they_always_had_beside_host_ones(tmp_path, host):
    repo = plan_repo(tmp_path / "repo", {})
    inline = '"tests/test_hidden.py" = "def test_hidden():\\n    assert True\\n"\n'
    alone = freeze_inputs(spec(evaluator=inline), str(repo), "HEAD").evaluator["hidden_files"]
    both = freeze_inputs(spec(evaluator=inline + entries(host)), str(repo), "HEAD").evaluator["hidden_files"]
    content = b"def test_hidden():\n    assert True\n"
    assert alone == [{"path": "tests/test_hidden.py", "sha256": hashlib.sha256(content).hexdigest()}]
    assert alone[0] in both


def test_freezing_snapshots_the_bytes_in_the_database(personas, tmp_path, host, data_dir):
    repo = plan_repo(tmp_path / "repo", {})
    search = services.search_freeze(personas.owner, personas.alpha, spec(evaluator=entries(host)), "HEAD",
                                    repository_path=str(repo))
    rows = {row.path: row for row in HiddenFile.objects.filter(search=search)}
    assert bytes(rows["hidden/tests/blob.bin"].content) == BINARY
    assert rows["hidden/tests/run.sh"].executable and not rows["hidden/value.txt"].executable
    (host / "value.txt").write_text("changed on the host\n")
    (host / "tests" / "blob.bin").unlink()
    files = hidden_files(search)
    assert files["hidden/value.txt"] == (SECRET + "\n").encode() and files["hidden/tests/blob.bin"] == BINARY


def test_a_change_on_the_host_after_freeze_does_not_change_what_evaluation_trees_receive(
    personas, tmp_path, host, data_dir
):
    repo = plan_repo(tmp_path / "repo", {"cand_001": 5, "cand_002": 7})
    text = spec(gates=(CAT_GATE, "./hidden/tests/run.sh"), evaluator=entries(host))
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    (host / "value.txt").write_text("changed on the host\n")
    (host / "tests" / "sub" / "deep.txt").unlink()
    run = run_inline(personas, search)
    assert (run.outcome, run.winner.candidate_id) == ("winner", "cand_002")
    gates = Receipt.objects.filter(label__contains="gate 1")
    assert gates.count() >= 3 and all(SECRET in gate.stdout_excerpt for gate in gates)
    assert not any("changed on the host" in gate.stdout_excerpt for gate in gates)
    assert all("ran" in gate.stdout_excerpt for gate in Receipt.objects.filter(label__contains="gate 2"))


# --- writers never see them ---------------------------------------------------------------------

PEEK_WRITER = '''import os, pathlib, sys
sys.stdin.read()
seen = []
for place in ("hidden/value.txt", {source!r}):
    try:
        seen.append(place + "=" + open(place).read())
    except OSError as error:
        seen.append(place + " unreadable: " + type(error).__name__)
seen += [os.path.join(d, f) for d, _, files in os.walk(".") if ".git" not in d for f in files]
print("\\n".join(seen))
# What it saw goes into its patch as data: code naming the judge's files would be the reviewer's.
pathlib.Path("code/seen.txt").write_text("\\n".join(seen) + "\\n")
pathlib.Path("code/answer.py").write_text("def answer():\\n    return 5\\n")
'''


def test_writers_never_see_the_hidden_contents_in_their_prompt_worktree_or_the_host(
    personas, tmp_path, host, data_dir
):
    repo = plan_repo(tmp_path / "repo", {})
    (repo / "scripts" / "peek.py").write_text(PEEK_WRITER.format(source=str(host / "value.txt")))
    from tests.gitrepo import git

    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "peek")
    text = spec(writer="python scripts/peek.py", gates=(CAT_GATE,), evaluator=entries(host), population=2)
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    assert SECRET not in writer_prompt(search, search_spec(search), "cand_001", 0)
    run = run_inline(personas, search)
    writers = Receipt.objects.filter(label__endswith="writer")
    assert writers.count() == 2 and all(w.isolation == "bubblewrap" for w in writers)
    for writer in writers:
        assert SECRET not in writer.stdout_excerpt and "hidden/value.txt unreadable" in writer.stdout_excerpt
        assert f"{host / 'value.txt'} unreadable" in writer.stdout_excerpt
    for candidate in search.candidates.exclude(number=0):
        assert SECRET not in bytes(candidate.patch).decode()
    # …while every evaluation tree had it (the gate printed it).
    assert all(SECRET in gate.stdout_excerpt for gate in Receipt.objects.filter(label__contains="gate 1"))
    assert run.outcome == "winner"


def test_the_search_page_shows_each_hidden_file_by_path_hash_and_size_never_its_contents(
    personas, tmp_path, host, data_dir
):
    repo = plan_repo(tmp_path / "repo", {})
    search = services.search_freeze(personas.owner, personas.alpha, spec(evaluator=entries(host)), "HEAD",
                                    repository_path=str(repo))
    page = text_of(login(personas.member).get(f"/searches/{search.search_id}/"))
    digest = hashlib.sha256((SECRET + "\n").encode()).hexdigest()
    assert "hidden/value.txt" in page and digest in page and "hidden/tests/blob.bin" in page
    assert f"{len(SECRET) + 1} bytes" in page
    assert SECRET not in page


def test_a_worker_read_path_over_the_evaluator_roots_is_refused(tmp_path, host, settings):
    roots(settings, read_roots=[tmp_path], evaluator_roots=[host])
    repo = plan_repo(tmp_path / "repo", {})
    text = spec(worker=f"read_paths = [{json.dumps(str(host))}]", evaluator=entries(host))
    assert problems(text, repo) == [
        f"spec 11:1 worker.read_paths[0]: {host} overlaps CRUCIBLE_EVALUATOR_ROOTS: writers must never see "
        "hidden evaluator files; declare another path"]


# --- refusals -----------------------------------------------------------------------------------


def test_without_evaluator_roots_host_entries_are_refused_naming_the_setting(tmp_path, settings):
    roots(settings, evaluator_roots=[])
    repo = plan_repo(tmp_path / "repo", {})
    text = spec(evaluator='"hidden/x.py" = { path = "/srv/hidden/x.py" }')
    assert problems(text, repo) == [
        "spec 32:1 evaluator.files.hidden/x.py: /srv/hidden/x.py: no host paths are allowed here: an "
        "administrator sets CRUCIBLE_EVALUATOR_ROOTS (comma-separated absolute directories) to allow them"]


def test_a_path_outside_the_roots_gets_the_same_answer_whether_or_not_it_exists(tmp_path, host):
    repo = plan_repo(tmp_path / "repo", {})
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "exists.py").write_text("secret\n")
    (host / "leak").symlink_to(outside)  # a link inside the root that leads out of it

    def refusal(path: Path) -> str:
        [problem] = problems(spec(evaluator=f'"hidden/x.py" = {{ path = {json.dumps(str(path))} }}'), repo)
        return problem.replace(str(path), "PATH")

    answers = {refusal(outside / "exists.py"), refusal(outside / "missing.py"),
               refusal(host / "leak" / "exists.py"), refusal(host / "leak" / "missing.py")}
    assert answers == {f"spec 32:1 evaluator.files.hidden/x.py: PATH is not under CRUCIBLE_EVALUATOR_ROOTS "
                       f"({host}); move it there"}
    # Inside the roots, a missing file may say so: the administrator chose to show that place.
    assert "no such file or directory" in refusal(host / "missing.py")


def test_a_symlink_inside_a_hidden_directory_is_refused_with_its_path(tmp_path, host):
    repo = plan_repo(tmp_path / "repo", {})
    (host / "tests" / "sub" / "link.txt").symlink_to(host / "value.txt")
    [problem] = problems(spec(evaluator=entries(host)), repo)
    assert f"{host}/tests/sub/link.txt: a symlink; hidden files are copied as regular files only" in problem
    assert problem.startswith("spec 33:1 evaluator.files.hidden/tests: ")


def test_a_fifo_inside_a_hidden_directory_is_refused_without_reading_it(tmp_path, host):
    repo = plan_repo(tmp_path / "repo", {})
    os.mkfifo(host / "tests" / "pipe")
    [problem] = problems(spec(evaluator=entries(host)), repo)
    assert f"{host}/tests/pipe: a socket, FIFO or device, not a regular file" in problem


def test_the_caps_on_files_and_bytes_are_refused_clearly(tmp_path, host, monkeypatch):
    repo = plan_repo(tmp_path / "repo", {})
    monkeypatch.setattr(hidden, "HIDDEN_MAX_FILES", 3)
    [problem] = problems(spec(evaluator=entries(host)), repo)
    assert "hidden evaluator files from the host hold more than 3 files in all; keep only what the " \
           "evaluation needs" in problem
    monkeypatch.setattr(hidden, "HIDDEN_MAX_FILES", 2_000)
    monkeypatch.setattr(hidden, "HIDDEN_MAX_BYTES", 700)  # the binary file alone is 768 bytes
    [problem] = problems(spec(evaluator=entries(host)), repo)
    assert "blob.bin: hidden evaluator files from the host hold more than 700 bytes in all" in problem


def test_the_default_caps_are_2000_files_and_10_mib(tmp_path, host):
    assert (hidden.HIDDEN_MAX_FILES, hidden.HIDDEN_MAX_BYTES) == (2_000, 10 << 20)
    repo = plan_repo(tmp_path / "repo", {})
    (host / "big.bin").write_bytes(b"\0" * ((10 << 20) + 1))
    text = spec(evaluator=f'"hidden/big.bin" = {{ path = {json.dumps(str(host / "big.bin"))} }}')
    [problem] = problems(text, repo)
    assert "more than 10 MiB in all" in problem


def test_two_entries_landing_on_the_same_path_are_refused(tmp_path, host):
    repo = plan_repo(tmp_path / "repo", {})
    text = spec(evaluator=entries(host) + '"hidden/tests/blob.bin" = "inline"\n')
    [problem] = problems(text, repo)
    assert "would land at hidden/tests/blob.bin, where hidden/tests/blob.bin already puts a hidden file" \
        in problem


def test_a_hidden_directory_with_a_git_dir_inside_is_refused(tmp_path, host):
    repo = plan_repo(tmp_path / "repo", {})
    (host / "tests" / ".git").mkdir()
    (host / "tests" / ".git" / "config").write_text("x")
    [problem] = problems(spec(evaluator=entries(host)), repo)
    assert "would land at hidden/tests/.git/config: expected a path outside `.git`" in problem


def test_search_freeze_reports_host_problems_as_a_validation_error(personas, tmp_path, host, data_dir):
    repo = plan_repo(tmp_path / "repo", {})
    text = spec(evaluator=f'"hidden/x.py" = {{ path = {json.dumps(str(host / "nope.py"))} }}')
    with pytest.raises(ValidationError) as caught:
        services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    assert caught.value.messages == [f"spec 32:1 evaluator.files.hidden/x.py: {host}/nope.py: no such file "
                                     "or directory"]


# --- other spellings --------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "says"), [
    ('[[evaluator.files]]\npath = "/srv/hidden/bench.py"\ndest = "bench/hidden.py"\n',
     '(did you mean `[evaluator.files] "bench/hidden.py" = { path = "/srv/hidden/bench.py" }`?)'),
    ('[evaluator.files]\n"bench/hidden.py" = { file = "/srv/hidden/bench.py" }\n', "(did you mean `path`?)"),
    ('[evaluator.files]\n"bench" = { directory = "/srv/hidden/bench" }\n', "(did you mean `dir`?)"),
    ('[evaluator]\nhidden_files = ["/srv/hidden/bench.py"]\n', "(did you mean `files`?)"),
    ('[evaluator.files]\n"x.py" = { path = "/srv/x.py", dest = "bench/x.py" }\n',
     '(did you mean `[evaluator.files] "bench/x.py" = { path = "/srv/x.py" }`?)'),
])
def test_other_natural_spellings_of_a_host_hidden_file_point_to_the_supported_form(body, says):
    text = spec().split("[evaluator.files]")[0] + "\n" + body
    report = spec_validate(text)
    assert not report.valid
    assert any(says in str(error) for error in report.errors), [str(e) for e in report.errors]


def test_a_top_level_hidden_files_key_points_to_evaluator_files():
    report = spec_validate('hidden_files = ["/srv/x.py"]\n' + spec())
    assert str(report.errors[0]).endswith("(did you mean `[evaluator.files]`?)")
