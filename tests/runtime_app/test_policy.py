"""The change policy refuses, with a path and a reason, every change a patch may not make.

Each patched tree is built in a real repository: files written, removed, linked, made
executable or added as submodules with the git CLI, then `git add -A` + `git write-tree`.
Trees git itself refuses to make (`..`, absolute names, `.git/`) are built with dulwich objects
in the same repository's object store. Two hypothesis tests build random patches directly
with dulwich objects: any patch touching a protected path is refused, naming that path, and
any patch touching only allowed files is accepted.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from dulwich.object_store import commit_tree_changes
from dulwich.objects import Blob, Tree
from dulwich.repo import Repo
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime_app.policy import (
    EXECUTABLE,
    REGULAR,
    ImportNames,
    PolicyRules,
    PolicyVerdict,
    Violation,
    command_script,
    policy_check,
)
from search_app.context import policy_rules
from search_app.spec import spec_validate
from tests.gitrepo import git, repo_create, write_files

PYPROJECT = """[project]
name = "certificate"
description = "Compute the certificate quickly"

[tool.pytest.ini_options]
addopts = "-q"
testpaths = ["tests"]

[tool.ruff]
line-length = 100
"""

BASE = {
    "code/certificate.py": "def certificate(n):\n    return sum(i * i for i in range(n))\n",
    "code/util.py": "def square(x):\n    return x * x\n",
    "code/golden/out.txt": "328350\n",
    "lib/src/helpers.py": "HELP = 1\n",
    "expected_result.json": '{"result": 328350}\n',
    "README.md": "# certificate\n",
    "docs/notes.md": "Notes.\n",
    "docs/protected/spec.md": "The spec.\n",
    "tests/test_certificate.py": "def test_certificate():\n    assert True\n",
    "scripts/benchmark_candidate.sh": "#!/bin/sh\necho 1\n",
    "pyproject.toml": PYPROJECT,
    ".github/workflows/ci.yml": "on: push\n",
    ".gitignore": "*.pyc\n",
}

RULES = PolicyRules(
    write_roots=("code", "lib/src"),
    exact_files=("README.md", "pyproject.toml"),
    protected_paths=("expected_result.json", "tests", "docs/protected", "code/golden"),
    score_script="scripts/benchmark_candidate.sh",
)

TEST_FILES = "test files cannot be changed (forbid_test_changes)"
OUTSIDE = "outside the paths writers may change (code, lib/src, README.md, pyproject.toml)"


@pytest.fixture
def repo(tmp_path) -> Path:
    return repo_create(tmp_path / "repo", BASE)


def baseline(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD^{tree}")


def patched(repo: Path) -> str:
    """The working tree as it is now, as a tree id."""
    git(repo, "add", "-A")
    return git(repo, "write-tree")


def check(repo: Path, rules: PolicyRules = RULES, tree: str | bytes | None = None) -> PolicyVerdict:
    with Repo(str(repo)) as opened:
        return policy_check(opened, baseline(repo), tree or patched(repo), rules)


def reasons(verdict: PolicyVerdict, path: str) -> list[str]:
    return [v.reason for v in verdict.violations if v.path == path]


def has(verdict: PolicyVerdict, path: str, reason: str) -> bool:
    return any(reason in r for r in reasons(verdict, path))


def write_bytes(repo: Path, relative: str, data: bytes) -> None:
    path = repo / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def dulwich_tree(repo: Path, changes: dict[bytes, bytes | None]) -> bytes:
    """The baseline tree with these paths set (regular files) or removed, built by dulwich, for
    trees git itself refuses to make."""
    with Repo(str(repo)) as opened:
        store = opened.object_store
        items = []
        for path, data in changes.items():
            if data is None:
                items.append((path, None, None))
                continue
            blob = Blob.from_string(data)
            store.add_object(blob)
            items.append((path, REGULAR, blob.id))
        return commit_tree_changes(store, baseline(repo).encode(), items)


# --- allowed changes --------------------------------------------------------------------------


def test_changes_inside_the_write_roots_are_accepted(repo):
    closed_form = "def certificate(n):\n    return (n - 1) * n * (2 * n - 1) // 6\n"
    write_files(repo, {"code/certificate.py": closed_form, "lib/src/fast/closed_form.py": "X = 1\n"})
    (repo / "code/util.py").unlink()
    verdict = check(repo)
    assert verdict.accepted and verdict.violations == ()
    assert str(verdict) == "accepted"


def test_a_change_to_an_exact_file_is_accepted(repo):
    write_files(repo, {"README.md": "# certificate\n\nNow faster.\n"})
    assert check(repo).accepted


def test_an_empty_patch_is_accepted(repo):
    assert check(repo).accepted


def test_a_new_executable_file_inside_a_write_root_is_accepted(repo):
    write_files(repo, {"code/run.sh": "#!/bin/sh\n"})
    (repo / "code/run.sh").chmod(0o755)
    assert check(repo).accepted


# --- where a patch may write ------------------------------------------------------------------


def test_a_change_outside_the_write_roots_is_refused(repo):
    write_files(repo, {"docs/notes.md": "Changed.\n", "new_top_level.py": "X = 1\n"})
    verdict = check(repo)
    assert [(v.path, v.reason) for v in verdict.violations] == [
        ("docs/notes.md", OUTSIDE + "; keep the change under a write root or in an exact file"),
        ("new_top_level.py", OUTSIDE + "; keep the change under a write root or in an exact file"),
    ]


def test_a_write_root_matches_whole_path_segments_only(repo):
    write_files(repo, {"codex/x.py": "X = 1\n", "lib/srcs/y.py": "Y = 1\n"})
    verdict = check(repo)
    assert has(verdict, "codex/x.py", OUTSIDE) and has(verdict, "lib/srcs/y.py", OUTSIDE)


def test_deleting_a_file_outside_the_write_roots_is_refused(repo):
    git(repo, "rm", "-q", "docs/notes.md")
    assert has(check(repo), "docs/notes.md", OUTSIDE)


def test_with_no_write_roots_and_no_exact_files_every_change_is_outside(repo):
    write_files(repo, {"code/util.py": "def square(x):\n    return x ** 2\n"})
    verdict = check(repo, PolicyRules())
    assert reasons(verdict, "code/util.py") == [
        "writers may change no paths here (write_roots and exact_files are both empty); add a write root "
        "to the spec"
    ]


def test_a_write_root_of_dot_allows_the_whole_repository(repo):
    write_files(repo, {"docs/notes.md": "Changed.\n"})
    assert check(repo, dataclasses.replace(RULES, write_roots=(".",))).accepted


# --- protected paths, tests, configuration, CI, the score script --------------------------------


def test_a_protected_path_is_refused_even_inside_a_write_root(repo):
    write_files(repo, {"code/golden/out.txt": "0\n", "code/golden/extra.txt": "1\n"})
    verdict = check(repo)
    reason = "`code/golden` is a protected path (hard_gates.protected_paths) and cannot be changed"
    assert reasons(verdict, "code/golden/out.txt") == [reason]
    assert reasons(verdict, "code/golden/extra.txt") == [reason]
    assert str(verdict.violations[0]) == f"code/golden/extra.txt: {reason}"


def test_changing_or_deleting_a_protected_file_is_refused(repo):
    write_files(repo, {"expected_result.json": '{"result": 0}\n'})
    git(repo, "rm", "-q", "docs/protected/spec.md")
    verdict = check(repo)
    assert has(verdict, "expected_result.json", "`expected_result.json` is a protected path")
    assert has(verdict, "docs/protected/spec.md", "`docs/protected` is a protected path")


def test_test_files_are_refused_wherever_they_are(repo):
    paths = ["code/test_speed.py", "code/speed_test.py", "code/tests/helper.py", "code/test/data.txt",
             "code/tests.py", "lib/src/deep/tests/fixtures/x.json"]
    write_files(repo, dict.fromkeys(paths, "X = 1\n"))
    write_files(repo, {"tests/test_certificate.py": "def test_certificate():\n    pass\n"})
    verdict = check(repo)
    for path in paths:
        assert reasons(verdict, path) == [
            TEST_FILES + "; leave the tests as they are and change the code under test"
        ], path
    assert has(verdict, "tests/test_certificate.py", TEST_FILES)
    assert has(verdict, "tests/test_certificate.py", "`tests` is a protected path")


def test_names_that_only_contain_test_are_not_test_files(repo):
    write_files(repo, {"code/testing_utils.py": "X = 1\n", "code/contest.py": "X = 1\n",
                       "code/latest/x.py": "X = 1\n"})
    assert check(repo).accepted


def test_test_configuration_is_refused(repo):
    names = ["conftest.py", "pytest.ini", "tox.ini", "setup.cfg", ".coveragerc", "pytest.toml"]
    write_files(repo, {f"code/{name}": "[pytest]\n" for name in names})
    verdict = check(repo)
    for name in names:
        assert reasons(verdict, f"code/{name}") == [
            f"`{name}` is test configuration and cannot be changed (forbid_test_changes)"
        ]


def test_interpreter_start_up_files_are_refused(repo):
    write_files(repo, {"code/sitecustomize.py": "import os\n", "code/usercustomize.py": "import os\n",
                       "code/evil.pth": "import os\n"})
    verdict = check(repo)
    for name in ("sitecustomize.py", "usercustomize.py", "evil.pth"):
        assert reasons(verdict, f"code/{name}") == [
            f"`{name}` runs inside every Python process, tests included, and cannot be changed "
            "(forbid_test_changes)"
        ]


def test_ci_files_are_refused(repo):
    write_files(repo, {".github/workflows/ci.yml": "on: [push, pull_request]\n",
                       "code/.gitlab-ci.yml": "x: 1\n", "code/Jenkinsfile": "x\n",
                       "code/.circleci/config.yml": "x: 1\n", "code/azure-pipelines.yml": "x: 1\n",
                       "code/.ci/run": "x\n", "code/.travis.yml": "x: 1\n", "code/noxfile.py": "x = 1\n"})
    verdict = check(repo)
    expected = {".github/workflows/ci.yml": ".github/", "code/.gitlab-ci.yml": ".gitlab-ci.yml",
                "code/Jenkinsfile": "jenkinsfile", "code/.circleci/config.yml": ".circleci/",
                "code/azure-pipelines.yml": "azure-pipelines.yml", "code/.ci/run": ".ci/",
                "code/.travis.yml": ".travis.yml", "code/noxfile.py": "noxfile.py"}
    for path, name in expected.items():
        reason = f"CI configuration (`{name}`) cannot be changed (forbid_test_changes)"
        assert has(verdict, path, reason), path


def test_the_score_script_is_refused(repo):
    write_files(repo, {"scripts/benchmark_candidate.sh": "#!/bin/sh\necho 0\n"})
    verdict = check(repo, dataclasses.replace(RULES, write_roots=(".",)))
    assert reasons(verdict, "scripts/benchmark_candidate.sh") == [
        "`scripts/benchmark_candidate.sh` is the score script the evaluator runs and cannot be changed"
    ]


def test_with_forbid_test_changes_off_tests_under_a_write_root_are_accepted(repo):
    write_files(repo, {"code/test_speed.py": "X = 1\n", "code/conftest.py": "X = 1\n"})
    assert check(repo, dataclasses.replace(RULES, forbid_test_changes=False)).accepted


# --- pyproject.toml ---------------------------------------------------------------------------


@pytest.mark.parametrize("edit", [
    lambda text: text.replace('addopts = "-q"', 'addopts = "-q -k not_slow"'),
    lambda text: text + "\n[tool.coverage.run]\nomit = ['code/*']\n",
    lambda text: text + "\n[tool.tox]\nlegacy_tox_ini = ''\n",
    lambda text: text + '\n[project.entry-points.pytest11]\nx = "code.plugin"\n',
    lambda text: text.replace('[tool.pytest.ini_options]\naddopts = "-q"\ntestpaths = ["tests"]\n', ""),
], ids=["pytest-option", "coverage-added", "tox-added", "pytest-plugin", "pytest-removed"])
def test_changing_the_test_sections_of_pyproject_is_refused(repo, edit):
    write_files(repo, {"pyproject.toml": edit(PYPROJECT)})
    assert reasons(check(repo), "pyproject.toml") == [
        "changes test sections of pyproject.toml ([tool.pytest], [tool.coverage], [tool.tox], "
        "[project.entry-points.pytest11]); leave them as in the baseline (forbid_test_changes)"
    ]


def test_changing_pyproject_outside_its_test_sections_is_accepted(repo):
    text = PYPROJECT.replace("line-length = 100", "line-length = 120").replace("quickly", "fast")
    # reformatting a test section without changing its meaning is fine too
    text = text.replace('addopts = "-q"\ntestpaths = ["tests"]',
                        "testpaths = [\n  'tests',\n]\naddopts = '-q'")
    write_files(repo, {"pyproject.toml": text + "# a comment\n"})
    assert check(repo).accepted


def test_an_unparseable_pyproject_is_refused(repo):
    write_files(repo, {"pyproject.toml": PYPROJECT + "\n[tool.pytest\n"})
    assert reasons(check(repo), "pyproject.toml") == [
        "not valid TOML after the patch, so its test sections cannot be checked; fix the file "
        "(forbid_test_changes)"
    ]


def test_deleting_pyproject_with_test_sections_is_refused(repo):
    git(repo, "rm", "-q", "pyproject.toml")
    assert has(check(repo), "pyproject.toml", "changes test sections of pyproject.toml")


def test_a_new_pyproject_without_test_sections_is_accepted(repo):
    write_files(repo, {"code/pyproject.toml": "[project]\nname = 'inner'\n"})
    assert check(repo).accepted


# --- kinds of files ---------------------------------------------------------------------------


def test_a_symlink_is_refused(repo):
    os.symlink("../expected_result.json", repo / "code/result_link")
    (repo / "code/util.py").unlink()
    os.symlink("/etc/passwd", repo / "code/util.py")  # a file replaced by a symlink
    verdict = check(repo)
    reason = "symlinks cannot be added or changed; commit the content as a regular file"
    assert reasons(verdict, "code/result_link") == [reason]
    assert reasons(verdict, "code/util.py") == [reason]


def test_deleting_a_symlink_is_accepted(tmp_path):
    path = repo_create(tmp_path / "linked", {"code/a.py": "A = 1\n"})
    os.symlink("a.py", path / "code/b.py")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "link")
    (path / "code/b.py").unlink()
    assert check(path).accepted


def test_a_submodule_is_refused(repo, tmp_path):
    other = repo_create(tmp_path / "other", {"lib.py": "X = 1\n"})
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(other), "code/vendor")
    verdict = check(repo)
    assert reasons(verdict, "code/vendor") == [
        "submodules cannot be added or changed; commit the code as regular files"
    ]
    assert has(verdict, ".gitmodules", "git metadata and settings")


def test_git_metadata_and_settings_are_refused(repo):
    write_files(repo, {".gitignore": "*.pyc\ncode/x.py\n", "code/.gitattributes": "* -text\n",
                       "code/.gitmodules": "\n", "code/.GitIgnore": "*\n"})
    verdict = check(repo)
    for path in (".gitignore", "code/.gitattributes", "code/.gitmodules", "code/.GitIgnore"):
        assert has(verdict, path, "git metadata and settings (`.git/`, `.gitattributes`, `.gitmodules`, "
                                  "`.gitignore` …) cannot be changed by a patch"), path


def test_anything_under_a_git_directory_is_refused(repo):
    tree = dulwich_tree(repo, {b"code/.git/hooks/pre-commit": b"#!/bin/sh\n", b"code/sub/.GIT/config": b"x\n",
                               "code/.g\u200dit/config".encode(): b"x\n", b"code/git~1/config": b"x\n"})
    verdict = check(repo, tree=tree)
    for path in ("code/.git/hooks/pre-commit", "code/sub/.GIT/config", "code/.g\u200dit/config",
                 "code/git~1/config"):
        assert has(verdict, path, "git metadata and settings"), path
    assert has(verdict, "code/.g\u200dit/config", "reads as `code/.git/config`")
    assert has(verdict, "code/.g\u200dit/config", "control or invisible characters (U+200D)")


def test_a_mode_change_is_refused(repo):
    (repo / "code/certificate.py").chmod(0o755)
    assert reasons(check(repo), "code/certificate.py") == [
        "file mode changed from 100644 to 100755; keep the baseline's mode"
    ]


def test_a_binary_file_is_refused(repo):
    write_bytes(repo, "code/model.bin", b"\x7fELF\x00\x01\x02")
    write_bytes(repo, "code/late_nul.txt", b"a" * 7999 + b"\x00")
    assert reasons(check(repo), "code/model.bin") == [
        "a binary file (a NUL byte in its first 8,000 bytes); only text files can be changed"
    ]
    assert has(check(repo), "code/late_nul.txt", "a binary file")


def test_an_oversized_file_is_refused(repo):
    write_files(repo, {"code/big.py": "x" * 1001, "code/fits.py": "x" * 1000})
    verdict = check(repo, dataclasses.replace(RULES, max_file_bytes=1000))
    assert [(v.path, v.reason) for v in verdict.violations] == [
        ("code/big.py", "1,001 bytes, over the 1,000-byte limit for a changed file; keep large or generated "
                        "data out of the patch"),
    ]


def test_an_unusual_file_mode_is_refused(repo):
    with Repo(str(repo)) as opened:
        blob = Blob.from_string(b"X = 1\n")
        opened.object_store.add_object(blob)
        tree = commit_tree_changes(opened.object_store, baseline(repo).encode(),
                                   [(b"code/group_writable.py", 0o100664, blob.id)])
    assert reasons(check(repo, tree=tree), "code/group_writable.py") == [
        "unusual file mode 100664; only regular files (100644 or 100755) can be added"
    ]


# --- path tricks ------------------------------------------------------------------------------


def test_dot_dot_segments_are_refused(repo):
    tree = dulwich_tree(repo, {b"code/../escape.py": b"X = 1\n", b"code/./x.py": b"X = 1\n"})
    verdict = check(repo, tree=tree)
    reason = "the path has a `..`, `.` or empty segment that can step outside its directory"
    assert has(verdict, "code/../escape.py", reason)
    assert has(verdict, "code/./x.py", reason)


def test_absolute_paths_and_empty_names_are_refused(repo):
    with Repo(str(repo)) as opened:
        store = opened.object_store
        root = store[baseline(repo).encode()]
        blob = Blob.from_string(b"root::0:0::/root:/bin/sh\n")
        store.add_object(blob)
        tree = Tree()
        for entry in root.iteritems():
            tree.add(entry.path, entry.mode, entry.sha)
        tree.add(b"/etc/passwd", REGULAR, blob.id)
        store.add_object(tree)
    verdict = check(repo, tree=tree.id)
    assert has(verdict, "/etc/passwd", "an absolute path; a patch may only name paths inside the repository")
    assert has(verdict, "/etc/passwd", OUTSIDE)


def test_backslashes_and_control_characters_are_refused(repo):
    write_files(repo, {"code/a\\..\\..\\b.py": "X = 1\n", "code/line\nbreak.py": "X = 1\n",
                       "code/evil\u202eyp.txt": "X = 1\n"})
    verdict = check(repo)
    assert has(verdict, "code/a\\..\\..\\b.py", "the path has a backslash")
    assert has(verdict, "code/line\\x0abreak.py", "control or invisible characters (U+000A)")
    assert has(verdict, "code/evil\u202eyp.txt", "control or invisible characters (U+202E)")


def test_a_path_that_is_not_utf8_is_refused(repo):
    tree = dulwich_tree(repo, {b"code/caf\xe9.py": b"X = 1\n"})
    assert has(check(repo, tree=tree), "code/caf\\xe9.py", "the path is not valid UTF-8")


def test_a_case_folding_collision_is_refused(repo):
    write_files(repo, {"code/Certificate.py": "X = 1\n", "Code/x.py": "X = 1\n"})
    verdict = check(repo)
    assert reasons(verdict, "code/Certificate.py") == [
        "collides with `code/certificate.py` on case-insensitive file systems (the names differ only in "
        "letter case or Unicode form); rename it"
    ]
    assert has(verdict, "Code/x.py", "collides with `code`")
    assert has(verdict, "Code/x.py", OUTSIDE)


def test_a_unicode_normalization_collision_is_refused(repo):
    write_files(repo, {"code/caf\u00e9.py": "A = 1\n", "code/cafe\u0301.py": "B = 1\n"})
    verdict = check(repo)
    assert has(verdict, "code/caf\u00e9.py", "collides with `code/cafe\u0301.py`")
    assert has(verdict, "code/cafe\u0301.py", "collides with `code/caf\u00e9.py`")


def test_letter_case_variants_of_test_names_are_refused(repo):
    write_files(repo, {"code/Tests/helper.py": "X = 1\n", "code/CONFTEST.PY": "X = 1\n",
                       "code/Test_Speed.py": "X = 1\n"})
    verdict = check(repo)
    assert reasons(verdict, "code/Tests/helper.py") == [
        TEST_FILES + "; leave the tests as they are and change the code under test"
    ]
    assert has(verdict, "code/CONFTEST.PY", "`conftest.py` is test configuration")
    assert has(verdict, "code/Test_Speed.py", TEST_FILES)


def test_unicode_look_alikes_of_protected_and_test_names_are_refused(repo):
    cyrillic_tests = "t\u0435sts"  # Cyrillic е
    fullwidth_tests = "\uff54\uff45\uff53\uff54\uff53"
    greek_golden = "g\u03bflden"  # Greek ο
    write_files(repo, {f"code/{cyrillic_tests}/x.py": "X = 1\n", f"code/{fullwidth_tests}/x.py": "X = 1\n",
                       f"code/{greek_golden}/out.txt": "0\n", "\u0435xpected_result.json": "{}\n",
                       "code/\u0441onftest.py": "X = 1\n"})
    verdict = check(repo)
    assert has(verdict, f"code/{cyrillic_tests}/x.py", TEST_FILES)
    assert reasons(verdict, f"code/{cyrillic_tests}/x.py") == [
        TEST_FILES + "; leave the tests as they are and change the code under test "
        f"(`code/{cyrillic_tests}/x.py` reads as `code/tests/x.py` once letter case, accents and look-alike "
        "characters are ignored)"
    ]
    assert has(verdict, f"code/{fullwidth_tests}/x.py", TEST_FILES)
    assert has(verdict, f"code/{greek_golden}/out.txt", "`code/golden` is a protected path")
    assert has(verdict, "\u0435xpected_result.json", "`expected_result.json` is a protected path")
    assert has(verdict, "code/\u0441onftest.py", "`conftest.py` is test configuration")


def test_accented_and_padded_look_alikes_are_refused(repo):
    write_files(repo, {"code/t\u00e9sts/x.py": "X = 1\n", "code/tests./x.py": "X = 1\n"})
    verdict = check(repo)
    assert has(verdict, "code/t\u00e9sts/x.py", TEST_FILES)
    assert has(verdict, "code/tests./x.py", TEST_FILES)


# --- renames, order, inputs ---------------------------------------------------------------------


def test_a_rename_is_judged_as_a_delete_and_an_add(repo):
    git(repo, "mv", "tests/test_certificate.py", "code/check_certificate.py")
    verdict = check(repo)
    assert has(verdict, "tests/test_certificate.py", TEST_FILES)
    assert has(verdict, "tests/test_certificate.py", OUTSIDE)
    assert reasons(verdict, "code/check_certificate.py") == []


def test_violations_are_one_per_path_and_reason_in_a_stable_order(repo):
    write_files(repo, {"tests/tests/test_x.py": "X = 1\n", "code/b_test.py": "X = 1\n", "docs/a.md": "a\n"})
    verdict = check(repo)
    pairs = [(v.path, v.reason) for v in verdict.violations]
    assert pairs == sorted(set(pairs))
    assert [v.path for v in verdict.violations] == [
        "code/b_test.py", "docs/a.md", *["tests/tests/test_x.py"] * 3,
    ]
    assert str(verdict).startswith("refused:\n- code/b_test.py: test files cannot be changed")
    assert check(repo) == verdict  # the same trees give the same verdict


def test_commit_ids_stand_for_their_trees_and_unknown_ids_are_an_error(repo):
    write_files(repo, {"docs/notes.md": "x\n"})
    git(repo, "commit", "-q", "-am", "change")
    with Repo(str(repo)) as opened:
        verdict = policy_check(opened.object_store, git(repo, "rev-parse", "HEAD~1"),
                               git(repo, "rev-parse", "HEAD").encode(), RULES)
        assert [v.path for v in verdict.violations] == ["docs/notes.md"]
        with pytest.raises(ValueError, match="no such tree"):
            policy_check(opened, "0" * 40, baseline(repo), RULES)


def test_violations_are_plain_values():
    assert Violation("a", "b") == Violation("a", "b") and str(Violation("a", "b")) == "a: b"
    assert PolicyVerdict().accepted


# --- files that stand in for the tools that judge ---------------------------------------------

NAMES = ImportNames(
    stdlib=frozenset({"json", "os", "sys", "code", "unittest"}),
    installed=frozenset({"pytest", "_pytest", "pluggy", "django", "google", "google.protobuf"}),
    regular=frozenset({"json", "os", "sys", "code", "unittest", "pytest", "_pytest", "pluggy", "django"}),
    namespaces=frozenset({"google", "google.protobuf"}),
    interpreters=("Python 3.11.7 at /venv/bin/python",),
)
GATES = ("python -m pytest -q -p myplugin tests", "python scripts/check.py", "python certificate.py")
SHADOW_BASE = {
    "certificate.py": "import json\n",
    "code/certificate.py": "def certificate(n):\n    return n\n",
    "code/mypkg/__init__.py": "",
    "code/myplugin.py": "def pytest_configure(config):\n    pass\n",
    "scripts/check.py": "import json\n",
    "tests/test_certificate.py": "def test_certificate():\n    assert True\n",
    "expected_result.json": "{}\n",
}


def shadow_rules(write_roots: tuple[str, ...] = (".",), commands: tuple[str, ...] = GATES,
                 names: ImportNames | None = NAMES) -> PolicyRules:
    return PolicyRules(write_roots=write_roots, protected_paths=("expected_result.json",),
                       commands=commands, import_names=names)


@pytest.fixture
def shadow_repo(tmp_path) -> Path:
    return repo_create(tmp_path / "shadow", SHADOW_BASE)


STDLIB_JSON = "would be imported instead of the standard library's `json` by the commands"


def test_a_root_json_py_is_refused_because_the_root_is_on_sys_path(shadow_repo):
    write_files(shadow_repo, {"json.py": "def load(f):\n    return {}\n"})
    verdict = check(shadow_repo, shadow_rules())
    assert has(verdict, "json.py", STDLIB_JSON)
    assert has(verdict, "json.py", "`json.py` is in the repository root (every command's working directory), "
                                   "which is on sys.path")
    assert has(verdict, "json.py", "rename it")
    assert has(verdict, "json.py", "(names from Python 3.11.7 at /venv/bin/python)")


def test_a_root_pytest_py_or_package_is_refused_as_the_installed_pytest(shadow_repo):
    write_files(shadow_repo, {"pytest.py": "raise SystemExit(0)\n", "pluggy/__init__.py": "",
                              "pluggy/_hooks.py": "X = 1\n"})
    verdict = check(shadow_repo, shadow_rules())
    assert has(verdict, "pytest.py", "instead of the installed module `pytest`")
    assert has(verdict, "pluggy/__init__.py", "instead of the installed module `pluggy`")
    assert has(verdict, "pluggy/_hooks.py", "instead of the installed module `pluggy`")


def test_a_module_beside_a_script_a_command_runs_is_refused(shadow_repo):
    write_files(shadow_repo, {"scripts/json.py": "X = 1\n"})
    verdict = check(shadow_repo, shadow_rules())
    assert has(verdict, "scripts/json.py", STDLIB_JSON)
    assert has(verdict, "scripts/json.py",
               "the directory of `scripts/check.py`, which a command runs), which is on sys.path")


def test_a_package_in_a_write_root_is_refused_when_it_is_named_like_an_installed_module(shadow_repo):
    write_files(shadow_repo, {"code/pytest/__init__.py": "",
                              "code/pytest/__main__.py": "raise SystemExit(0)\n"})
    verdict = check(shadow_repo, shadow_rules(write_roots=("code",)))
    for path in ("code/pytest/__init__.py", "code/pytest/__main__.py"):
        assert has(verdict, path, "instead of the installed module `pytest`"), verdict
        assert has(verdict, path, "`code/pytest/` is in the write root `code`, which is on sys.path")


def test_a_submodule_and_an_ordinary_new_module_are_allowed(shadow_repo):
    write_files(shadow_repo, {"code/mypkg/json.py": "X = 1\n", "code/fastmath.py": "X = 1\n",
                              "code/certificate.py": "def certificate(n):\n    return n + 0\n"})
    assert check(shadow_repo, shadow_rules(write_roots=("code",))).accepted


def test_the_baselines_own_namespace_dir_named_like_a_stdlib_module_stays_writable_until_it_becomes_a_package(
        shadow_repo):
    # `code/` is the stdlib's `code` too: as a namespace portion it loses to the stdlib module.
    write_files(shadow_repo, {"code/faster.py": "X = 1\n"})
    assert check(shadow_repo, shadow_rules()).accepted
    write_files(shadow_repo, {"code/__init__.py": ""})
    verdict = check(shadow_repo, shadow_rules())
    assert has(verdict, "code/__init__.py", "instead of the standard library's `code`")
    assert has(verdict, "code/faster.py", "instead of the standard library's `code`")


def test_a_portion_of_an_installed_namespace_package_is_judged_by_what_it_adds(shadow_repo):
    write_files(shadow_repo, {"google/protobuf/__init__.py": "", "google/mine.py": "X = 1\n"})
    verdict = check(shadow_repo, shadow_rules())
    assert has(verdict, "google/protobuf/__init__.py", "instead of the installed module `google.protobuf`")
    assert reasons(verdict, "google/mine.py") == []


@pytest.mark.parametrize("path", ["JSON.py", "Json/__init__.py", "jѕon.py"])
def test_look_alikes_and_case_variants_of_a_name_are_refused(shadow_repo, path):
    write_files(shadow_repo, {path: "X = 1\n"})
    assert has(check(shadow_repo, shadow_rules()), path, STDLIB_JSON)


def test_directories_named_by_the_commands_and_the_baselines_pytest_config_are_on_sys_path(tmp_path):
    repo = repo_create(tmp_path / "conf", {
        **SHADOW_BASE, "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["lib"]\n',
        "work/run.py": "X = 1\n"})
    write_files(repo, {"src/json.py": "X = 1\n", "lib/os.py": "X = 1\n", "work/sys.py": "X = 1\n",
                       "other/json.py": "X = 1\n"})
    commands = ("PYTHONPATH=src python -m pytest", "cd work && python -c 'import run'")
    verdict = check(repo, shadow_rules(commands=commands))
    assert has(verdict, "src/json.py",
               "`src` (PYTHONPATH in `PYTHONPATH=src python -m pytest`), which is on sys.path")
    assert has(verdict, "lib/os.py", "`lib` (pytest's pythonpath in `pyproject.toml`), which is on sys.path")
    assert has(verdict, "work/sys.py", "`work` (a command runs there: `cd work`), which is on sys.path")
    assert reasons(verdict, "other/json.py") == []


@pytest.mark.parametrize(("path", "reason"), [
    ("evil-1.0.dist-info/entry_points.txt", "packaging metadata (`evil-1.0.dist-info`)"),
    ("evil-1.0.dist-info/METADATA", "packaging metadata (`evil-1.0.dist-info`)"),
    ("code/evil.egg-info/PKG-INFO", "packaging metadata (`evil.egg-info`)"),
    ("code/evil.egg-info", "packaging metadata (`evil.egg-info`)"),
    ("code/entry_points.txt", "packaging metadata (`entry_points.txt`)"),
    ("code/evil.egg-link", "packaging metadata (`evil.egg-link`)"),
    ("code/Evil.Dist-Info/RECORD", "packaging metadata (`evil.dist-info`)"),
    ("code/__pycache__/certificate.cpython-311.pyc", "compiled bytecode"),
    ("code/certificate.pyc", "compiled bytecode"),
])
def test_packaging_metadata_and_bytecode_are_refused_anywhere(shadow_repo, path, reason):
    write_files(shadow_repo, {path: "[pytest11]\nevil = evil_plugin\n"})
    verdict = check(shadow_repo, shadow_rules(write_roots=("code", "evil-1.0.dist-info"), names=None,
                                              commands=()))
    assert has(verdict, path, reason), verdict


def test_pytests_cache_is_refused(shadow_repo):
    write_files(shadow_repo, {".pytest_cache/v/cache/lastfailed": "{}\n"})
    assert has(check(shadow_repo, shadow_rules()), ".pytest_cache/v/cache/lastfailed", "pytest's cache")


def test_a_module_a_command_loads_as_a_pytest_plugin_is_refused(shadow_repo):
    write_files(shadow_repo, {"code/myplugin.py": "def pytest_configure(config):\n    config.x = 1\n"})
    verdict = check(shadow_repo, shadow_rules(write_roots=("code",)))
    assert has(verdict, "code/myplugin.py",
               "part of `myplugin`, loaded as a pytest plugin by `-p myplugin` in")
    assert has(verdict, "code/myplugin.py", "test-runner plugins cannot be changed")


@pytest.mark.parametrize("command", ["PYTEST_PLUGINS=evil.plug python -m pytest",
                                     "PYTEST_ADDOPTS='-p evil.plug' python -m pytest",
                                     "python -m pytest -o addopts='-p evil.plug'"])
def test_plugins_named_in_the_environment_or_options_of_a_command_are_refused(shadow_repo, command):
    write_files(shadow_repo, {"evil/__init__.py": "", "evil/plug.py": "X = 1\n"})
    verdict = check(shadow_repo, shadow_rules(commands=(command,)))
    for path in ("evil/__init__.py", "evil/plug.py"):
        assert has(verdict, path, "part of `evil.plug`, loaded as a pytest plugin"), (command, verdict)


def test_plugins_named_by_the_baselines_conftest_and_test_patterns_of_its_config_are_refused(tmp_path):
    repo = repo_create(tmp_path / "conf", {
        **SHADOW_BASE, "conftest.py": "pytest_plugins = ['helpers.fixtures']\n",
        "pytest.ini": "[pytest]\npython_files = check_*.py\n"})
    write_files(repo, {"helpers/fixtures.py": "X = 1\n", "code/check_speed.py": "X = 1\n"})
    verdict = check(repo, shadow_rules(commands=("python -m pytest",)))
    assert has(verdict, "helpers/fixtures.py", "by `pytest_plugins` in `conftest.py`")
    assert has(verdict, "code/check_speed.py",
               "collected as a test file (pytest's python_files in `pytest.ini`")


def test_the_directory_pytest_imports_a_test_module_from_is_on_sys_path(tmp_path):
    repo = repo_create(tmp_path / "conf", {**SHADOW_BASE, "code/checks/test_fast.py": "X = 1\n"})
    write_files(repo, {"code/checks/json.py": "X = 1\n"})
    verdict = check(repo, shadow_rules(write_roots=("code",), commands=("python -m pytest",)))
    assert has(verdict, "code/checks/json.py",
               "pytest puts it on sys.path to import `code/checks/test_fast.py`")


def test_a_shell_script_a_command_runs_is_read_for_the_directories_its_commands_use(tmp_path):
    repo = repo_create(tmp_path / "conf", {**SHADOW_BASE,
                                           "scripts/bench.sh": "#!/bin/sh\ncd work && python -m bench\n"})
    write_files(repo, {"work/json.py": "X = 1\n"})
    verdict = check(repo, shadow_rules(commands=("./scripts/bench.sh",)))
    assert has(verdict, "work/json.py", "`work` (a command runs there: `cd work`), which is on sys.path")


def test_unittest_discovery_patterns_are_test_files(shadow_repo):
    write_files(shadow_repo, {"code/testing_speed.py": "def load_tests(*a):\n    pass\n"})
    verdict = check(shadow_repo, shadow_rules(write_roots=("code",),
                                              commands=("python -m unittest discover",)))
    assert has(verdict, "code/testing_speed.py", "unittest's default test file pattern")


def test_when_the_interpreters_cannot_be_asked_every_importable_new_file_is_refused_with_why(shadow_repo):
    failed = ImportNames(
        error="the interpreters that run the commands could not be asked what they import (boom)")
    write_files(shadow_repo, {"fastjson.py": "X = 1\n", "code/certificate.py": "X = 2\n", "notes.txt": "x\n"})
    verdict = check(shadow_repo, shadow_rules(names=failed))
    assert has(verdict, "fastjson.py", "could not be asked what they import (boom)")
    assert reasons(verdict, "code/certificate.py") == [] and reasons(verdict, "notes.txt") == []


def test_the_rules_from_a_spec_carry_the_probed_names_and_the_hidden_files_directories(settings, data_dir):
    seed = (Path(__file__).parent.parent / "search_app" / "specs" / "seed_example.toml").read_text()
    seed += '\n[evaluator.files]\n"bench/hidden/check.py" = "import json\\n"\n'
    rules = policy_rules(spec_validate(seed).spec)
    assert rules.import_names is not None and not rules.import_names.error
    assert {"json", "os"} <= rules.import_names.stdlib and "pytest" in rules.import_names.installed
    assert rules.commands[-1] == "./scripts/benchmark_candidate.sh"
    assert rules.import_dirs == ("bench/hidden/check.py", "bench/hidden")


# --- rules from a spec ------------------------------------------------------------------------


def test_rules_come_from_the_spec():
    seed = (Path(__file__).parent.parent / "search_app" / "specs" / "seed_example.toml").read_text()
    spec = spec_validate(seed).spec
    rules = policy_rules(spec)
    assert dataclasses.replace(rules, commands=(), import_names=None) == PolicyRules(
        write_roots=("code",), exact_files=(), protected_paths=("tests", "expected_result.json"),
        score_script="scripts/benchmark_candidate.sh", forbid_test_changes=True,
    )
    assert rules.commands == (*spec.hard_gates.commands, spec.score.command)


@pytest.mark.parametrize(("command", "script"), [
    ("./scripts/benchmark_candidate.sh", "scripts/benchmark_candidate.sh"),
    ("PYTHONHASHSEED=0 ./bench/run.sh --trials 3", "bench/run.sh"),
    ("bench/run.py", "bench/run.py"),
    ("make bench", None),
    ("python -m timeit 'x'", None),
    ("/usr/bin/time ./x", None),
    ("../outside.sh", None),
    ("./unbalanced 'quote", "unbalanced"),
])
def test_the_score_script_is_the_command_when_it_is_a_repo_path(command, script):
    assert command_script(command) == script


# --- random patches ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_repo(tmp_path_factory) -> Iterator[tuple[Repo, bytes]]:
    path = repo_create(tmp_path_factory.mktemp("policy") / "repo", BASE)
    opened = Repo(str(path))
    yield opened, baseline(path).encode()
    opened.close()


def build(repo: Repo, base: bytes, changes: dict[str, tuple[int, bytes] | None]) -> bytes:
    store, items = repo.object_store, []
    for path, value in changes.items():
        if value is None:
            items.append((path.encode(), None, None))
            continue
        blob = Blob.from_string(value[1])
        store.add_object(blob)
        items.append((path.encode(), value[0], blob.id))
    return commit_tree_changes(store, base, items)


TEXT = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=200).map(
    str.encode)
ANY_BYTES = st.one_of(TEXT, st.binary(max_size=200))
NAME = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8)
FILE_NAME = st.tuples(NAME, st.sampled_from(["", ".py", ".txt", ".md", ".json"])).map(
    lambda name_suffix: f"m_{name_suffix[0]}{name_suffix[1]}")
DIR_NAME = NAME.map(lambda name: f"dm_{name}")
ALLOWED_EXISTING = ["code/certificate.py", "code/util.py", "lib/src/helpers.py", "README.md"]
LOOKALIKES = {"e": ["\u0435", "\uff45"], "o": ["\u043e", "\u03bf"], "c": ["\u0441"], "p": ["\u0440"],
              "a": ["\u0430"], "s": ["\u0455"], "i": ["\u0456"], "t": ["\uff54"], "x": ["\u0445"]}


@st.composite
def allowed_changes(draw) -> dict[str, tuple[int, bytes] | None]:
    """Edits and deletions of existing allowed files, and new files under the write roots with
    plain names, text content and a regular mode."""
    changes: dict[str, tuple[int, bytes] | None] = {}
    for path in draw(st.lists(st.sampled_from(ALLOWED_EXISTING), unique=True, max_size=3)):
        changes[path] = draw(st.one_of(st.none(), TEXT.map(lambda data: (REGULAR, data))))
    for _ in range(draw(st.integers(0, 4))):
        root = draw(st.sampled_from(RULES.write_roots))
        parts = [root, *draw(st.lists(DIR_NAME, max_size=2)), draw(FILE_NAME)]
        changes["/".join(parts)] = (draw(st.sampled_from([REGULAR, EXECUTABLE])), draw(TEXT))
    return changes


@st.composite
def disguise(draw, path: str) -> str:
    """The path as it may look to a reader: other letter case, look-alike letters, an invisible
    joiner, fullwidth forms; never the path itself."""
    out = []
    for char in path:
        choice = draw(st.sampled_from(["same", "same", "upper", "lookalike", "fullwidth"]))
        if choice == "upper":
            out.append(char.upper())
        elif choice == "lookalike" and char in LOOKALIKES:
            out.append(draw(st.sampled_from(LOOKALIKES[char])))
        elif choice == "fullwidth" and "!" <= char <= "~" and char != "/":
            out.append(chr(ord(char) + 0xFEE0))
        else:
            out.append(char)
    text = "".join(out)
    if text == path:
        text = text[0].upper() + text[1:] if text[0].isalpha() else "\u200d" + text
    return text


@st.composite
def protected_touches(draw) -> tuple[str, dict[str, tuple[int, bytes] | None]]:
    """A random protected path touched (edited, deleted, added to, or added to under a disguised
    name), plus random allowed changes. Returns the touched path and all changes."""
    protected = draw(st.sampled_from(RULES.protected_paths))
    existing = [path for path in BASE if path == protected or path.startswith(protected + "/")]
    is_dir = existing != [protected]
    kind = draw(st.sampled_from(["edit", "delete", "add", "disguised"]))
    content = draw(ANY_BYTES)
    if kind in ("edit", "delete") or (kind == "add" and not is_dir):
        touched = draw(st.sampled_from(existing))
        if content == BASE[touched].encode():
            content += b"!"
        change = None if kind == "delete" else (REGULAR, content)
    else:
        base = protected if kind == "add" else draw(disguise(protected))
        touched = f"{base}/{draw(DIR_NAME)}/{draw(FILE_NAME)}" if is_dir else base
        change = (draw(st.sampled_from([REGULAR, EXECUTABLE])), content)
    changes = draw(allowed_changes())
    changes[touched] = change
    return touched, changes


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(touch=protected_touches())
def test_random_patches_touching_a_protected_path_are_always_refused(shared_repo, touch):
    repo, base = shared_repo
    touched, changes = touch
    verdict = policy_check(repo, base, build(repo, base, changes), RULES)
    assert not verdict.accepted
    named = [v.reason for v in verdict.violations if v.path == touched]
    assert any("is a protected path" in reason for reason in named), (touched, verdict.violations)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=allowed_changes())
def test_random_patches_touching_only_allowed_files_are_always_accepted(shared_repo, changes):
    repo, base = shared_repo
    verdict = policy_check(repo, base, build(repo, base, changes), RULES)
    assert verdict.accepted, verdict.violations

