"""Print the figures of the code's shape: imports inside functions, import cycles, the longest functions.

Usage: python scripts/code_figures.py [--longest N]

The same import graph backs tests/test_architecture.py, which fails the suite on a new cycle or on
runtime_app importing an app built on it.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("crucible", "runtime_app", "search_app", "evolve_app")
APPS_BUILT_ON_RUNTIME = ("search_app", "evolve_app")


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    in_function: bool
    type_checking: bool


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the project's packages (migrations left out), by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).with_suffix("")
            if "migrations" in relative.parts:
                continue
            parts = list(relative.parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The project module a dotted import name lands in (a name imported from a module maps to it)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(known: dict[str, Path] | None = None) -> Iterator[Import]:
    """Every import of one project module by another."""
    known = known if known is not None else modules()
    for name, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]

        def walk(
            node: ast.AST,
            in_function: bool,
            type_checking: bool,
            importer: str = name,
            package: str = package,
        ) -> Iterator[Import]:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                    yield from walk(child, True, type_checking)
                elif isinstance(child, ast.If) and _is_type_checking(child.test):
                    for inner in child.body:
                        yield from walk(ast.Module(body=[inner], type_ignores=[]), in_function, True)
                    for inner in child.orelse:
                        yield from walk(ast.Module(body=[inner], type_ignores=[]), in_function, type_checking)
                elif isinstance(child, ast.Import | ast.ImportFrom):
                    targets: list[str] = []
                    if isinstance(child, ast.Import):
                        targets = [alias.name for alias in child.names]
                    else:
                        base = child.module or ""
                        if child.level:
                            anchor = package.split(".")
                            anchor = anchor[: len(anchor) - (child.level - 1)]
                            base = ".".join([*anchor, base] if base else anchor)
                        targets = [f"{base}.{alias.name}" for alias in child.names]
                    for target in targets:
                        resolved = _resolve(target, known)
                        if resolved and resolved != importer:
                            yield Import(importer, resolved, child.lineno, in_function, type_checking)
                else:
                    yield from walk(child, in_function, type_checking)

        yield from walk(tree, False, False)


def in_function_imports(root: Path = ROOT) -> list[tuple[str, int]]:
    """Every import statement (of anything) written inside a function, as (path, line)."""
    found = []
    for path in modules(root).values():
        tree = ast.parse(path.read_text(), filename=str(path))
        for func in ast.walk(tree):
            if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(func):
                    if isinstance(node, ast.Import | ast.ImportFrom):
                        found.append((str(path.relative_to(root)), node.lineno))
    return sorted(set(found))


def cycles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected groups of modules that import each other, directly or through others."""
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        graph[edge.importer].add(edge.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(groups)


def runtime_imports_of_apps(edges: list[Import]) -> list[Import]:
    """Imports by which runtime_app would depend on an app built on it."""
    return [
        edge
        for edge in edges
        if edge.importer.split(".")[0] == "runtime_app"
        and edge.imported.split(".")[0] in APPS_BUILT_ON_RUNTIME
    ]


def longest_functions(count: int, root: Path = ROOT) -> list[tuple[int, str]]:
    found = []
    for name, path in modules(root).items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                where = f"{name}.{node.name} ({path.name}:{node.lineno})"
                found.append((node.end_lineno - node.lineno + 1, where))
    return sorted(found, reverse=True)[:count]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--longest", type=int, default=10)
    args = parser.parse_args()
    edges = list(imports())
    inside = in_function_imports()
    by_file: dict[str, int] = defaultdict(int)
    for path, _ in inside:
        by_file[path] += 1
    print(f"imports inside functions: {len(inside)}")
    for path, n in sorted(by_file.items(), key=lambda item: -item[1])[:8]:
        print(f"  {n:4d}  {path}")
    runtime_edges = [edge for edge in edges if not edge.type_checking]
    groups = cycles(runtime_edges)
    print(f"import cycles (counting imports inside functions): {len(groups)}")
    for group in groups:
        print("  " + " <-> ".join(group))
    top_level = cycles([edge for edge in runtime_edges if not edge.in_function])
    print(f"import cycles among module-level imports: {len(top_level)}")
    wrong_way = runtime_imports_of_apps(runtime_edges)
    print(f"runtime_app imports of the apps built on it: {len(wrong_way)}")
    for edge in wrong_way:
        print(f"  {edge.importer}:{edge.line} -> {edge.imported}")
    print("longest functions (lines):")
    for length, where in longest_functions(args.longest):
        print(f"  {length:4d}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
