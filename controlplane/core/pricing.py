"""Cost of an attempt from its usage and a price table. Pure: the table is an argument.

An unknown model is `unpriced` (cost null, never 0); an attempt with no usage is `no-usage`.
"""

from __future__ import annotations

import fnmatch

import msgspec

from shared.codes import CostReason
from shared.wire import Usage


class Price(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    models: tuple[str, ...]
    input: float
    output: float
    cache_read: float
    cache_creation: float


class PriceTable(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    price: tuple[Price, ...]


def price_for(table: PriceTable, model: str) -> Price | None:
    for price in table.price:
        if any(fnmatch.fnmatchcase(model, pattern) for pattern in price.models):
            return price
    return None


def cost_of(table: PriceTable, model: str | None, usage: Usage | None) -> tuple[float | None, CostReason]:
    if usage is None:
        return None, CostReason.NO_USAGE
    price = price_for(table, model) if model else None
    if price is None:
        return None, CostReason.UNPRICED
    total = (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + usage.cache_read_tokens * price.cache_read
        + usage.cache_creation_tokens * price.cache_creation
    ) / 1_000_000
    return round(total, 8), CostReason.PRICED
