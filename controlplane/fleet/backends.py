"""What `controlplane.wiring.wire` hands the service, the desk and the stores: the shared state's
homes (SPEC §16), and embedded mode's in-process ones.

Fleet mode's Redis homes are built by `controlplane/fleet/wiring.fleet`, which `main` imports
only when `GATEWAY_FLEET_REDIS_URL` is set: an embedded daemon never imports the Redis client
(tests/unit/test_lazy_imports.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from controlplane.circuits import CircuitRegistry, CircuitView, LocalCircuits
from controlplane.decisions import DecisionStore
from controlplane.stores.decisions import JournalledDecisions
from controlplane.stores.leasedecisions import LEASE_DECISIONS_FILE, LeaseDecisions
from shared.capacity import CapacityStore, LocalCapacity
from shared.chainstorage import ChainStorage

if TYPE_CHECKING:
    from controlplane.stores.keys import KeyTable
    from shared.settings import Settings

OnTransition = Callable[[CircuitView], object]


class Backends(msgspec.Struct, frozen=True, kw_only=True):
    """What `wire` hands the service, the desk and the stores: the shared state's homes."""

    lease_capacity: CapacityStore
    decisions: DecisionStore
    circuits: Callable[[int, OnTransition], CircuitRegistry]
    admin_chain: ChainStorage | None = None  # None: the state dir's files
    policy_chain: ChainStorage | None = None
    chain_recent_s: float | None = None  # None: every loop read asks the (local) storage
    # fleet mode: `controlplane.fleet.wiring.FleetBackends` (not named here: wiring imports this)
    fleet: Any = None


def embedded(settings: Settings, keys: KeyTable) -> Backends:
    """The in-process tables: one host, nothing shared. The decision table keeps the decisions of
    its live leases and of its leases ended within the hour in the same journal as fleet mode
    (SPEC §5), replayed here for the leases the key table restored, and for those it found
    expired (it is loaded before `wire`)."""
    journal = None if keys.path is None else os.path.join(settings.state_dir, LEASE_DECISIONS_FILE)
    decisions = JournalledDecisions(LeaseDecisions(journal, keys.get))
    decisions.restore(keys.all(), keys.expired_at_load)
    return Backends(
        lease_capacity=LocalCapacity(),
        decisions=decisions,
        circuits=lambda cooldown_s, on_transition: CircuitRegistry(
            LocalCircuits(), cooldown_s, on_transition=on_transition
        ),
    )
