"""Starting points for a new spec: each is a TOML file in spec_templates/ that validates."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

TEMPLATES_DIR = Path(__file__).resolve().parent / "spec_templates"


@dataclass(frozen=True)
class SpecTemplate:
    slug: str
    label: str
    description: str

    @property
    def text(self) -> str:
        return _read(self.slug)


SPEC_TEMPLATES: tuple[SpecTemplate, ...] = (
    SpecTemplate("speed-up", "Speed-up",
                 "Make a program faster without changing its exact results (the seed's example)."),
    SpecTemplate("bug-fix-with-tests", "Bug fix with tests",
                 "Make a failing behaviour pass, judged by a hidden regression test."),
    SpecTemplate("refactor-with-gates", "Refactor with gates",
                 "Simplify code while lint, types, tests and golden outputs stay green."),
    SpecTemplate("demo-scripted", "Demo: scripted writers",
                 "The demo repository's speed-up, written by scripted command workers (no API key)."),
)


@cache
def _read(slug: str) -> str:
    return (TEMPLATES_DIR / f"{slug}.toml").read_text(encoding="utf-8")


def spec_template_get(slug: str | None) -> SpecTemplate | None:
    return next((template for template in SPEC_TEMPLATES if template.slug == slug), None)

