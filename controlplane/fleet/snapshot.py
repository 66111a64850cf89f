"""The fleet's read model, and embedded mode's source of it (SPEC §16): no Redis here.

`FleetSnapshot` is what `GET /control/v2/accounts` (`hosts` per account and the view's
`fleet`), `GET /control/v2/fleet` and the metrics' fleet gauges read; `EmbeddedFleet` is the
source in embedded mode (this process is the whole fleet). Fleet mode's source, `RedisFleet`,
is in `controlplane/fleet/view.py`. Kept apart so an embedded daemon never imports the Redis
client (tests/unit/test_lazy_imports.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import msgspec

from controlplane.core.fleet import HostRow
from shared.codes import FleetMode, FleetState
from shared.supervisor import LoopStatus


class HostSeen(msgspec.Struct, frozen=True, kw_only=True):
    host_id: str
    last_seen_ms: int | None
    live: bool


class FleetSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    mode: FleetMode
    state: FleetState
    host_id: str  # this host
    fleet_id: str | None
    hosts_live: int
    hosts: tuple[HostSeen, ...]
    accounts: dict[str, list[HostRow]]  # account → its rows, one per host
    writes_owed: int = 0  # queued for Redis (`controlplane/fleet/owed.py`)
    loops: tuple[LoopStatus, ...] = ()  # the supervised Redis loops (SPEC §19); embedded: none
    # account → WebSockets open on the fleet's other live hosts (SPEC §20); unavailable: none
    sockets_elsewhere: dict[str, int] = msgspec.field(default_factory=dict)


class FleetSource(Protocol):
    async def snapshot(self, now_ms: int) -> FleetSnapshot: ...


LocalCounts = Callable[[], Mapping[str, int]]  # account → count, on this host now


class EmbeddedFleet:
    """Embedded mode: this host is the fleet."""

    def __init__(self, host_id: str, account_ids: list[str], leases: LocalCounts, in_flight: LocalCounts) -> None:
        self.host_id = host_id
        self.account_ids = account_ids
        self.leases = leases
        self.in_flight = in_flight

    async def snapshot(self, now_ms: int) -> FleetSnapshot:
        return local_snapshot(
            FleetMode.EMBEDDED,
            FleetState.AVAILABLE,
            self.host_id,
            None,
            1,
            self.account_ids,
            self.leases(),
            self.in_flight(),
            now_ms,
        )


def local_snapshot(
    mode: FleetMode,
    state: FleetState,
    host_id: str,
    fleet_id: str | None,
    hosts_live: int,
    account_ids: list[str],
    leases: Mapping[str, int],
    in_flight: Mapping[str, int],
    now_ms: int,
    writes_owed: int = 0,
) -> FleetSnapshot:
    accounts = {
        a: [
            HostRow(
                host_id=host_id, lease_count=leases.get(a, 0), in_flight_count=in_flight.get(a, 0), last_seen_ms=now_ms
            )
        ]
        for a in account_ids
    }
    return FleetSnapshot(
        mode=mode,
        state=state,
        host_id=host_id,
        fleet_id=fleet_id,
        hosts_live=hosts_live,
        hosts=(HostSeen(host_id=host_id, last_seen_ms=now_ms, live=True),),
        accounts=accounts,
        writes_owed=writes_owed,
    )
