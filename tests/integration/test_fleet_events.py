"""Fan-out across hosts over a real redis-server: events reach the other hosts' feeds, and an
account-wide revocation is acknowledged by every live host or names the ones that did not."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from controlplane.events import EventKind
from controlplane.fleet.events import FleetEvent, FleetEvents, FleetRevocations, RevokeRequest
from tests.support.fleet import Fleet
from tests.support.waits import until as wait_until_async


@pytest.fixture
async def hosts(fleet: Fleet) -> AsyncIterator[list[asyncio.Task]]:
    """Background tasks a test starts; every one is cancelled and awaited afterwards."""
    tasks: list[asyncio.Task] = []
    yield tasks
    for task in tasks:
        task.cancel()
    if tasks:
        _done, pending = await asyncio.wait(tasks, timeout=10)
        assert not pending, pending


async def _listening(events: FleetEvents, into: list[FleetEvent], tasks: list[asyncio.Task]) -> None:
    ready = asyncio.Event()

    async def listen() -> None:
        async for event in events.listen(ready=ready):
            into.append(event)

    tasks.append(asyncio.create_task(listen()))
    await asyncio.wait_for(ready.wait(), 10)


async def test_an_event_reaches_every_other_host_and_not_its_own(fleet: Fleet, hosts) -> None:
    a, b, c = (FleetEvents(fleet.client, fleet.keys, h, entries=fleet.entries) for h in ("gw-a", "gw-b", "gw-c"))
    got: dict[str, list[FleetEvent]] = {"gw-a": [], "gw-b": [], "gw-c": []}
    for events in (a, b, c):
        await _listening(events, got[events.host_id], hosts)
    assert await a.publish(EventKind.ACCOUNT_STATE, {"account_id": "acct", "state": "disabled"}) == 3
    await a.publish(EventKind.POLICY, {"revision": 4})

    async def delivered() -> bool:
        return len(got["gw-b"]) == 2 and len(got["gw-c"]) == 2

    await wait_until_async(delivered, 10, "both events on gw-b and gw-c")
    assert [(e.kind, e.host_id, e.data) for e in got["gw-b"]] == [
        (EventKind.ACCOUNT_STATE, "gw-a", {"account_id": "acct", "state": "disabled"}),
        (EventKind.POLICY, "gw-a", {"revision": 4}),
    ]
    assert got["gw-a"] == []


async def test_only_the_fleet_wide_kinds_are_fanned_out(fleet: Fleet) -> None:
    with pytest.raises(ValueError):
        await FleetEvents(fleet.client, fleet.keys, "gw-a", entries=fleet.entries).publish(EventKind.ROUTE_STARTED, {})


async def _serving(
    revocations: FleetRevocations, seen: list[RevokeRequest], tasks: list[asyncio.Task], fail: bool = False
) -> None:
    ready = asyncio.Event()

    async def handle(request: RevokeRequest) -> None:
        seen.append(request)
        if fail:
            raise RuntimeError("could not end the leases")

    tasks.append(asyncio.create_task(revocations.serve(handle, ready=ready)))
    await asyncio.wait_for(ready.wait(), 10)


async def test_revoke_leases_is_acknowledged_by_every_live_host(fleet: Fleet, hosts) -> None:
    names = ("gw-a", "gw-b", "gw-c")
    fleet_of = {h: FleetRevocations(fleet.client, fleet.keys, h, entries=fleet.entries) for h in names}
    seen: dict[str, list[RevokeRequest]] = {h: [] for h in names}
    for h in names:
        await _serving(fleet_of[h], seen[h], hosts)
    answer = await fleet_of["gw-a"].request("acct", names)
    assert (answer.acked, answer.missing) == (names, ())
    assert all(
        [(r.account_id, r.from_host, r.request_id) for r in seen[h]] == [("acct", "gw-a", answer.request_id)]
        for h in names
    )
    assert seen["gw-b"][0].at_ms > 0


async def test_revoke_leases_names_the_hosts_that_did_not_acknowledge(fleet: Fleet, hosts) -> None:
    """gw-c is live but does not serve requests; gw-d's handler fails: both are named, within
    the bound, and the hosts that did acknowledge are not."""
    bound_s = 0.5
    requester = FleetRevocations(fleet.client, fleet.keys, "gw-a", ack_timeout_s=bound_s, entries=fleet.entries)
    await _serving(requester, [], hosts)
    await _serving(FleetRevocations(fleet.client, fleet.keys, "gw-b", entries=fleet.entries), [], hosts)
    await _serving(FleetRevocations(fleet.client, fleet.keys, "gw-d", entries=fleet.entries), [], hosts, fail=True)
    started = time.monotonic()
    answer = await requester.request("acct", ["gw-a", "gw-b", "gw-c", "gw-d"])
    waited = time.monotonic() - started
    assert (answer.acked, answer.missing) == (("gw-a", "gw-b"), ("gw-c", "gw-d"))
    assert bound_s <= waited < bound_s + 2.0


async def test_a_host_that_reconnects_reads_the_requests_it_missed(fleet: Fleet, hosts) -> None:
    """The stream keeps requests: a server that resumes from its last entry handles what came
    while it was away (the requester had named it missing meanwhile)."""
    requester = FleetRevocations(fleet.client, fleet.keys, "gw-a", ack_timeout_s=0.2, entries=fleet.entries)
    late = FleetRevocations(fleet.client, fleet.keys, "gw-b", entries=fleet.entries)
    last_id = await late.last_id()
    answer = await requester.request("acct", ["gw-b"])
    assert answer.missing == ("gw-b",)
    seen: list[RevokeRequest] = []

    async def handle(request: RevokeRequest) -> None:
        seen.append(request)

    await late._serve_batch(last_id, handle)
    assert [r.request_id for r in seen] == [answer.request_id]
    assert fleet.admin().hexists(fleet.keys.revoke_acks(answer.request_id), "gw-b")
