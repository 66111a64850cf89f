"""A fleet host's event relay and chain poll (SPEC §16): `HostEvents`. This host's account-state,
circuit and policy events out to the fleet's channel, the other hosts' in (each re-reads the
chain it changed, then feeds this host's event feed without being published again), and the
chains validated every `CHAIN_POLL_S` (off the loop, so readers on the loop get a recently
validated chain: `HashChain.read_recent`). Its loops run under the fleet's supervisor (SPEC
§19), started by `FleetHost.start`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import msgspec

from controlplane.events import Event, EventHub, EventKind
from controlplane.fleet.events import FANNED_OUT, FleetEvent
from shared.capacity import StateUnavailable
from shared.fleet.redis_client import raise_if_cancelled
from shared.logging import get_logger

if TYPE_CHECKING:
    from controlplane.fleet.wiring import FleetBackends
    from controlplane.stores.admin import AccountAdminStore
    from controlplane.stores.policy import PolicyStore

log = get_logger("fleet")

CHAIN_POLL_S = 0.5  # the chains are validated at least this often (and before every mint)
EVENT_QUEUE_MAX = 1024  # events waiting to go out; past it (Redis gone for long) they are dropped


class HostEvents:
    """The events a fleet host relays, both ways, and the chains it keeps validated."""

    def __init__(self, backends: FleetBackends, hub: EventHub, admin: AccountAdminStore, policy: PolicyStore) -> None:
        self.b = backends
        self.hub = hub
        self.admin = admin
        self.policy = policy
        self._outbox: asyncio.Queue[tuple[EventKind, Any]] = asyncio.Queue(EVENT_QUEUE_MAX)
        self._relaying = False  # set while a received event is fed to the hub
        hub.listen(self._on_local_event)

    # ---- events out and in -------------------------------------------------------------------

    def _on_local_event(self, event: Event) -> None:
        if self._relaying or event.kind not in FANNED_OUT:
            return
        try:
            self._outbox.put_nowait((event.kind, msgspec.to_builtins(event.data)))
        except asyncio.QueueFull:
            log.warning("fleet_event_dropped", kind=str(event.kind), queued=EVENT_QUEUE_MAX)

    async def publisher(self) -> None:
        while True:
            kind, data = await self._outbox.get()
            try:
                await self.b.events.publish(kind, data)
            except StateUnavailable as exc:  # pub/sub is at-most-once; the state itself is in Redis
                log.warning("fleet_event_unpublished", kind=str(kind), error=str(exc))

    async def on_fleet_event(self, event: FleetEvent) -> None:
        """Another host's event: re-read the chain it changed, then feed it to this host's feed."""
        if event.kind == EventKind.ACCOUNT_STATE:
            await self._refresh_quietly(self.admin)
        elif event.kind == EventKind.POLICY:
            await self._refresh_quietly(self.policy)
        self._relaying = True
        try:
            self.hub.publish(event.kind, event.data)
        finally:
            self._relaying = False

    async def refresh_chains(self) -> None:
        await asyncio.gather(self.admin.refresh(), self.policy.refresh())

    async def _refresh_quietly(self, store: AccountAdminStore | PolicyStore) -> None:
        try:
            await store.refresh()
        except StateUnavailable:
            pass

    async def chain_poll(self) -> None:
        while True:
            raise_if_cancelled()
            try:
                await self.refresh_chains()
            except StateUnavailable:
                pass  # readers on the loop see it once the last validation is too old
            await asyncio.sleep(CHAIN_POLL_S)
