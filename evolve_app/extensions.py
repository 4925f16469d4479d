"""How engines, agent classes and benchmarks are chosen: by name, never by importing what a request says.

The web and API may name what is registered: the built-ins, and the entry points installed
packages declare in the groups `crucible.engines`, `crucible.agents` and `crucible.benchmarks`
(read from their metadata: nothing is loaded). A dotted path (`package.module.Name` or
`package.module:Name`) is honoured only from the trusted CLI (`manage.py evolve run`), or when
an administrator lists that exact path in CRUCIBLE_ALLOWED_EXTENSIONS. Checking a request is a
name lookup plus checks that import nothing; a worker loads what was checked, and checks it
again first, with the trust the run was started with.
"""

from __future__ import annotations

import importlib
import re
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError

from runtime_app.services import server_path_check

ENGINE_GROUP = "crucible.engines"
AGENT_GROUP = "crucible.agents"
BENCHMARK_GROUP = "crucible.benchmarks"
SETTING = "CRUCIBLE_ALLOWED_EXTENSIONS"
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?::[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)?")


def installed(group: str) -> dict[str, EntryPoint]:
    """name -> entry point of the group, from installed packages' metadata (nothing is loaded)."""
    found: dict[str, EntryPoint] = {}
    for point in entry_points(group=group):
        found.setdefault(point.name, point)
    return found


def is_dotted(value: Any) -> bool:
    """A Python path with a module and a name in it (`os.system`, `pkg.mod:Name`)."""
    return isinstance(value, str) and ("." in value or ":" in value) and bool(_DOTTED.fullmatch(value))


def allowed_paths() -> tuple[str, ...]:
    """The dotted paths an administrator lets the web and API name (CRUCIBLE_ALLOWED_EXTENSIONS)."""
    return tuple(settings.CONFIG.allowed_extensions)


def dotted_allowed(path: str, *, trusted: bool) -> bool:
    """May this caller name this dotted path? The CLI may; the web and API only an allowed one."""
    return trusted or path in allowed_paths()


def dotted_refusal(kind: str, path: str, registered: list[str]) -> str:
    """Why a dotted path from the web or API is refused, and how an administrator allows it."""
    return (f"{kind} {path!r} is a dotted path, and the web and API may name only registered "
            f"{kind}s ({', '.join(registered)}); nothing was imported. An administrator allows this "
            f"one by adding {path} to {SETTING}, or runs it with `manage.py evolve run`.")


def dotted_load(path: str, error: type[Exception]) -> Any:
    """Import `package.module:attr` or `package.module.attr`; only for a path already allowed."""
    module_name, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attribute:
        raise error(f"{path!r} is not a dotted path (package.module:name)")
    try:
        value: Any = importlib.import_module(module_name)
    except ImportError as problem:
        raise error(f"cannot import {module_name!r} for {path!r}: {problem}") from None
    try:
        for part in attribute.split("."):
            value = getattr(value, part)
    except AttributeError:
        raise error(f"{module_name!r} has no {attribute!r} ({path!r})") from None
    return value


def server_path(raw: str, *, trusted: bool, what: str, error: type[Exception]) -> Path:
    """A path on the server named in a request: under CRUCIBLE_REPO_ROOTS unless `trusted`
    (runtime_app's check). Every refusal reads the same, whether the path exists or not, so a
    refusal tells nothing about the server's files."""
    try:
        checked: Path = server_path_check(raw, trusted=trusted, what=what)
        return checked
    except ValidationError as refused:
        if trusted:  # the CLI's own mistake (an empty or unusable path): its message as it is
            raise error(" ".join(refused.messages)) from None
        roots = ", ".join(str(root) for root in settings.CONFIG.repo_roots) or \
            "none yet: an administrator sets CRUCIBLE_REPO_ROOTS"
        raise error(f"a {what} path from the web or API must be an absolute path under an allowed "
                    f"directory (CRUCIBLE_REPO_ROOTS: {roots})") from None
