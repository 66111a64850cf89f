"""What `controlplane.main.wire` hands the service, the desk and the stores: the shared state's
homes (SPEC §16), and embedded mode's in-process ones.

Fleet mode's Redis homes are built by `controlplane/fleet/wiring.fleet`, which `main` imports
only when `GATEWAY_FLEET_REDIS_URL` is set: an embedded daemon never imports the Redis client
(tests/unit/test_lazy_imports.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from controlplane.circuits import CircuitRegistry, CircuitView, LocalCircuits
from controlplane.decisions import DecisionStore, LocalDecisions
from shared.capacity import CapacityStore, LocalCapacity
from shared.chainfile import ChainStorage

OnTransition = Callable[[CircuitView], None]


class Backends(msgspec.Struct, frozen=True, kw_only=True):
    """What `wire` hands the service, the desk and the stores: the shared state's homes."""

    lease_capacity: CapacityStore
    decisions: DecisionStore
    circuits: Callable[[int, OnTransition], CircuitRegistry]
    admin_chain: ChainStorage | None = None      # None: the state dir's files
    policy_chain: ChainStorage | None = None
    chain_recent_s: float | None = None          # None: every loop read asks the (local) storage
    # fleet mode: `controlplane.fleet.wiring.FleetBackends` (not named here: wiring imports this)
    fleet: Any = None


def embedded() -> Backends:
    """Today's in-process tables: one host, nothing shared."""
    return Backends(lease_capacity=LocalCapacity(), decisions=LocalDecisions(),
                    circuits=lambda cooldown_s, on_transition: CircuitRegistry(LocalCircuits(), cooldown_s,
                                                                               on_transition=on_transition))
