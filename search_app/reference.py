"""docs/spec-reference.md, generated from the spec schema so the two cannot drift.

`spec_reference_markdown()` walks SearchSpec and its section models: every key with its
type, default, range or allowed values and description. `manage.py search reference
--write` rewrites the file; a test fails when the checked-in file differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from runtime_app.fleet import PRESETS
from runtime_app.metrics import CORROBORATED_LABEL, DESCRIPTOR_LABEL, REPORTED_LABEL
from search_app import freeze
from search_app.spec import (
    LIVE_CEILING,
    MAX_SPEC_BYTES,
    RUNTIME_METRICS,
    ResultsSpec,
    SearchSpec,
    _check_repo_path,
)

REFERENCE_PATH = Path(__file__).resolve().parent.parent / "docs" / "spec-reference.md"
# The full score contract lives in docs/sandbox.md; this reference states it in short and links there.
SCORE_CONTRACT_TITLE = "docs/sandbox.md, Metrics: the score contract"
SCORE_CONTRACT_LINK = "sandbox.md#metrics-the-score-contract"

# The example from the seed document (shared/seeds/workflow-experimental-search.md), byte for
# byte but for the `reported` line the score contract asks of a reported metric (issue 30);
# tests check it against tests/search_app/specs/seed_example.toml.
SEED_EXAMPLE = """\
name = "speed-up-certificate"
objective = "Reduce runtime without changing exact results"
population = 32
rounds = [32, 8, 3, 1]
concurrency = 16
integration_policy = "review_only"

[worker]
provider = "deepseek"
model = "deepseek-v4-flash"
reasoning_effort = "high"
write_authority = "worktree_write"
write_roots = ["code"]

[budget]
max_cost_microusd = 5000000
max_tokens = 10000000

[hard_gates]
commands = [
"PYTHONWARNINGS=error python certificate.py",
"git diff --exit-code -- expected_result.json",
]
forbid_test_changes = true
protected_paths = ["tests", "expected_result.json"]

[score]
command = "./scripts/benchmark_candidate.sh"
direction = "minimize"
metric = "median_runtime_ms"
reported = "time_ms"
trials = 5
tie_breakers = ["diff_lines", "cost_microusd"]

[selection]
policy = "pareto"
retain_diversity = true
"""


def _code(value: Any) -> str:
    """A value as it is written in TOML, in backticks."""
    return f"`{_toml(value)}`"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{_toml(k)} = {_toml(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    return str(value)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _type(schema: dict[str, Any]) -> str:
    members = schema.get("anyOf") or schema.get("oneOf")
    if members:
        return " or ".join(_type(member) for member in members if member.get("type") != "null")
    if "$ref" in schema:
        return "table"
    kind = schema.get("type")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}s"
    if kind == "object":
        values = schema.get("additionalProperties", {})
        return "table of " + " or ".join(f"{_type(m)}s" for m in values.get("oneOf", [values]))
    return {"integer": "integer", "string": "string", "boolean": "boolean"}.get(str(kind), str(kind))


def _range(schema: dict[str, Any], *, paths: bool = False) -> str:
    """Allowed values and bounds, as the schema states them."""
    if "anyOf" in schema:
        members = [m for m in schema["anyOf"] if m.get("type") != "null"]
        texts = [("an array: " if m.get("type") == "array" else "") + _range(m, paths=paths) for m in members]
        return "; or ".join(text for text in texts if text)
    parts = []
    if "const" in schema:
        parts.append(f"only {_code(schema['const'])}")
    if "enum" in schema:
        parts.append("one of " + ", ".join(_code(v) for v in schema["enum"]))
    low = schema.get("minimum")
    high = schema.get("maximum")
    if "exclusiveMinimum" in schema:
        parts.append(f"> {schema['exclusiveMinimum']:,}")
    elif low is not None and high is not None:
        parts.append(f"{low:,} – {high:,}")
    elif low is not None:
        parts.append(f"≥ {low:,}")
    for least, most, unit in (("minLength", "maxLength", "characters"), ("minItems", "maxItems", "items")):
        a, b = schema.get(least), schema.get(most)
        if a is not None and b is not None:
            parts.append(f"{a:,}–{b:,} {unit}")
        elif a is not None:
            parts.append(f"at least {a:,} {unit if a != 1 else unit[:-1]}")
        elif b is not None:
            parts.append(f"at most {b:,} {unit}")
    if "pattern" in schema:
        parts.append(f"matches `{schema['pattern']}`")
    if schema.get("type") == "array":
        each = _range(schema.get("items", {}), paths=paths)
        if paths:
            each = "a repo path (see [Paths](#paths))"
        if each:
            parts.append(f"each {each}")
    if schema.get("type") == "boolean" and not parts:
        parts.append("`true` or `false`")
    if schema.get("type") == "object" and paths:
        host = "oneOf" in schema.get("additionalProperties", {})
        parts.append("keys are repo paths (see [Paths](#paths)), values the file contents"
                     + (" or a host source table" if host else ""))
    return "; ".join(parts)


def _path_fields(model: type[BaseModel]) -> set[str]:
    """Fields checked as repo-relative paths (the `_paths` validators)."""
    fields: set[str] = set()
    for decorator in model.__pydantic_decorators__.field_validators.values():
        if decorator.cls_var_name == "_paths":
            fields.update(decorator.info.fields)
    return fields


def _default(name: str, model: type[BaseModel]) -> str:
    field = model.model_fields[name]
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "optional"
    if value is None:
        return "unset"
    return _code(value)


def _table(model: type[BaseModel], schema: dict[str, Any], defs: dict[str, Any], prefix: str) -> list[str]:
    rows = [
        "| key | type | default | range / allowed values | meaning |",
        "|---|---|---|---|---|",
    ]
    paths = _path_fields(model)
    for name, field in model.model_fields.items():
        prop = schema["properties"][name]
        if "$ref" in prop:
            section = prop["$ref"].rsplit("/", 1)[-1]
            kind, allowed = f"table `[{name}]`", f"see [`[{name}]`](#{name})"
            description = defs[section].get("description", "")
        else:
            kind, allowed = _type(prop), _range(prop, paths=name in paths)
            description = field.description or ""
            if prefix == "worker." and name == "provider":
                allowed = "one of " + ", ".join(f"`{preset}`" for preset in PRESETS) + \
                    " (see [Provider presets](#provider-presets))"
        rows.append(
            f"| `{prefix}{name}` | {_cell(kind)} | {_cell(_default(name, model))} | {_cell(allowed)} "
            f"| {_cell(description)} |"
        )
    return rows


def _doc(text: str | None) -> str:
    return " ".join((text or "").split())


def spec_reference_markdown() -> str:
    schema = SearchSpec.model_json_schema()
    defs = schema.get("$defs", {})
    out = [
        "# Spec reference",
        "",
        "<!-- Generated from search_app/spec.py by `manage.py search reference --write`; do not edit. -->",
        "",
        "A spec is the TOML a person writes to describe a search. Crucible validates it (every",
        "error at once, each with `line:column`, the key path, what was expected and a \"did you",
        "mean\" for misspelled keys), and freezes it against a git baseline into an immutable",
        "search. Check a file with `manage.py search validate FILE`; freeze it with",
        "`manage.py search freeze FILE --repo PATH --ref REF`.",
        "",
        "The seed's example, which validates unchanged:",
        "",
        "```toml",
        SEED_EXAMPLE.rstrip("\n"),
        "```",
        "",
        "## Rules for every spec",
        "",
        f"- A spec is UTF-8 TOML of at most {MAX_SPEC_BYTES:,} bytes.",
        "- Unknown keys are errors, at every level; a close match is suggested.",
        "- Values are not converted: `population = \"32\"` is a string, not an integer, and is refused.",
        "- Keys marked *required* must be present; every other key has the default shown.",
        "",
        "### Paths",
        "",
        _doc(_check_repo_path.__doc__) + " Each list holds a path at most once.",
        "",
        "## Top level",
        "",
        _doc(SearchSpec.__doc__),
        "",
        *_table(SearchSpec, schema, defs, ""),
        "",
        f"The runtime never runs more than {LIVE_CEILING} steps of a search at once.",
    ]
    for name, field in SearchSpec.model_fields.items():
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        section = defs[model.__name__]
        out += ["", f"## [{name}]", "", _doc(model.__doc__), "", *_table(model, section, defs, f"{name}.")]
        if name == "score":
            out += ["", "### `score.results` as a table", "", _doc(ResultsSpec.__doc__), "",
                    *_table(ResultsSpec, defs[ResultsSpec.__name__], defs, "score.results.")]
        if name == "worker":
            out += [
                "",
                "### Provider presets",
                "",
                "| preset | kind | needs |",
                "|---|---|---|",
                *(
                    f"| `{preset.name}` | {preset.kind} | "
                    f"{'`worker.command`' if preset.needs_command else '`worker.model`'} — "
                    f"{_cell(preset.description)} |"
                    for preset in PRESETS.values()
                ),
            ]
    out += [
        "",
        "## Freezing",
        "",
        _doc(freeze.__doc__),
        "",
        "### What freeze checks",
        "",
        "A spec that cannot run is refused at freeze, with the spec key, the command and the path or",
        "key named, never frozen to fail later. The spec editor shows the same refusals as you type once",
        "a repository and baseline are chosen (\"Freeze will refuse\"), as does `POST /api/specs/validate`",
        "with `repository_id` and `ref`, and `manage.py search validate FILE --repo PATH --ref REF`;",
        "`search freeze` and `search run` print them on stderr and exit 1; `POST /api/searches` is a 400.",
        "",
        "- **Programs and scripts.** Each simple command of `worker.command`, `hard_gates.commands` and",
        "  `score.command` must start inside the sandbox: a bare program on its PATH, an absolute path it",
        "  shows (declared in the section's `read_paths`), a `./x` the baseline has (executable, its `#!`",
        "  interpreter there), and the script an interpreter runs (`python x.py`, `bash -e s.sh`) in the",
        "  baseline tree, among the hidden evaluator files (gates and score) or under a declared read path.",
        "- **Files named as arguments.** A word names a file of the tree when it is not an option, holds",
        "  nothing only the shell knows (`$VAR`, globs, quotes with spaces, `~`), no URL, `key=value` or",
        "  `host:path`, is relative, and has a `/` or a file's suffix (`.py`, `.json`, `.toml` …; a pytest",
        "  node id names its file). It must be in the baseline when its directory is (refused otherwise);",
        "  when only its first directory is (`tests/unit/x.py` without `tests/unit/`) freeze warns; a word",
        "  whose first directory is not in the tree (`origin/main`, `out/result.json`) is not a tree path.",
        "  A `git` pathspec that matches nothing (`git diff --exit-code -- gone.json`) is a warning: the",
        "  command passes, but checks nothing.",
        "  Not checked: inline code (`python -c`, `-m module`), values of `-k`, `-p`, `-e` and the like,",
        "  outputs (`-o`, `--output`, `--write`, `--junitxml` … and redirections), the arguments of",
        "  programs that make files (`cp`, `mkdir`, `make`, `tar` …), lines this parser cannot follow",
        "  (`if`, `$( )`, here-documents) and words after a `cd` it cannot follow.",
        "- **Made before it is read.** A path an earlier part of the same line may make (`make &&",
        "  ./build/app`, `cp a b && python b`) is only warned about. Across commands it is refused: each",
        "  gate and trial starts from the pristine baseline tree, so what an earlier gate wrote is gone",
        "  (the message says so).",
        "- **Declared read paths.** An absolute path under one of the section's `read_paths` must exist on",
        "  the host; other absolute paths (tools, `/dev/null`) are the sandbox's to show.",
        "- **The writers' key.** A provider other than `command` and local servers needs its key",
        "  (`DEEPSEEK_API_KEY`, `ANTHROPIC_API_KEY` …) in the environment of the process freezing, or",
        "  stored by an administrator (Admin → Provider keys). When the key lives only with the workers,",
        "  `search run FILE --start-anyway` freezes and starts it regardless. A local server that does not",
        "  answer, or an agent CLI not installed, is a warning: Start asks again.",
        "",
        "## The score contract",
        "",
        "How the runtime reads `score.metric` from each trial, in short (the full contract, with the",
        f"attacks it stops and the ones it cannot: [{SCORE_CONTRACT_TITLE}]({SCORE_CONTRACT_LINK})):",
        "",
        "- " + ", ".join(f"`{name}`" for name in RUNTIME_METRICS) + " are measured by the runtime from",
        "  outside the command (wall time to its reaping, CPU time and peak memory of its whole",
        "  process tree); nothing the command prints or writes is read.",
        "- Any other name is reported by the score command, and `score.reported` says what it measures",
        "  (a spec without it is refused). A time or memory figure (`time_s`, `time_ms`, `time_us`,",
        "  `time_ns`, `memory_kib`, `memory_bytes`) is a JSON object the command writes to its report",
        "  descriptor (`$CRUCIBLE_REPORT_FD`), to the file named by `$CRUCIBLE_METRICS_FILE` (outside",
        "  its tree) or, writing neither, prints as its last non-empty line of stdout, e.g.",
        "  `{\"median_runtime_ms\": 12.5}`. The candidate's code runs inside that command and can forge",
        "  it, so the runtime checks it against its own wall, CPU and memory figures of the same trials:",
        "  a saving the report claims and the runtime's measurement does not show (beyond its noise)",
        "  eliminates the candidate, with both figures. Such a figure is labelled",
        f"  *{CORROBORATED_LABEL}*.",
        "- A figure of another kind (`reported = \"other\"`: accuracy, a count …) is read only from the",
        "  report descriptor, never from stdout or the metrics file: a hidden evaluator writes it there",
        "  and runs the candidate's code in a child process, which does not get the descriptor. It is",
        f"  labelled *{DESCRIPTOR_LABEL}*.",
        f"- A search frozen before `reported` existed reads its figure as it always did: *{REPORTED_LABEL}*.",
        "  Each label is on the search and candidate pages, in the spec editor's summary, in",
        "  `manage.py search status` and in the API (`metric_source`).",
        "- Either way a trial's metric counts only when the command exited 0 within",
        "  `score.timeout_seconds` and the value is a finite number; a trial without one eliminates the",
        "  candidate, with the reason.",
        "- With `score.results`, what each trial computed (its stdout less its metric lines, and/or the",
        "  files it names) is compared by the runtime, outside the sandbox, with the baseline's trial in",
        "  the same block; a difference eliminates the candidate with the first differing lines shown.",
        "  Without it, nothing checks correctness while the score runs: the spec validates and freezes",
        "  with that warning.",
        "",
    ]
    return "\n".join(out)
