"""The fleet's gauges on `/metrics` (SPEC §16), read from one `FleetSnapshot` per scrape.

Labelled by host id only (a fleet's host ids are its operator's few names, never a key or a
principal): hosts live, the shared state's availability, and each host's leases and attempts
in flight. Embedded mode reports itself as a fleet of one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from controlplane.fleet.snapshot import FleetSnapshot, FleetSource
from shared.clock import now_ms
from shared.codes import FleetState

if TYPE_CHECKING:  # fleet mode only (tests/unit/test_lazy_imports.py)
    from shared.fleet.entries import FleetEntries


class FleetGauges:
    """A prometheus collector; `refresh` (awaited before each scrape) reads the snapshot."""

    def __init__(self, source: FleetSource, entries: FleetEntries | None = None) -> None:
        self.source = source
        self.entries = entries  # fleet mode: what this host rejected of what it read (SPEC §19)
        self.last: FleetSnapshot | None = None

    async def refresh(self) -> None:
        self.last = await self.source.snapshot(now_ms())

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self.last
        if snap is None:
            return
        yield GaugeMetricFamily(
            "leasehold_fleet_hosts_live", "Hosts of the fleet with a live heartbeat.", value=snap.hosts_live
        )
        yield GaugeMetricFamily(
            "leasehold_fleet_state_available",
            "1 while this host can rely on the fleet's shared state.",
            value=1 if snap.state == FleetState.AVAILABLE else 0,
        )
        yield GaugeMetricFamily(
            "leasehold_fleet_writes_owed",
            "Writes to the fleet's Redis kept until it answers again.",
            value=snap.writes_owed,
        )
        leases = GaugeMetricFamily("leasehold_fleet_host_leases", "Live leases held by each host.", labels=["host_id"])
        flight = GaugeMetricFamily(
            "leasehold_fleet_host_in_flight", "Attempts in flight on each host.", labels=["host_id"]
        )
        totals: dict[str, list[int]] = {h.host_id: [0, 0] for h in snap.hosts}
        for rows in snap.accounts.values():
            for row in rows:
                total = totals.setdefault(row.host_id, [0, 0])
                total[0] += row.lease_count
                total[1] += row.in_flight_count
        for host, (lease_count, in_flight) in sorted(totals.items()):
            leases.add_metric([host], lease_count)
            flight.add_metric([host], in_flight)
        yield leases
        yield flight
        if snap.loops:
            restarts = CounterMetricFamily(
                "leasehold_fleet_loop_restarts",
                "Unexpected ends of a supervised Redis loop (SPEC §19), by loop (`dataplane:` names the data plane's).",
                labels=["loop"],
            )
            for loop in snap.loops:
                restarts.add_metric([loop.name], loop.restarts)
            yield restarts
        if self.entries is not None:
            rejected = CounterMetricFamily(
                "leasehold_fleet_entries_rejected",
                "Entries read from the fleet's Redis and rejected (no valid MAC, undecodable, out of range), by kind.",
                labels=["kind"],
            )
            for kind, count in sorted(self.entries.rejected.items()):
                rejected.add_metric([str(kind)], count)
            yield rejected
