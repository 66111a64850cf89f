"""Every loop that reads Redis is supervised (SPEC §19), in a control wired as the daemon is, over
a real redis-server: an unexpected exception is logged and the loop starts again; a loop that
keeps failing makes the host read `fleet.state: unavailable` and hold its mints, and the fleet
view lists each loop with its state and last error kind; a malformed revoke-stream entry (the
one that used to crash-loop control with KeyError b'from_host') stops neither control's start nor
revocation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis

from controlplane.http.fleet import fleet_payload
from shared.clock import now_ms
from shared.codes import FleetState, Refusal
from shared.fleet.entries import EntryKind
from tests.support.fleethosts import FleetHosts, fleet_world, mint
from tests.support.redis_server import RedisServer
from tests.support.waits import until

A, B = "acct-a", "acct-b"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[tuple[RedisServer, FleetHosts]]:
    async for opened in fleet_world(tmp_path, {A: 2, B: None}):
        yield opened


async def test_a_loop_that_keeps_failing_holds_the_mints_until_it_runs_again(world) -> None:
    _server, fleet = world
    h1 = await fleet.add("h1")
    assert h1.fleet is not None and (await mint(h1, "d1")).status == 201
    board = h1.fleet.b.board
    healthy_write = board.write
    failures = {"left": 1_000}

    async def broken_write(*args, **kwargs) -> None:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise RuntimeError("a bug, not an outage")
        await healthy_write(*args, **kwargs)

    board.write = broken_write  # type: ignore[method-assign]
    await until(lambda: not h1.fleet.b.supervisor.healthy(), 15, "the in-flight loop to read failing")
    held = await mint(h1, "d2")
    assert held.body["refusal_reason"] == str(Refusal.FLEET_STATE_UNAVAILABLE)
    snap = await h1.fleet_view.snapshot(now_ms())
    loops = {loop["name"]: loop for loop in fleet_payload(snap, now_ms())["loops"]}
    assert snap.state == FleetState.UNAVAILABLE
    assert loops["in-flight"]["state"] == "failing" and loops["in-flight"]["last_error_kind"] == "RuntimeError"
    assert set(loops) == {
        "heartbeat",
        "in-flight",
        "chain-poll",
        "owed-writes",
        "events-in",
        "events-out",
        "revocations",
    }  # FleetHosts starts no spend loops (the daemon adds spend-*)
    assert loops["heartbeat"]["state"] == "running"
    failures["left"] = 0
    await until(h1.fleet.b.supervisor.healthy, 15, "the loop to run steadily again")
    assert (await mint(h1, "d3")).status == 201


async def test_a_malformed_revoke_entry_stops_neither_the_start_nor_revocation(world) -> None:
    _server, fleet = world
    h1 = await fleet.add("h1")
    key = (await mint(h1, "d1")).body["key_id"]
    client = redis.Redis.from_url(fleet.redis_url)
    stream = "{" + fleet.fleet_id + "}:revoke"
    client.xadd(stream, {"request_id": "x", "account_id": "y"})  # no from_host, no MAC
    await fleet.stop("h1")
    h1 = await fleet.add("h1")  # a restart reads the stream
    assert h1.fleet is not None and h1.service.keys.get(key) is not None
    h2 = await fleet.add("h2")
    client.xadd(stream, {"request_id": "x", "account_id": "y"})
    revocation = await h2.fleet.revocation.revoke_account(A)
    assert revocation.unacknowledged_hosts == () and h1.service.keys.get(key) is None
    assert h1.fleet.b.entries.rejected[EntryKind.REVOKE] >= 1
    assert all(s.state == "running" for s in h1.fleet.b.supervisor.statuses())
    client.close()


async def test_a_forged_registration_does_not_lift_the_hold_after_a_data_loss(world) -> None:
    """SPEC §19: the `registered` set ends the post-loss hold; a member without this incarnation's
    MAC (added by a writer, or copied from before the loss) is not believed, and is counted."""
    _server, fleet = world
    h1, h2 = await fleet.add("h1"), await fleet.add("h2")
    assert h1.fleet is not None and h2.fleet is not None
    keys = h1.fleet.b.keys
    assert await h1.fleet.recovery.registrations.hosts(h1.fleet.recovery.incarnation) == {"h1", "h2"}
    client = redis.Redis.from_url(fleet.redis_url)
    before = {m for m in client.smembers(keys.registered)}
    client.sadd(keys.registered, "h3", "h3:" + "A" * 43, "h9:garbage")
    assert await h1.fleet.recovery.registrations.hosts(h1.fleet.recovery.incarnation) == {"h1", "h2"}
    assert h1.fleet.b.entries.rejected[EntryKind.REGISTERED] == 3
    client.delete(keys.registered)
    client.sadd(keys.registered, *before)
    assert await h2.fleet.recovery.registrations.hosts("inc-another") == frozenset()  # copied across a data loss
    client.close()
