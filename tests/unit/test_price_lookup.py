"""The price lookup answers as the price table does, memoized once per model and bounded."""

from __future__ import annotations

import pytest

from controlplane.core.pricing import Price, PriceLookup, PriceTable, cost_of, price_for
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
        assert len(lookup._memo) <= PriceLookup.MEMO_MAX
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
