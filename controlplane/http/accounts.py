"""`GET /control/v2/accounts` (SPEC §11, seed 002 D2): every account, each fact on its own.

A projection over the registry, the key table, the route book, the evidence book, the circuits
and the admin overlay. It names the credential's variable, never reads its value (an AST test
holds this module to that).

Fleet mode (SPEC §16): `lease_count`, `in_flight_count` and `sockets_open` are fleet-wide, `hosts` splits them by
host (`{host_id, lease_count, in_flight_count, last_seen_at}`), and the view's `fleet` says
`{mode, state, hosts_live}`. While the fleet's state is `unavailable` the counts are this host's
own and the circuit and administrative state the last ones read; embedded mode is a fleet of one
(`{mode: "embedded", state: "available", hosts_live: 1}`).

`rate_limits` (SPEC §22) is each account's provider headroom, per kind (`requests`, `tokens`,
`input_tokens`, `output_tokens`) its latest observation — `limit`, `remaining`, `reset_at`,
`observed_at`, `headroom_percent`, and `current` (false once its reset passed: it no longer
says anything about now). It is its own fact: `health` stays evidence-based.
"""

from __future__ import annotations

from typing import cast
from urllib.parse import urlsplit

import msgspec

from controlplane.circuits import CircuitView
from controlplane.core.health import derive_health
from controlplane.core.overlay import Overlay
from controlplane.fleet.snapshot import FleetSnapshot
from controlplane.headroom import HeadroomBook, KindView
from controlplane.http.appkeys import DESK, FLEET, HEADROOM, READS
from controlplane.http.common import int_query, json_response, requires
from controlplane.ports import ControlReads
from controlplane.registry import AccountSpec
from controlplane.stores.admin import AccountAdminStore
from shared.capacity import StateUnavailable
from shared.chain import Verdict
from shared.chainfile import ChainView
from shared.clock import iso_ms, now_ms
from shared.codes import AdminState, Scope
from shared.http1 import web

WINDOW_DEFAULT_S, WINDOW_MIN_S, WINDOW_MAX_S = 900, 60, 86400


class HostView(msgspec.Struct, frozen=True, kw_only=True):
    host_id: str
    lease_count: int
    in_flight_count: int
    last_seen_at: str | None  # the host's last heartbeat; null for a dead host not yet reaped


class FleetView(msgspec.Struct, frozen=True, kw_only=True):
    mode: str  # embedded | redis
    state: str  # available | unavailable
    hosts_live: int


class AccountView(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    display_name: str
    provider_binding: str
    upstream_origin: str
    auth_style: str
    credential_env: str
    configured: bool
    administrative_state: str
    leased: bool
    lease_count: int
    in_flight: bool
    in_flight_count: int
    sockets_open: int  # Responses WebSockets open (SPEC §20); fleet mode: fleet-wide
    observed: bool
    observed_request_count: int
    observed_aborted_count: int
    last_observed_at: str | None
    circuit: CircuitView
    health: str
    health_reason: str
    hosts: list[HostView]
    rate_limits: dict[str, KindView]


class AccountsView(msgspec.Struct, frozen=True, kw_only=True):
    accounts: list[AccountView]
    window_seconds: int
    as_of: str
    evidence_since: str
    evidence_truncated: bool
    admin_chain_verdict: str  # while `corrupt`, every account reads `disabled` and mints hold
    admin_revision: int | None  # null while the chain is corrupt
    fleet: FleetView


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def admin_chain(request: web.Request) -> ChainView[Overlay] | None:
    """The admin chain's view; in fleet mode with Redis away, the last one validated (the
    view's `fleet.state` says so)."""
    admin = cast(AccountAdminStore, request.app[DESK].admin)  # reads its chain, not just the overlay
    try:
        return admin.read()
    except StateUnavailable:
        return admin.chain.last_validated()


async def accounts_view(request: web.Request, window_s: int) -> AccountsView:
    reads = request.app[READS]
    headroom = request.app[HEADROOM]
    now = now_ms()
    fleet = await request.app[FLEET].snapshot(now)
    chain = admin_chain(request)
    overlay = None if chain is None else chain.state
    truncated_any = False
    views = []
    for account in reads.registry.accounts:
        view, truncated = await _account_view(reads, headroom, fleet, overlay, account, now, window_s)
        views.append(view)
        truncated_any = truncated_any or truncated
    return AccountsView(
        accounts=views,
        window_seconds=window_s,
        as_of=iso_ms(now),
        evidence_since=iso_ms(reads.evidence.since_ms),
        evidence_truncated=truncated_any,
        admin_chain_verdict=str(Verdict.CORRUPT if chain is None else chain.check.verdict),
        admin_revision=None if chain is None else chain.check.revision,
        fleet=FleetView(mode=str(fleet.mode), state=str(fleet.state), hosts_live=fleet.hosts_live),
    )


async def _account_view(
    reads: ControlReads,
    headroom: HeadroomBook,
    fleet: FleetSnapshot,
    overlay: Overlay | None,
    account: AccountSpec,
    now: int,
    window_s: int,
) -> tuple[AccountView, bool]:
    """One account's row of the view, and whether its evidence window was truncated."""
    rows = fleet.accounts.get(account.id, [])
    lease_count = sum(r.lease_count for r in rows)
    in_flight = sum(r.in_flight_count for r in rows)
    counts, last_ms, truncated = reads.evidence.window(account.id, now - window_s * 1000)
    configured = reads.configured(account)
    health, reason = derive_health(configured, counts)
    view = AccountView(
        id=account.id,
        display_name=account.display_name,
        provider_binding=str(account.provider_binding),
        upstream_origin=origin_of(account.base_url),
        auth_style=str(account.auth_style),
        credential_env=account.credential_env,
        configured=configured,
        administrative_state=str(AdminState.DISABLED if overlay is None else overlay.state_of(account.id)),
        leased=lease_count > 0,
        lease_count=lease_count,
        in_flight=in_flight > 0,
        in_flight_count=in_flight,
        sockets_open=(reads.routes.sockets_open.get(account.id, 0) + fleet.sockets_elsewhere.get(account.id, 0)),
        observed=counts.observed > 0,
        observed_request_count=counts.observed,
        observed_aborted_count=counts.aborted,
        last_observed_at=None if last_ms is None else iso_ms(last_ms),
        circuit=await reads.circuits.view_or_last(account.id, now),
        health=str(health),
        health_reason=str(reason),
        hosts=[
            HostView(
                host_id=r.host_id,
                lease_count=r.lease_count,
                in_flight_count=r.in_flight_count,
                last_seen_at=None if r.last_seen_ms is None else iso_ms(r.last_seen_ms),
            )
            for r in rows
        ],
        rate_limits=headroom.view(account.id, now),
    )
    return view, truncated


@requires(Scope.READ)
async def accounts(request: web.Request) -> web.Response:
    window_s = int_query(request, "window_seconds", WINDOW_DEFAULT_S, WINDOW_MIN_S, WINDOW_MAX_S)
    return json_response(await accounts_view(request, window_s))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/control/v2/accounts", accounts)
