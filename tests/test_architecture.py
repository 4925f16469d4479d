"""The lint contract of the code's shape, from the import graph of scripts/code_figures.py: runtime_app
never imports the apps built on it, no import cycle among the project's modules, and no import inside a
function of the apps except the commented allow-list below. Each rule also has a self-test on a tiny
package in tmp_path, showing it catches what it forbids."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from tests.helpers import REPO_ROOT


def _code_figures() -> ModuleType:
    """scripts/code_figures.py as a module (scripts/ is not a package; its CLI stays as it is)."""
    spec = importlib.util.spec_from_file_location("code_figures", REPO_ROOT / "scripts" / "code_figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


figures = _code_figures()

# Imports that may stay inside a function, by (file, function's qualified name), each with why.
ALLOWED_IN_FUNCTION = {
    # Django imports apps.py before the app registry is ready: models and signals only in ready().
    ("runtime_app/apps.py", "RuntimeAppConfig.ready"): "models and signal receivers, once apps are ready",
    ("search_app/apps.py", "SearchAppConfig.ready"): "models and signal receivers, once apps are ready",
    ("evolve_app/apps.py", "EvolveAppConfig.ready"): "models and signal receivers, once apps are ready",
    # The provider SDKs take about a second to import: every manage.py command would pay it.
    ("runtime_app/llm.py", "anthropic_client"): "the anthropic SDK, loaded by its first use",
    ("runtime_app/llm.py", "anthropic_call"): "the anthropic SDK, loaded by its first use",
    ("runtime_app/llm.py", "bedrock_client"): "the anthropic SDK, loaded by its first use",
    ("runtime_app/llm.py", "openai_client"): "the openai SDK, loaded by its first use",
    ("runtime_app/llm.py", "openai_call"): "the openai SDK, loaded by its first use",
}


def runtime_app_imports_of_apps(root: Path) -> list[str]:
    """Every import (inside functions and under TYPE_CHECKING too) by which runtime_app depends on
    search_app or evolve_app, as `importer:line -> imported`."""
    edges = figures.runtime_imports_of_apps(list(figures.imports(figures.modules(root))))
    return [f"{edge.importer}:{edge.line} -> {edge.imported}" for edge in edges]


def import_cycles(root: Path) -> list[list[str]]:
    """The groups of modules that import each other, counting imports inside functions; an import under
    `if TYPE_CHECKING:` is for annotations only and never runs, so it is not counted."""
    edges = [edge for edge in figures.imports(figures.modules(root)) if not edge.type_checking]
    return figures.cycles(edges)


def _qualified_functions(tree: ast.Module) -> dict[int, str]:
    """For each line of an import inside a function: the innermost function's qualified name."""
    found: dict[int, str] = {}

    def visit(node: ast.AST, names: list[str], in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, [*names, child.name], True)
            elif isinstance(child, ast.ClassDef):
                visit(child, [*names, child.name], in_function)
            elif isinstance(child, ast.Import | ast.ImportFrom) and in_function:
                found[child.lineno] = ".".join(names)
            else:
                visit(child, names, in_function)

    visit(tree, [], False)
    return found


def in_function_imports(root: Path, allowed: dict[tuple[str, str], str]) -> list[str]:
    """Every import statement inside a function of the apps that the allow-list does not name,
    as `path:line (function)`."""
    functions: dict[str, dict[int, str]] = {}
    refused = []
    for path, line in figures.in_function_imports(root):
        if path not in functions:
            functions[path] = _qualified_functions(ast.parse((root / path).read_text()))
        function = functions[path][line]
        if (path, function) not in allowed:
            refused.append(f"{path}:{line} ({function})")
    return refused


# ---- the rules on the project's code


def test_runtime_app_imports_neither_search_app_nor_evolve_app():
    found = runtime_app_imports_of_apps(REPO_ROOT)
    assert not found, "runtime_app imports an app built on it:\n" + "\n".join(found)


def test_no_import_cycle_among_the_projects_modules():
    found = import_cycles(REPO_ROOT)
    assert not found, "modules that import each other:\n" + "\n".join(" <-> ".join(group) for group in found)


def test_no_import_inside_a_function_of_the_apps_but_the_allowed_ones():
    found = in_function_imports(REPO_ROOT, ALLOWED_IN_FUNCTION)
    assert not found, f"{len(found)} imports inside functions (move them to the top):\n" + "\n".join(found)


def test_every_allowed_in_function_import_names_a_function_that_exists():
    """An allow-list entry whose function was renamed or moved would silently allow nothing."""
    for path, function in ALLOWED_IN_FUNCTION:
        qualified = set(_qualified_functions(ast.parse((REPO_ROOT / path).read_text())).values())
        assert function in qualified, f"{path}: no import inside {function}"


# ---- each rule catches what it forbids, on a tiny package of the same names in tmp_path


def package(root: Path, files: dict[str, str]) -> Path:
    """Write `files` (path: source) under `root`, with an __init__.py in every folder."""
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in path.relative_to(root).parents:
            if folder != Path("."):
                (root / folder / "__init__.py").touch()
        path.write_text(source)
    return root


def test_the_runtime_app_rule_catches_an_import_of_search_app_inside_a_function(tmp_path):
    root = package(tmp_path, {
        "runtime_app/policy.py": "def rules():\n    from search_app.spec import LIMIT\n    return LIMIT\n",
        "search_app/spec.py": "from runtime_app import policy\n\nLIMIT = 3\n",  # the allowed direction
    })
    assert runtime_app_imports_of_apps(root) == ["runtime_app.policy:2 -> search_app.spec"]


def test_the_runtime_app_rule_catches_a_module_level_import_of_evolve_app(tmp_path):
    root = package(tmp_path, {"runtime_app/setup.py": "import evolve_app.services\n",
                              "evolve_app/services.py": "X = 1\n"})
    assert runtime_app_imports_of_apps(root) == ["runtime_app.setup:1 -> evolve_app.services"]


def test_the_cycle_rule_catches_two_modules_importing_each_other_one_inside_a_function(tmp_path):
    root = package(tmp_path, {
        "search_app/services.py": "from search_app import tasks\n",
        "search_app/tasks.py": "def drive():\n    from search_app.services import run\n    run()\n",
        "search_app/models.py": "from search_app import services\n",  # imports it, but no cycle
    })
    assert import_cycles(root) == [["search_app.services", "search_app.tasks"]]


def test_the_cycle_rule_ignores_an_import_under_type_checking(tmp_path):
    root = package(tmp_path, {
        "runtime_app/git.py": "from runtime_app import worktrees\n",
        "runtime_app/worktrees.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                    "    from runtime_app.git import Repo\n",
    })
    assert import_cycles(root) == []


def test_the_in_function_rule_catches_an_import_inside_a_method_and_keeps_the_allowed_one(tmp_path):
    root = package(tmp_path, {
        "evolve_app/engines.py": "import json\n\n\nclass Engine:\n    def run(self):\n"
                                 "        import subprocess\n        return subprocess, json\n",
        "evolve_app/apps.py": "class EvolveAppConfig:\n    def ready(self):\n"
                              "        from evolve_app import engines\n",
    })
    assert in_function_imports(root, ALLOWED_IN_FUNCTION) == ["evolve_app/engines.py:6 (Engine.run)"]
    assert in_function_imports(root, {}) == ["evolve_app/apps.py:3 (EvolveAppConfig.ready)",
                                             "evolve_app/engines.py:6 (Engine.run)"]
