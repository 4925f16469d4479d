"""The interpreters that run a search's commands are asked, inside the real sandbox, which names
they import from outside the tree: the standard library and every installed module, never the
tree's own modules; the answer is cached until the interpreter or its path changes."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from runtime_app import interpreters
from runtime_app.interpreters import ProbeError, import_names, interpreter_probe, interpreters_find


@pytest.fixture
def isolation(mode, settings, data_dir) -> str:
    """Each test under bubblewrap and under rlimits only; a fresh cache for each."""
    settings.CONFIG = dataclasses.replace(settings.CONFIG, sandbox=mode)
    interpreters._cache.clear()
    return mode


def test_the_probe_names_the_standard_library_and_what_is_installed_not_the_tree(isolation, tmp_path,
                                                                                monkeypatch):
    # The server's own working directory holds a module: no tree's module is ever counted.
    (tmp_path / "my_own_module.py").write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    names = import_names(["python -m pytest -q", "python certificate.py"])
    assert not names.error, names.error
    assert {"json", "os", "sys", "importlib"} <= names.stdlib
    assert {"pytest", "_pytest", "pluggy", "django"} <= names.installed
    assert {"json", "pytest", "django"} <= names.regular
    assert "my_own_module" not in names.stdlib | names.installed | names.regular | names.namespaces
    assert any(label.startswith(f"Python {sys.version.split()[0]} at ") for label in names.interpreters)


def test_python_python3_and_the_interpreter_of_a_console_script_are_probed(isolation, tmp_path):
    found = interpreters_find(["pytest -q", "PYTHONPATH=src /usr/bin/python3 x.py"], tree=tmp_path)
    venv_python = Path(sys.executable).parent / "python"
    assert venv_python in found  # first on the sandbox's PATH, and pytest's `#!` line
    if Path("/usr/bin/python3").is_file():
        assert Path("/usr/bin/python3") in found  # named by a command


def test_the_answer_is_cached_until_the_interpreter_or_its_path_changes(isolation, monkeypatch):
    venv_python = Path(sys.executable).parent / "python"
    first = interpreter_probe(venv_python)
    runs = []
    monkeypatch.setattr(interpreters, "_probe_run", lambda *args: runs.append(args) or first)
    assert interpreter_probe(venv_python) is first and not runs
    stamp, probed = interpreters._cache[(str(venv_python), interpreters.sandbox.isolation_choose())]
    changed = ((stamp[0][0], stamp[0][1] - 1), *stamp[1:])  # as if a package was installed since
    interpreters._cache[(str(venv_python), interpreters.sandbox.isolation_choose())] = (changed, probed)
    interpreter_probe(venv_python)
    assert len(runs) == 1


def test_a_probe_that_fails_is_an_error_with_its_reason_never_an_empty_answer(isolation, monkeypatch):
    def broken(interpreter, *args):
        raise ProbeError(f"{interpreter} exited with 1 when asked what it imports: boom")

    monkeypatch.setattr(interpreters, "_probe_run", broken)
    names = import_names(["python -m pytest"])
    assert "could not be asked what they import" in names.error and "boom" in names.error
    assert not names.stdlib and not names.installed
