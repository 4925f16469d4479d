"""Search specs: the TOML a person writes, its schema, and errors with line and column.

`spec_validate(text)` never raises on bad input: every problem comes back as a SpecError
(line, column, key path, what was expected, a "did you mean" for misspelled keys).
"""

from __future__ import annotations

import difflib
import itertools
import json
import re
import tomllib
import types
import typing
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from runtime_app.fleet import EFFORTS, PRESETS, preset_get, preset_names
from runtime_app.policy import DEFAULT_MAX_PATCH_BYTES, DEFAULT_MAX_PATCH_FILES, command_script
from runtime_app.presenters import NAME_MAX_LENGTH
from search_app.measurement import min_blocks

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

LIVE_CEILING = 16  # the runtime's live-step ceiling; no search runs more at once
MAX_STEPS = 1000
MAX_SPEC_BYTES = 256 * 1024
TieBreaker = Literal["diff_lines", "cost_microusd", "score", "tokens"]
OrderingKey = Literal["score", "runtime", "diff_lines", "cost_microusd"]
TIE_BREAKERS: tuple[TieBreaker, ...] = typing.get_args(TieBreaker)
ORDERING_KEYS: tuple[OrderingKey, ...] = typing.get_args(OrderingKey)
NAME_RE = rf"^[a-z0-9_-]{{1,{NAME_MAX_LENGTH}}}$"
# Metrics the runtime measures from outside the score command (docs/sandbox.md, the score contract).
RUNTIME_METRICS = ("runtime:wall_seconds", "runtime:cpu_seconds", "runtime:max_rss_kib")
# What a figure the score command reports about itself measures (`score.reported`): the runtime
# corroborates the time and memory kinds with its own measurement; `other` only comes through the
# report descriptor.
REPORTED_KINDS = ("time_s", "time_ms", "time_us", "time_ns", "memory_kib", "memory_bytes", "other")
ReportedKind = Literal["time_s", "time_ms", "time_us", "time_ns", "memory_kib", "memory_bytes", "other"]
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DRIVE = re.compile(r"^[A-Za-z]:")
_SURROGATE = re.compile("[\ud800-\udfff]")

if TYPE_CHECKING:  # built from runtime_app.fleet.EFFORTS at run time, which a checker cannot read
    Effort = str
else:
    Effort = Literal[EFFORTS]


def _check_repo_path(value: str) -> str:
    """A bounded repo-relative path: 1–400 characters, no `..`, no absolute or drive paths
    (`/x`, `C:\\x`), no control characters, nothing inside `.git` (in any letter case)."""
    if not value or len(value) > 400:
        raise ValueError("a path of 1 to 400 characters")
    if _CONTROL.search(value):
        raise ValueError("a path without control characters")
    if value.startswith(("/", "\\")) or _DRIVE.match(value):
        raise ValueError("a repo-relative path, not an absolute or drive path")
    parts = re.split(r"[\\/]", value)
    if ".." in parts:
        raise ValueError("a path that stays inside the repository (no `..`)")
    if any(part.lower() == ".git" for part in parts):  # `.GIT` is the git dir on macOS/Windows
        raise ValueError("a path outside `.git`")
    return value


def _check_host_path(value: str) -> str:
    """An absolute host path: 2–1,000 characters, written out plainly (no `..`, `.`, `//` or
    trailing `/`), no control characters."""
    if not value or len(value) > 1000:
        raise ValueError("a path of 1 to 1,000 characters")
    if _CONTROL.search(value):
        raise ValueError("a path without control characters")
    if not value.startswith("/"):
        raise ValueError("an absolute host path, starting with `/`")
    parts = value.split("/")[1:]
    if value == "/" or any(part in ("", ".", "..") for part in parts):
        raise ValueError("an absolute path written out plainly: no `..`, `.`, `//` or trailing `/`, "
                         "and not `/` itself")
    return value


def _check_host_path_list(values: list[str]) -> list[str]:
    for value in values:
        _check_host_path(value)
    if len(set(values)) != len(values):
        duplicates = sorted({v for v in values if values.count(v) > 1})
        raise ValueError(f"each path once; repeated: {', '.join(duplicates)}")
    return values


def _check_path_list(values: list[str]) -> list[str]:
    for value in values:
        _check_repo_path(value)
    if len(set(values)) != len(values):
        duplicates = sorted({v for v in values if values.count(v) > 1})
        raise ValueError(f"each path once; repeated: {', '.join(duplicates)}")
    return values


def _tie_breakers_default() -> list[TieBreaker]:
    return ["diff_lines"]


def _ordering_default() -> list[OrderingKey]:
    return ["cost_microusd", "score"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


Command = Annotated[str, Field(min_length=1, max_length=4000)]
RepoPaths = Annotated[list[str], Field(max_length=500)]
HostPaths = Annotated[list[str], Field(max_length=50)]
READ_PATHS_HELP = ("absolute host files or directories this section's commands may read, read-only, "
                   "inside the sandbox; each under an administrator's CRUCIBLE_READ_ROOTS")


def _read_paths(what: str) -> Any:
    return Field(default_factory=list, description=f"{READ_PATHS_HELP}; {what}")


class WorkerSpec(_Section):
    """Who writes the candidates and where they may write. `model` is required for the LLM
    presets, `command` for the `command` preset; give `write_roots` or `exact_files` (or both)
    with at least one path."""

    provider: str = Field(description="a fleet preset: " + ", ".join(PRESETS))
    model: str = Field("", max_length=200, description="the model id requested from the provider")
    reasoning_effort: Effort | list[Effort] = Field(
        "high", description="one effort for every round, or a list with one per round "
        "(scouts low, finalists high)"
    )
    write_authority: Literal["worktree_write"] = Field(
        "worktree_write", description="writers edit only their own worktree"
    )
    write_roots: RepoPaths = Field(default_factory=list, description="directories writers may change")
    exact_files: RepoPaths = Field(default_factory=list, description="single files writers may change")
    command: str = Field("", max_length=4000, description="the agent command line (provider `command`)")
    refine: bool = Field(
        False, description="each promoted candidate's writer revises its own patch at the start of "
        "every later round, at that round's effort (a writer's budget reservation each time)"
    )
    max_patch_bytes: int = Field(
        DEFAULT_MAX_PATCH_BYTES, ge=1, le=256 << 20,
        description="the most a candidate's patch may change, in bytes: added and modified files at "
        "their new size plus deleted files, and the diff text itself; a writer that changes more is "
        "refused before its diff is built (default 10 MiB)",
    )
    max_patch_files: int = Field(
        DEFAULT_MAX_PATCH_FILES, ge=1, le=100_000,
        description="the most files a candidate's patch may add, modify or delete (a rename counts "
        "two); a writer that changes more is refused",
    )
    read_paths: HostPaths = _read_paths("hashed into the public evidence at freeze")

    @field_validator("provider")
    @classmethod
    def _known_provider(cls, value: str) -> str:
        if value not in PRESETS and value not in preset_names():
            raise ValueError(f"one of the fleet presets: {', '.join(preset_names())}")
        return value

    @field_validator("write_roots", "exact_files")
    @classmethod
    def _paths(cls, values: list[str]) -> list[str]:
        return _check_path_list(values)

    @field_validator("read_paths")
    @classmethod
    def _host_paths(cls, values: list[str]) -> list[str]:
        return _check_host_path_list(values)


class BudgetSpec(_Section):
    """Ceilings for the whole search; admission stops before either would be exceeded.
    Leave a key out for no ceiling."""

    max_cost_microusd: int | None = Field(None, gt=0, description="spend ceiling in millionths of a dollar")
    max_tokens: int | None = Field(None, gt=0, description="token ceiling across all calls")


class EvidenceSpec(_Section):
    """Public evidence, given identically to every writer. Files are read at the baseline
    commit and hashed into the search id."""

    files: RepoPaths = Field(
        default_factory=list, description="repo files every writer sees, read at the baseline"
    )
    text: str = Field("", max_length=100_000, description="notes given identically to every writer")

    @field_validator("files")
    @classmethod
    def _paths(cls, values: list[str]) -> list[str]:
        return _check_path_list(values)


class HiddenSource(_Section):
    """A hidden evaluator file (`path`) or directory (`dir`) read from the host at freeze, under
    an administrator's CRUCIBLE_EVALUATOR_ROOTS, and kept as a snapshot of its bytes."""

    path: str = Field("", description="a host file")
    dir: str = Field("", description="a host directory: every file below it, at the same relative paths")

    @field_validator("path", "dir")
    @classmethod
    def _host(cls, value: str) -> str:
        return _check_host_path(value) if value else value

    @model_validator(mode="after")
    def _one_source(self) -> HiddenSource:
        if bool(self.path) == bool(self.dir):
            raise ValueError('exactly one of `path = "/host/file"` or `dir = "/host/dir"`')
        return self

    @model_serializer
    def _only_the_source(self) -> dict[str, str]:
        return {"path": self.path} if self.path else {"dir": self.dir}

    @property
    def host_path(self) -> str:
        return self.path or self.dir


def _hidden_kind(value: Any) -> str:
    return "host" if isinstance(value, dict | HiddenSource) else "text"


HiddenEntry = Annotated[
    Annotated[str, Tag("text")] | Annotated[HiddenSource, Tag("host")], Discriminator(_hidden_kind)
]
HIDDEN_FORM = ('a table `[evaluator.files]` of repo path = "contents", { path = "/host/file" } '
               'or { dir = "/host/dir" }')


class EvaluatorSpec(_Section):
    """Hidden evaluator inputs: only evaluation trees receive them, after writers are done.
    Inline contents are hashed into the search id; host files and directories
    (`"bench/hidden.py" = { path = "/srv/hidden/bench.py" }`, `"tests/hidden" = { dir =
    "/srv/hidden/tests" }`) are read at freeze, hashed into the search id and snapshotted, so a
    later change on the host does not change a frozen search."""

    files: dict[str, HiddenEntry] = Field(
        default_factory=dict,
        description="hidden files only evaluation trees receive: repo-relative path = contents, or "
        "= { path = \"/host/file\" } or { dir = \"/host/dir\" } under CRUCIBLE_EVALUATOR_ROOTS",
    )

    @field_validator("files")
    @classmethod
    def _paths(cls, files: dict[str, Any]) -> dict[str, Any]:
        _check_path_list(list(files))
        if sum(len(content) for content in files.values() if isinstance(content, str)) > 1_000_000:
            raise ValueError("inline hidden files of at most 1,000,000 characters in all")
        return files

    def inline(self) -> dict[str, str]:
        """The hidden files whose contents the spec itself holds."""
        return {path: entry for path, entry in self.files.items() if isinstance(entry, str)}

    def host(self) -> dict[str, HiddenSource]:
        """The hidden files and directories read from the host at freeze."""
        return {path: entry for path, entry in self.files.items() if isinstance(entry, HiddenSource)}


class HardGatesSpec(_Section):
    """Commands every patched tree must pass; any failure eliminates the candidate."""

    commands: Annotated[list[Command], Field(min_length=1, max_length=50)] = Field(
        description="run in order on each patched tree; the first failure eliminates"
    )
    forbid_test_changes: Literal[True] = Field(
        True, description="always true: weakening tests is never allowed"
    )
    protected_paths: RepoPaths = Field(default_factory=list, description="paths no patch may touch")
    timeout_seconds: int = Field(600, ge=1, le=86_400, description="per gate command")
    read_paths: HostPaths = _read_paths("hashed into the evaluator record at freeze")

    @field_validator("protected_paths")
    @classmethod
    def _paths(cls, values: list[str]) -> list[str]:
        return _check_path_list(values)

    @field_validator("read_paths")
    @classmethod
    def _host_paths(cls, values: list[str]) -> list[str]:
        return _check_host_path_list(values)


RESULTS_WARNING = ("nothing checks correctness while the score runs: the score command's results are not "
                   "compared with the baseline's, so code that behaves only while it is watched can win "
                   "(add `results = \"stdout\"` or `results = { files = [...] }` to [score])")
MAX_RESULTS_FILES = 20


class ResultsSpec(_Section):
    """What a score trial computed, compared by the runtime with the baseline's trial in the same
    block: a difference eliminates the candidate. `results = "stdout"` is `{ stdout = true }`."""

    stdout: bool = Field(False, description="the command's whole stdout, less its metric lines (lines that "
                         "are a JSON object with the metric's name as a key)")
    files: Annotated[list[str], Field(max_length=MAX_RESULTS_FILES)] = Field(
        default_factory=list,
        description="repo-relative files the command writes in its tree, written in place (under "
        "bubblewrap each is a file bound there: renaming over it or removing it fails); not protected "
        "paths, hidden evaluator files or the score script",
    )
    tolerance: float = Field(
        0.0, ge=0, le=1, allow_inf_nan=False,
        description="0: every line exactly; above 0, the numbers on a line compare with "
        "`math.isclose(rel_tol=tolerance, abs_tol=tolerance)` and the rest of the line exactly",
    )

    @field_validator("files")
    @classmethod
    def _paths(cls, values: list[str]) -> list[str]:
        return _check_path_list(values)

    @model_validator(mode="after")
    def _something(self) -> ResultsSpec:
        if not self.stdout and not self.files:
            raise ValueError("`stdout = true`, `files = [...]` or both: results to compare")
        return self


def _results_kind(value: Any) -> str:
    return "table" if isinstance(value, dict | ResultsSpec) else "text"


ResultsEntry = Annotated[
    Annotated[Literal["stdout"], Tag("text")] | Annotated[ResultsSpec, Tag("table")],
    Discriminator(_results_kind),
]


class ScoreSpec(_Section):
    """How survivors of the gates are scored: each round runs the score command in blocks (every
    survivor and the baseline once per block), and a candidate's figure is the median of its
    per-block ratios to the baseline (`paired`) or of its values (`absolute`)."""

    command: Command = Field(description="the benchmark the runtime runs on each surviving tree")
    metric: str = Field(
        min_length=1, max_length=100,
        description="the metric to compare: " + ", ".join(f"`{name}`" for name in RUNTIME_METRICS)
        + " are measured by the runtime from outside the score command; any other name is reported by the "
        "score command itself, as a JSON object, and must say what it measures with `reported` (see "
        "[The score contract](#the-score-contract))",
    )
    direction: Literal["minimize", "maximize"] = Field("minimize", description="better is lower or higher")
    trials: int = Field(
        5, ge=1, le=25,
        description="blocks per round: in each block every survivor and the baseline run the score command "
        "once, and each round measures its survivors afresh. `paired`: a candidate's figure is the median of "
        "its per-block ratios to the baseline's trial in the same block, with a confidence interval; a "
        "candidate that cannot yet be told apart from the baseline or from its neighbours at the round's "
        "cut, or that beats the baseline on fewer blocks than `confidence` needs "
        f"({min_blocks(0.95)} at 0.95), gets more blocks, up to `max_trials`. "
        "`absolute`: its figure is the median of its values, and a scored baseline's median is the one "
        "to beat",
    )
    tie_breakers: Annotated[list[TieBreaker], Field(min_length=1)] = Field(
        default_factory=_tie_breakers_default,
        description="applied in order on equal scores; each once",
    )
    timeout_seconds: int = Field(900, ge=1, le=86_400, description="per trial")
    replay_tolerance: float = Field(
        0.25, ge=0, le=10, allow_inf_nan=False,
        description="`absolute` comparison only: replay passes when its median is within this share of "
        "the earlier median, or within the earlier trials' spread",
    )
    comparison: Literal["paired", "absolute"] = Field(
        "paired", description="`paired`: each block runs every survivor and the baseline once, in a "
        "shuffled order, and a candidate's figure is the median of its per-block ratios to the baseline, "
        "decided by confidence intervals; `absolute`: medians of the values, as measured (used when the "
        "baseline has no score)",
    )
    confidence: float = Field(
        0.95, ge=0.5, le=0.999, allow_inf_nan=False,
        description="`paired`: the confidence level of the intervals that promote, beat the baseline "
        "and pick the winner",
    )
    max_trials: int | None = Field(
        None, ge=1, le=100, description="`paired`: blocks a candidate may get in one round when the "
        "candidates either side of the cut cannot be told apart (default: 3 × trials)",
    )
    reported: ReportedKind | None = Field(
        None, description="what a metric the score command reports about itself measures (required for "
        "any metric not starting with `runtime:`, refused for one that does): `time_s`, `time_ms`, "
        "`time_us`, `time_ns`, `memory_kib` or `memory_bytes` are checked against the runtime's own wall, "
        "CPU and memory figures of the same trials, and a candidate whose report they contradict is "
        "eliminated (these need `direction = \"minimize\"`); `other` (accuracy, a count …) is read only "
        "from the runtime's report descriptor (`$CRUCIBLE_REPORT_FD`), which the score command's own "
        "process holds and its children need not, never from stdout or `$CRUCIBLE_METRICS_FILE`",
    )
    read_paths: HostPaths = _read_paths("hashed into the evaluator record at freeze")
    results: ResultsEntry | None = Field(
        None, description="what each trial computed, compared by the runtime with the baseline's trial in "
        "the same block (a difference eliminates the candidate, its first differing lines shown): "
        "`\"stdout\"`, or a table `{ stdout = true, files = [\"out/result.json\"], tolerance = 1e-9 }`. "
        "Without it nothing checks correctness while the score runs, and the spec is frozen with a warning",
    )

    @field_validator("read_paths")
    @classmethod
    def _host_paths(cls, values: list[str]) -> list[str]:
        return _check_host_path_list(values)

    @property
    def results_checked(self) -> ResultsSpec | None:
        """The results every trial is checked on (`"stdout"` read as `{ stdout = true }`), or None."""
        if self.results is None:
            return None
        return ResultsSpec(stdout=True) if self.results == "stdout" else self.results  # type: ignore[return-value]

    @property
    def trials_ceiling(self) -> int:
        """The most blocks one candidate gets in a round, adaptive ones included."""
        return self.max_trials or min(3 * self.trials, 100)

    @property
    def runtime_measured(self) -> bool:
        """Whether the runtime measures the metric itself (no code the command runs can report it)."""
        return self.metric in RUNTIME_METRICS

    @property
    def corroborated(self) -> bool:
        """Whether a reported figure is of a kind the runtime measures too (time or memory), so the
        runtime checks it against its own measurement."""
        return self.reported is not None and self.reported != "other"


class SelectionSpec(_Section):
    """How each round's survivors are chosen among the scored candidates."""

    policy: Literal["pareto", "ordered"] = Field("pareto", description="how survivors are ranked")
    ordering: Annotated[list[OrderingKey], Field(min_length=1)] = Field(
        default_factory=_ordering_default,
        description="for `ordered`: keys in priority order, each once (cost-first by default)",
    )
    retain_diversity: bool = Field(True, description="identical patches collapse to one")
    review: Literal["blocking", "advisory"] = Field(
        "blocking",
        description="`blocking`: a provisional winner the reviewer rejects is eliminated and the next "
                    "candidate is replayed (code inside a gate can force its exit code; the reviewer reads "
                    "the patch from outside); `advisory`: the verdict is only shown beside Approve",
    )


class SearchSpec(_Section):
    """A search: what to achieve, how many candidates, and how the field narrows."""

    schema_version: Literal[1] = Field(1, description="the spec format version")
    name: str = Field(pattern=NAME_RE, description=f"1–{NAME_MAX_LENGTH} characters of a-z 0-9 - _")
    objective: str = Field(min_length=1, max_length=4000, description="what the writers must achieve")
    population: int = Field(ge=2, le=MAX_STEPS, description="candidates admitted")
    rounds: Annotated[list[int], Field(min_length=2, max_length=20)] = Field(
        description="survivors per round: first = population, strictly decreasing, last = 1"
    )
    concurrency: int = Field(ge=1, le=LIVE_CEILING, description="live steps at once, ≤ population")
    integration_policy: Literal["review_only"] = Field(
        "review_only", description="winners wait for a person's approval; nothing merges itself"
    )
    worker: WorkerSpec
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    evidence: EvidenceSpec = Field(default_factory=EvidenceSpec)
    evaluator: EvaluatorSpec = Field(default_factory=EvaluatorSpec)
    hard_gates: HardGatesSpec
    score: ScoreSpec
    selection: SelectionSpec = Field(default_factory=SelectionSpec)


@dataclass(frozen=True)
class SpecError:
    line: int
    column: int
    path: str
    message: str
    expected: str = ""
    suggestion: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        where = f"{self.line}:{self.column}"
        text = f"{where} {self.path or '(document)'}: {self.message}"
        if self.expected:
            text += f"; expected {self.expected}"
        if self.suggestion:
            text += f" (did you mean `{self.suggestion}`?)"
        return text


@dataclass(frozen=True)
class SpecReport:
    errors: tuple[SpecError, ...]
    spec: SearchSpec | None

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def warnings(self) -> list[str]:
        """What a valid spec allows but a person should know before freezing it."""
        return spec_warnings(self.spec) if self.spec is not None else []

    def summary(self) -> dict[str, Any] | None:
        return spec_summary(self.spec) if self.spec is not None else None


# --- where keys are in the text ---------------------------------------------------------

_KEY_PART = r"(?:[A-Za-z0-9_-]+|\"(?:[^\"\\]|\\.)*\"|'[^']*')"
_DOTTED = rf"{_KEY_PART}(?:[ \t]*\.[ \t]*{_KEY_PART})*"
_HEADER = re.compile(rf"^\s*\[\[?[ \t]*(?P<name>{_DOTTED})[ \t]*\]\]?\s*(#.*)?$")
_KEY = re.compile(rf"^\s*(?P<key>{_DOTTED})[ \t]*=")


def _split_key(raw: str) -> list[str]:
    """The parts of a (dotted, quoted, escaped) key, as TOML reads them."""
    try:
        node: Any = tomllib.loads(f"{raw} = 0")
    except tomllib.TOMLDecodeError:
        return []
    parts = []
    while isinstance(node, dict) and len(node) == 1:
        key, node = next(iter(node.items()))
        parts.append(key)
    return parts


def _value_balance(text: str, state: dict[str, Any]) -> None:
    """Track open brackets and multi-line strings across lines, so lines inside a value
    (an array of commands with `=` in them) are not taken for keys."""
    i = 0
    while i < len(text):
        if state["string"]:
            quote = state["string"]
            if text.startswith(quote, i):
                state["string"] = None
                i += len(quote)
                continue
            if quote in {'"', '"""'} and text[i] == "\\":
                i += 2
                continue
            i += 1
            continue
        char = text[i]
        if char == "#":
            return
        for quote in ('"""', "'''", '"', "'"):
            if text.startswith(quote, i):
                state["string"] = quote
                i += len(quote)
                break
        else:
            if char in "[{":
                state["depth"] += 1
            elif char in "]}":
                state["depth"] = max(0, state["depth"] - 1)
            i += 1
    if state["string"] in {'"', "'"}:
        state["string"] = None  # single-line strings end with their line


def key_positions(text: str) -> dict[tuple[str, ...], tuple[int, int]]:
    """Map each key path (and table header) to its 1-based (line, column)."""
    positions: dict[tuple[str, ...], tuple[int, int]] = {}
    table: tuple[str, ...] = ()
    state: dict[str, Any] = {"depth": 0, "string": None}
    for number, raw_line in enumerate(text.split("\n"), start=1):
        line = raw_line.removesuffix("\r")
        if state["depth"] == 0 and state["string"] is None:
            header = _HEADER.match(line)
            if header and not _KEY.match(line):
                table = tuple(_split_key(header.group("name")))
                positions.setdefault(table, (number, line.index("[") + 1))
                continue
            key = _KEY.match(line)
            if key:
                path = table + tuple(_split_key(key.group("key")))
                column = len(line) - len(line.lstrip()) + 1
                positions.setdefault(path, (number, column))
                _value_balance(line[key.end():], state)
                continue
        _value_balance(line, state)
    return positions


def _locate(positions: dict[tuple[str, ...], tuple[int, int]], path: tuple[str, ...]) -> tuple[int, int]:
    for end in range(len(path), 0, -1):
        if path[:end] in positions:
            return positions[path[:end]]
    return (1, 1)


# --- validation ---------------------------------------------------------------------------

_MODEL_FOR_TABLE: dict[tuple[str, ...], type[BaseModel]] = {
    (): SearchSpec,
    ("worker",): WorkerSpec,
    ("budget",): BudgetSpec,
    ("evidence",): EvidenceSpec,
    ("evaluator",): EvaluatorSpec,
    ("hard_gates",): HardGatesSpec,
    ("score",): ScoreSpec,
    ("score", "results"): ResultsSpec,
    ("selection",): SelectionSpec,
}
_TOML_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")
_REASONS = {
    ("integration_policy",): "only `review_only`: a winner is merged only after a person approves it",
    ("hard_gates", "forbid_test_changes"): "`true`: weakening tests is never allowed",
    ("worker", "reasoning_effort"): "'off', 'low', 'medium', 'high' or 'max', or a list of those "
    "with one per round",
}


def _value_at(data: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        in_table = isinstance(data, dict) and isinstance(part, str) and part in data
        in_array = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
        if not (in_table or in_array):
            return None
        data = data[part]
    return data


def _union_fields() -> frozenset[tuple[str, ...]]:
    """Key paths of fields typed as a union (`reasoning_effort`: one effort or a list)."""
    found = set()
    for table, model in _MODEL_FOR_TABLE.items():
        for name, field in model.model_fields.items():
            members = [arg for arg in typing.get_args(field.annotation) if arg is not type(None)]
            if typing.get_origin(field.annotation) in (typing.Union, types.UnionType) and len(members) > 1:
                found.add((*table, name))
    return frozenset(found)


_UNION_FIELDS = _union_fields()


def _field_path(loc: tuple[str | int, ...], data: dict[str, Any]) -> tuple[str | int, ...] | None:
    """The key path of an error, without the member tag pydantic puts after a union field
    (`literal[...]`, `list[...]`); None when the error comes from the member the value's
    type did not pick (a string checked as a list), so each mistake is reported once."""
    if loc[:2] == ("evaluator", "files") and len(loc) >= 4 and loc[3] in ("text", "host"):
        return loc[:3] + loc[4:]  # a hidden file's tag: inline contents or a host source
    if loc[:2] == ("score", "results") and len(loc) >= 3 and loc[2] in ("text", "table"):
        return loc[:2] + loc[3:]  # `"stdout"` or a table
    for index in range(1, len(loc)):
        tag = loc[index]
        if loc[:index] in _UNION_FIELDS and isinstance(tag, str):
            is_list = isinstance(_value_at(data, loc[:index]), list)
            if is_list != tag.startswith("list["):
                return None
            return loc[:index] + loc[index + 1 :]
    return loc


def _expected(error: ErrorDetails, path: tuple[str, ...]) -> str:
    if path in _REASONS:
        return _REASONS[path]
    ctx = error.get("ctx") or {}
    kind = error["type"]
    if len(path) == 3 and path[:2] == ("evaluator", "files") and kind == "string_type":
        return 'a valid string of file contents, or { path = "/host/file" } or { dir = "/host/dir" }'
    if path == ("score", "results") and kind in ("literal_error", "model_attributes_type"):
        return '"stdout", or a table { stdout = true, files = ["out/result.json"], tolerance = 1e-9 }'
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    if kind == "literal_error":
        return ctx.get("expected", "")
    if kind in {"greater_than_equal", "greater_than", "less_than_equal", "less_than"}:
        return error["msg"].replace("Input should be ", "a number ")
    if kind in {"too_short", "string_too_short"}:
        return f"at least {ctx.get('min_length', 1)} {'character' if 'string' in kind else 'item'}(s)"
    if kind in {"too_long", "string_too_long"}:
        return f"at most {ctx.get('max_length')} {'characters' if 'string' in kind else 'items'}"
    if kind == "string_pattern_mismatch":
        return f"1–{NAME_MAX_LENGTH} characters of a-z 0-9 - _"
    if kind == "missing":
        return "this key"
    return error["msg"].replace("Input should be ", "")


def _pydantic_errors(
    error: ValidationError, positions: dict[tuple[str, ...], tuple[int, int]], data: dict[str, Any]
) -> list[SpecError]:
    found = []
    for item in error.errors(include_url=False):
        path = _field_path(tuple(item["loc"]), data)
        if path is None:
            continue
        keys = tuple(str(part) for part in path)
        line, column = _locate(positions, keys)
        if item["type"] == "extra_forbidden":
            table, key = keys[:-1], keys[-1]
            hidden_source = len(table) == 3 and table[:2] == ("evaluator", "files")
            model = HiddenSource if hidden_source else _MODEL_FOR_TABLE.get(table)
            known = list(model.model_fields) if model else []
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            aliases = ("files",) if hidden_source else table
            suggestion = close[0] if close else _KEY_ALIASES.get((aliases, key), "")
            message = f"unknown key `{key}`"
            if hidden_source and key in _DESTINATION_KEYS:
                message += "; the repo path a hidden file lands at is its key in `[evaluator.files]`"
                entry = _value_at(data, path[:-1])
                suggestion = _hidden_suggestion([{**entry, key: entry[key]}]) if isinstance(entry, dict) \
                    and isinstance(entry.get(key), str) else ""
            found.append(SpecError(
                line, column, _dotted(path), message,
                expected="one of " + ", ".join(known) if known else "", suggestion=suggestion,
            ))
            continue
        if keys == ("evaluator", "files") and isinstance(item.get("input"), list):
            found.append(SpecError(
                line, column, "evaluator.files", "hidden files are not an array of tables",
                expected=HIDDEN_FORM, suggestion=_hidden_suggestion(item["input"]),
            ))
            continue
        message = "missing required key" if item["type"] == "missing" else "invalid value"
        suggestion = ""
        if keys == ("worker", "provider") and isinstance(item.get("input"), str):
            close = difflib.get_close_matches(item["input"], preset_names(), n=1, cutoff=0.6)
            suggestion = close[0] if close else ""
        found.append(SpecError(line, column, _dotted(path), message, _expected(item, keys), suggestion))
    return found


# Other natural spellings of a key, pointed at the supported one ("did you mean").
_READ_PATH_ALIASES = ("readable", "readable_paths", "read_only_paths", "readonly_paths", "ro_paths",
                      "mounts", "binds", "host_paths", "paths", "read_roots", "extra_paths")
_KEY_ALIASES: dict[tuple[tuple[str, ...], str], str] = {
    **{((), key): "[evaluator.files]" for key in ("hidden_files", "hidden", "evaluator_files")},
    **{(("evaluator",), key): "files" for key in ("hidden_files", "hidden", "paths", "dirs", "file",
                                                   "host_files", "sources")},
    **{(("hard_gates",), key): "read_paths" for key in _READ_PATH_ALIASES},
    **{((section,), key): "read_paths" for section in ("worker", "score") for key in _READ_PATH_ALIASES},
    **{((), key): "read_paths in [worker], [hard_gates] or [score]" for key in _READ_PATH_ALIASES},
    **{(("files",), key): "path" for key in ("file", "source", "src", "from", "host_path", "host")},
    **{(("files",), key): "dir" for key in ("directory", "folder", "source_dir", "src_dir", "tree")},
}
_DESTINATION_KEYS = ("dest", "destination", "target", "to", "as", "name", "repo_path")
_SOURCE_KEYS = ("path", "file", "source", "src", "from", "host_path", "host")
_DIR_KEYS = ("dir", "directory", "folder", "source_dir", "src_dir")


def _hidden_suggestion(items: list[Any]) -> str:
    """The `[evaluator.files]` line an array-of-tables entry means, e.g.
    `"bench/hidden.py" = { path = "/srv/hidden/bench.py" }`."""
    for item in items:
        if not isinstance(item, dict):
            continue
        dest = next((item[k] for k in _DESTINATION_KEYS if isinstance(item.get(k), str)), None)
        source = next((("path", item[k]) for k in _SOURCE_KEYS if isinstance(item.get(k), str)), None)
        folder = next((("dir", item[k]) for k in _DIR_KEYS if isinstance(item.get(k), str)), None)
        source = folder or source
        if source and dest is None and source[0] == "path" and not source[1].startswith("/"):
            continue  # `path` named the repo path, with no host source beside it
        if source and dest is not None:
            return f'[evaluator.files] {json.dumps(dest)} = {{ {source[0]} = {json.dumps(source[1])} }}'
    return '[evaluator.files] "repo/path.py" = { path = "/host/file" }'


def _dotted(path: tuple[str | int, ...]) -> str:
    """`score.tie_breakers[0]`: keys joined by dots, list indexes in brackets."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _cross_checks(data: dict[str, Any], positions: dict[tuple[str, ...], tuple[int, int]]) -> list[SpecError]:
    """Rules between keys; each runs only when the keys it reads are well-formed."""
    errors: list[SpecError] = []

    def add(path: tuple[str, ...], message: str, expected: str) -> None:
        line, column = _locate(positions, path)
        errors.append(SpecError(line, column, ".".join(path), message, expected))

    population, rounds = data.get("population"), data.get("rounds")
    if not (isinstance(rounds, list) and all(type(r) is int for r in rounds)):
        rounds = []  # not well-formed: pydantic reports it, and no rule below reads it
    ints = bool(rounds)
    if ints and len(rounds) >= 2:
        if type(population) is int and rounds[0] != population:
            add(("rounds",), f"the first round admits {rounds[0]}, not the population",
                f"rounds[0] = population = {population}")
        if any(b >= a for a, b in itertools.pairwise(rounds)):
            add(("rounds",), "rounds do not narrow", "strictly decreasing survivor counts")
        if rounds[-1] != 1:
            add(("rounds",), f"the last round keeps {rounds[-1]}", "a last round of 1 (one winner)")
    concurrency = data.get("concurrency")
    if type(concurrency) is int and type(population) is int and concurrency > population:
        add(("concurrency",), f"concurrency {concurrency} exceeds the population {population}",
            "concurrency ≤ population")
    worker = data.get("worker")
    if isinstance(worker, dict):
        roots, files = worker.get("write_roots", []), worker.get("exact_files", [])
        if isinstance(roots, list) and isinstance(files, list) and not roots and not files:
            add(("worker",), "writers have nowhere to write",
                "`write_roots` or `exact_files` with at least one path")
        effort = worker.get("reasoning_effort")
        if isinstance(effort, list) and ints and len(effort) != len(rounds):
            add(("worker", "reasoning_effort"), f"{len(effort)} efforts for {len(rounds)} rounds",
                "one effort, or exactly one per round")
        provider = worker.get("provider")
        preset = preset_get(provider) if isinstance(provider, str) else None
        if preset is not None:
            if preset.needs_command and not str(worker.get("command", "")).strip():
                add(("worker", "command"), "the `command` provider needs its command line",
                    "worker.command, e.g. \"my-agent --yes\"")
            if not preset.needs_command and not preset.default_model and \
                    not str(worker.get("model", "")).strip():
                add(("worker", "model"), f"`{provider}` needs a model id",
                    "worker.model, e.g. \"deepseek-v4-flash\"")
    selection = data.get("selection")
    if isinstance(selection, dict) and _strings(selection.get("ordering")):
        ordering = selection["ordering"]
        if len(set(ordering)) != len(ordering):
            add(("selection", "ordering"), "a key is repeated", "each ordering key once")
    score = data.get("score")
    if isinstance(score, dict) and _strings(score.get("tie_breakers")):
        breakers = score["tie_breakers"]
        if len(set(breakers)) != len(breakers):
            add(("score", "tie_breakers"), "a tie-breaker is repeated", "each tie-breaker once")
    ceiling, trials = (score.get("max_trials"), score.get("trials", 5)) if isinstance(score, dict) else (0, 0)
    if type(ceiling) is int and type(trials) is int and ceiling < trials:
        add(("score", "max_trials"), f"max_trials {ceiling} is below trials {trials}",
            "max_trials ≥ trials (the blocks every survivor gets)")
    metric = score.get("metric") if isinstance(score, dict) else None
    if isinstance(metric, str) and metric.startswith("runtime:") and metric not in RUNTIME_METRICS:
        add(("score", "metric"), f"`{metric}` is not a metric the runtime measures",
            "one of " + ", ".join(RUNTIME_METRICS) + ", or a name the score command reports")
    _results_checks(data, add)
    if isinstance(score, dict) and isinstance(metric, str) and metric:
        errors += _reported_checks(score, metric, positions)
    return errors


def _reported_checks(score: dict[str, Any], metric: str,
                     positions: dict[tuple[str, ...], tuple[int, int]]) -> list[SpecError]:
    """`score.reported`: required for a figure the score command reports about itself, refused for
    one the runtime measures, and a time or memory figure must be minimized. An authoring rule (not
    the model's): searches frozen before it re-read as they were frozen."""
    errors: list[SpecError] = []

    def add(path: tuple[str, ...], message: str, expected: str) -> None:
        line, column = _locate(positions, path)
        errors.append(SpecError(line, column, ".".join(path), message, expected))

    reported, direction = score.get("reported"), score.get("direction", "minimize")
    if metric.startswith("runtime:"):
        if reported is not None:
            add(("score", "reported"), f"`{metric}` is measured by the runtime, not reported by the "
                "score command: remove `reported`", "no `reported` with a runtime: metric")
    elif reported is None:
        add(("score", "metric"), f"`{metric}` is a figure the score command reports about itself: say what "
            "it measures with `reported = \"time_ms\"` (the runtime then checks it against its own "
            "measurement), `reported = \"other\"` (read only from the runtime's report descriptor, "
            "$CRUCIBLE_REPORT_FD), "
            "or score on a figure the runtime measures: " + ", ".join(RUNTIME_METRICS),
            "score.reported = " + " | ".join(f'"{kind}"' for kind in REPORTED_KINDS))
    elif reported in REPORTED_KINDS and reported != "other" and direction == "maximize":
        add(("score", "direction"), f"`reported = \"{reported}\"` is a time or memory figure: more of it is "
            "never better", "direction = \"minimize\" (or `reported = \"other\"`)")
    return errors


def _results_checks(data: dict[str, Any], add: Any) -> None:
    """A results file must be one the score command can write: not a protected path, a hidden
    evaluator file or the score script (each is bound read-only in every trial)."""
    score, gates, evaluator = (data.get(key) for key in ("score", "hard_gates", "evaluator"))
    results = score.get("results") if isinstance(score, dict) else None
    files = results.get("files") if isinstance(results, dict) else None
    if not isinstance(files, list) or not _strings(files):
        return
    protected = gates.get("protected_paths", []) if isinstance(gates, dict) else []
    hidden = list(evaluator.get("files", {})) if isinstance(evaluator, dict) and \
        isinstance(evaluator.get("files"), dict) else []
    command = score.get("command") if isinstance(score, dict) else None
    script = command_script(command) if isinstance(command, str) else None

    def under(path: str, root: str) -> bool:
        root = root.strip("/")
        return bool(root) and (path.strip("/") == root or path.startswith(root + "/"))

    for path in files:
        where = ("score", "results", "files")
        if any(under(path, root) for root in protected if isinstance(root, str)):
            add(where, f"results file `{path}` is a protected path: no trial can write it",
                "a file the score command writes, outside hard_gates.protected_paths")
        elif any(under(path, root) for root in hidden):
            add(where, f"results file `{path}` is a hidden evaluator file: no trial can write it",
                "a file the score command writes, outside [evaluator.files]")
        elif script and under(path, script):
            add(where, f"results file `{path}` is the score script", "a file the score command writes")


def spec_warnings(spec: SearchSpec) -> list[str]:
    """What a valid spec allows but a person should know before freezing it; a freeze still
    succeeds."""
    return [] if spec.score.results is not None else [RESULTS_WARNING]


def _too_large() -> SpecReport:
    return SpecReport(
        (SpecError(1, 1, "", "the spec is too large", f"at most {MAX_SPEC_BYTES:,} bytes"),), None
    )


def spec_validate(source: str | bytes) -> SpecReport:
    """Parse and check a spec; every problem is reported at once, none raises."""
    if isinstance(source, bytes):
        raw = source
        if len(raw) > MAX_SPEC_BYTES:
            return _too_large()
        try:
            source = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            before = raw[: error.start].decode("utf-8", errors="replace")
            line = before.count("\n") + 1
            column = len(before) - (before.rfind("\n") + 1) + 1
            return SpecReport((SpecError(line, column, "", "the spec is not UTF-8 text", "UTF-8"),), None)
    if len(source.encode("utf-8", errors="surrogatepass")) > MAX_SPEC_BYTES:
        return _too_large()
    surrogate = _SURROGATE.search(source)
    if surrogate:  # only from str input (JSON "\\ud800"); cannot be stored or hashed as UTF-8
        before = source[: surrogate.start()]
        line = before.count("\n") + 1
        column = surrogate.start() - (before.rfind("\n") + 1) + 1
        return SpecReport(
            (SpecError(line, column, "", "the spec has a lone surrogate character", "UTF-8 text"),), None
        )
    try:
        data = tomllib.loads(source)
    except tomllib.TOMLDecodeError as error:
        text = str(error)
        match = _TOML_POSITION.search(text)
        if match:
            line, column = int(match.group(1)), int(match.group(2))
        else:
            line = source.count("\n") + 1
            column = len(source) - (source.rfind("\n") + 1) + 1
        message = _TOML_POSITION.sub("", text).replace("(at end of document)", "").strip()
        return SpecReport((SpecError(line, column, "", f"not valid TOML: {message}", "TOML syntax"),), None)
    except (UnicodeError, ValueError) as error:  # lone surrogates and the like
        return SpecReport((SpecError(1, 1, "", f"not valid TOML: {error}", "TOML syntax"),), None)
    except RecursionError:  # tomllib recurses per nested array or table: `a = [[[[…`
        return SpecReport((SpecError(1, 1, "", "not valid TOML: values nested too deeply",
                                     "arrays and tables nested a few levels at most"),), None)
    positions = key_positions(source)
    errors: list[SpecError] = []
    spec = None
    try:
        spec = SearchSpec.model_validate(data)
    except ValidationError as error:
        errors += _pydantic_errors(error, positions, data)
    errors += _cross_checks(data, positions)
    errors.sort(key=lambda e: (e.line, e.column, e.path))
    return SpecReport(tuple(errors), None if errors else spec)


# Keys added after specs were first frozen: at their default they are left out of the
# normalized spec, so a spec that does not use them keeps the search id it always had.
ADDED_KEYS_DEFAULTS = {
    ("worker", "refine"): False, ("score", "replay_tolerance"): 0.25, ("score", "comparison"): "paired",
    ("score", "confidence"): 0.95, ("score", "max_trials"): None,
    ("worker", "max_patch_bytes"): DEFAULT_MAX_PATCH_BYTES,
    ("worker", "max_patch_files"): DEFAULT_MAX_PATCH_FILES,
    ("worker", "read_paths"): [], ("hard_gates", "read_paths"): [], ("score", "read_paths"): [],
    ("selection", "review"): "blocking", ("score", "reported"): None,
    ("score", "results"): None,
}


def spec_normalized(spec: SearchSpec) -> dict[str, Any]:
    """The complete spec with every default filled in (but the later-added keys left at
    their default): what a freeze hashes."""
    data = spec.model_dump(mode="json")
    for (section, key), default in ADDED_KEYS_DEFAULTS.items():
        if data[section].get(key) == default:
            del data[section][key]
    return data


def spec_efforts(spec: SearchSpec) -> list[str]:
    """The reasoning effort of each round."""
    effort = spec.worker.reasoning_effort
    return list(effort) if isinstance(effort, list) else [effort] * len(spec.rounds)


def spec_summary(spec: SearchSpec) -> dict[str, Any]:
    budget = spec.budget
    return {
        "name": spec.name,
        "population": spec.population,
        "rounds": spec.rounds,
        "concurrency": spec.concurrency,
        "provider": spec.worker.provider,
        "model": spec.worker.model or spec.worker.command,
        "efforts": spec_efforts(spec),
        "budget_usd": None if budget.max_cost_microusd is None else budget.max_cost_microusd / 1_000_000,
        "budget_tokens": budget.max_tokens,
        "gates": list(spec.hard_gates.commands),
        "score": f"{spec.score.direction} {spec.score.metric} over {spec.score.trials} trials",
        "selection": spec.selection.policy
        + (f" by {', '.join(spec.selection.ordering)}" if spec.selection.policy == "ordered" else "")
        + (", diverse" if spec.selection.retain_diversity else ""),
    }
