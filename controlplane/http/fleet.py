"""`GET /control/v2/fleet` (scope `read`): the fleet's hosts, as `leaseholdctl fleet` prints them.

`{as_of, mode, state, fleet_id, host_id, hosts_live, writes_owed, hosts: [{host_id, live,
last_seen_at, lease_count, in_flight_count, this_host}]}`: every live host with its last
heartbeat (Redis's clock) and what it holds over all accounts, plus any dead host not yet
reaped. Embedded mode answers a fleet of one. Host and account ids and counts only.
"""

from __future__ import annotations

from typing import Any

from controlplane.fleet.snapshot import FleetSnapshot
from controlplane.http.appkeys import FLEET
from controlplane.http.common import json_response, requires
from shared.clock import iso_ms, now_ms
from shared.codes import Scope
from shared.http1 import web


def fleet_payload(snap: FleetSnapshot, now: int) -> dict[str, Any]:
    totals: dict[str, list[int]] = {}
    for rows in snap.accounts.values():
        for row in rows:
            total = totals.setdefault(row.host_id, [0, 0])
            total[0] += row.lease_count
            total[1] += row.in_flight_count
    hosts = [
        {
            "host_id": h.host_id,
            "live": h.live,
            "last_seen_at": None if h.last_seen_ms is None else iso_ms(h.last_seen_ms),
            "lease_count": totals.get(h.host_id, [0, 0])[0],
            "in_flight_count": totals.get(h.host_id, [0, 0])[1],
            "this_host": h.host_id == snap.host_id,
        }
        for h in snap.hosts
    ]
    return {
        "as_of": iso_ms(now),
        "mode": str(snap.mode),
        "state": str(snap.state),
        "fleet_id": snap.fleet_id,
        "host_id": snap.host_id,
        "hosts_live": snap.hosts_live,
        "writes_owed": snap.writes_owed,
        "hosts": hosts,
        "loops": [
            {
                "name": loop.name,
                "state": str(loop.state),
                "failures": loop.failures,
                "restarts": loop.restarts,
                "last_error_kind": loop.last_error_kind,
            }
            for loop in snap.loops
        ],
    }


@requires(Scope.READ)
async def fleet(request: web.Request) -> web.Response:
    now = now_ms()
    return json_response(fleet_payload(await request.app[FLEET].snapshot(now), now))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/control/v2/fleet", fleet)
