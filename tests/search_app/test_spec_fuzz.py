"""Any bytes or text posted as a spec get a structured answer, never an exception.

Five generators, 2,300 examples in all: random TOML documents, the seed spec with keys and
values mutated, the seed's text with characters mutated, random text and random bytes.
"""

from __future__ import annotations

import datetime
import json
import math
import re
import tomllib
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from search_app.freeze import canonical
from search_app.spec import (
    BudgetSpec,
    EvaluatorSpec,
    EvidenceSpec,
    HardGatesSpec,
    ScoreSpec,
    SearchSpec,
    SelectionSpec,
    SpecReport,
    WorkerSpec,
    spec_normalized,
    spec_validate,
)

SEED = (Path(__file__).parent / "specs" / "seed_example.toml").read_text()
SEED_DATA = tomllib.loads(SEED)


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


KNOWN_KEYS = sorted({
    key
    for model in (SearchSpec, WorkerSpec, BudgetSpec, EvidenceSpec, EvaluatorSpec, HardGatesSpec,
                  ScoreSpec, SelectionSpec)
    for key in model.model_fields
})


# --- a small TOML writer (tomlkit is not a dependency) -----------------------------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def toml_string(text: str) -> str:
    escaped = []
    for char in text:
        if char in '"\\':
            escaped.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            escaped.append(f"\\u{ord(char):04x}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'


def toml_key(key: str) -> str:
    return key if _BARE.fullmatch(key) else toml_string(key)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def toml_document(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> str:
    """Scalars and arrays as `key = value` lines, nested tables as `[a.b]` sections."""
    lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for key, value in data.items():
        if isinstance(value, dict):
            path = (*prefix, key)
            lines.append("")
            lines.append("[" + ".".join(toml_key(part) for part in path) + "]")
            lines.append(toml_document(value, path))
    return "\n".join(lines) + ("\n" if not prefix else "")


# --- strategies ----------------------------------------------------------------------------------

text_chars = st.characters(blacklist_categories=("Cs",))  # TOML text holds Unicode scalar values
keys = st.one_of(st.sampled_from(KNOWN_KEYS), st.text(text_chars, min_size=1, max_size=12))
scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=-3, max_value=1100),
    st.floats(allow_nan=False),
    st.booleans(),
    st.text(text_chars, max_size=30),
    st.sampled_from(["deepseek", "command", "review_only", "auto_merge", "high", "low", "pareto",
                     "ordered", "minimize", "score", "diff_lines", "code", "../x", "/abs", "C:\\x",
                     ".git", "worktree_write", "", "speed-up"]),
    st.dates(),
    st.times(),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(keys, children, max_size=4),
    ),
    max_leaves=12,
)
documents = st.dictionaries(keys, values, max_size=10)


def seed_paths(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for key, value in data.items():
        paths.append((*prefix, key))
        if isinstance(value, dict):
            paths += seed_paths(value, (*prefix, key))
    return paths


SEED_PATHS = seed_paths(SEED_DATA)


@st.composite
def mutated_seeds(draw) -> dict[str, Any]:
    """The seed with a few keys replaced, deleted, renamed or added."""
    data = json.loads(json.dumps(SEED_DATA))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        path = draw(st.sampled_from(SEED_PATHS))
        parent = data
        for part in path[:-1]:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or path[-1] not in parent:
            continue
        action = draw(st.sampled_from(["replace", "delete", "rename", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(values)
        elif action == "delete":
            del parent[path[-1]]
        elif action == "rename":
            parent[draw(keys)] = parent.pop(path[-1])
        else:
            parent[draw(keys)] = draw(values)
    return data


@st.composite
def mutated_seed_texts(draw) -> str:
    """The seed's text with characters inserted, deleted or replaced."""
    text = SEED
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        at = draw(st.integers(min_value=0, max_value=len(text)))
        action = draw(st.sampled_from(["insert", "delete", "replace"]))
        piece = draw(st.one_of(
            st.sampled_from(["=", "[", "]", '"', "'", '"""', "\n", "#", ".", ",", "{", "}", "\\", "\r",
                             "\u2028", "\x85", "\x00", "\t", " "]),
            st.text(text_chars, max_size=4),
        ))
        if action == "insert":
            text = text[:at] + piece + text[at:]
        elif action == "delete":
            text = text[:at] + text[at + len(piece) + 1:]
        else:
            text = text[:at] + piece + text[at + len(piece):]
    return text


# --- the property ----------------------------------------------------------------------------


def assert_structured(source: str | bytes) -> SpecReport:
    report = spec_validate(source)
    assert isinstance(report, SpecReport)
    text = source.decode("utf-8", errors="replace") if isinstance(source, bytes) else source
    lines = text.count("\n") + 1
    if report.valid:
        assert report.spec is not None and report.errors == ()
        spec = report.spec
        assert spec.rounds[0] == spec.population and spec.rounds[-1] == 1
        assert all(a > b for a, b in zip(spec.rounds, spec.rounds[1:], strict=False))
        assert spec.concurrency <= min(spec.population, 16)
        assert spec.worker.write_roots or spec.worker.exact_files
        canonical(spec_normalized(spec))  # what a freeze hashes can always be encoded
    else:
        assert report.spec is None and len(report.errors) >= 1
        for error in report.errors:
            assert error.line >= 1 and error.column >= 1, error
            assert error.line <= lines + 1, (error, lines)
            assert error.message
            assert str(error).startswith(f"{error.line}:{error.column} ")
            json.dumps(error.as_dict())
    return report


@fuzz(600)
@given(documents)
def test_random_toml_documents_get_a_structured_answer(data):
    text = toml_document(data)
    assert tomllib.loads(text) == data  # the writer writes what it was given
    assert_structured(text)
    assert_structured(text.encode())


@fuzz(600)
@given(mutated_seeds())
def test_the_seed_with_mutated_keys_and_values_gets_a_structured_answer(data):
    text = toml_document(data)
    report = assert_structured(text)
    lines = text.split("\n")
    for error in report.errors:
        if error.path in data:  # an error about a top-level key that is there points at its line
            assert toml_key(error.path) in lines[error.line - 1], (error, lines[error.line - 1])


@fuzz(500)
@given(mutated_seed_texts())
def test_the_seed_text_with_mutated_characters_gets_a_structured_answer(text):
    assert_structured(text)


@fuzz(300)
@given(st.text(max_size=300))
def test_random_text_gets_a_structured_answer(text):
    assert_structured(text)


@fuzz(300)
@given(st.binary(max_size=300))
def test_random_bytes_get_a_structured_answer(data):
    assert_structured(data)


def test_the_toml_writer_round_trips_the_seed():
    assert tomllib.loads(toml_document(SEED_DATA)) == SEED_DATA
    assert spec_validate(toml_document(SEED_DATA)).valid
