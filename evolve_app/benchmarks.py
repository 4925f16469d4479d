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

Any other benchmark with `get_tasks`/`evaluate` — an A-Evolve `BenchmarkAdapter` subclass, or one
written to its shape — is wrapped by `benchmark_adapt` (UpstreamBenchmark): its tasks become
Crucible's Tasks, `evaluate` gets back the task object it gave and A-Evolve's Trajectory, and its
Feedback becomes Crucible's (`raw` kept; a score that is not a number from 0 to 1, or an
exception, is a failed verdict with the reason). A-Evolve's registry keys (AEVOLVE_BENCHMARKS:
`swe-verified`, `mcp-atlas`, `terminal2` ...) name its classes, refused at request, naming what
the host lacks (Docker, a dataset, a server, a key, the module), until the host has it.

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
CRUCIBLE_REPO_ROOTS unless trusted), an A-Evolve registry key, or — from the CLI, or when
CRUCIBLE_ALLOWED_EXTENSIONS lists it — a dotted path (`package.module:name` or
`package.module.name`) to a BenchmarkAdapter subclass or instance (Crucible's or A-Evolve's), or
to a function marked `@benchmark_factory`, never to any other callable.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import math
import numbers
import os
import re
import shutil
import socket
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
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


DOCKER_SOCKET = Path("/var/run/docker.sock")
PROBE_SECONDS = 1.0  # how long a socket may take to answer whether a daemon or server is there


def _answers(family: int, address: Any) -> bool:
    """Does something accept a connection at `address` (a unix socket path or (host, port))?"""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(PROBE_SECONDS)
            probe.connect(address)
        return True
    except OSError:
        return False


def _module_file_exists(dotted: str) -> bool:
    """Is there a source file or package for module `dotted`? Found from its top-level package's
    folder, so nothing is imported (find_spec of a submodule would import its parents)."""
    top, *rest = dotted.split(".")
    try:
        spec = importlib.util.find_spec(top) if top not in sys.modules else sys.modules[top].__spec__
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    if not rest:
        return True
    for folder in spec.submodule_search_locations or []:
        base = Path(folder).joinpath(*rest[:-1])
        if (base / f"{rest[-1]}.py").is_file() or (base / rest[-1] / "__init__.py").is_file():
            return True
    return False


def host_has(requirement: str) -> bool:
    """Does this host have `requirement`? Nothing is imported or started to find out.

    `docker`: the docker command and a daemon that answers (DOCKER_HOST, or a connection to
    /var/run/docker.sock); `python:NAME`: an installed top-level package; `module:a.b.c`: that
    module's file; `env:A|B`: one of these environment variables set; `path-env:A|B`: one of them
    naming a folder that exists; `server:HOST:PORT`: something accepting connections there; any
    other name: a program on PATH."""
    kind, _, what = requirement.partition(":")
    if requirement == "docker":
        return bool(shutil.which("docker")) and bool(
            os.environ.get("DOCKER_HOST") or (DOCKER_SOCKET.is_socket()
                                              and _answers(socket.AF_UNIX, str(DOCKER_SOCKET))))
    if kind == "python":
        return _module_file_exists(what) and "." not in what
    if kind == "module":
        return _module_file_exists(what)
    if kind == "env":
        return any(os.environ.get(name, "").strip() for name in what.split("|"))
    if kind == "path-env":
        return any(os.environ.get(name, "").strip() and Path(os.environ[name]).expanduser().is_dir()
                   for name in what.split("|"))
    if kind == "server":
        host, _, port = what.rpartition(":")
        return port.isdigit() and _answers(socket.AF_INET, (host or "localhost", int(port)))
    return bool(shutil.which(requirement))


def requirement_words(requirement: str) -> str:
    """What a requirement (see host_has) is, in words for a refusal or a choice."""
    kind, _, what = requirement.partition(":")
    names = " or ".join(what.split("|"))
    if requirement == "docker":
        return "Docker (the docker command and a daemon that answers)"
    return {"python": f"the Python package {what}", "module": f"the module {what}",
            "env": f"the environment variable {names}",
            "path-env": f"a local dataset folder named by {names}",
            "server": f"a server at {what}"}.get(kind, requirement)


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


# ------------------------------------------------------------------ any BenchmarkAdapter, wrapped

AEVOLVE_PACKAGE = "agent_evolve"


def task_down(value: Any) -> Task:
    """`value` as Crucible's Task: itself, or one made from an object with A-Evolve's `id`,
    `input` and `metadata` (a `task_id` is taken for `id`; the metadata's `category`, if text, is
    the category, and stays in the metadata). Raises BenchmarkError for anything without an id."""
    if isinstance(value, Task):
        return value
    ident = getattr(value, "id", None)
    ident = getattr(value, "task_id", None) if ident is None else ident
    if ident is None or isinstance(ident, (dict, list)) or str(ident).strip() == "":
        raise BenchmarkError(f"a task of type {type(value).__name__} has no id")
    metadata = getattr(value, "metadata", None)
    metadata = dict(metadata) if isinstance(metadata, dict) else {}
    category = metadata.get("category", "")
    text = getattr(value, "input", "")
    return Task(id=str(ident), input=text if isinstance(text, str) else json.dumps(text, default=str),
                category=category if isinstance(category, str) else "", metadata=metadata)


def feedback_down(value: Any, where: str = "the benchmark") -> Feedback:
    """A benchmark's verdict as Crucible's Feedback: `success`, `score` (a finite number from 0 to
    1), `detail` and `raw` (kept). Anything else is a failed verdict that says why, never an error."""
    score = getattr(value, "score", None)
    raw = getattr(value, "raw", None)
    raw = dict(raw) if isinstance(raw, dict) else {}
    detail = getattr(value, "detail", "")
    detail = detail if isinstance(detail, str) else str(detail)
    if value is None or not hasattr(value, "score") or not hasattr(value, "success"):
        return feedback_make(False, 0.0, f"{where} gave {type(value).__name__}, not a Feedback "
                                         "(success, score, detail)", raw)
    if isinstance(score, bool) or not isinstance(score, numbers.Real) or not math.isfinite(float(score)):
        why = f"{where} gave score {score!r}, not a number: {detail}"
        return feedback_make(False, 0.0, why[:DETAIL_CHARS], raw)
    if not 0.0 <= float(score) <= 1.0:
        return feedback_make(False, 0.0, f"{where} gave score {float(score):g}, outside 0 to 1: "
                                         f"{detail}"[:DETAIL_CHARS], raw)
    return feedback_make(bool(getattr(value, "success", False)), float(score), detail, raw)


def feedback_make(success: bool, score: float, detail: str, raw: dict[str, Any] | None = None) -> Feedback:
    """Crucible's Feedback with `raw` kept: as its field where Feedback has one, else carried as an
    attribute (read it with getattr(feedback, "raw", {}))."""
    raw = raw or {}
    if "raw" in {f.name for f in dataclasses.fields(Feedback)}:
        return Feedback(success, score, detail, raw=raw)  # type: ignore[call-arg]  # the field another branch adds
    made = Feedback(success, score, detail)
    object.__setattr__(made, "raw", raw)  # frozen: set the way its own __init__ sets fields
    return made


def _upstream_module() -> Any:
    """evolve_app.aevolve_upstream (A-Evolve's types and the conversions), or None without a-evolve."""
    if importlib.util.find_spec(AEVOLVE_PACKAGE) is None:
        return None
    return importlib.import_module("evolve_app.aevolve_upstream")


class UpstreamBenchmark(BenchmarkAdapter):
    """Any benchmark with `get_tasks`/`evaluate` (an A-Evolve BenchmarkAdapter subclass, or one
    written to its shape), converted both ways: its tasks become Crucible's Tasks; `evaluate` gets
    back the task object it gave and, for a task that was not Crucible's, A-Evolve's Trajectory
    (task_id, output, steps, conversation); its Feedback becomes Crucible's, `raw` kept. A score
    outside 0 to 1, one that is not a number, or an exception is a failed verdict with the
    reason. An agent that did not finish fails without asking the benchmark."""

    def __init__(self, inner: Any, spec: str = "") -> None:
        self.inner = inner
        self.spec = spec or type(inner).__name__
        self.name = str(getattr(inner, "name", "") or type(inner).__name__)
        self.requires = tuple(getattr(inner, "requires", ()) or ())
        self._given: dict[str, tuple[Any, Task]] = {}  # task id -> (the object it gave, as Crucible's)

    def __getattr__(self, name: str) -> Any:  # the wrapped benchmark's own attributes (its options)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def get_tasks(self, split: str = "train", limit: int | None = 10) -> list[Task]:
        try:
            given = self.inner.get_tasks(split, limit)
        except Exception as error:  # its own failure (a dataset it cannot load): said, by name
            raise BenchmarkError(f"benchmark {self.spec} could not give {split} tasks: "
                                 f"{type(error).__name__}: {error}") from error
        if given is None:
            return []
        tasks = []
        for value in list(given):
            task = task_down(value)
            if task is not value:  # the object it gave rides along, for an A-Evolve agent's solve()
                object.__setattr__(task, "_upstream", value)
            self._given[task.task_id] = (value, task)
            tasks.append(task)
        return _limited(tasks, limit)

    def _as_given(self, task: Task, trajectory: Trajectory) -> tuple[Any, Any]:
        """The task and trajectory in the benchmark's own types: the task object it gave for this
        task (else one made from it), A-Evolve's Trajectory unless it gave Crucible's Task."""
        original, made = self._given.get(task.task_id, (None, None))
        if made != task:  # a task it did not give (or gave differently since): made from ours
            original = None
        if isinstance(original, Task) or (original is None and not _is_upstream_class(type(self.inner))):
            return original or task, trajectory
        upstream = _upstream_module()
        if upstream is None:  # written to A-Evolve's shape without the package: Crucible's types
            return original or task, trajectory
        # An A-Evolve agent's own Trajectory, where the drop-in's agent wrapper kept it, else one made.
        own = getattr(trajectory, "_upstream", None)
        made_up = own if own is not None else upstream.trajectory_up(trajectory)
        return original or upstream.task_up(task), made_up

    def evaluate(self, task: Task, trajectory: Trajectory) -> Feedback:
        failed = _agent_failed(trajectory)
        if failed is not None:
            return failed
        try:
            given_task, given_trajectory = self._as_given(task, trajectory)
            verdict = self.inner.evaluate(given_task, given_trajectory)
        except Exception as error:
            return feedback_make(False, 0.0, f"the benchmark could not evaluate it: {type(error).__name__}: "
                                             f"{error}"[:DETAIL_CHARS])
        return feedback_down(verdict, f"benchmark {self.spec}")


def benchmark_adapt(value: Any, spec: str = "") -> BenchmarkAdapter:
    """A benchmark the loop can use: Crucible's adapters as they are; anything else with
    `get_tasks` and `evaluate` (an A-Evolve BenchmarkAdapter, or one written to its shape) wrapped
    in UpstreamBenchmark. Raises BenchmarkError, with the reason, for anything else."""
    if isinstance(value, BenchmarkAdapter):
        return value
    named = spec or type(value).__name__
    if isinstance(value, type):
        raise BenchmarkError(f"benchmark {named!r} is a class, not a benchmark: make one first")
    if not (callable(getattr(value, "get_tasks", None)) and callable(getattr(value, "evaluate", None))):
        raise BenchmarkError(f"benchmark {named!r} gave {type(value).__name__}, which has no "
                             "get_tasks/evaluate")
    return UpstreamBenchmark(value, named)


# ------------------------------------------------------------------ A-Evolve's registry keys


@dataclass(frozen=True)
class Need:
    """One thing an A-Evolve benchmark needs of the host: a requirement (see host_has) and why."""

    requirement: str
    why: str


@dataclass(frozen=True)
class UpstreamKey:
    """An A-Evolve registry key: where its class is (the first path whose module this a-evolve
    ships) and what the class needs to run, read from its source."""

    paths: tuple[str, ...]
    needs: tuple[Need, ...]
    what: str


_SWE_NEEDS = (
    Need("python:swebench", "the SWE-bench harness that builds each task's test spec and grades it"),
    Need("python:datasets", "HuggingFace datasets, to load SWE-bench Verified"),
    Need("docker", "each task's repository is set up, run and graded in its own container"),
)
_TB2_NEEDS = (
    Need("docker", "each challenge and its test.sh run in the challenge's container"),
    Need("path-env:TB2_CHALLENGES_DIR", "the Terminal-Bench 2.0 challenges (eval.yaml, compose.yaml, "
                                         "tests), fetched by the package's tb2/download_challenges.sh"),
)
_ARC_NEEDS = (
    Need("python:arc_agi", "the ARC Prize arcade toolkit the games are played through"),
)
# A-Evolve's `_BENCHMARK_REGISTRY` (api.py: 0.1.0, and the keys its GitHub HEAD adds), each with
# what its class needs, read from its source.
AEVOLVE_BENCHMARKS: dict[str, UpstreamKey] = {
    "swe-verified": UpstreamKey(("agent_evolve.benchmarks.swe_verified.SweVerifiedBenchmark",), _SWE_NEEDS,
                                "A-Evolve's SWE-bench Verified"),
    "mcp-atlas": UpstreamKey(("agent_evolve.benchmarks.mcp_atlas.McpAtlasBenchmark",), (
        Need("python:datasets", "HuggingFace datasets, to load ScaleAI/MCP-Atlas"),
        Need("python:litellm", "the LLM judge that scores each claim (LiteLLM, its default)"),
        Need("env:EVAL_LLM_API_KEY|LLM_API_KEY", "the judge's API key (without it every claim is scored "
                                                  "not fulfilled)"),
        Need("server:localhost:1984", "the MCP-Atlas tool server its agent's tools call (started from its "
                                      "Docker image)"),
    ), "A-Evolve's MCP-Atlas"),
    # Listed by 0.1.0 and HEAD alike, shipped by neither: only its module can be named as missing.
    "hle": UpstreamKey(("agent_evolve.benchmarks.hle.HleBenchmark",), (), "A-Evolve's Humanity's Last Exam"),
    "terminal2": UpstreamKey(("agent_evolve.benchmarks.terminal2.Terminal2Benchmark",
                              "agent_evolve.benchmarks.tb2.terminal2.Terminal2Benchmark"), _TB2_NEEDS,
                             "A-Evolve's Terminal-Bench 2.0"),
    "terminal-bench": UpstreamKey(("agent_evolve.benchmarks.terminal2.Terminal2Benchmark",
                                   "agent_evolve.benchmarks.tb2.terminal2.Terminal2Benchmark"), _TB2_NEEDS,
                                  "A-Evolve's Terminal-Bench 2.0"),
    "skill-bench": UpstreamKey(("agent_evolve.benchmarks.skill_bench.SkillBenchBenchmark",), (
        Need("docker", "each task's environment and test.sh run in a container built from its Dockerfile"),
        Need("path-env:SKILLBENCH_TASKS_DIR|SKILLBENCH_REPO_DIR",
             "a local SkillsBench checkout (else it clones github.com/benchflow-ai/skillsbench when made)"),
    ), "A-Evolve's SkillsBench"),
    "arc-agi-3": UpstreamKey(("agent_evolve.benchmarks.arc_agi3.ArcAgi3Benchmark",), _ARC_NEEDS,
                             "A-Evolve's ARC-AGI-3 games"),
    "arc-agi3": UpstreamKey(("agent_evolve.benchmarks.arc_agi3.ArcAgi3Benchmark",), _ARC_NEEDS,
                            "A-Evolve's ARC-AGI-3 games"),
    "arc": UpstreamKey(("agent_evolve.benchmarks.arc_agi3.ArcAgi3Benchmark",), _ARC_NEEDS,
                       "A-Evolve's ARC-AGI-3 games"),
}


def _module_of(path: str) -> str:
    return path.rpartition(".")[0]


def upstream_key_problems(key: str) -> tuple[str | None, list[tuple[str, str]]]:
    """(the class path to make, or None, and each (requirement, why) this host lacks) for an
    A-Evolve registry key. Nothing is imported."""
    entry = AEVOLVE_BENCHMARKS[key]
    missing: list[tuple[str, str]] = []
    found = None
    if not host_has(f"python:{AEVOLVE_PACKAGE}"):
        missing.append((f"python:{AEVOLVE_PACKAGE}", "the a-evolve package, where its benchmarks live"))
    else:
        found = next((path for path in entry.paths if host_has(f"module:{_module_of(path)}")), None)
        if found is None:
            missing.append((f"module:{_module_of(entry.paths[0])}",
                            "A-Evolve's registry names it, and the installed a-evolve ships no such module"))
    missing += [(need.requirement, need.why) for need in entry.needs if not host_has(need.requirement)]
    return found, missing


def _upstream_check(key: str, spec: str) -> str:
    found, missing = upstream_key_problems(key)
    if missing or found is None:
        needs = "; ".join(f"{requirement_words(requirement)} — {why}" for requirement, why in missing)
        raise BenchmarkError(f"benchmark {spec} ({AEVOLVE_BENCHMARKS[key].what}) cannot run on this host, "
                             f"which lacks {needs}")
    return found


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
    """Every benchmark the web and API may name (built-ins, installed entry points and A-Evolve's
    registry keys), sorted."""
    return sorted(set(_BUILTINS) | set(installed(BENCHMARK_GROUP)) | set(AEVOLVE_BENCHMARKS))


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
    takes_none = set(_BUILTINS) | set(AEVOLVE_BENCHMARKS)
    return [(name, _DESCRIPTIONS.get(name) or _upstream_description(name)
             or f"installed: {points[name].value}",
             _PATH_KINDS.get(name) or (None if name in takes_none else "optional"))
            for name in benchmark_names()]


def _upstream_description(name: str) -> str:
    """An A-Evolve key for the start form: what it is, and what it needs that this host lacks."""
    entry = AEVOLVE_BENCHMARKS.get(name)
    if entry is None or name in installed(BENCHMARK_GROUP):
        return ""
    _, missing = upstream_key_problems(name)
    if not missing:
        return f"{entry.what} (ready on this host)"
    return f"{entry.what}; this host lacks {', '.join(requirement_words(r) for r, _ in missing)}"


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
    if spec in AEVOLVE_BENCHMARKS:  # A-Evolve's registry key: its class, if this host can run it
        return "upstream", _upstream_check(spec, spec), ()
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
    to_make = isinstance(value, type) or (callable(value) and not hasattr(value, "get_tasks"))
    try:
        made = value(*args) if to_make else value
    except BenchmarkError:
        raise
    except TypeError as error:
        hint = f"; give it one as {spec}:<argument>" if not args and "required" in str(error) else ""
        raise BenchmarkError(f"benchmark {spec!r} could not be made: {error}{hint}") from None
    except Exception as error:  # its own setup failing (a dataset or a folder it cannot find)
        why = f"{type(error).__name__}: {error}"
        raise BenchmarkError(f"benchmark {spec!r} could not be made: {why}") from None
    if not (callable(getattr(made, "get_tasks", None)) and callable(getattr(made, "evaluate", None))):
        raise BenchmarkError(f"benchmark {spec!r} gave {type(made).__name__}, which has no "
                             "get_tasks/evaluate")
    requirements_check(spec, getattr(made, "requires", ()) or ())
    return benchmark_adapt(made, spec)


def benchmark_get(name_or_spec: str, *, trusted: bool = False) -> BenchmarkAdapter:
    """The benchmark `name_or_spec` names (see benchmark_check, which it calls first with the
    same trust), made: `demo`, `jsonl:/path`, `folder:/path`, `task-folder:/path`, an entry
    point of `crucible.benchmarks` (with `:argument` if its factory takes one), an A-Evolve
    registry key (its class, made without arguments as A-Evolve makes it), or an allowed dotted
    path to a factory or class (Crucible's BenchmarkAdapter or A-Evolve's). Anything that is not
    Crucible's own adapter comes wrapped by benchmark_adapt."""
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
    if kind == "upstream":
        return _adapter(value, spec)
    is_class = isinstance(value, type) and (issubclass(value, BenchmarkAdapter) or _is_upstream_class(value))
    marked = getattr(value, "crucible_benchmark", False) is True
    if not (is_class or isinstance(value, BenchmarkAdapter) or _is_upstream_class(type(value)) or marked):
        raise BenchmarkError(f"{spec!r} is not a benchmark: a dotted path must name a BenchmarkAdapter "
                             "subclass or instance (Crucible's or A-Evolve's), or a function marked with "
                             "@benchmark_factory")
    return _adapter(value, spec)


def _is_upstream_class(value: type) -> bool:
    """A subclass of A-Evolve's BenchmarkAdapter (looked up among loaded modules: a class that
    subclasses it has loaded it, so nothing is imported here)."""
    base = getattr(sys.modules.get(f"{AEVOLVE_PACKAGE}.benchmarks.base"), "BenchmarkAdapter", None)
    return isinstance(base, type) and issubclass(value, base)
