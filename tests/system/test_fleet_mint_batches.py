"""A fleet mint's Redis commands go in batches (issue 27 §4, `shared/fleet/batching.py`), and the
chains are still checked at every mint: two real pairs on one real redis-server, nothing waited
for between the write and the very next mint (each host reads the chains' versions in the
mint's own batch).
- a record forged into the admin chain (no MAC: a Redis writer without the fleet secret) between
  two mints holds the next mint on every host `account-state-unavailable`;
- a disable committed on host A is obeyed by host B's very next mint;
- a mint and its revoke end with nothing left in Redis for the key (slot, live key).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from shared.fleet.keys import Ceiling, FleetKeys
from tests.support.fleet import forge_chain_record
from tests.support.fleetpairs import FleetPairs, accounts_toml, mint
from tests.support.harness import Stub
from tests.support.redis_server import RedisServer

ADMIN = "/control/v2/accounts"


@pytest.fixture
def pairs(tmp_path: Path, stub: Stub) -> Iterator[FleetPairs]:
    server = RedisServer(tmp_path / "redis").start()
    fleet = FleetPairs(tmp_path / "fleet", stub, server, 2, accounts=accounts_toml(stub, lease_capacity=2))
    try:
        yield fleet.start()
    finally:
        fleet.stop()
        server.stop()


def admin_client(pairs: FleetPairs) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=pairs.redis.port, socket_timeout=5)


def test_a_chain_forged_between_two_mints_holds_the_next_one_on_every_host(pairs: FleetPairs) -> None:
    a, b = pairs[0], pairs[1]
    for n, gw in enumerate((a, b)):
        status, _, body = mint(gw, f"before-{n}")
        assert status == 201 and body["account_id"] == "team-a", body
        assert gw.revoke(body["key_id"])
    forge_chain_record(
        admin_client(pairs),
        FleetKeys(pairs.fleet_id),
        "account-admin",
        lambda f: {
            **f,
            "account_id": "team-a",
            "action": "set-state",
            "state": "disabled",
            "actor": "mallory",
            "actor_authenticated_by": "control-token",
            "reason": "forged",
        },
    )
    for n, gw in enumerate((b, a)):  # the very next mint, on each host: no wait, no retry
        status, _, body = mint(gw, f"after-{n}")
        assert status == 503 and body["refusal_reason"] == "account-state-unavailable", body


def test_a_disable_on_one_host_is_obeyed_by_the_next_mint_on_another(pairs: FleetPairs) -> None:
    a, b = pairs[0], pairs[1]
    status, _, body = mint(b, "warm")
    assert status == 201 and body["account_id"] == "team-a", body
    assert b.revoke(body["key_id"])
    status, _, body = a.api("PATCH", f"{ADMIN}/team-a/state", {"state": "disabled", "reason": "incident"})
    assert status == 200, body
    status, _, body = mint(b, "next")  # the very next mint on B, nothing waited for
    assert status == 201 and body["account_id"] == "team-b", body
    assert any(s["account_id"] == "team-a" for s in body["skipped"]), body


def test_a_mint_and_its_revoke_leave_nothing_of_the_key_in_redis(pairs: FleetPairs) -> None:
    a = pairs[0]
    keys = FleetKeys(pairs.fleet_id)
    client = admin_client(pairs)
    status, _, body = mint(a, "d-1")
    assert status == 201 and body["account_id"] == "team-a", body
    key_id = body["key_id"]
    assert client.hexists(keys.cap_owner(Ceiling.LEASE), key_id)
    assert client.exists(keys.live_of_key(key_id))
    assert a.revoke(key_id)
    assert not client.hexists(keys.cap_owner(Ceiling.LEASE), key_id)
    assert not client.exists(keys.live_of_key(key_id))
    assert client.smembers(keys.live("acme/app", "d-1")) == set()
