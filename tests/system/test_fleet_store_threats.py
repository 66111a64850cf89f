"""The fleet's store is trusted for availability, not for integrity (SPEC §19; README "Threat
model"). A Redis writer without the fleet secret, against two real pairs sharing a real
redis-server, can no longer:
- lift a disable (a forged `set-state enabled` record with a recomputed hash and anchor);
- remove a budget (a forged policy record without the budget);
- erase spend (a negative cost published under a host id);
- forge a revoke (a revoke-leases request in the stream);
- crash a host (a malformed revoke-stream entry: control's revocation and its restart);
and a host that cannot refresh the fleet's spend fails closed for budgeted scopes only.
Each of these passed through on the commit before issue 22.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from shared.fleet.keys import FleetKeys
from tests.support.fleet import forge_chain_record
from tests.support.fleetpairs import FleetPairs, accounts_toml, call, mint
from tests.support.harness import Gateway, Stub
from tests.support.redis_server import RedisServer
from tests.support.waits import wait_until

ADMIN = "/control/v2/accounts"
PRICES = '[[price]]\nmodels = ["team-*"]\ninput = 3.0\noutput = 15.0\ncache_read = 0.3\ncache_creation = 3.75\n'
BUDGET_USD = 0.00015  # the second request ($0.00010185 each) exhausts it


class World:
    def __init__(self, pairs: FleetPairs, redis_server: RedisServer) -> None:
        self.pairs = pairs
        self.redis = redis_server
        self.keys = FleetKeys(pairs.fleet_id)
        self.admin = redis.Redis(host="127.0.0.1", port=redis_server.port, socket_timeout=5)


@pytest.fixture
def world(tmp_path: Path, stub: Stub) -> Iterator[World]:
    server = RedisServer(tmp_path / "redis").start()
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    pairs = FleetPairs(
        tmp_path / "fleet",
        stub,
        server,
        2,
        accounts=accounts_toml(stub, lease_capacity=None),
        extra_env={"GATEWAY_PRICES_FILE": str(prices)},
    )
    try:
        yield World(pairs.start(), server)
    finally:
        server.resume()
        pairs.stop()
        server.stop()


def put_budget(gw: Gateway, level: str = "platform", usd: float = BUDGET_USD) -> None:
    revision = gw.api("GET", "/control/v2/policy")[2]["revision"]
    status, _, body = gw.api(
        "PUT",
        "/control/v2/policy/level",
        {
            "name": level,
            "expected_revision": revision,
            "document": {"budgets": [{"window": "month", "usd": usd}]},
            "reason": "threat model",
        },
    )
    assert status == 200, body


def rejected(gw: Gateway, kind: str) -> float:
    text = gw.api("GET", "/metrics")[2]
    for line in (text if isinstance(text, str) else "").splitlines():
        if line.startswith(f'leasehold_fleet_entries_rejected_total{{kind="{kind}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def exhaust(world: World) -> tuple[Gateway, Gateway, dict[str, Any]]:
    a, b = world.pairs[0], world.pairs[1]
    put_budget(a)
    wait_until(lambda: b.api("GET", "/control/v2/budgets")[2]["budgets"], 30, "B folds A's budget")
    status, _, lease = mint(b, "d-held")
    assert status == 201, lease
    status, _, spender = mint(a, "d-spender")
    assert status == 201, spender
    for _ in range(2):
        assert call(a, spender["token"])[0] == 200
    wait_until(lambda: call(b, lease["token"])[0] == 429, 30, "B's lease refused once A exhausted the budget")
    return a, b, lease


def test_a_writer_cannot_lift_a_disable(world: World) -> None:
    a, b = world.pairs[0], world.pairs[1]
    status, _, body = a.api("PATCH", f"{ADMIN}/team-a/state", {"state": "disabled", "reason": "incident"})
    assert status == 200, body
    wait_until(lambda: mint(b, "d-0")[2].get("account_id") == "team-b", 30, "B skips the disabled team-a")
    forged = forge_chain_record(
        world.admin,
        world.keys,
        "account-admin",
        lambda f: {
            **f,
            "account_id": "team-a",
            "action": "set-state",
            "state": "enabled",
            "actor": "alice",
            "actor_authenticated_by": "control-token",
            "reason": "forged",
        },
    )
    for n in range(5):  # never a mint on team-a: held while the chain cannot be believed
        status, _, body = mint(b, f"d-{n + 1}")
        assert body.get("account_id") != "team-a", body
    wait_until(
        lambda: mint(b, "d-held")[2].get("refusal_reason") == "account-state-unavailable",
        30,
        "B holds mints on a chain that does not verify",
    )
    mirror = (b.state_dir / "account-admin.jsonl").read_bytes()
    assert forged["hash"].encode() not in mirror and b"forged" not in mirror
    status, _, view = b.api("GET", ADMIN)
    assert view["admin_chain_verdict"] == "corrupt"


def test_a_writer_cannot_remove_a_budget(world: World) -> None:
    _a, b, lease = exhaust(world)
    forge_chain_record(world.admin, world.keys, "policy", lambda f: {**f, "document": {}, "reason": "forged"})
    for n in range(3):
        status, _, body = mint(b, f"d-after-{n}")
        assert status == 503 and body["refusal_reason"] in ("budget-exhausted", "policy-unavailable"), body
    assert call(b, lease["token"])[0] == 429
    assert b"forged" not in (b.state_dir / "policy.jsonl").read_bytes()


def test_a_writer_cannot_erase_spend(world: World) -> None:
    import msgspec

    _a, b, lease = exhaust(world)
    spent = b.api("GET", "/control/v2/budgets")[2]["budgets"][0]["spent_usd"]
    negative = msgspec.msgpack.encode([("platform", "", [-999.99, 1, 0, 0, 0, 0, 0])])
    month = b.api("GET", "/control/v2/budgets")[2]["budgets"][0]["window_start"][:7]
    for host in ("gw-a", "gw-z"):
        world.admin.hset(world.keys.spend_host(host), mapping={month: negative, "_": "1"})
        world.admin.hset(world.keys.spend_versions, host, "forged")
        world.admin.publish(world.keys.spend_moved, host)
    wait_until(
        lambda: rejected(b, "spend") >= 2 or not b.api("GET", "/control/v2/budgets")[2]["budgets"][0]["exhausted"],
        30,
        "B reads the forged spend",
    )
    budget = b.api("GET", "/control/v2/budgets")[2]["budgets"][0]
    assert budget["exhausted"] and budget["spent_usd"] >= spent > 0  # (a late row of B's own may add)
    assert rejected(b, "spend") >= 2
    assert call(b, lease["token"])[0] == 429


def test_a_writer_cannot_forge_a_revoke_nor_crash_a_host(world: World) -> None:
    a, b = world.pairs[0], world.pairs[1]
    status, _, lease = mint(b, "d-1")
    assert status == 201, lease
    world.admin.xadd(
        world.keys.revoke,
        {"request_id": "rv-" + "0" * 16, "account_id": lease["account_id"], "from_host": "gw-a", "mac": "A" * 43},
    )
    world.admin.xadd(world.keys.revoke, {"request_id": "x", "account_id": "y"})  # the crash-loop entry
    wait_until(lambda: rejected(b, "revoke") >= 2 or call(b, lease["token"])[0] != 200, 30, "B reads both entries")
    assert call(b, lease["token"])[0] == 200  # not revoked by a forgery
    assert rejected(b, "revoke") >= 2
    b.stop()
    b.start()  # a restart reads the stream
    world.pairs.wait_hosts_live(2)
    status, _, body = a.api("POST", f"{ADMIN}/{lease['account_id']}/revoke-leases", {"reason": "real"})
    assert status == 200 and body["unacknowledged_hosts"] == [], body
    wait_until(lambda: call(b, lease["token"])[0] == 401, 30, "the real revoke ends B's lease")


def test_stale_fleet_spend_holds_budgeted_scopes_only(world: World) -> None:
    a = world.pairs[0]
    put_budget(a, "repo:acme/app", usd=100.0)  # never exhausted here: only staleness holds
    wait_until(lambda: a.api("GET", "/control/v2/budgets")[2]["budgets"], 30, "A folds the budget")
    status, _, budgeted = mint(a, "d-budgeted")
    assert status == 201, budgeted
    status, _, free = mint(a, "d-free", repo_slug="other/app")
    assert status == 201, free
    assert call(a, budgeted["token"])[0] == 200 and call(a, free["token"])[0] == 200
    world.redis.pause()
    wait_until(lambda: call(a, budgeted["token"])[0] == 503, 30, "the budgeted lease held once spend is stale")
    status, headers, body = call(a, budgeted["token"])
    assert status == 503 and "fleet-state-unavailable" in str(body) and int(headers["retry-after"]) >= 1
    assert call(a, free["token"])[0] == 200  # an unbudgeted scope is unaffected
    world.redis.resume()  # the pause outlived the host TTL: its leases ended (SPEC §16); a new one serves
    tries = iter(range(1000))

    def fresh_lease_served() -> bool:
        status, _, again = mint(a, f"d-again-{next(tries)}")
        return status == 201 and call(a, again["token"])[0] == 200

    wait_until(fresh_lease_served, 30, "a budgeted lease served again once spend is fresh")
