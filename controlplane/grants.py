"""`Grants`: a lease stored and pushed to the data plane, re-bound, or its slot let go — what the
mint desk, the dispatch keys' hops and the v1 mint need of the key table and the link.

Apart from `ControlService` so that `controlplane.wiring.wire` can build the desk and the hopper
(the service's settle hook) before the service, each handed what it uses. Ending a key is not
here: that is the release seam, `ControlService.end_keys`, which settles the rows first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec

from controlplane.circuits import CircuitRegistry
from controlplane.decisions import DecisionStore
from controlplane.registry import AccountSpec
from controlplane.replication import DataPlaneLink
from controlplane.stores.keys import KeyTable
from shared.capacity import CapacityStore
from shared.clock import iso_ms, now_ms
from shared.logging import get_logger
from shared.settings import Settings
from shared.wire import Lease
from shared.wires import FACTS

log = get_logger("control")


class Minted(msgspec.Struct, frozen=True, kw_only=True):
    token: str
    lease: Lease
    account: AccountSpec
    base_url: str


class Grants:
    """The desk's `Granter` (`controlplane/mint.py`): store and replicate a lease, release a slot."""

    def __init__(
        self,
        settings: Settings,
        *,
        keys: KeyTable,
        link: DataPlaneLink,
        gate: Callable[[Lease], Lease],
        lease_capacity: CapacityStore,
        decisions: DecisionStore,
        circuits: CircuitRegistry,
    ) -> None:
        self.settings = settings
        self.keys = keys
        self.link = link
        self.gate = gate  # SPEC §18: a lease as the data plane must hold it now (`BudgetGuard.gate`)
        self.lease_capacity = lease_capacity
        self.decisions = decisions
        self.circuits = circuits

    def base_url_for(self, account: AccountSpec) -> str:
        root = self.settings.dataplane_url
        return root + FACTS[account.wire].base_path

    async def grant(self, lease: Lease, account: AccountSpec, token: str) -> Minted:
        """Store the lease (its slot already reserved) and wait until the data plane has it."""
        self.keys.add(lease)
        await self.link.lease_added(self.gate(lease))
        log.info(
            "lease_granted",
            key_id=lease.key_id,
            account_id=account.id,
            expires_at=iso_ms(lease.expires_at_ms),
            dataplane=self.link.connected,
        )
        return Minted(token=token, lease=lease, account=account, base_url=self.base_url_for(account))

    async def rebind(self, lease: Lease) -> None:
        """A live key's lease replaced under the same token (a dispatch key's hop or extension):
        journalled, then pushed with its budget gate; the data plane switches the token atomically."""
        self.keys.add(lease)
        await self.link.lease_added(self.gate(lease))

    async def release(self, lease: Lease) -> None:
        """The release seam's own part: the lease slot, the dispatch's live key, the circuit's
        probe. `ControlService.end_keys` adds forgetting the key and telling the data plane; a
        dispatch key's hop (SPEC §17) keeps the key and re-binds it instead."""
        await asyncio.gather(
            self.lease_capacity.release(lease.key_id),
            self.decisions.end_key(lease.key_id),
            self.circuits.on_lease_ended(lease.account_id, lease.key_id, now_ms()),
        )
