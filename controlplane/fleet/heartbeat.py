"""A fleet host's beat-paced loops (SPEC §16): `HostHeartbeat`.

The heartbeat itself and the reaper are `Membership.run` (its standing's repairs are
`controlplane/fleet/recovery.HostRecovery`'s); beside it, each beat writes this host's in-flight
counts (`InFlightBoard`) and reads the live hosts (who a data loss waits for), and the owed
writes are delivered, a bounded batch at a time, with the data loss's hold checked between.
Both run under the fleet's supervisor (SPEC §19), started by `FleetHost.start`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from controlplane.fleet.owed import DELIVER_INTERVAL_S
from controlplane.ports import RouteReads
from shared.capacity import StateUnavailable
from shared.fleet.redis_client import raise_if_cancelled

if TYPE_CHECKING:
    from controlplane.fleet.recovery import HostRecovery
    from controlplane.fleet.wiring import FleetBackends


class HostHeartbeat:
    """The in-flight board's and the owed writes' loops, paced by the membership's beat."""

    def __init__(self, backends: FleetBackends, host_id: str, recovery: HostRecovery, routes: RouteReads) -> None:
        self.b = backends
        self.host_id = host_id
        self.recovery = recovery
        self.routes = routes

    async def flight_loop(self) -> None:
        """Each beat: this host's in-flight counts out, the live hosts in (who a data loss waits for)."""
        recovery = self.recovery
        while True:
            raise_if_cancelled()
            try:
                await self.b.board.write(self.host_id, self.routes.in_flight_by_account())
                await self.b.sockets.write(self.host_id, self.routes.sockets_open)  # SPEC §20
                if recovery.hold is None:
                    recovery.live_seen = frozenset(await self.b.hosts.live_hosts())
            except StateUnavailable:
                pass
            await asyncio.sleep(recovery.membership.interval_s)

    async def owed_loop(self) -> None:
        while True:
            raise_if_cancelled()
            delivered = 0
            try:
                if len(self.b.owed):
                    delivered = await self.b.owed.deliver()  # a bounded batch: the hold's check gets its turn
                await self.recovery.check_hold()
            except StateUnavailable:
                pass
            # more owed and Redis took the last batch: the next at once (releases wait behind the queue)
            await asyncio.sleep(0 if delivered and len(self.b.owed) else DELIVER_INTERVAL_S)
