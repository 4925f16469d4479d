"""Benchmarks: where an evolution run's tasks come from and how each answer is judged.

The A-Evolve seed's `BenchmarkAdapter` contract: `get_tasks(split, limit)` gives tasks in a
fixed order, `evaluate(task, trajectory)` gives a `Feedback`. The agent is never trusted: a
benchmark reads only `trajectory.output` (text) and `trajectory.error`; its self-verdict,
claimed steps and printed scores count for nothing.

Built-ins:

- `TaskFolderBenchmark(root)`: `<root>/<split>/<task_id>/` holds `input.md` (what the agent
  sees), an optional `category` file, and its check: `check.sh` (a script run by /bin/sh) or
  `check` (one shell command line). The check runs in the runtime sandbox in a fresh scratch
  folder holding a copy of the task folder and the agent's output as `output.txt`. Exit 0 is
  success; a score (0 to 1) may be reported by the runtime's metrics contract — a JSON object
  with `"score"` in the file `$CRUCIBLE_METRICS_FILE` or as the last line of stdout — and
  counts only after exit 0 (else 1.0 on success, 0.0 on failure).
- `JsonlBenchmark(path)`: one JSON object per line, `{"task_id", "input", "expected", "split",
  "category", "match"}`, judged in process by the `match` rule (MATCH_RULES).

A benchmark may need something of the host (`requires`, e.g. `docker`): a task folder says so
in `<root>/benchmark.yaml` (`requires: [docker]`), an adapter class in its `requires`
attribute. A requirement is `docker` (the docker command and a daemon: DOCKER_HOST or
/var/run/docker.sock) or the name of a program that must be on PATH; a benchmark whose
requirement the host lacks is refused by name ("benchmark X needs docker, which this host does
not have") — a task folder's when the run is requested, an installed or dotted adapter's when
it is made (its class is not imported before).

`benchmark_check(spec, trusted=...)` says whether a caller may name a benchmark, importing
nothing; `benchmark_get(spec, trusted=...)` checks the same and makes it (in a worker or the
CLI). A spec is a name registered in the `crucible.benchmarks` entry point group (`demo`,
`task-folder`, `jsonl` are built in), `name:argument` (the factory called with the argument,
e.g. `jsonl:/path/tasks.jsonl`; `folder:` is `task-folder:`; a built-in's path must lie under
CRUCIBLE_REPO_ROOTS unless trusted), or — from the CLI, or when CRUCIBLE_ALLOWED_EXTENSIONS
lists it — a dotted path (`package.module:name` or `package.module.name`) to a
BenchmarkAdapter subclass or instance, or to a function marked `@benchmark_factory`, never to
any other callable.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings

from evolve_app.extensions import (
    BENCHMARK_GROUP,
    dotted_allowed,
    dotted_load,
    dotted_refusal,
    installed,
    is_dotted,
    server_path,
)
from evolve_app.types import Feedback, Task, Trajectory
from runtime_app import sandbox
from runtime_app.metrics import metric_read

SPLITS = ("train", "holdout")
MATCH_RULES = ("exact", "normalized", "contains", "regex", "number")
ENTRY_POINT_GROUP = BENCHMARK_GROUP
NUMBER_TOLERANCE = 1e-6
CHECK_TIMEOUT_SECONDS = 120.0
MAX_OUTPUT_CHARS = 1 << 20  # what a check or a match rule gets to see of an agent's output
DETAIL_CHARS = 2000
DEMO_BENCHMARK = Path(__file__).resolve().parent / "demo" / "benchmark.jsonl"
_TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_JSONL_FIELDS = {"task_id", "input", "expected", "split", "category", "match", "metadata"}


class BenchmarkError(Exception):
    """A benchmark that cannot be found, loaded or used as asked; the message says why."""


class BenchmarkAdapter:
    """The seed's benchmark interface. `record`, if set, receives each sandbox receipt the
    benchmark makes (e.g. `runtime_app.services.receipt_record` bound to a run) and returns it."""

    name = "benchmark"
    record: Callable[[Any], Any] | None = None
    requires: tuple[str, ...] = ()  # what the host must have: "docker", or a program on PATH

    def get_tasks(self, split: str = "train", limit: int | None = 10) -> list[Task]:
        raise NotImplementedError

    def evaluate(self, task: Task, trajectory: Trajectory) -> Feedback:
        raise NotImplementedError


def host_has(requirement: str) -> bool:
    """Does this host have `requirement`: `docker` (its command and a daemon to talk to), else a
    program of that name on PATH."""
    if requirement == "docker":
        return bool(shutil.which("docker")) and bool(
            os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").is_socket())
    return bool(shutil.which(requirement))


def requirements_check(spec: str, requires: Any) -> None:
    """Raise BenchmarkError naming each requirement of benchmark `spec` this host lacks."""
    if isinstance(requires, str):
        requires = [requires]
    if not isinstance(requires, (list, tuple)) or not all(isinstance(r, str) and r.strip() for r in requires):
        raise BenchmarkError(f"benchmark {spec!r}: `requires` must be a list of names such as docker")
    missing = [r.strip() for r in requires if not host_has(r.strip())]
    if missing:
        raise BenchmarkError(f"benchmark {spec} needs {', '.join(missing)}, which this host does not have")


def folder_requires(root: Path) -> list[str]:
    """The `requires:` list of a task folder's benchmark.yaml ([] without one)."""
    path = root / "benchmark.yaml"
    if path.is_symlink() or not path.is_file():
        return []
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as error:
        raise BenchmarkError(f"{path}: not readable YAML ({error})") from None
    requires = data.get("requires", []) if isinstance(data, dict) else []
    return [requires] if isinstance(requires, str) else requires


def _split_check(split: str) -> None:
    if split not in SPLITS:
        raise BenchmarkError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")


def _limited(tasks: list[Task], limit: int | None) -> list[Task]:
    if limit is None or limit <= 0:
        return tasks
    return tasks[:limit]


def _agent_failed(trajectory: Trajectory) -> Feedback | None:
    if trajectory.error:
        return Feedback(False, 0.0, f"the agent did not finish: {trajectory.error[:DETAIL_CHARS]}")
    return None


def _excerpt(text: str, limit: int = 200) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


# ------------------------------------------------------------------------------ task folders


class TaskFolderBenchmark(BenchmarkAdapter):
    """Tasks as folders, judged by a check command in the sandbox (see the module docstring)."""

    name = "task-folder"

    def __init__(self, root: str | Path, *, timeout: float = CHECK_TIMEOUT_SECONDS, limits: Any = None,
                 isolation: str | None = None) -> None:
        self.root = Path(root).expanduser().resolve()
        if not self.root.is_dir():
            raise BenchmarkError(f"task folder benchmark {root}: no such folder")
        if not any((self.root / split).is_dir() for split in SPLITS):
            raise BenchmarkError(f"task folder benchmark {root}: it has neither train/ nor holdout/")
        self.timeout, self.limits, self.isolation = timeout, limits, isolation
        self.requires = tuple(folder_requires(self.root))

    def _folder(self, split: str, task_id: str) -> Path:
        _split_check(split)
        if not _TASK_ID.fullmatch(task_id):
            raise BenchmarkError(f"task id {task_id!r} is not a task folder name")
        folder = self.root / split / task_id
        if folder.is_symlink() or not folder.is_dir():
            raise BenchmarkError(f"no task {split}/{task_id} in {self.root}")
        return folder

    def _task(self, split: str, folder: Path) -> Task:
        where = f"{split}/{folder.name}"
        if not _TASK_ID.fullmatch(folder.name):
            raise BenchmarkError(f"task folder {where}: its name must be letters, digits, '.', '_', '-'")
        prompt = folder / "input.md"
        if prompt.is_symlink() or not prompt.is_file():
            raise BenchmarkError(f"task folder {where} has no input.md")
        if not any((folder / name).is_file() for name in ("check.sh", "check")):
            raise BenchmarkError(f"task folder {where} has no check.sh or check file")
        category_file = folder / "category"
        category = category_file.read_text().strip() if category_file.is_file() else ""
        return Task(task_id=folder.name, input=prompt.read_text(), category=category,
                    metadata={"split": split})

    def get_tasks(self, split: str = "train", limit: int | None = 10) -> list[Task]:
        _split_check(split)
        base = self.root / split
        if not base.is_dir():
            return []
        folders = sorted(path for path in base.iterdir() if path.is_dir() and not path.name.startswith("."))
        return _limited([self._task(split, folder) for folder in folders], limit)

    def _check_command(self, folder: Path) -> list[str] | str:
        if (folder / "check.sh").is_file():
            return ["/bin/sh", "check.sh"]
        line = (folder / "check").read_text().strip()
        if not line:
            raise BenchmarkError(f"the check file of {folder.name} is empty")
        return line

    def evaluate(self, task: Task, trajectory: Trajectory) -> Feedback:
        split = str(task.metadata.get("split", "train"))
        folder = self._folder(split, task.task_id)  # found again from the id, never from a path
        failed = _agent_failed(trajectory)
        if failed is not None:
            return failed
        command = self._check_command(folder)
        scratch = Path(settings.DATA_DIR) / "evolve" / "checks" / f"{task.task_id}-{uuid.uuid4().hex[:12]}"
        try:
            shutil.copytree(folder, scratch, symlinks=True)
            output = trajectory.output[:MAX_OUTPUT_CHARS]
            (scratch / "output.txt").write_text(output, encoding="utf-8", errors="replace")
            metrics_file = scratch / ".crucible-metrics.json"
            metrics_file.unlink(missing_ok=True)
            try:
                receipt = sandbox.run(
                    command, cwd=scratch, timeout=self.timeout, limits=self.limits, isolation=self.isolation,
                    env={"CRUCIBLE_TASK_ID": task.task_id, "CRUCIBLE_METRICS_FILE": str(metrics_file)},
                    kind="check",
                )
            except sandbox.SandboxError as error:
                return Feedback(False, 0.0, f"the check could not run: {error}")
            if self.record is not None:
                receipt = self.record(receipt)
            return self._judge(receipt, metrics_file, cut=len(trajectory.output) > MAX_OUTPUT_CHARS)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _judge(self, receipt: Any, metrics_file: Path, cut: bool) -> Feedback:
        said = (receipt.stderr_excerpt.strip() or receipt.stdout_excerpt.strip())[-DETAIL_CHARS:]
        note = f" (the output was cut to its first {MAX_OUTPUT_CHARS:,} characters)" if cut else ""
        if receipt.timed_out:
            return Feedback(False, 0.0, f"the check timed out after {self.timeout:g} s{note}")
        if not receipt.succeeded:
            said = f": {said}" if said else ""
            return Feedback(False, 0.0, f"the check failed ({receipt.outcome}){note}{said}")
        reading = metric_read(receipt, "score", metrics_file)
        if reading.value is None:  # not counted
            return Feedback(True, 1.0, f"the check passed{note}")
        if not 0.0 <= reading.value <= 1.0:
            return Feedback(False, 0.0, f"the check reported score {reading.value:g}, outside 0 to 1")
        return Feedback(True, reading.value,
                        f"the check passed with score {reading.value:g} ({reading.reason})")


# ------------------------------------------------------------------------------------ JSONL


def normalize(text: str) -> str:
    """Case-folded, whitespace runs made one space, trimmed, without a trailing period."""
    return re.sub(r"\s+", " ", text.casefold()).strip().removesuffix(".").strip()


def _number(text: str) -> float | None:
    if "_" in text:  # float() reads "1_000"; an answer never should
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def match(rule: str, expected: str, output: str) -> bool:
    """Does `output` satisfy `expected` under `rule` (one of MATCH_RULES)?

    exact: equal after trimming surrounding whitespace; normalized: equal after `normalize`;
    contains: the normalized expected text occurs in the normalized output; regex: the pattern
    matches the whole trimmed output; number: the trimmed output is a finite number within
    1e-6 (absolute or relative) of the expected one.
    """
    output = output[:MAX_OUTPUT_CHARS]
    if rule == "exact":
        return output.strip() == expected.strip()
    if rule == "normalized":
        return normalize(output) == normalize(expected)
    if rule == "contains":
        return normalize(expected) in normalize(output)
    if rule == "regex":
        return re.fullmatch(expected, output.strip(), re.DOTALL) is not None
    if rule == "number":
        got, want = _number(output), _number(expected)
        return got is not None and want is not None and math.isclose(
            got, want, rel_tol=NUMBER_TOLERANCE, abs_tol=NUMBER_TOLERANCE)
    raise BenchmarkError(f"unknown match rule {rule!r}; use one of {', '.join(MATCH_RULES)}")


class JsonlBenchmark(BenchmarkAdapter):
    """Tasks from a JSONL file, judged in process by each line's match rule."""

    name = "jsonl"

    def __init__(self, path: str | Path, *, reveal_expected: bool = False) -> None:
        self.path = Path(path).expanduser().resolve()
        self.reveal_expected = reveal_expected
        self.tasks: dict[str, list[Task]] = {split: [] for split in SPLITS}
        self.answers: dict[tuple[str, str], tuple[str, str]] = {}  # (split, id) -> (expected, rule)
        self._load()

    def _load(self) -> None:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise BenchmarkError(f"JSONL benchmark {self.path}: cannot read it ({error})") from None
        seen: dict[str, int] = {}
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{self.path.name} line {number}"
            try:
                row = json.loads(line)
            except ValueError as error:
                raise BenchmarkError(f"{where}: not valid JSON ({error})") from None
            if not isinstance(row, dict):
                raise BenchmarkError(f"{where}: expected a JSON object, got {type(row).__name__}")
            unknown = sorted(set(row) - _JSONL_FIELDS)
            if unknown:
                raise BenchmarkError(f"{where}: unknown field(s) {', '.join(unknown)}; "
                                     f"allowed: {', '.join(sorted(_JSONL_FIELDS))}")
            for name in ("task_id", "input", "expected"):
                if name not in row:
                    raise BenchmarkError(f"{where}: missing {name!r}")
            task_id, text, expected = row["task_id"], row["input"], row["expected"]
            if not isinstance(task_id, str) or not _TASK_ID.fullmatch(task_id):
                raise BenchmarkError(f"{where}: task_id must be 1-200 letters, digits, '.', '_', '-' "
                                     f"starting with a letter or digit, got {task_id!r}")
            if task_id in seen:
                raise BenchmarkError(f"{where}: task_id {task_id!r} repeats line {seen[task_id]}")
            seen[task_id] = number
            if not isinstance(text, str) or not text.strip():
                raise BenchmarkError(f"{where}: input must be non-empty text")
            if isinstance(expected, bool) or not isinstance(expected, (str, int, float)):
                raise BenchmarkError(f"{where}: expected must be text or a number")
            expected = expected if isinstance(expected, str) else repr(expected)
            split, category = row.get("split", "train"), row.get("category", "")
            rule, metadata = row.get("match", "exact"), row.get("metadata", {})
            if split not in SPLITS:
                raise BenchmarkError(f"{where}: split {split!r}; use one of {', '.join(SPLITS)}")
            if not isinstance(category, str):
                raise BenchmarkError(f"{where}: category must be text")
            if rule not in MATCH_RULES:
                raise BenchmarkError(f"{where}: match {rule!r}; use one of {', '.join(MATCH_RULES)}")
            if not isinstance(metadata, dict):
                raise BenchmarkError(f"{where}: metadata must be an object")
            if rule == "regex":
                try:
                    re.compile(expected)
                except re.error as error:
                    raise BenchmarkError(f"{where}: expected is not a valid regular expression "
                                         f"({error})") from None
            if rule == "number" and _number(expected) is None:
                raise BenchmarkError(f"{where}: match 'number' needs a finite number as expected, "
                                     f"got {expected!r}")
            self.tasks[split].append(Task(task_id=task_id, input=text, category=category,
                                          metadata={**metadata, "split": split, "match": rule}))
            self.answers[(split, task_id)] = (expected, rule)

    def get_tasks(self, split: str = "train", limit: int | None = 10) -> list[Task]:
        _split_check(split)
        return _limited(list(self.tasks[split]), limit)

    def evaluate(self, task: Task, trajectory: Trajectory) -> Feedback:
        split = str(task.metadata.get("split", "train"))
        _split_check(split)
        if (split, task.task_id) not in self.answers:
            raise BenchmarkError(f"no task {split}/{task.task_id} in {self.path.name}")
        expected, rule = self.answers[(split, task.task_id)]  # from the file, never from the task
        failed = _agent_failed(trajectory)
        if failed is not None:
            return failed
        if match(rule, expected, trajectory.output):
            return Feedback(True, 1.0, f"the output matches ({rule})")
        wanted = f"; expected {_excerpt(expected)}" if self.reveal_expected else ""
        got = _excerpt(trajectory.output.strip())
        return Feedback(False, 0.0, f"the output does not match ({rule}): got {got}{wanted}")


def benchmark_factory(function: Callable[..., BenchmarkAdapter]) -> Callable[..., BenchmarkAdapter]:
    """Marks a function as a benchmark factory, so `benchmark_get` may call it by dotted path
    (a dotted path may only name such a function or a BenchmarkAdapter subclass)."""
    function.__dict__["crucible_benchmark"] = True  # a function's attribute, which Callable does not declare
    return function


@benchmark_factory
def demo_benchmark() -> JsonlBenchmark:
    """The offline demo (evolve_app/demo/README.md): 12 train and 8 holdout tasks in 4 categories."""
    return JsonlBenchmark(DEMO_BENCHMARK)


# --------------------------------------------------------------------------------- registry

_BUILTINS: dict[str, Callable[..., BenchmarkAdapter]] = {
    "demo": demo_benchmark, "task-folder": TaskFolderBenchmark, "jsonl": JsonlBenchmark,
}
_PATH_KINDS = {"task-folder": "folder", "jsonl": "file"}  # built-ins whose argument is a server path
_ALIASES = {"folder": "task-folder"}
ALIASES = _ALIASES  # what a spec may call a built-in (`folder:PATH`), for the start form
# A built-in named by its dotted path (its entry point's value) is the built-in, found by lookup.
_BUILTIN_PATHS = {f"evolve_app.benchmarks{sep}{made.__name__}": name for name, made in _BUILTINS.items()
                  for sep in (".", ":")}


def benchmark_names() -> list[str]:
    """Every benchmark the web and API may name (built-ins and installed entry points), sorted."""
    return sorted(set(_BUILTINS) | set(installed(BENCHMARK_GROUP)))


_DESCRIPTIONS = {
    "demo": "the offline demo: 12 train and 8 holdout tasks in 4 categories",
    "task-folder": "a folder of tasks on the server (give its path)",
    "jsonl": "a JSONL file of tasks on the server (give its path)",
}


def benchmark_choices() -> list[tuple[str, str, str | None]]:
    """(name, what it is, its argument) of every benchmark benchmark_names() offers, for a select
    and the path field beside it. The argument is "folder" or "file" (a server path it needs),
    "optional" (an installed entry point's factory may take one) or None (it takes none)."""
    points = installed(BENCHMARK_GROUP)
    return [(name, _DESCRIPTIONS.get(name) or f"installed: {points[name].value}",
             _PATH_KINDS.get(name) or (None if name in _BUILTINS else "optional"))
            for name in benchmark_names()]


def _builtin_argument(name: str, spec: str, argument: str | None, trusted: bool) -> tuple[Any, ...]:
    """A built-in's arguments, checked without making it: a path must be under CRUCIBLE_REPO_ROOTS
    unless trusted (refused alike whether it exists or not), and then exist."""
    kind = _PATH_KINDS.get(name)
    if kind is None:
        if argument is not None:
            raise BenchmarkError(f"benchmark {spec!r}: {name} takes no argument")
        return ()
    if argument is None:
        raise BenchmarkError(f"benchmark {spec!r} needs a {kind}; give it one as {name}:<argument>")
    path = server_path(argument, trusted=trusted, what="benchmark", error=BenchmarkError)
    if kind == "folder" and not path.is_dir():
        raise BenchmarkError(f"task folder benchmark {argument}: no such folder")
    if kind == "folder":
        requirements_check(spec, folder_requires(path))
    if kind == "file" and not path.is_file():
        raise BenchmarkError(f"JSONL benchmark {argument}: no such file")
    return (path,)


def _resolve(name_or_spec: str, trusted: bool) -> tuple[str, str, tuple[Any, ...]]:
    """("builtin" | "installed" | "dotted", what to make, its arguments), or BenchmarkError.
    A lookup: nothing is imported."""
    spec = (name_or_spec or "").strip()
    if not spec:
        raise BenchmarkError("no benchmark named; use a registered name, folder:/path or jsonl:/path")
    name, colon, argument = spec.partition(":")
    name = _ALIASES.get(name, name)
    if colon and name in _BUILTINS | installed(BENCHMARK_GROUP) and not argument.strip():
        raise BenchmarkError(f"benchmark {spec!r}: nothing after the colon")
    given = argument.strip() if colon else None
    if name in _BUILTINS:
        return "builtin", name, _builtin_argument(name, spec, given, trusted)
    if spec in _BUILTIN_PATHS:
        return "builtin", _BUILTIN_PATHS[spec], ()
    if name in installed(BENCHMARK_GROUP):
        return "installed", name, (given,) if colon else ()
    if is_dotted(spec):
        if not dotted_allowed(spec, trusted=trusted):
            raise BenchmarkError(dotted_refusal("benchmark", spec, benchmark_names()))
        return "dotted", spec, ()
    raise BenchmarkError(
        f"unknown benchmark {spec!r}; registered: {', '.join(benchmark_names())}; or use folder:/path "
        "or jsonl:/path (a dotted path package.module:factory only from the CLI or "
        "CRUCIBLE_ALLOWED_EXTENSIONS)"
    )


def benchmark_check(name_or_spec: str, *, trusted: bool = False) -> None:
    """Raise BenchmarkError unless this caller may name this benchmark. A name lookup and path
    checks: nothing is imported, made or called. `trusted` (the CLI) may give any path and a
    dotted path; the web and API paths under CRUCIBLE_REPO_ROOTS and the dotted paths listed in
    CRUCIBLE_ALLOWED_EXTENSIONS."""
    _resolve(name_or_spec, trusted)


def _adapter(value: Any, spec: str, *args: Any) -> BenchmarkAdapter:
    try:
        made = value(*args) if callable(value) and not isinstance(value, BenchmarkAdapter) else value
    except BenchmarkError:
        raise
    except TypeError as error:
        hint = f"; give it one as {spec}:<argument>" if not args and "required" in str(error) else ""
        raise BenchmarkError(f"benchmark {spec!r} could not be made: {error}{hint}") from None
    if not (callable(getattr(made, "get_tasks", None)) and callable(getattr(made, "evaluate", None))):
        raise BenchmarkError(f"benchmark {spec!r} gave {type(made).__name__}, which has no "
                             "get_tasks/evaluate")
    requirements_check(spec, getattr(made, "requires", ()) or ())
    adapter: BenchmarkAdapter = made  # or anything with get_tasks and evaluate, as checked above
    return adapter


def benchmark_get(name_or_spec: str, *, trusted: bool = False) -> BenchmarkAdapter:
    """The benchmark `name_or_spec` names (see benchmark_check, which it calls first with the
    same trust), made: `demo`, `jsonl:/path`, `folder:/path`, `task-folder:/path`, an entry
    point of `crucible.benchmarks` (with `:argument` if its factory takes one), or an allowed
    dotted path to a factory or class."""
    spec = (name_or_spec or "").strip()
    kind, target, args = _resolve(spec, trusted)
    if kind == "builtin":
        return _adapter(_BUILTINS[target], spec, *args)
    if kind == "installed":
        try:
            value = installed(BENCHMARK_GROUP)[target].load()
        except Exception as error:  # an installed package's own failure to load
            raise BenchmarkError(f"benchmark {target!r} cannot be loaded: {type(error).__name__}: "
                                 f"{error}") from None
        return _adapter(value, spec, *args)
    value = dotted_load(target, BenchmarkError)
    is_class = isinstance(value, type) and issubclass(value, BenchmarkAdapter)
    marked = getattr(value, "crucible_benchmark", False) is True
    if not (is_class or isinstance(value, BenchmarkAdapter) or marked):
        raise BenchmarkError(f"{spec!r} is not a benchmark: a dotted path must name a BenchmarkAdapter "
                             "subclass or instance, or a function marked with @benchmark_factory")
    return _adapter(value, spec)
