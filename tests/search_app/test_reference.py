"""docs/spec-reference.md is generated from the schema and checked in; the two never drift."""

from __future__ import annotations

import re
from pathlib import Path

from runtime_app.metrics import CORROBORATED_LABEL, DESCRIPTOR_LABEL, REPORTED_LABEL
from search_app.measurement import min_blocks
from search_app.reference import REFERENCE_PATH, SCORE_CONTRACT_LINK, SEED_EXAMPLE, spec_reference_markdown
from search_app.spec import RUNTIME_METRICS, SearchSpec, spec_validate

SEED = (Path(__file__).parent / "specs" / "seed_example.toml").read_text()


def test_the_checked_in_reference_is_what_the_schema_generates():
    assert REFERENCE_PATH.read_text(encoding="utf-8") == spec_reference_markdown(), (
        "docs/spec-reference.md is stale: run `manage.py search reference --write`"
    )


def test_the_reference_opens_with_the_seed_example_which_validates():
    assert SEED_EXAMPLE == SEED
    assert spec_validate(SEED_EXAMPLE).valid
    assert f"```toml\n{SEED_EXAMPLE}```" in spec_reference_markdown()


def test_every_key_of_every_section_is_documented_with_its_default():
    reference = spec_reference_markdown()
    for name, field in SearchSpec.model_fields.items():
        assert f"| `{name}` |" in reference
        section = field.annotation
        if isinstance(section, type) and issubclass(section, SearchSpec.__mro__[1]):
            assert f"## [{name}]" in reference
            for key in section.model_fields:
                assert f"| `{name}.{key}` |" in reference, f"{name}.{key}"
    assert "| `score.trials` | integer | `5` | 1 – 25 |" in reference
    assert "| `population` | integer | required | 2 – 1,000 |" in reference
    assert "| `selection.ordering` | array of strings | `[\"cost_microusd\", \"score\"]` |" in reference


def _row(reference: str, key: str) -> str:
    return next(line for line in reference.splitlines() if line.startswith(f"| `{key}` |"))


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation dropped, spaces to -."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in markdown.splitlines() if line.startswith("#")}


def test_the_reference_states_the_score_contract_defined_in_the_sandbox_docs_and_links_there():
    reference = spec_reference_markdown()
    assert "## Not defined yet" not in reference and "a later issue builds" not in reference
    metric = _row(reference, "score.metric")
    assert all(f"`{name}`" in metric for name in RUNTIME_METRICS)
    assert "(#the-score-contract)" in metric and "the-score-contract" in _anchors(reference)
    contract = reference.split("## The score contract", 1)[1]
    assert all(f"`{name}`" in contract for name in RUNTIME_METRICS)
    assert "`$CRUCIBLE_METRICS_FILE`" in contract and f"*{REPORTED_LABEL}*" in contract
    assert f"*{CORROBORATED_LABEL}*" in contract and f"*{DESCRIPTOR_LABEL}*" in contract
    assert "`$CRUCIBLE_REPORT_FD`" in contract
    # The contract is not invented here: the link lands on the section that defines it.
    page, anchor = SCORE_CONTRACT_LINK.split("#")
    sandbox = (REFERENCE_PATH.parent / page).read_text(encoding="utf-8")
    assert f"]({SCORE_CONTRACT_LINK})" in contract and anchor in _anchors(sandbox)
    defined = sandbox.split("## Metrics: the score contract", 1)[1].split("\n## ", 1)[0]
    assert "`$CRUCIBLE_METRICS_FILE`" in defined and all(f"`{name}`" in defined for name in RUNTIME_METRICS)


def test_the_reference_says_how_trials_become_a_figure_when_paired_and_when_absolute():
    reference = spec_reference_markdown()
    trials = _row(reference, "score.trials")
    assert "the score is their median" not in trials
    paired, absolute = trials.split("`paired`:", 1)[1].split("`absolute`:", 1)
    assert "median of its per-block ratios to the baseline's trial in the same block" in paired
    assert f"({min_blocks(0.95)} at 0.95)" in paired and "up to `max_trials`" in paired
    assert "median of its values" in absolute
    assert "repeated trials, the median counts" not in reference
