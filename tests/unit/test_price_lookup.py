"""The price lookup answers as the price table does, memoized once per model and bounded."""

from __future__ import annotations

import math
import random

import pytest

from controlplane.core.pricing import PRICE_KINDS, Price, PriceLookup, PriceTable, cost_of, price_for, round8
from shared.codes import CostReason
from shared.wire import Usage

PRICES = PriceTable(
    price=(
        Price(models=("claude-sonnet-*",), input=3.0, output=15.0, cache_read=0.3, cache_creation=3.75),
        Price(models=("gpt-4o", "gpt-4o-*"), input=2.5, output=10.0, cache_read=1.25, cache_creation=0.0),
    )
)


@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "gpt-4o", "gpt-4o-mini", "unknown", "claude-opus-4"])
def test_price_lookup_answers_as_the_table_does(model: str) -> None:
    lookup = PriceLookup(PRICES)
    assert lookup(model) is price_for(PRICES, model)
    assert lookup(model) is price_for(PRICES, model)  # memoized answer is the same
    usage = Usage(input_tokens=1000, output_tokens=100)
    assert cost_of(lookup, model, usage) == cost_of(lambda m: price_for(PRICES, m), model, usage)


def test_price_lookup_memo_is_bounded() -> None:
    lookup = PriceLookup(PRICES)
    for n in range(PriceLookup.MEMO_MAX * 2 + 3):
        lookup(f"model-{n}")
        assert len(lookup) <= PriceLookup.MEMO_MAX
    assert lookup("claude-sonnet-4-5") is PRICES.price[0]


# SPEC §19: what a row costs by its path and status when its usage is missing.
COST_CASES = [
    ("/v1/messages", 200, None, (None, CostReason.UNPRICED)),
    ("/v1/chat/completions", 200, None, (None, CostReason.UNPRICED)),
    ("/v1/responses", 201, None, (None, CostReason.UNPRICED)),
    ("/v1/embeddings", 200, None, (None, CostReason.UNPRICED)),
    ("/v1/messages", 429, None, (None, CostReason.NO_USAGE)),
    ("/v1/messages", 400, None, (None, CostReason.NO_USAGE)),  # a refusal
    ("/v1/chat/completions", None, None, (None, CostReason.NO_USAGE)),  # no answer at all
    ("/v1/messages/count_tokens", 200, None, (0.0, CostReason.NOT_BILLED)),
    ("/v1/messages/count_tokens", 200, Usage(input_tokens=1000), (0.0, CostReason.NOT_BILLED)),
    ("/v1/models", 200, None, (0.0, CostReason.NOT_BILLED)),
    ("/v1/messages", 200, Usage(input_tokens=1_000_000), (3.0, CostReason.PRICED)),
]


@pytest.mark.parametrize(("path", "status", "usage", "expect"), COST_CASES)
def test_cost_by_path_and_status(path: str, status: int | None, usage: Usage | None, expect: tuple) -> None:
    assert cost_of(PriceLookup(PRICES), "claude-sonnet-4-5", usage, path, status) == expect


def _near(value: float, steps: int = 3) -> list[float]:
    """`value` and the few doubles either side of it."""
    around, up, down = [value], value, value
    for _ in range(steps):
        up, down = math.nextafter(up, math.inf), math.nextafter(down, -math.inf)
        around += [up, down]
    return around


ROUND8_EDGES = [0.0, -0.0, -1e-9, -0.5, 5e-9, 4.9999999e-9, 1.5e-8, 2.5e-8, 5e-324, 1e-300, 0.09999999999999999]
ROUND8_EDGES += [99999.999999995, 1e5, 1e13 / 1e8, 1e5 + 1e-9, 3e7 + 0.123456785, 123456789.123456789, 1e13, 1e300]
# `total * 1e8` is a decimal tie exactly while `total` is not: `round` goes by `total`'s side of it
ROUND8_EDGES += [2818.482166455, 3940.279748095, 7161.424113055, 5837.819406405, 1756.680300115]


def test_round8_is_round_to_8_digits() -> None:
    """The ledger's `cost_usd` is `round(total, 8)` (issue 27: `round8` the same float, faster):
    every priced total a row can have, decimal ties and values a hair either side of one, the
    fast path's bounds, signs and non-finite values answer as `round` does, to the last bit."""
    rng = random.Random(27)
    cases = [rng.random() * 10 ** rng.uniform(-12, 6) for _ in range(20_000)]
    for _ in range(20_000):
        tokens = [rng.randint(0, 2_000_000) for _ in PRICE_KINDS]
        prices = [rng.choice((0.08, 0.1, 0.3, 1.25, 2.5, 3.0, 3.75, 10.0, 15.0, 75.0)) for _ in PRICE_KINDS]
        cases.append(sum(t * p for t, p in zip(tokens, prices)) / 1_000_000)
    for n in (*range(2_000), *(rng.randint(0, 10**13) for _ in range(2_000))):
        for tie in (n + 0.5, n + 0.499, n + 0.501, float(n)):
            cases += _near(tie / 1e8)
    for value in [*ROUND8_EDGES, math.inf, -math.inf, math.nan]:
        cases += _near(value) if math.isfinite(value) else [value]
    wrong = [(x, round8(x), round(x, 8)) for x in cases if repr(round8(x)) != repr(round(x, 8))]
    assert not wrong, wrong[:5]
