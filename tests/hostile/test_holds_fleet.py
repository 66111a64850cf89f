"""A hostile worker's key does not outlive a hung fleet store (SPEC §19, §16), with two real
pairs on a redis-server of the test's own: while Redis is paused (SIGSTOP: its socket accepts,
nothing answers), a dispatch key's `extend` and a caller's renewal are held 503
`fleet-state-unavailable` with `Retry-After` — within the reply bound, never 200 on stale state
— and the key's expiry stays as it was; after SIGCONT both are served again."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fleetpairs import FleetPairs, mint
from tests.support.harness import Gateway, Stub
from tests.support.redis_server import RedisServer
from tests.support.waits import wait_until


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def expiry_on_disk(gw: Gateway, key_id: str) -> int:
    expiry = None
    for line in (gw.state_dir / "keys.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry["op"] == "add" and entry["lease"]["key_id"] == key_id:
            expiry = entry["lease"]["expires_at_ms"]
    assert expiry is not None
    return expiry


def test_a_paused_redis_holds_extend_and_renewal(tmp_path: Path, stub: Stub, own_redis: RedisServer) -> None:
    fleet = FleetPairs(tmp_path / "fleet", stub, own_redis, 2)
    try:
        fleet.start()
        a = fleet[0]
        status, _, keyed = mint(a, "dk-1", fallback_driver="gateway")
        assert status == 201, keyed
        status, _, caller = mint(a, "cl-1")
        assert status == 201, caller
        before = expiry_on_disk(a, keyed["key_id"]), expiry_on_disk(a, caller["key_id"])
        own_redis.pause()
        try:
            for path in (f"/control/v2/keys/{keyed['key_id']}/extend", f"/control/v2/keys/{caller['key_id']}/renew"):
                started = time.monotonic()
                status, headers, held = a.api("POST", path, {"ttl_seconds": 7200})
                assert (status, held.get("outcome"), held.get("refusal_reason")) == (
                    503,
                    "held",
                    "fleet-state-unavailable",
                ), (path, held)
                assert "retry-after" in headers and time.monotonic() - started < 5
        finally:
            own_redis.resume()
        assert (expiry_on_disk(a, keyed["key_id"]), expiry_on_disk(a, caller["key_id"])) == before
        wait_until(
            lambda: a.api("POST", f"/control/v2/keys/{keyed['key_id']}/extend", {"ttl_seconds": 7200})[0] == 200,
            15,
            "extend served after SIGCONT",
        )
        assert expiry_on_disk(a, keyed["key_id"]) > before[0]
        status, _, renewed = a.api("POST", f"/control/v2/keys/{caller['key_id']}/renew", {})
        assert (status, renewed["account_id"]) == (201, caller["account_id"]), renewed
    finally:
        fleet.stop()
