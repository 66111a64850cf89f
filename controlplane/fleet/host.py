"""`FleetHost`: this control daemon's place in the fleet (SPEC §16), composed of its four
concerns, each in its own module:
- joining and the repairs its standing calls for: `controlplane/fleet/recovery.HostRecovery`
  (the membership, the re-registration of the restored leases, the hold after a data loss);
- the beat-paced loops: `controlplane/fleet/heartbeat.HostHeartbeat` (the in-flight board, the
  owed writes' delivery; the heartbeat and the reaper are `Membership.run`);
- account-wide revocation: `controlplane/fleet/revocation.HostRevocation`;
- the event relay and the chain poll: `controlplane/fleet/hostevents.HostEvents`.

`start` (before the RPC socket and the HTTP listener open) joins, ends the leases an account-wide
revocation missed while this host was down, re-registers the restored leases' holders and only
then opens the fence; then it starts the loops (heartbeat + reaper, in-flight, chain poll, owed
writes, events out and in, revocations) under the fleet's supervisor, ended by `stop`. It reads
the daemon through its ports (`controlplane/ports.py`), never through the service.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from controlplane.events import EventHub
from controlplane.fleet.heartbeat import HostHeartbeat
from controlplane.fleet.hostevents import HostEvents
from controlplane.fleet.incarnationfile import read_known, returned_after_loss
from controlplane.fleet.recovery import HostRecovery
from controlplane.fleet.revocation import HostRevocation
from controlplane.fleet.view import RedisFleet
from controlplane.fleet.wiring import SUPERSEDED, UNJOINED, FleetBackends
from controlplane.ports import AccountReads, KeyEnder, LeaseReads, RouteReads
from controlplane.stores.admin import AccountAdminStore
from controlplane.stores.policy import PolicyStore
from shared.codes import Standing
from shared.logging import get_logger
from shared.settings import Settings
from shared.supervisor import LoopStatus, reported

if TYPE_CHECKING:
    from controlplane.circuits import CircuitRegistry

log = get_logger("fleet")

SUBSCRIBE_WAIT_S = 2.0  # a start waits this long for the event subscription, then goes on


class FleetHost:
    def __init__(
        self,
        backends: FleetBackends,
        *,
        settings: Settings,
        keys: LeaseReads,
        routes: RouteReads,
        registry: AccountReads,
        seam: KeyEnder,
        circuits: CircuitRegistry,
        admin: AccountAdminStore,
        policy: PolicyStore,
        events: EventHub,
    ) -> None:
        self.b = backends
        self.settings = settings
        self.host_id = settings.host_id
        self.keys = keys
        self.routes = routes
        self.registry = registry
        self.circuits = circuits
        self._tasks: list[asyncio.Task[Any]] = []
        self.events = HostEvents(backends, events, admin, policy)
        self.recovery = HostRecovery(
            backends,
            settings=settings,
            keys=keys,
            registry=registry,
            seam=seam,
            circuits=circuits,
            refresh_chains=self.events.refresh_chains,
            spawn=self._spawn,
        )
        self.membership = self.recovery.membership
        self.heartbeat = HostHeartbeat(backends, settings.host_id, self.recovery, routes)
        self.revocation = HostRevocation(backends, settings.host_id, seam)

    # ---- what the read plane asks (`controlplane/fleet/view.Standings`) ----------------------

    @property
    def standing(self) -> Standing | None:
        return self.membership.standing

    @property
    def registered(self) -> bool:
        return (
            self.b.fence.value not in (UNJOINED, SUPERSEDED, None)
            and not self.membership.recovering
            and self.b.lease_capacity.admitting
            and self.b.supervisor.healthy()
        )

    def writes_owed(self) -> int:
        return len(self.b.owed)

    def loops(self) -> tuple[LoopStatus, ...]:  # this control's, then its data plane's (SPEC §19)
        return self.b.supervisor.statuses() + reported(self.routes.dataplane_loops, "dataplane:")

    def view(self) -> RedisFleet:
        """The read plane's fleet (`controlplane/fleet/view.py`)."""
        return RedisFleet(
            host_id=self.host_id,
            fleet_id=self.settings.fleet_id,
            account_ids=[a.id for a in self.registry.accounts],
            hosts=self.b.hosts,
            capacity=self.b.lease_capacity,
            board=self.b.board,
            me=self,
            leases=self.keys.count_by_account,
            in_flight=self.routes.in_flight_by_account,
            sockets=self.b.sockets,
        )

    # ---- start and stop ----------------------------------------------------------------------

    async def start(self) -> None:
        recovery = self.recovery
        self.b.lease_decisions.load(self.keys.all())  # the restored leases' decisions
        claim = await recovery.join()
        recovery.live_seen = frozenset(await self.b.hosts.live_hosts())
        after = await self.b.revocations.last_id()  # served from here on: nothing between is missed
        await recovery.end_missed_revocations()
        # back after Redis lost its data while this host was away: hold as a host that saw it
        after_loss = returned_after_loss(read_known(self.settings.state_dir), claim.incarnation)
        await recovery.reregister(claim.incarnation, after_loss=after_loss)
        self.membership.registered(claim)
        log.info(
            "fleet_host_registered",
            host_id=self.host_id,
            fleet_id=self.settings.fleet_id,
            epoch=claim.epoch,
            leases=len(self.keys.all()),
        )
        subscribed = asyncio.Event()
        self.b.lease_capacity.healthy = self.b.supervisor.healthy  # a failing loop holds the mints
        revocations, events = self.b.revocations, self.events
        loops: dict[str, Callable[[], Coroutine[Any, Any, Any]]] = {
            "heartbeat": self.membership.run,
            "in-flight": self.heartbeat.flight_loop,
            "chain-poll": events.chain_poll,
            "owed-writes": self.heartbeat.owed_loop,
            "events-out": events.publisher,
            "events-in": lambda: self.b.events.run(events.on_fleet_event, ready=subscribed),
            # a restart resumes after the last request handled, never handles one twice
            "revocations": lambda: revocations.serve(self.revocation.on_request, after=revocations.position or after),
        }
        for name, make in loops.items():
            self._tasks.append(self.b.supervisor.spawn(name, make))
        try:  # the other hosts' events reach this host's feed from the moment it serves
            await asyncio.wait_for(subscribed.wait(), SUBSCRIBE_WAIT_S)
        except TimeoutError:
            log.warning("fleet_events_not_subscribed", host_id=self.host_id, waited_s=SUBSCRIBE_WAIT_S)

    async def stop(self) -> None:
        """A clean stop: the loops end, owed writes get one last try, the host id is let go."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:  # the quiet rows held back, then every owed write
            await asyncio.wait_for(self.circuits.fold_held(), 2.0)
            await asyncio.wait_for(self.b.owed.deliver(), 2.0)
        except Exception:  # Redis away at shutdown: a restart's re-registration lets go of them
            pass
        await self.membership.leave()
        await self.b.close()
        log.info("fleet_host_left", host_id=self.host_id, writes_owed=len(self.b.owed))

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(coroutine))
