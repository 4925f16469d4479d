"""docs/spec-reference.md is generated from the schema and checked in; the two never drift."""

from __future__ import annotations

from pathlib import Path

from search_app.reference import REFERENCE_PATH, SEED_EXAMPLE, spec_reference_markdown
from search_app.spec import SearchSpec, spec_validate

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


def test_the_reference_does_not_invent_the_score_commands_output_contract():
    reference = spec_reference_markdown()
    assert "JSON" not in reference.split("## Not defined yet")[0].replace("UTF-8 JSON", "")
    assert "belongs\nto the evaluator host" in reference
