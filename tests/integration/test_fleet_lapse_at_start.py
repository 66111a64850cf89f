"""A data plane that read its place as lapsed before its control's first heartbeat (both
daemons start at once) serves ceilinged accounts as soon as that beat lands (SPEC §16, §19):
the held request itself reads the heartbeat again (`FleetAdmission.hold_now`), and the standing
loop reads it again soon while lapsed, not a twelfth of the TTL later. Before, the first
requests after a pair's start were refused `fleet-state-unavailable` for up to a standing pass
(CI: the fleet soak and the forged-heartbeat test, each right after a start).

Real redis-server; no sleep: each wait is a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import time

from dataplane import fleetloops
from dataplane.admission import RECHECK_S, FleetAdmission
from shared.fleet.hosts import HostRegistry
from shared.fleet.redis_client import connect as redis_connect
from tests.support.fleet import Fleet
from tests.support.waits import until

HOST = "h1"
TTL_S = 600  # a standing pass every 50 s: only the new re-reads can end the lapse in time


async def test_a_held_request_reads_the_heartbeat_again(fleet: Fleet) -> None:
    admission = FleetAdmission(redis_connect(fleet.server.url), fleet.keys.fleet_id, HOST, ttl_s=TTL_S)
    try:
        assert await admission.check_standing()  # no heartbeat yet: lapsed
        assert admission.hold() is not None
        assert (await HostRegistry(fleet.client, fleet.keys, TTL_S).claim(HOST, "inst-1")).granted
        await until(lambda: time.monotonic() - admission.checked_at >= RECHECK_S, 10, "the re-read's spacing")
        assert await admission.hold_now() is None  # served: no standing pass ran meanwhile
        assert admission.hold() is None
    finally:
        await admission.close()


async def test_a_lapsed_place_is_read_again_soon_by_the_standing_loop(fleet: Fleet) -> None:
    admission = FleetAdmission(redis_connect(fleet.server.url), fleet.keys.fleet_id, HOST, ttl_s=TTL_S)
    task = asyncio.create_task(fleetloops.standing(admission))
    try:
        await until(lambda: admission.lapsed, 20, "the first pass to read no heartbeat")
        assert (await HostRegistry(fleet.client, fleet.keys, TTL_S).claim(HOST, "inst-1")).granted
        await until(lambda: not admission.lapsed, 20, "the loop to read the fresh heartbeat")  # not 50 s
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await admission.close()
