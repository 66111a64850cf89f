"""The fleet as the read plane sees it (SPEC §16): which hosts are live, what each holds.

One read model, `FleetSnapshot`, for `GET /control/v2/accounts` (`hosts` per account and the
view's `fleet`), `GET /control/v2/fleet` and the metrics' fleet gauges. Two sources:
- `EmbeddedFleet` (`controlplane/fleet/snapshot.py`, with the read model, so embedded mode never
  imports Redis): this process is the whole fleet (mode `embedded`, always available, one host);
- `RedisFleet`: live hosts and their last heartbeats (`HostRegistry`), each account's lease
  holders by host (the lease table's registry) and each host's in-flight counts (`InFlightBoard`:
  every host writes its own with its heartbeat). When Redis does not answer, or this host is not
  registered in the fleet's current state, the snapshot says `unavailable` and carries only this
  host's own counts — never a guess at the others'.

Nothing here is secret: host ids, account ids and counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import msgspec
import redis.asyncio as aredis

from controlplane.core.fleet import fleet_state, host_rows
from controlplane.fleet.snapshot import FleetSnapshot, HostSeen, LocalCounts, local_snapshot
from controlplane.fleet.sockets import SocketsBoard
from shared.capacity import StateUnavailable
from shared.codes import FleetMode, FleetState, Standing
from shared.fleet.capacity import RedisCapacity
from shared.fleet.hosts import HostRegistry
from shared.fleet.keys import FleetKeys
from shared.fleet.redis_client import guard
from shared.supervisor import LoopStatus


class InFlightBoard:
    """Each host's per-account in-flight counts in Redis, written by the host itself with its
    heartbeat and living twice the host TTL (a dead host's counts vanish with it)."""

    def __init__(self, client: aredis.Redis, keys: FleetKeys, ttl_s: float) -> None:
        self.client = client
        self.keys = keys
        self.ttl_ms = int(ttl_s * 2000)

    async def write(self, host_id: str, counts: Mapping[str, int]) -> None:
        key = self.keys.host_in_flight(host_id)
        with guard("in-flight write"):
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                if counts:
                    pipe.hset(key, mapping={a: n for a, n in counts.items()})
                    pipe.pexpire(key, self.ttl_ms)
                await pipe.execute()

    async def read(self, host_ids: list[str]) -> dict[str, dict[str, int]]:
        """host → account → in flight, for each of `host_ids`."""
        with guard("in-flight read"):
            async with self.client.pipeline(transaction=False) as pipe:
                for host in host_ids:
                    pipe.hgetall(self.keys.host_in_flight(host))
                answers = await pipe.execute()
        return {host: _counts(answer) for host, answer in zip(host_ids, answers)}


def _counts(answer: Mapping[bytes, bytes]) -> dict[str, int]:
    """A host's in-flight hash; an entry that is not account → count >= 0 (a writer's garbage)
    is left out, never a reason to fail the read plane (SPEC §19)."""
    counts: dict[str, int] = {}
    for account, n in answer.items():
        try:
            value = int(n)
        except ValueError:
            continue
        if value >= 0:
            counts[account.decode("utf-8", "replace")] = value
    return counts


class Standings(Protocol):
    """What the fleet host knows of itself (`controlplane/fleet/host.py`)."""

    @property
    def standing(self) -> Standing | None: ...
    @property
    def registered(self) -> bool: ...
    def writes_owed(self) -> int: ...
    def loops(self) -> tuple[LoopStatus, ...]: ...


class RedisFleet:
    def __init__(
        self,
        *,
        host_id: str,
        fleet_id: str,
        account_ids: list[str],
        hosts: HostRegistry,
        capacity: RedisCapacity,
        board: InFlightBoard,
        me: Standings,
        leases: LocalCounts,
        in_flight: LocalCounts,
        sockets: SocketsBoard | None = None,
    ) -> None:
        self.host_id = host_id
        self.fleet_id = fleet_id
        self.account_ids = account_ids
        self.hosts = hosts
        self.capacity = capacity
        self.board = board
        self.me = me
        self.leases = leases
        self.in_flight = in_flight
        self.sockets = sockets  # the other hosts' open WebSockets (SPEC §20)
        self.last_hosts_live = 1  # what an unavailable snapshot reports: the last count known

    async def snapshot(self, now_ms: int) -> FleetSnapshot:
        try:
            live = await self.hosts.live_hosts()
            held = {a: await self.capacity.counts_by_host(a) for a in self.account_ids}
            flight = await self.board.read(sorted(set(live) - {self.host_id}))
            sockets = {} if self.sockets is None else await self.sockets.read(sorted(set(live) - {self.host_id}))
        except StateUnavailable:
            return self._local(now_ms)
        state = fleet_state(True, self.me.standing, self.me.registered)
        if state is FleetState.UNAVAILABLE:
            return self._local(now_ms)
        self.last_hosts_live = len(live)
        local_flight = self.in_flight()
        accounts = {
            a: host_rows(
                self.host_id,
                now_ms,
                live,
                held[a],
                {h: flight.get(h, {}).get(a, 0) for h in live},
                local_flight.get(a, 0),
            )
            for a in self.account_ids
        }
        seen = sorted(set(live) | {r.host_id for rows in accounts.values() for r in rows} | {self.host_id})
        hosts = tuple(
            HostSeen(
                host_id=h,
                last_seen_ms=now_ms if h == self.host_id else live.get(h),
                live=h in live or h == self.host_id,
            )
            for h in seen
        )
        return FleetSnapshot(
            mode=FleetMode.REDIS,
            state=state,
            host_id=self.host_id,
            fleet_id=self.fleet_id,
            hosts_live=len(live),
            hosts=hosts,
            accounts=accounts,
            writes_owed=self.me.writes_owed(),
            loops=self.me.loops(),
            sockets_elsewhere=sockets,
        )

    def _local(self, now_ms: int) -> FleetSnapshot:
        snap = local_snapshot(
            FleetMode.REDIS,
            FleetState.UNAVAILABLE,
            self.host_id,
            self.fleet_id,
            self.last_hosts_live,
            self.account_ids,
            self.leases(),
            self.in_flight(),
            now_ms,
            self.me.writes_owed(),
        )
        return msgspec.structs.replace(snap, loops=self.me.loops())
