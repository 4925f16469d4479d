"""Engines by name: the built-ins (ENGINES), the entry points of `crucible.engines`, or a dotted
path where the caller may give one; checked without importing, constructing or calling anything."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
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
# A-Evolve's own engine classes by their dotted paths -> the built-in that adapts each (found by
# lookup: their constructors want an EvolveConfig and an LLM, which a run's options never give).
_UPSTREAM_PATHS: dict[str, str] = {}
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


def upstream_paths_register(engines: Mapping[str, type[EvolutionEngine]]) -> None:
    """Add the A-Evolve classes the built-ins `engines` adapt (their `upstream_path`), by the paths
    a user writes them: where each lives (`…skillforge.engine.AEvolveEngine`) and where its package
    exports it (`…skillforge.AEvolveEngine`), with `.` or `:` before the class."""
    for name, cls in engines.items():
        path = str(getattr(cls, "upstream_path", "") or "")
        module, _, attribute = path.rpartition(".")
        if not module:
            continue
        for where in {module, module.removesuffix(".engine")}:
            for sep in (".", ":"):
                _UPSTREAM_PATHS[f"{where}{sep}{attribute}"] = name


def engine_resolve(name: str) -> tuple[str, str]:
    """(the engine a run records, a note saying why it is not the name given): an A-Evolve engine
    class named by its dotted path is Crucible's adapter of it; any other name is itself."""
    builtin = _UPSTREAM_PATHS.get(name)
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
    return name if name in ENGINES else _BUILTIN_PATHS.get(name) or _UPSTREAM_PATHS.get(name)


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
    built-in's options are checked in full; an entry point's or a dotted path's are its own,
    checked when a worker makes it. A dotted path needs `trusted` (the CLI) or its exact
    spelling in CRUCIBLE_ALLOWED_EXTENSIONS."""
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


def _dotted_check(name: str, options: Mapping[str, Any]) -> None:
    """A dotted path the caller may name: imported (as its worker would) to read what its
    constructor needs, never called. Refused when it is not an engine class or factory, or when its
    constructor needs arguments the run's options do not give, or takes none of the options given."""
    try:
        value = dotted_load(name, EngineError)
    except EngineError as error:
        raise EngineError(f"engine {name!r} cannot be loaded: {error}") from None
    except Exception as error:  # the module's own failure to import
        raise EngineError(f"engine {name!r} cannot be loaded: {type(error).__name__}: {error}") from None
    if isinstance(value, type) and not callable(getattr(value, "step", None)):
        raise EngineError(f"{name!r} is not an evolution engine (its class has no step())")
    if not callable(value):
        raise EngineError(f"{name!r} is not an evolution engine class or factory")
    try:
        parameters = inspect.signature(value).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): its worker finds out
        return
    given = set(options)
    positional_only = [key for key, p in parameters.items()
                       if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is p.empty]
    missing = positional_only + [key for key, p in parameters.items() if p.kind in _SETTABLE
                                 and p.default is p.empty and key not in given]
    if missing:
        shown = f"{getattr(value, '__name__', name)}{inspect.signature(value)}"
        raise EngineError(f"engine {name} needs {', '.join(missing)}, which the run's options do not give "
                          f"(its constructor: {shown}); nothing was made. A worker makes an engine with "
                          "the run's engine options as keyword arguments only")
    takes = {key for key, p in parameters.items() if p.kind in _SETTABLE}
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        unknown = sorted(given - takes)
        if unknown:
            raise EngineError(f"engine {name} has no option {', '.join(map(repr, unknown))}; its options: "
                              f"{', '.join(sorted(takes)) or 'none'}")


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
