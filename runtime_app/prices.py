"""The versioned price table: what a model call costs, in micro-USD, and which table said so.

Tables ship in runtime_app/price_tables/<version>.json (the newest version is used); a price
in USD per million tokens is exactly micro-USD per token. Model ids match the longest
listed prefix (`claude-sonnet-4` prices `claude-sonnet-4-5-20250929`). Admins override a
model's prices in the admin (PriceOverride); a cost computed with an override records the
version as `<table>+override`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from runtime_app.models import PriceOverride

TABLES_DIR = Path(__file__).resolve().parent / "price_tables"


@dataclass(frozen=True)
class Price:
    input: float
    output: float
    cache_write: float
    cache_read: float


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_write_tokens + self.cache_read_tokens


@cache
def price_table() -> tuple[str, dict[str, Price]]:
    """(version, {model prefix: Price}) of the newest shipped table."""
    newest = sorted(TABLES_DIR.glob("*.json"))[-1]
    data = json.loads(newest.read_text())
    return data["version"], {name: Price(**values) for name, values in data["models"].items()}


def price_for(model: str) -> tuple[Price | None, str]:
    """The price of a model id and the table version it came from (None if unlisted)."""
    version, table = price_table()
    overrides = PriceOverride.objects.filter(model_prefix__in=_prefixes(model))
    override = max(overrides, key=lambda o: len(o.model_prefix), default=None)
    if override is not None:
        return Price(override.input, override.output, override.cache_write, override.cache_read), \
            f"{version}+override"
    matches = [prefix for prefix in table if model.startswith(prefix)]
    if not matches:
        return None, version
    return table[max(matches, key=len)], version


def _prefixes(model: str) -> list[str]:
    return [model[:end] for end in range(1, len(model) + 1)]


def cost_microusd(price: Price, usage: Usage) -> int:
    """The cost of one call, rounded up to a whole micro-USD."""
    return math.ceil(
        usage.input_tokens * price.input + usage.output_tokens * price.output
        + usage.cache_write_tokens * price.cache_write + usage.cache_read_tokens * price.cache_read
    )


def worst_case_microusd(price: Price, input_tokens: int, max_output_tokens: int) -> int:
    """What a call can cost at most: every input token written to the cache, full output."""
    return math.ceil(input_tokens * max(price.input, price.cache_write) + max_output_tokens * price.output)


def usd_text(microusd: int | float | None) -> str:
    """Micro-USD as dollars for people: $1.25, or enough digits for small sums ($0.00035)."""
    usd = (microusd or 0) / 1_000_000
    return f"${usd:,.2f}" if usd >= 0.01 or not usd else f"${usd:.6f}".rstrip("0")
