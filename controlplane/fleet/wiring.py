"""The fleet set: every Redis backend one control daemon uses, built in one place (SPEC §16).

`controlplane.wiring.wire` asks `backends_for(settings, keys)` for the state it shares: without
`GATEWAY_FLEET_REDIS_URL`, the in-process tables (`backends.embedded`, which never imports this
module nor Redis; the live leases' decisions journalled as in fleet mode, SPEC §5); with it, the
Redis ones behind the same interfaces (`fleet`): the lease table (fenced by this host's
incarnation, its releases owed while Redis is away), circuits, decisions, and the admin and
policy chains with Redis their authority and the state dir's files their witness. One asyncio
client serves the event-loop backends and one blocking client the chains (`HashChain` calls its
storage from worker threads); readers on the loop take a chain validated within
`CHAIN_RECENT_S` (`HashChain.read_recent`), never a blocking call.

The fleet's own machinery (membership, event fan-out, revocations, the in-flight board) is
built here too and driven by `controlplane/fleet/host.FleetHost`.
"""

from __future__ import annotations

import os
from typing import Any

from controlplane.circuits import CircuitRegistry
from controlplane.fleet.backends import Backends, OnTransition
from controlplane.fleet.circuits import RedisCircuits
from controlplane.fleet.events import FleetEvents, FleetRevocations
from controlplane.fleet.owed import OwedCapacity, OwedCircuits, OwedDecisions, OwedWrites
from controlplane.fleet.sockets import SocketsBoard
from controlplane.fleet.view import InFlightBoard
from controlplane.stores import admin as admin_store
from controlplane.stores import policy as policy_store
from controlplane.stores.keys import KeyTable
from controlplane.stores.leasedecisions import LEASE_DECISIONS_FILE, LeaseDecisions
from shared.chain import ChainAuth
from shared.chainstorage import ChainStorage, FileChainStorage
from shared.clock import iso_ms, now_ms
from shared.fleet.batching import BatchingRedis
from shared.fleet.capacity import Incarnation
from shared.fleet.chains import RedisChainStorage
from shared.fleet.entries import FleetEntries
from shared.fleet.hosts import HostRegistry
from shared.fleet.keys import FleetKeys
from shared.fleet.mirror import MirroredChainStorage
from shared.fleet.redis_client import connect, connect_sync
from shared.fleet.secret import Keyring
from shared.settings import Settings
from shared.supervisor import Supervisor

# Fence values no incarnation equals ("inc-<hex>"): every reserve is refused (`StateLost`, held)
# before this host registered its holders, and after another instance superseded it.
UNJOINED = "-unjoined"
SUPERSEDED = "-superseded"
# A chain read on the event loop takes a view validated (in a worker thread) this recently; the
# chain poll validates every 0.5 s and every mint validates first, so this is only reached when
# Redis stopped answering: the reader is then told `StateUnavailable`.
CHAIN_RECENT_S = 2.0


class FleetBackends:
    """The Redis side of one control daemon."""

    def __init__(self, settings: Settings, keys: KeyTable) -> None:
        url = settings.fleet_redis_url
        assert url is not None and settings.fleet_secret is not None  # settings require both
        self.keys = FleetKeys(settings.fleet_id)
        self.keyring = Keyring(
            settings.fleet_secret,
            settings.fleet_id,  # SPEC §19: every MAC's key
            settings.fleet_verify_secret,
        )  # a rotation's other: verifies only
        self.host_id = settings.host_id
        self.entries = FleetEntries(self.keyring)  # SPEC §19: what is published, MAC'd; what is read, checked
        self.client = connect(url)
        # The mint's and the revoke's backends: their concurrent commands go as one pipeline (issue 27)
        self.batching = BatchingRedis(self.client)
        self.sync = connect_sync(url)
        self.fence = Incarnation(UNJOINED)
        self.supervisor = Supervisor()  # every loop that reads Redis (SPEC §19)
        self.owed = OwedWrites(is_live=lambda key_id: keys.get(key_id) is not None)
        self.lease_capacity = OwedCapacity(self.batching, self.keys, settings.host_id, self.fence, self.owed)
        journal = None if keys.path is None else os.path.join(settings.state_dir, LEASE_DECISIONS_FILE)
        self.lease_decisions = LeaseDecisions(journal, keys.get)  # beside the key table's journal
        self.decisions = OwedDecisions(self.batching, self.keys, self.owed, self.lease_decisions, entries=self.entries)
        self.hosts = HostRegistry(self.client, self.keys, settings.fleet_host_ttl_seconds, entries=self.entries)
        self.events = FleetEvents(self.client, self.keys, settings.host_id, entries=self.entries)
        self.revocations = FleetRevocations(self.client, self.keys, settings.host_id, entries=self.entries)
        self.board = InFlightBoard(self.client, self.keys, settings.fleet_host_ttl_seconds)
        self.sockets = SocketsBoard(self.client, self.keys, self.entries, settings.fleet_host_ttl_seconds)

    def circuits(self, cooldown_s: int, on_transition: OnTransition) -> CircuitRegistry:
        store = RedisCircuits(self.batching, self.keys, entries=self.entries, unverified_open_ms=cooldown_s * 1000)
        return OwedCircuits(store, cooldown_s, self.owed, on_transition)

    def chain(self, name: str, state_dir: str, chain_file: str, anchor_file: str) -> ChainStorage:
        mirror = FileChainStorage(os.path.join(state_dir, chain_file), os.path.join(state_dir, anchor_file))
        auth = ChainAuth(
            self.keyring.key("chain/" + name), self._seal_fields, verify_also=self.keyring.keys("chain/" + name)[1:]
        )
        remote = RedisChainStorage(self.sync, self.keys, name, aclient=self.batching)  # a mint's refresh: async
        return MirroredChainStorage(remote, mirror, auth)

    def _seal_fields(self) -> dict[str, Any]:
        """Who adopts a chain (SPEC §19): this host, on the fleet secret's authority."""
        return {
            "at": iso_ms(now_ms()),
            "actor": "host:" + self.host_id,
            "actor_authenticated_by": "fleet-secret",
            "reason": "adopted into fleet mode under this fleet secret",
        }

    async def close(self) -> None:
        await self.batching.aclose()
        await self.client.aclose()
        self.sync.close()
        self.lease_decisions.close()


def fleet(settings: Settings, keys: KeyTable) -> Backends:
    redis_side = FleetBackends(settings, keys)
    return Backends(
        lease_capacity=redis_side.lease_capacity,
        decisions=redis_side.decisions,
        circuits=redis_side.circuits,
        admin_chain=redis_side.chain(
            "account-admin", settings.state_dir, admin_store.CHAIN_FILE, admin_store.ANCHOR_FILE
        ),
        policy_chain=redis_side.chain("policy", settings.state_dir, policy_store.CHAIN_FILE, policy_store.ANCHOR_FILE),
        chain_recent_s=CHAIN_RECENT_S,
        fleet=redis_side,
    )
