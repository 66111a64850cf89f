"""Headroom for the fleet (SPEC §22, §16): two pairs on one real redis-server. An answer host A
relayed with a nearly exhausted token window makes host B's mints skip the account too
(`rate-limit-headroom-low`, in B's explain and B's mint), B's accounts view and metrics show
A's observation, and a newer, healthy answer on B lifts the skip on A."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fleetpairs import FleetPairs, account, accounts_toml, call, mint
from tests.support.harness import Gateway, Stub
from tests.support.redis_server import RedisServer
from tests.support.waits import wait_until
from tests.system.test_headroom import anthropic_headers

LOW = "rate-limit-headroom-low"
MODEL = "team-sonnet-1"


@pytest.fixture
def fleet(tmp_path: Path, stub: Stub, redis_server: RedisServer) -> Iterator[FleetPairs]:
    pairs = FleetPairs(tmp_path / "fleet", stub, redis_server, 2, accounts=accounts_toml(stub, lease_capacity=None))
    try:
        yield pairs.start()
    finally:
        pairs.stop()


def codes(gw: Gateway) -> dict[str, str | None]:
    status, _, body = gw.api("GET", f"/control/v2/policy/explain?repo_slug=acme/app&model={MODEL}")
    assert status == 200, body
    return {c["account_id"]: c["code"] for c in body["candidates"]}


def test_an_observation_on_one_host_steers_the_other(fleet: FleetPairs, clean_stub: Stub) -> None:
    a, b = fleet[0], fleet[1]
    status, _, body = a.api(
        "PUT",
        "/control/v2/policy/level",
        {
            "name": "platform",
            "expected_revision": a.api("GET", "/control/v2/policy")[2]["revision"],
            "document": {"min_headroom_percent": 10},
            "reason": "steer before the 429",
        },
    )
    assert status == 200, body
    status, _, on_a = mint(a, "d-a")
    assert (status, on_a["account_id"]) == (201, "team-a"), on_a

    low = json.dumps({"headers": anthropic_headers(800, time.time() + 120)})  # 2 % of the tokens
    assert call(a, on_a["token"], low)[0] == 200
    wait_until(lambda: codes(b)["team-a"] == LOW, 10, "B skips the account A saw run low")
    tokens = account(b, "team-a")["rate_limits"]["tokens"]
    assert (tokens["remaining"], tokens["limit"], tokens["current"]) == (800, 40000, True)
    status, _, on_b = mint(b, "d-b")
    assert (status, on_b["account_id"], on_b["skipped"]) == (
        201,
        "team-b",
        [{"account_id": "team-a", "position": 0, "code": LOW}],
    )
    metrics = b.api("GET", "/metrics")[2]
    assert 'leasehold_account_ratelimit_remaining{account_id="team-a",kind="tokens"} 800.0' in metrics

    # a newer answer on B (A's dispatch was never moved; B's lease of team-a is minted while
    # the floor is off for its repo) says the window refilled: A lifts the skip
    status, _, body = b.api(
        "PUT",
        "/control/v2/policy/level",
        {
            "name": "repo:acme/refill",
            "expected_revision": b.api("GET", "/control/v2/policy")[2]["revision"],
            "document": {"min_headroom_percent": 0},
            "reason": "this repo ignores headroom",
        },
    )
    assert status == 200, body
    status, _, refill = b.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": "d-refill",
            "repo_slug": "acme/refill",
            "principal_kind": "worker",
            "principal_id": "w-1",
            "model": MODEL,
        },
    )
    assert (status, refill["account_id"]) == (201, "team-a"), refill
    healthy = json.dumps({"headers": anthropic_headers(39000, time.time() + 120)})
    assert call(b, refill["token"], healthy)[0] == 200
    wait_until(lambda: codes(a)["team-a"] is None, 10, "A lifts the skip on B's newer observation")
    assert account(a, "team-a")["rate_limits"]["tokens"]["remaining"] == 39000
