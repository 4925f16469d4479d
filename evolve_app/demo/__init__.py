"""The offline demo: a benchmark, a seed workspace and the textbook of correct rules (README.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DEMO_DIR = Path(__file__).resolve().parent
BENCHMARK = DEMO_DIR / "benchmark.jsonl"
SEED_WORKSPACE = DEMO_DIR / "seed_workspace"
TEXTBOOK = DEMO_DIR / "textbook.json"


def textbook_load() -> dict[str, dict[str, Any]]:
    """category -> {"skill", "description", "skill_md", "rules", "lesson"} (see README.md)."""
    categories: dict[str, dict[str, Any]] = json.loads(TEXTBOOK.read_text(encoding="utf-8"))["categories"]
    return categories
