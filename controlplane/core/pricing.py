"""Cost of an attempt from its usage and a price table. Pure: the table is an argument.

An unknown model is `unpriced` (cost null, never 0), and so is a served (2xx) answer of a
generating path that carries no usage; any other attempt with no usage is `no-usage`;
`count_tokens` and `/v1/models` are `not-billed` ($0).
`check_price_entries` validates the `[[price]]` entries of a prices file (SPEC §18) as TOML
decoded them, naming file, entry and field for every problem at once; `with_overrides` puts a
file's entries before the shipped ones, so the first match — the file's — wins.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Sequence
from typing import Any

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


PRICE_KINDS = ("input", "output", "cache_read", "cache_creation")  # USD per million tokens
PRICE_FIELDS = frozenset(("models", *PRICE_KINDS))
MAX_PATTERN = 256


def pattern_problem(pattern: Any) -> str | None:
    """Why `pattern` is not a usable model glob, or None. fnmatch reads an unclosed `[` as a
    literal, which is never what a price entry means, so it is refused with the rest."""
    if not isinstance(pattern, str) or not pattern:
        return "must be a non-empty string"
    if len(pattern) > MAX_PATTERN or any(c.isspace() or not c.isprintable() for c in pattern):
        return f"must be at most {MAX_PATTERN} printable characters without spaces"
    at = 0
    while (at := pattern.find("[", at)) != -1:
        first = at + 2 if pattern.startswith("!", at + 1) else at + 1
        close = pattern.find("]", first + 1)  # a `]` right after `[` or `[!` is a literal
        if close == -1:
            return "has a `[` without its closing `]`"
        at = close + 1
    return None


def _entry_problems(entry: Any) -> list[str]:
    if not isinstance(entry, dict):
        return ["must be a table ([[price]])"]
    problems = [f"unknown field `{k}`" for k in sorted(set(entry) - PRICE_FIELDS)]
    models = entry.get("models")
    if models is None:
        problems.append("field `models` is missing")
    elif not isinstance(models, list) or not models:
        problems.append("field `models` must list at least one glob")
    else:
        problems += [f"field `models` entry {m!r} {why}" for m in models if (why := pattern_problem(m))]
    for kind in PRICE_KINDS:
        value = entry.get(kind)
        if value is None:
            problems.append(f"field `{kind}` is missing")
        elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            problems.append(f"field `{kind}` must be a number (USD per million tokens)")
        elif value < 0:
            problems.append(f"field `{kind}` must not be negative")
    return problems


def check_price_entries(raw: Any, source: str) -> tuple[tuple[Price, ...], tuple[str, ...]]:
    """The entries of a decoded prices file, or every problem as `source: price[i] (...): ...`."""
    if not isinstance(raw, dict):
        return (), (f"{source}: must be a TOML document of [[price]] entries",)
    problems = [f"{source}: unknown top-level key `{k}`" for k in sorted(set(raw) - {"price"})]
    entries = raw.get("price")
    if not isinstance(entries, list) or not entries:
        return (), (*problems, f"{source}: no [[price]] entry")
    prices: list[Price] = []
    for index, entry in enumerate(entries):
        models = entry.get("models") if isinstance(entry, dict) else None
        label = f" ({models[0]})" if isinstance(models, list) and models and isinstance(models[0], str) else ""
        found = _entry_problems(entry)
        problems += [f"{source}: price[{index}]{label}: {p}" for p in found]
        if not found:
            prices.append(Price(models=tuple(entry["models"]), **{kind: float(entry[kind]) for kind in PRICE_KINDS}))
    return (tuple(prices), ()) if not problems else ((), tuple(problems))


def with_overrides(shipped: PriceTable, first: Sequence[Price]) -> PriceTable:
    """`first` (a prices file's entries) ahead of the shipped table: the first match wins."""
    return PriceTable(price=(*first, *shipped.price))


def price_for(table: PriceTable, model: str) -> Price | None:
    for price in table.price:
        if any(fnmatch.fnmatchcase(model, pattern) for pattern in price.models):
            return price
    return None


class PriceLookup(dict[str, Price | None]):
    """`price_for` memoized per model name: a ledger row costs one dict lookup, not a glob match
    over the whole table. Model names come from workers and upstreams, so the memo is bounded
    (cleared when full); the table is immutable, so an entry is never stale.

    The memo is the dict itself and a call is its look-up (`__call__` is `dict.__getitem__`, a
    miss `__missing__`): no Python frame per row (issue 27: 1.6k → 1.2k instructions a call, and
    0.55k through the bound `__getitem__`, which `ControlService` holds)."""

    MEMO_MAX = 4096

    def __init__(self, table: PriceTable) -> None:
        super().__init__()
        self.table = table

    def __missing__(self, model: str) -> Price | None:
        if len(self) >= self.MEMO_MAX:
            self.clear()
        price = self[model] = price_for(self.table, model)
        return price

    __call__ = dict.__getitem__


# SPEC §19: the paths whose answer is billed by its usage, and those the provider never bills.
GENERATING_PATHS = frozenset({"/v1/messages", "/v1/chat/completions", "/v1/responses", "/v1/embeddings"})
NOT_BILLED_PATHS = frozenset({"/v1/messages/count_tokens", "/v1/models"})
# `cost_of` runs per row: a member read off its enum class costs ~90 ns on Python 3.11, a global ~7.
_PRICED, _UNPRICED, _NOT_BILLED, _NO_USAGE = (
    CostReason.PRICED,
    CostReason.UNPRICED,
    CostReason.NOT_BILLED,
    CostReason.NO_USAGE,
)
# For 0 <= x < _ROUNDS_BELOW, `x + _ROUNDER - _ROUNDER` is x rounded to an integer (`round8`).
_ROUNDER, _ROUNDS_BELOW = 1.5 * 2.0**52, 2.0**51


def cost_of(
    price_of: Callable[[str], Price | None],
    model: str | None,
    usage: Usage | None,
    path: str | None = None,
    http_status: int | None = None,
) -> tuple[float | None, CostReason]:
    """`price_of` is a `PriceLookup` (or any model → price function). SPEC §19: `count_tokens`
    and `/v1/models` cost $0 (`not-billed`), never unpriced; a 2xx answer of a generating path
    that carries no usage (a stream asked without `include_usage`, a body the observer could not
    read) was served and billed by the provider, so it is `unpriced` (cost null, counted in
    `unpriced_attempts`), never $0 in silence; any other row without usage cost nothing."""
    if path in NOT_BILLED_PATHS:
        return 0.0, _NOT_BILLED
    if usage is None:
        served = http_status is not None and 200 <= http_status < 300
        return None, _UNPRICED if served and path in GENERATING_PATHS else _NO_USAGE
    price = price_of(model) if model else None
    if price is None:
        return None, _UNPRICED
    total = (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + usage.cache_read_tokens * price.cache_read
        + usage.cache_creation_tokens * price.cache_creation
    ) / 1_000_000
    # `round8(total)`, inline: this runs per row
    scaled = total * 1e8
    if 0.0 < scaled < _ROUNDS_BELOW:
        near = scaled + _ROUNDER - _ROUNDER
        if -0.5 < scaled - near < 0.5:
            return near / 1e8, _PRICED
    return round(total, 8), _PRICED


def round8(total: float) -> float:
    """`round(total, 8)`, the same float, without its trip through a decimal string (~2.7k
    instructions a call on 3.11; this ~1.1k inline in `cost_of`). `round` rounds the exact value
    of `total` to 8 decimals (never a tie: a tie has a 5 in its denominator) and answers the
    double nearest to that, which is `n / 1e8` for the integer `n` (exact below 2**53; one
    correctly rounded division). `scaled` is `total * 10**8` rounded to a double, and rounding
    is monotonic: when `scaled` is strictly within half of the integer `near` nearest to it,
    so is the exact product, and `n` is `near`. A `scaled` on a tie, 0, -0.0, negative, huge or
    not finite goes to `round` itself. `tests/unit/test_price_lookup.py` holds the two equal."""
    scaled = total * 1e8
    if 0.0 < scaled < _ROUNDS_BELOW:
        near = scaled + _ROUNDER - _ROUNDER
        if -0.5 < scaled - near < 0.5:
            return near / 1e8
    return round(total, 8)
