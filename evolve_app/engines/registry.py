"""Engines by name: the built-ins (ENGINES), the entry points of `crucible.engines`, or a dotted
path where the caller may give one; checked without importing, constructing or calling anything.
A-Evolve's own engine classes by their dotted paths are the built-ins that adapt them
(engine_resolve); another dotted path's constructor is read from its source, so one that needs
what the run's options do not give is refused when the run is asked for, not in the worker."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolve_app.engines.base import EngineError, EvolutionEngine
from evolve_app.extensions import (
    ENGINE_GROUP,
    dotted_allowed,
    dotted_load,
    dotted_refusal,
    installed,
    is_dotted,
    server_path,
)

# The engines by name, filled by evolve_app.engines (the built-ins, then A-Evolve's adapters).
ENGINES: dict[str, type[EvolutionEngine]] = {}
# A built-in named by its dotted path is the built-in: found by lookup, not imported.
_BUILTIN_PATHS: dict[str, str] = {}
RESERVED_OPTIONS = ("trusted",)  # set by the runtime from where the run was started
_SETTABLE = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def builtins_register(engines: Mapping[str, type[EvolutionEngine]], public_module: str) -> None:
    """Add built-ins by name, and by dotted path both where they live and where they are named
    publicly (`public_module`, the package pyproject's entry points point at)."""
    ENGINES.update(engines)
    for name, cls in engines.items():
        for module in {cls.__module__, public_module}:
            for sep in (".", ":"):
                _BUILTIN_PATHS[f"{module}{sep}{cls.__name__}"] = name


def upstream_paths() -> dict[str, str]:
    """A-Evolve's own engine classes by their dotted paths -> the built-in that adapts each (its
    `upstream_path`), as a user writes them: where each lives (`…skillforge.engine.AEvolveEngine`)
    and where its package exports it (`…skillforge.AEvolveEngine`), `.` or `:` before the class.
    A lookup: their constructors want an EvolveConfig and an LLM, which a run's options never give."""
    paths = {}
    for name, cls in ENGINES.items():
        module, _, attribute = str(getattr(cls, "upstream_path", "") or "").rpartition(".")
        for where in {module, module.removesuffix(".engine")} if module else ():
            for sep in (".", ":"):
                paths[f"{where}{sep}{attribute}"] = name
    return paths


def engine_resolve(name: str) -> tuple[str, str]:
    """(the engine a run records, a note saying why it is not the name given): an A-Evolve engine
    class named by its dotted path is Crucible's adapter of it; any other name is itself."""
    builtin = upstream_paths().get(name)
    if builtin is None:
        return name, ""
    return builtin, (f"{name} runs as {builtin}: A-Evolve's own engine, adapted (its model calls go "
                     "through Crucible's model settings and receipts, its bash into the sandbox)")


def engine_names() -> list[str]:
    """The engines the web and API may name: the built-ins (those whose package is installed),
    then installed entry points."""
    offered = [name for name, cls in ENGINES.items() if getattr(cls, "offered", lambda: True)()]
    return [*offered, *sorted(name for name in installed(ENGINE_GROUP) if name not in ENGINES)]


# What each built-in does, in a few words for a select (others: their docstring's first sentence).
_SUMMARIES = {
    "textbook": "offline and deterministic: the demo's engine",
    "skillforge": "a model edits the workspace (A-Evolve's default engine)",
    "guided": "Guided Synthesis: lessons in memory, then curated skills",
    "adaptive": "Adaptive Evolution: chosen observations, a change size that follows the score",
    "adaptive-skill": "Adaptive Skill: skills grown where the agent fails",
    "search": "candidate mutations tried side by side; the best one is kept",
    "aevolve-skillforge": "A-Evolve's own SkillForge engine",
    "aevolve-guided": "A-Evolve's own Guided Synthesis engine",
    "aevolve-adaptive": "A-Evolve's own Adaptive Evolution engine",
    "aevolve-adaptive-skill": "A-Evolve's own Adaptive Skill engine",
}


def engine_choices() -> list[tuple[str, str]]:
    """(name, what it does) of each engine engine_names() offers, for a select."""
    described = []
    for name in engine_names():
        summary = _SUMMARIES.get(name, "")
        cls = ENGINES.get(name)
        if not summary and cls is not None:
            summary = (inspect.getdoc(cls) or "").split("\n\n", 1)[0].replace("\n", " ").split(". ", 1)[0]
            summary = summary if len(summary) <= 90 else summary[:89] + "…"
        elif not summary:
            summary = f"installed: {installed(ENGINE_GROUP)[name].value}"
        described.append((name, summary))
    return described


def _builtin(name: str) -> str | None:
    return name if name in ENGINES else _BUILTIN_PATHS.get(name) or upstream_paths().get(name)


def _value_check(engine: str, key: str, value: Any, default: Any) -> None:
    """A value the constructor would turn into its default's type (int() or float())."""
    kind = type(default)
    if kind not in (int, float):
        return
    try:
        kind(value)
    except (TypeError, ValueError):
        wanted = "a whole number" if kind is int else "a number"
        raise EngineError(f"{engine}: option {key} must be {wanted}, got {value!r}") from None


def _options_check(name: str, cls: type[EvolutionEngine], options: dict[str, Any], trusted: bool) -> None:
    """A built-in's options against its signature (inspected, never called), its own bounds, its
    path options (under CRUCIBLE_REPO_ROOTS unless trusted), and its inner engine, if it has one."""
    parameters = inspect.signature(cls).parameters
    settable = {key: p for key, p in parameters.items()
                if p.kind in _SETTABLE and key not in RESERVED_OPTIONS}
    passes_on = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    unknown = [key for key in options if key not in settable]
    if unknown and not passes_on:
        raise EngineError(f"{name} has no option {', '.join(map(repr, unknown))}; its options: "
                          f"{', '.join(settable) or 'none'}")
    missing = [key for key, p in settable.items() if p.default is p.empty and key not in options]
    if missing:
        raise EngineError(f"{name} needs the option {', '.join(missing)}")
    for key, value in options.items():
        if key in settable:
            _value_check(name, key, value, settable[key].default)
    for key in cls.PATH_OPTIONS:
        if options.get(key) not in (None, ""):
            server_path(str(options[key]), trusted=trusted, what=f"{name} {key} file", error=EngineError)
    cls.options_check(options)
    if passes_on and "inner" in settable:
        inner = str(options.get("inner", settable["inner"].default))
        rest = {key: value for key, value in options.items() if key not in settable}
        try:
            engine_check(inner, rest, trusted=trusted)
        except EngineError as error:
            raise EngineError(f"{name}'s inner engine: {error}") from None


def engine_check(name: str, options: Mapping[str, Any] | None = None, *, trusted: bool = False) -> None:
    """Raise EngineError unless `name` is an engine this caller may name, with options it takes.

    A name lookup and signature checks only: nothing is imported, constructed or called. A
    built-in's options are checked in full (A-Evolve's engine classes by their dotted paths are
    built-ins: engine_resolve); an entry point's are its own, checked when a worker makes it. A
    dotted path needs `trusted` (the CLI) or its exact spelling in CRUCIBLE_ALLOWED_EXTENSIONS; its
    constructor, read from its source, must need nothing the options do not give."""
    options = dict(options or {})
    reserved = [key for key in options if key in RESERVED_OPTIONS]
    if reserved:
        raise EngineError(f"{', '.join(reserved)} is set by the runtime, not an engine option")
    builtin = _builtin(name)
    if builtin is not None:
        _options_check(builtin, ENGINES[builtin], options, trusted)
    elif name in installed(ENGINE_GROUP):
        return
    elif is_dotted(name):
        if not dotted_allowed(name, trusted=trusted):
            raise EngineError(dotted_refusal("engine", name, engine_names()))
        _dotted_check(name, options)
    else:
        raise EngineError(f"unknown engine {name!r}: use one of {', '.join(engine_names())}")


@dataclass(frozen=True)
class _Parameter:
    name: str
    required: bool
    kind: str  # "positional" (positional only), "either" or "keyword" (keyword only)


_Signature = tuple[list[_Parameter], bool]  # the parameters, and whether it takes **kwargs too
_NO_ARGUMENTS: _Signature = ([], False)
_PLAIN_BASES = ("abc", "typing", "typing_extensions", "builtins", "collections.abc")
_MAX_HOPS = 16  # imports and base classes followed to find a constructor


def _module_source(module: str) -> tuple[Path, bool] | None:
    """(source file, is a package) of `module`, found from its top-level package's folder: nothing
    is imported (importlib's find_spec of a submodule would import its parents)."""
    top, *rest = module.split(".")
    loaded = sys.modules.get(top)
    try:
        spec = loaded.__spec__ if loaded is not None else importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        origin = spec.origin or ""
        return (Path(origin), spec.submodule_search_locations is not None) if origin.endswith(".py") else None
    for folder in spec.submodule_search_locations or []:
        base = Path(folder).joinpath(*rest)
        if (base / "__init__.py").is_file():
            return base / "__init__.py", True
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py"), False
    return None


def _function_signature(function: ast.FunctionDef | ast.AsyncFunctionDef, drop_first: bool) -> _Signature:
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    first_default = len(positional) - len(arguments.defaults)
    found = [_Parameter(arg.arg, index < first_default, "positional" if index < len(arguments.posonlyargs)
                        else "either") for index, arg in enumerate(positional)][1 if drop_first else 0:]
    found += [_Parameter(arg.arg, default is None, "keyword")
              for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)]
    return found, arguments.kwarg is not None


def _imported_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if is_package else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _static_signature(module: str, attribute: str, hops: int = 0) -> _Signature | None:
    """What `module.attribute` (a class or a function) takes when called, read from its source:
    the class's own __init__, else its first base's that has one, following imports. None when
    that cannot be told from the source (the worker finds out)."""
    if hops > _MAX_HOPS or module.partition(".")[0] in _PLAIN_BASES:
        return None if hops > _MAX_HOPS else _NO_ARGUMENTS
    source = _module_source(module)
    if source is None:
        return None
    path, is_package = source
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    head, _, rest = attribute.partition(".")
    found: ast.AST | None = None
    for node in tree.body:  # the last binding of the name wins, as when the module runs
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == head:
            found = node
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == head:
                    found = ast.ImportFrom(module=_imported_from(module, is_package, node),
                                           names=[ast.alias(name=alias.name)], level=0)
    if isinstance(found, ast.ImportFrom):
        target = f"{found.names[0].name}.{rest}" if rest else found.names[0].name
        return _static_signature(found.module or "", target, hops + 1)
    for part in rest.split(".") if rest else []:
        inner = [node for node in getattr(found, "body", [])
                 if isinstance(node, ast.ClassDef) and node.name == part]
        found = inner[-1] if inner else None
    if isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return _function_signature(found, drop_first=False)
    if not isinstance(found, ast.ClassDef):
        return None
    return _class_signature(found, module, hops)


def _class_signature(node: ast.ClassDef, module: str, hops: int) -> _Signature | None:
    init = [item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            and item.name == "__init__"]
    if init:
        return _function_signature(init[-1], drop_first=True)
    if any("dataclass" in ast.unparse(decorator) for decorator in node.decorator_list):
        return None  # its fields make its __init__, with its bases': not told from here
    for base in node.bases:
        if not isinstance(base, ast.Name):
            return None
        if base.id == "object":
            continue
        signature = _static_signature(module, base.id, hops + 1)  # defined or imported in this module
        if signature is None or signature != _NO_ARGUMENTS:
            return signature
    return _NO_ARGUMENTS


def _live_signature(name: str) -> _Signature | None:
    """The signature of what `name` names when its module is loaded already (nothing imported)."""
    module_name, _, attribute = name.partition(":") if ":" in name else name.rpartition(".")
    value: Any = sys.modules.get(module_name)
    if value is None:
        return None
    for part in attribute.split("."):
        value = getattr(value, part, None)
    if value is None or not callable(value):
        return None
    try:
        parameters = inspect.signature(value).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds: dict[Any, str] = {inspect.Parameter.POSITIONAL_ONLY: "positional",
                             inspect.Parameter.POSITIONAL_OR_KEYWORD: "either",
                             inspect.Parameter.KEYWORD_ONLY: "keyword"}
    return ([_Parameter(p.name, p.default is p.empty, kinds[p.kind]) for p in parameters if p.kind in kinds],
            any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters))


def _dotted_check(name: str, options: Mapping[str, Any]) -> None:
    """A dotted path's constructor, read without importing or calling anything (its source, or the
    object if its module is loaded already): refused when it needs arguments the run's options do
    not give, or takes none of the options given. What cannot be told is left to the worker."""
    module_name, _, attribute = name.partition(":") if ":" in name else name.rpartition(".")
    top = module_name.partition(".")[0]
    try:
        present = top in sys.modules or importlib.util.find_spec(top) is not None  # top level: no import
    except (ImportError, ValueError):
        present = False
    if not present:
        raise EngineError(f"engine {name!r} cannot be found: there is no module {top!r} on this host")
    signature = _live_signature(name) or _static_signature(module_name, attribute)
    if signature is None:
        return
    parameters, passes_on = signature
    given = set(options)
    missing = [p.name for p in parameters if p.required and (p.kind == "positional" or p.name not in given)]
    if missing:
        raise EngineError(f"engine {name} needs {', '.join(missing)}, which the run's options do not give; "
                          "nothing was made. A worker makes an engine with the run's engine options as "
                          "keyword arguments only, so name one whose constructor needs nothing else")
    unknown = sorted(given - {p.name for p in parameters if p.kind != "positional"})
    if unknown and not passes_on:
        raise EngineError(f"engine {name} has no option {', '.join(map(repr, unknown))}; its options: "
                          f"{', '.join(p.name for p in parameters if p.kind != 'positional') or 'none'}")


def engine_get(name: str, *, trusted: bool = False, **options: Any) -> EvolutionEngine:
    """The engine `name` names, made with `options` (in a worker or the CLI, never to check a
    request). It is checked first, with the trust the run has, so a stored row or option that
    names a dotted path nobody allowed is refused, not imported."""
    engine_check(name, options, trusted=trusted)
    builtin = _builtin(name)
    if builtin is not None:
        factory: Any = ENGINES[builtin]
        if "trusted" in inspect.signature(factory).parameters:  # its inner engines get the same trust
            options = {**options, "trusted": trusted}
    else:
        point = installed(ENGINE_GROUP).get(name)
        try:
            factory = point.load() if point is not None else dotted_load(name, EngineError)
        except EngineError as error:
            raise EngineError(f"engine {name!r} cannot be loaded: {error}") from None
        except Exception as error:  # an installed package's own failure to load
            raise EngineError(f"engine {name!r} cannot be loaded: {type(error).__name__}: {error}") from None
    engine = factory(**options)
    if not hasattr(engine, "step"):
        raise EngineError(f"{name!r} is not an evolution engine (it has no step())")
    made: EvolutionEngine = engine  # or anything with a step(), as checked above
    return made
