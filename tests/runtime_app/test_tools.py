"""The writer's editor and shell tools: confined to the write roots, never through links or .git."""

from __future__ import annotations

import os

import pytest

from runtime_app.tools import tool_dispatch


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "a.py").write_text("one\ntwo\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("assert True\n")
    return tmp_path


def run(tree, name="editor", shell=lambda command: f"ran {command}", **tool_input):
    return tool_dispatch(name, tool_input, worktree=tree, shell=shell, write_roots=["code"],
                         exact_files=["README.md"])


def test_view_numbers_lines_and_lists_directories(tree):
    assert run(tree, command="view", path="code/a.py") == ("     1\tone\n     2\ttwo", False)
    assert run(tree, command="view", path="code") == ("a.py", False)


def test_create_replace_and_insert_inside_the_write_roots(tree):
    assert not run(tree, command="create", path="code/new/b.py", file_text="b = 1\n")[1]
    assert not run(tree, command="str_replace", path="code/a.py", old_str="two", new_str="deux")[1]
    assert not run(tree, command="insert", path="code/a.py", insert_line=0, insert_text="zero")[1]
    assert (tree / "code" / "a.py").read_text() == "zero\none\ndeux\n"
    assert not run(tree, command="create", path="README.md", file_text="# hi\n")[1]  # an exact file


@pytest.mark.parametrize(("tool_input", "message"), [
    ({"command": "create", "path": "tests/test_a.py", "file_text": "x"}, "outside the paths you may change"),
    ({"command": "create", "path": "../escape.py", "file_text": "x"}, "without `..`"),
    ({"command": "create", "path": "/etc/passwd", "file_text": "x"}, "without `..`"),
    ({"command": "view", "path": ".git/config"}, "git directory"),
    ({"command": "str_replace", "path": "code/a.py", "old_str": "o", "new_str": "0"}, "occurs 2 times"),
    ({"command": "insert", "path": "code/a.py", "insert_line": 9, "insert_text": "x"}, "between 0 and 2"),
    ({"command": "delete", "path": "code/a.py"}, "unknown command"),
    ({"command": "view", "path": ""}, "give `path`"),
])
def test_bad_calls_come_back_as_errors_the_model_can_act_on(tree, tool_input, message):
    text, is_error = run(tree, **tool_input)
    assert is_error and message in text
    assert (tree / "code" / "a.py").read_text() == "one\ntwo\n"


def test_a_path_through_a_symlink_is_refused(tree, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    os.symlink(outside, tree / "code" / "link")
    text, is_error = run(tree, command="create", path="code/link/x.py", file_text="x")
    assert is_error and "symlink" in text and not (outside / "x.py").exists()


def test_the_shell_tool_goes_through_the_given_runner_and_unknown_tools_are_errors(tree):
    assert run(tree, "shell", command="pytest -q") == ("ran pytest -q", False)
    assert run(tree, "browser", url="x")[1]
    assert tool_dispatch("editor", "not a dict", worktree=tree, shell=str)[1]


def test_a_read_only_tool_set_can_view_but_not_write(tree):
    text, is_error = tool_dispatch("editor", {"command": "create", "path": "code/x.py", "file_text": "x"},
                                   worktree=tree, shell=str, write_roots=["code"], read_only=True)
    assert is_error and "read-only" in text
