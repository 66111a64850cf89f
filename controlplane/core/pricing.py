"""Cost of an attempt from its usage and a price table. Pure: the table is an argument.

An unknown model is `unpriced` (cost null, never 0); an attempt with no usage is `no-usage`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable

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


class PriceLookup:
    """`price_for` memoized per model name: a ledger row costs one dict lookup, not a glob match
    over the whole table. Model names come from workers and upstreams, so the memo is bounded
    (cleared when full); the table is immutable, so an entry is never stale."""

    MEMO_MAX = 4096

    def __init__(self, table: PriceTable) -> None:
        self.table = table
        self._memo: dict[str, Price | None] = {}

    def __call__(self, model: str) -> Price | None:
        try:
            return self._memo[model]
        except KeyError:
            if len(self._memo) >= self.MEMO_MAX:
                self._memo.clear()
            price = self._memo[model] = price_for(self.table, model)
            return price


def cost_of(price_of: Callable[[str], Price | None], model: str | None,
            usage: Usage | None) -> tuple[float | None, CostReason]:
    """`price_of` is a `PriceLookup` (or any model → price function)."""
    if usage is None:
        return None, CostReason.NO_USAGE
    price = price_of(model) if model else None
    if price is None:
        return None, CostReason.UNPRICED
    total = (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + usage.cache_read_tokens * price.cache_read
        + usage.cache_creation_tokens * price.cache_creation
    ) / 1_000_000
    return round(total, 8), CostReason.PRICED
