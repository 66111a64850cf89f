"""The data plane's Redis loops are supervised (SPEC §19), against a real redis-server: a value
they cannot read (an incarnation that is not text) or a bug that escapes a pass is logged and the
loop runs again; while a loop keeps failing the data plane holds its ceilinged accounts
(`FleetAdmission.hold`), and serves them again once the loop runs steadily; what control hears of
them (`FleetLoops`) says so; Redis answering an error (a key of the wrong type) is an outage the
loop waits out, not a failure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from dataplane import fleetloops
from dataplane.admission import FleetAdmission
from shared.fleet.hosts import HostRegistry
from shared.fleet.redis_client import connect
from shared.supervisor import Supervisor
from shared.wire import LoopReport
from tests.support.fleet import Fleet
from tests.support.waits import until

HOST = "h1"


@pytest.fixture
async def plane(fleet: Fleet) -> AsyncIterator[FleetAdmission]:
    hosts = HostRegistry(fleet.client, fleet.keys, 10)
    assert (await hosts.claim(HOST, "inst-1")).granted  # this host's control: a fresh heartbeat
    admission = FleetAdmission(connect(fleet.server.url), fleet.keys.fleet_id, HOST)
    admission.supervisor = Supervisor(pause_s=0.05, failing_after=3, steady_s=1.0)
    admission.check_interval_s = 0.05
    yield admission
    await admission.close()


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_an_unreadable_incarnation_fails_the_upkeep_loop_which_holds_then_recovers(
    fleet: Fleet, plane: FleetAdmission
) -> None:
    admin = fleet.admin()
    good = admin.get(fleet.keys.incarnation)
    admin.set(fleet.keys.incarnation, b"\xff\xfe not text")
    tasks = fleetloops.spawn(plane)  # `start` was never done: the upkeep loop does it
    try:
        await until(lambda: plane.supervisor.failing() == ["upkeep"], 15, "the upkeep loop to read failing")
        assert plane.supervisor.restarts["upkeep"] >= 3 and plane.supervisor.restarts["standing"] == 0
        reason = plane.hold()
        assert reason is not None and "upkeep" in reason and not plane.started
        admin.set(fleet.keys.incarnation, good)
        await until(lambda: plane.started, 15, "the loop, started again, to do the start")
        await until(lambda: plane.hold() is None, 15, "the loop to run steadily again")
        assert await plane.reserve("capped", "att-1", 1)
    finally:
        await _stop(tasks)


async def test_a_bug_in_the_standing_pass_is_survived_and_a_wrong_type_is_waited_out(
    fleet: Fleet, plane: FleetAdmission
) -> None:
    await plane.start()
    healthy_check = plane.check_standing
    calls = {"bug": 0, "ok": 0}

    async def buggy() -> bool:
        calls["bug"] += 1
        raise RuntimeError("a bug, not an outage")

    async def counted() -> bool:
        calls["ok"] += 1
        return await healthy_check()

    plane.check_standing = buggy  # type: ignore[method-assign]
    sent: list[list[LoopReport]] = []
    tasks = fleetloops.spawn(plane, sent.append)
    try:
        await until(lambda: plane.supervisor.failing() == ["standing"], 15, "the standing loop to read failing")
        reason = plane.hold()
        assert reason is not None and "standing" in reason
        await until(
            lambda: any(r.name == "standing" and r.state == "failing" for r in sent[-1]),
            15,
            "control to hear the standing loop fail",
        )
        plane.check_standing = counted  # type: ignore[method-assign]
        await until(lambda: plane.hold() is None, 15, "the standing loop to run steadily again")
        restarts = plane.supervisor.restarts["standing"]
        assert restarts >= 3
        await until(
            lambda: (
                {r.name: (r.state, r.restarts) for r in sent[-1]}
                == {"standing": ("running", restarts), "upkeep": ("running", 0)}
            ),
            15,
            "control to hear it runs again, with its restarts counted",
        )
        admin = fleet.admin()
        seen = admin.zrange(fleet.keys.hosts_seen, 0, -1, withscores=True)
        admin.delete(fleet.keys.hosts_seen)
        admin.set(fleet.keys.hosts_seen, "not a sorted set")  # WRONGTYPE: Redis answers an error
        before = calls["ok"]
        await until(lambda: calls["ok"] >= before + 5, 15, "the loop to go on past Redis's errors")
        assert plane.supervisor.restarts["standing"] == restarts and plane.hold() is None
        admin.delete(fleet.keys.hosts_seen)
        admin.zadd(fleet.keys.hosts_seen, dict(seen))
    finally:
        await _stop(tasks)
