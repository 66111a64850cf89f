"""`leaseholdctl fleet` (SPEC §16, scope `read`): the fleet's hosts and their last heartbeats.

Reads `GET /control/v2/fleet` from the control daemon it talks to: its mode (`embedded`: a fleet
of one; `redis`), whether the shared state is available to it, and every host with its last
heartbeat (Redis's clock), how long ago that was, and what it holds over all accounts. A host
that is not live (dead, not yet reaped) prints `dead`. `--json` prints the answer as given.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from controlplane.cli.client import Client
from controlplane.cli.exits import Exit
from controlplane.cli.output import cell, emit, emit_json, render_table
from shared.codes import Scope

FLEET_PATH = "/control/v2/fleet"
HEADERS = ("HOST", "LIVE", "LAST HEARTBEAT", "AGO", "LEASES", "IN FLIGHT")


def ago_text(as_of: str | None, seen: str | None) -> str:
    """`1.2s` between the answer's time and a heartbeat; `-` when either is missing."""
    if not as_of or not seen:
        return "-"
    try:
        seconds = (
            datetime.fromisoformat(as_of.replace("Z", "+00:00")) - datetime.fromisoformat(seen.replace("Z", "+00:00"))
        ).total_seconds()
    except ValueError:
        return "-"
    return f"{max(0.0, seconds):.1f}s"


def fleet_table(body: dict[str, Any]) -> str:
    rows = [
        (
            h.get("host_id") + (" (this host)" if h.get("this_host") else ""),
            "yes" if h.get("live") else "dead",
            cell(h.get("last_seen_at")),
            ago_text(body.get("as_of"), h.get("last_seen_at")),
            h.get("lease_count"),
            h.get("in_flight_count"),
        )
        for h in body.get("hosts", [])
    ]
    head = (
        f"fleet {cell(body.get('fleet_id'))}: mode {cell(body.get('mode'))}, state {cell(body.get('state'))}, "
        f"{cell(body.get('hosts_live'))} host(s) live"
    )
    if body.get("mode") == "embedded":
        head = "embedded mode (no GATEWAY_FLEET_REDIS_URL): this host is the whole fleet"
    footer = f"as of {cell(body.get('as_of'))}"
    if body.get("state") == "unavailable":
        footer += (
            "\nthe fleet's Redis is unreachable (or this host is re-registering): mints are held "
            "fleet-state-unavailable; the counts are this host's own"
        )
    if body.get("writes_owed"):
        footer += f"\n{body['writes_owed']} write(s) owed to Redis, delivered when it answers"
    return head + "\n" + render_table(HEADERS, rows) + "\n" + footer


def run_fleet(args: argparse.Namespace, client: Client) -> int:
    body = client.get(FLEET_PATH, Scope.READ)
    emit_json(body) if args.json else emit(fleet_table(body))
    return Exit.OK


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("fleet", parents=[common], help="the fleet's hosts and their last heartbeats")
    p.set_defaults(run=run_fleet)
