"""Fleet mode: the decisions of live leases outlive Redis's data and a control restart (SPEC §16:
"losing Redis's data must not lose a promise"; §5 renew, §8 citations, §17 dispatch keys).

Two real pairs on a redis-server of the test's own (`team-a` with `lease_capacity = 2`, then
`team-b`). A dispatch key and a caller-driven lease are minted on host A; then Redis restarts
empty (or A's control restarts, with or without Redis's data): A renews and extends them, the
dispatch key still hops on the gateway's evidence, host B answers a citation of the dispatch
key's decision by its lineage and lease, and B refuses a second lease for the dispatch
(`fallback-lease-still-held`, held: SPEC §8, one live lease per dispatch).

Host TTL 3 s (a beat a second). Every wait is a condition with a deadline.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from shared.fleet.keys import FleetKeys
from tests.support.fleetpairs import MODEL, FleetPairs, accounts, call, mint
from tests.support.harness import Gateway, Stub
from tests.support.redis_server import RedisServer
from tests.support.waits import wait_until

RATE_LIMITED = json.dumps({"status": 429, "headers": {"retry-after": "1"}})


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture
def fleet(tmp_path: Path, stub: Stub, own_redis: RedisServer) -> Iterator[FleetPairs]:
    pairs = FleetPairs(tmp_path / "fleet", stub, own_redis, 2)
    try:  # a start that fails stops what it started too
        yield pairs.start()
    finally:
        pairs.stop()


def registered(server: RedisServer, fleet: FleetPairs) -> set[str]:
    """The hosts that re-registered their holders in Redis's current data (lost with it); each
    member is `<host>:<mac>` (SPEC §19, controlplane/fleet/registered.py)."""
    with redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=2) as admin:
        return {m.decode().rpartition(":")[0] for m in admin.smembers(FleetKeys(fleet.fleet_id).registered)}


def wait_recovered(server: RedisServer, fleet: FleetPairs) -> None:
    """Until every host re-registered into the new data and admits again."""
    wait_until(lambda: registered(server, fleet) == {"gw-a", "gw-b"}, 20, "both hosts re-registered")
    for gw in fleet.pairs:
        wait_until(
            lambda gw=gw: accounts(gw)["fleet"] == {"mode": "redis", "state": "available", "hosts_live": 2},
            15,
            "the host admitting again",
        )


def minted_pair(a: Gateway) -> tuple[dict[str, Any], dict[str, Any]]:
    """A dispatch key and a caller-driven lease, both on team-a (position 0), on host A."""
    status, _, keyed = mint(a, "dk-1", fallback_driver="gateway")
    assert (status, keyed["account_id"], keyed["fallback_position"]) == (201, "team-a", 0), keyed
    status, _, caller = mint(a, "cl-1")
    assert (status, caller["account_id"], caller["fallback_position"]) == (201, "team-a", 0), caller
    return keyed, caller


def explain_retry(gw: Gateway, dispatch_id: str, cited: str) -> dict[str, Any]:
    query = urllib.parse.urlencode(
        {"repo_slug": "acme/app", "model": MODEL, "dispatch_id": dispatch_id, "retry_of_mint_decision_id": cited}
    )
    status, _, body = gw.api("GET", f"/control/v2/policy/explain?{query}")
    assert status == 200, body
    return body["would_select"]


def assert_decisions_kept(a: Gateway, b: Gateway, keyed: dict[str, Any], caller: dict[str, Any]) -> None:
    """Everything a live lease's decision answers, on its host and on the other one."""
    status, _, extended = a.api("POST", f"/control/v2/keys/{keyed['key_id']}/extend", {"ttl_seconds": 900})
    assert status == 200, extended
    assert (extended["account_id"], extended["mint_decision_id"]) == ("team-a", keyed["mint_decision_id"])
    status, _, renewed = a.api("POST", f"/control/v2/keys/{caller['key_id']}/renew", {})
    assert status == 201, renewed
    assert (renewed["account_id"], renewed["fallback_position"], renewed["hop"]) == ("team-a", 0, 0)
    assert a.revoke(caller["key_id"])  # the caller's part of a renewal
    # another host: the citation is known (its lineage, its lease still held), never lineage-unknown
    status, _, cited = mint(b, "dk-1", retry_of_mint_decision_id=keyed["mint_decision_id"])
    assert (status, cited["outcome"], cited["refusal_reason"]) == (503, "held", "fallback-lease-still-held"), cited
    status, _, foreign = mint(b, "dk-other", retry_of_mint_decision_id=keyed["mint_decision_id"])
    assert (status, foreign["outcome"], foreign["refusal_reason"]) == (409, "rejected", "fallback-lineage-mismatch"), (
        foreign
    )
    would = explain_retry(b, "dk-1", keyed["mint_decision_id"])
    assert (would["outcome"], would["refusal_reason"]) == ("held", "fallback-lease-still-held"), would
    # one live lease per dispatch, fleet-wide: a fresh mint for the dispatch on B is held
    status, _, second = mint(b, "dk-1")
    assert (status, second["outcome"], second["refusal_reason"]) == (503, "held", "fallback-lease-still-held"), second
    status, _, renewal_twin = mint(b, "cl-1")  # the renewed dispatch is held too (its successor)
    assert (status, renewal_twin["refusal_reason"]) == (503, "fallback-lease-still-held"), renewal_twin


def assert_the_key_hops(a: Gateway, keyed: dict[str, Any]) -> None:
    """A qualifying terminal on the dispatch key moves it to team-b; the worker's retry lands there."""
    status, _, _ = call(a, keyed["token"], RATE_LIMITED)
    assert status == 429
    assert call(a, keyed["token"])[0] == 200
    rows = [r for r in a.wait_rows(2) if r["key_id"] == keyed["key_id"]]
    assert [(r["account_id"], r["http_status"]) for r in rows[-2:]] == [("team-a", 429), ("team-b", 200)], rows
    assert rows[-1]["mint_decision_id"] != keyed["mint_decision_id"]


def test_redis_restarted_empty_keeps_the_live_leases_decisions(fleet: FleetPairs, own_redis: RedisServer) -> None:
    a, b = fleet[0], fleet[1]
    keyed, caller = minted_pair(a)
    own_redis.restart()  # same port, nothing kept
    wait_recovered(own_redis, fleet)
    assert_decisions_kept(a, b, keyed, caller)
    assert_the_key_hops(a, keyed)


def test_a_control_restart_keeps_the_live_leases_decisions(fleet: FleetPairs, own_redis: RedisServer) -> None:
    a, b = fleet[0], fleet[1]
    keyed, caller = minted_pair(a)
    a.control.stop()  # a clean stop; Redis keeps its data
    a.start_control()
    a.wait_synchronised()
    fleet.wait_hosts_live(2)
    assert_decisions_kept(a, b, keyed, caller)
    assert_the_key_hops(a, keyed)


def test_a_control_down_while_redis_lost_its_data_keeps_the_live_leases_decisions(
    fleet: FleetPairs, own_redis: RedisServer
) -> None:
    a, b = fleet[0], fleet[1]
    keyed, caller = minted_pair(a)
    a.control.stop()
    own_redis.restart()  # lost while A's control was away
    a.start_control()  # its decisions come from its own state dir
    a.wait_synchronised()
    wait_recovered(own_redis, fleet)
    assert_decisions_kept(a, b, keyed, caller)
    assert_the_key_hops(a, keyed)


def test_a_host_back_after_a_data_loss_yields_a_dispatch_another_host_took_meanwhile(
    fleet: FleetPairs, own_redis: RedisServer
) -> None:
    a, b = fleet[0], fleet[1]
    keyed, caller = minted_pair(a)
    a.control.stop()
    own_redis.restart()  # A's dispatch entries are gone, A is away
    taken = wait_until(
        lambda: (answer := mint(b, "dk-1"))[0] == 201 and answer[2],
        20,
        "B to mint for the dispatch once its hold is over",
    )
    a.start_control()  # A's key for dk-1 ends at re-registration
    a.wait_synchronised()
    wait_recovered(own_redis, fleet)
    assert call(a, keyed["token"])[0] == 401  # its worker re-mints
    assert call(a, caller["token"])[0] == 200  # the other dispatch's lease keeps serving
    assert call(b, taken["token"])[0] == 200
    status, _, again = mint(a, "dk-1")  # B's lease is the dispatch's one live lease
    assert (status, again["refusal_reason"]) == (503, "fallback-lease-still-held"), again
