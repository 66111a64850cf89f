"""`GATEWAY_PRICES_FILE` through the real daemons: its entries price the rows before the shipped
table's, and a model only it names is priced instead of `unpriced`."""

from __future__ import annotations

from pathlib import Path

from tests.support.attempts import A_HEADERS, MESSAGES, one_row
from tests.support.harness import Stub, http
from tests.support.stub_upstream import (
    STUB_CACHE_CREATION_INPUT_TOKENS,
    STUB_CACHE_READ_INPUT_TOKENS,
    STUB_INPUT_TOKENS,
)

PRICES = """
[[price]]
models = ["claude-sonnet-4-6*"]   # overrides the shipped claude-sonnet-4* entry
input = 1.0
output = 2.0
cache_read = 0.1
cache_creation = 1.5

[[price]]
models = ["claude-house-*"]       # a model the shipped table does not know
input = 10.0
output = 10.0
cache_read = 10.0
cache_creation = 10.0
"""


def test_the_prices_file_prices_rows_first(make_gateway, clean_stub: Stub, tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    gw = make_gateway({"GATEWAY_PRICES_FILE": str(prices)}).start()
    costs = {}
    for model in ("claude-sonnet-4-6", "claude-house-1", "claude-sonnet-4-5", "claude-unknown-9"):
        minted = gw.mint()
        status, _, _ = http(
            "POST",
            gw.dataplane_url + "/v1/messages",
            {"model": model, "max_tokens": 16, "messages": MESSAGES},
            {**A_HEADERS, "x-api-key": minted["token"]},
        )
        assert status == 200
        row = one_row(gw, minted["key_id"])
        costs[model] = (row["cost_usd"], row["cost_reason"], row["usage"]["output_tokens"])
    prompt = (STUB_INPUT_TOKENS, STUB_CACHE_READ_INPUT_TOKENS, STUB_CACHE_CREATION_INPUT_TOKENS)

    def cost(prices: tuple[float, float, float, float], output_tokens: int) -> float:
        tokens = (prompt[0], output_tokens, prompt[1], prompt[2])
        return round(sum(t * p for t, p in zip(tokens, prices)) / 1_000_000, 8)

    assert costs["claude-sonnet-4-6"][:2] == (cost((1.0, 2.0, 0.1, 1.5), costs["claude-sonnet-4-6"][2]), "priced")
    assert costs["claude-house-1"][:2] == (cost((10.0,) * 4, costs["claude-house-1"][2]), "priced")
    assert costs["claude-sonnet-4-5"][:2] == (cost((3.0, 15.0, 0.3, 3.75), costs["claude-sonnet-4-5"][2]), "priced")
    assert costs["claude-unknown-9"][:2] == (None, "unpriced")
