"""Budgets for the fleet (SPEC §18 "Fleet mode", §16): two pairs on one redis-server share one
spend. A budget exhausted by requests on host A holds host B's mints 503 `budget-exhausted` and
refuses B's requests 429, B's views count A's spend, and after Redis lost its data a host that
joins later still finds the budget exhausted (the hosts publish their own totals again).

The stub's usage is deterministic (12 input, 3 output, 7 cache-read, 5 cache-write tokens), and
the prices file prices the fleet's `team-*` models as claude-sonnet-4-6 is: $0.00010185 a request.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fleetpairs import FleetPairs, call, mint
from tests.support.harness import Gateway, Stub
from tests.support.redis_server import RedisServer
from tests.support.waits import wait_until

PER_REQUEST_USD = 0.00010185
BUDGET_USD = 0.00025  # the third request exhausts it
PRICES = '[[price]]\nmodels = ["team-*"]\ninput = 3.0\noutput = 15.0\ncache_read = 0.3\ncache_creation = 3.75\n'


@pytest.fixture
def fleet(tmp_path: Path, stub: Stub) -> Iterator[FleetPairs]:
    redis = RedisServer(tmp_path / "redis").start()  # its own: this test empties it
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    pairs = FleetPairs(
        tmp_path / "fleet", stub, redis, 2, accounts=None, extra_env={"GATEWAY_PRICES_FILE": str(prices)}
    )
    try:
        yield pairs.start()
    finally:
        pairs.stop()
        redis.stop()


def budget(gw: Gateway) -> dict:
    status, _, body = gw.api("GET", "/control/v2/budgets")
    assert status == 200, body
    (row,) = body["budgets"]
    return row


def test_a_budget_spent_on_one_host_holds_the_other(fleet: FleetPairs) -> None:
    a, b = fleet[0], fleet[1]
    status, _, body = a.api(
        "PUT",
        "/control/v2/policy/level",
        {
            "name": "platform",
            "expected_revision": a.api("GET", "/control/v2/policy")[2]["revision"],
            "document": {"budgets": [{"window": "month", "usd": BUDGET_USD}]},
            "reason": "fleet budget",
        },
    )
    assert status == 200, body
    wait_until(lambda: b.api("GET", "/control/v2/budgets")[2]["budgets"], 10, "B folds A's budget")
    status, _, held_on_b = mint(b, "d-on-b")  # minted before the budget is spent
    assert status == 201, held_on_b
    status, _, spender = mint(a, "d-on-a")
    assert status == 201, spender
    for _ in range(3):
        assert call(a, spender["token"])[0] == 200
    wait_until(lambda: budget(b)["exhausted"], 10, "B counts A's spend")
    seen = budget(b)
    assert seen["spent_usd"] == pytest.approx(3 * PER_REQUEST_USD) and seen["overshoot_usd"] > 0
    status, _, spend = b.api("GET", "/control/v2/spend?window=month&by=account")
    assert status == 200 and sum(r["attempts"] for r in spend["rows"]) == 3
    assert sum(r["cost_usd"] for r in spend["rows"]) == pytest.approx(3 * PER_REQUEST_USD)

    def refused_on_b() -> tuple[int, dict]:
        status, headers, _ = call(b, held_on_b["token"])
        return status, headers

    wait_until(lambda: refused_on_b()[0] == 429, 10, "B's lease refused once A exhausted the budget")
    status, headers = refused_on_b()
    assert headers.get("x-should-retry") == "false" and int(headers["retry-after"]) >= 1
    status, headers, body = mint(b, "d-after")
    assert status == 503 and body["refusal_reason"] == "budget-exhausted", body
    assert int(headers["retry-after"]) >= 1

    fleet.redis.restart()  # Redis comes back empty
    late = fleet.make("c")  # a host that joins after the loss
    fleet.pairs.append(late)
    late.start()
    wait_until(
        lambda: late.api("GET", "/control/v2/budgets")[2]["budgets"] and budget(late)["exhausted"],
        15,
        "a host that joined after the loss finds the budget exhausted",
    )
    assert budget(late)["spent_usd"] == pytest.approx(3 * PER_REQUEST_USD)
    wait_until(
        lambda: mint(late, "d-late")[2].get("refusal_reason") == "budget-exhausted", 10, "the late host holds mints"
    )
