"""`wire`: every collaborator of the control daemon, built once in reading order.

Construction only: each part is handed the ports it uses (`controlplane/ports.py`), never the
service; `controlplane.main` serves what this builds, and tests build theirs with it too.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec

from controlplane.books import Books, build_books
from controlplane.budgetguard import BudgetGuard
from controlplane.circuits import CircuitRegistry
from controlplane.core.policy import Ceiling
from controlplane.core.pricing import PriceTable
from controlplane.disabled import DisabledAccounts
from controlplane.drain import ReportDrain
from controlplane.events import EventHub, EventKind
from controlplane.evidence import EvidenceBook
from controlplane.fleet import backends
from controlplane.fleet.gauges import FleetGauges
from controlplane.fleet.snapshot import EmbeddedFleet, FleetSource
from controlplane.grants import Grants
from controlplane.headroom import HeadroomBook
from controlplane.hops import Hopper
from controlplane.metrics import GatewayMetrics
from controlplane.mint import MintDesk
from controlplane.ports import Configured, ControlReads, RowSink
from controlplane.registry import Registry, is_configured
from controlplane.replication import DataPlaneLink
from controlplane.routebook import RouteBook
from controlplane.service import ControlService
from controlplane.spend import SpendBook
from controlplane.stores.admin import AccountAdminStore, Revoker
from controlplane.stores.keys import KeyTable
from controlplane.stores.ledger import Ledger
from controlplane.stores.policy import PolicyStore
from controlplane.traces import TraceCollector, Traces
from shared.clock import now_ms
from shared.http1 import web
from shared.settings import Settings

if TYPE_CHECKING:  # fleet mode's modules (and the Redis client) load only in fleet mode: `backends_for`
    from controlplane.fleet.headroom import FleetHeadroom
    from controlplane.fleet.host import FleetHost
    from controlplane.fleet.spend import FleetSpend


Upkeep = Callable[[web.Application], AsyncIterator[None]]  # the app's cleanup context: a loop while the app runs


class Control(msgspec.Struct, frozen=True, kw_only=True):
    """The control daemon's collaborators, wired once by `wire` (tests build theirs with it too)."""

    settings: Settings
    service: ControlService
    reads: ControlReads  # what the read handlers and the metrics see of the daemon
    desk: MintDesk
    admin: AccountAdminStore
    revoke: Revoker  # `revoke-leases`: this host's seam, or every live host's (SPEC §16)
    policy: PolicyStore
    metrics: GatewayMetrics
    spend: SpendBook
    budgets: BudgetGuard
    fleet_view: FleetSource
    headroom: HeadroomBook
    upkeep: tuple[Upkeep, ...] = ()  # the background loops the HTTP app runs (budgets, headroom)
    fleet: FleetHost | None = None  # fleet mode (SPEC §16): this host's membership and loops
    fleet_spend: FleetSpend | None = None  # fleet mode (SPEC §18): the spend counters in Redis
    traces: Traces | None = None  # SPEC §21: set when an OTLP endpoint is
    fleet_headroom: FleetHeadroom | None = None  # fleet mode (SPEC §22): observations shared


def backends_for(settings: Settings, keys: KeyTable) -> backends.Backends:
    """In-process tables, or the fleet's Redis (SPEC §16). Fleet mode's modules are imported here,
    only when `GATEWAY_FLEET_REDIS_URL` is set: an embedded daemon never loads the Redis client
    (~9 MiB of RSS and ~130 modules at start; tests/unit/test_lazy_imports.py keeps it so)."""
    if not settings.fleet_redis_url:
        return backends.embedded(settings, keys)
    from controlplane.fleet.wiring import fleet

    return fleet(settings, keys)


class _Parts(msgspec.Struct, frozen=True, kw_only=True):
    """What every later part of `wire` reads: the shared state, the chains and the books."""

    shared: backends.Backends
    events: EventHub
    circuits: CircuitRegistry
    admin: AccountAdminStore
    policy: PolicyStore
    link: DataPlaneLink
    drain: ReportDrain  # what a row-reading answer awaits first (its settle bound by `wire`)
    routes: RouteBook
    evidence: EvidenceBook
    books: Books
    account_ids: list[str]
    disabled: DisabledAccounts  # what the data plane hears of the disables (SPEC §20)


def wire(
    settings: Settings,
    registry: Registry,
    keys: KeyTable,
    ledger: Ledger,
    prices: PriceTable,
    env: dict[str, str] | None = None,
) -> Control:
    """Every collaborator, in reading order, each handed the ports it uses: the shared state and
    the chains; spend, budgets and headroom; the read side; the desk and its hops; then the
    service over them all, its row sinks in the order they run, and the link bound to it; last,
    fleet mode's host, which ends keys through the service's release seam."""
    parts = _parts(settings, registry, keys, ledger, prices)
    books, circuits, link = parts.books, parts.circuits, parts.link
    configured = partial(is_configured, env=dict(os.environ if env is None else env))
    reads, metrics, traces = _read_side(settings, registry, keys, ledger, parts, configured)
    grants = Grants(
        settings,
        keys=keys,
        link=link,
        gate=books.budgets.gate,
        lease_capacity=parts.shared.lease_capacity,
        decisions=parts.shared.decisions,
        circuits=circuits,
    )
    desk, hopper = _desk(settings, registry, keys, parts, grants, configured, metrics, traces)
    service = _service(
        settings, registry, keys, ledger, prices, parts, grants, configured, _row_sinks(metrics, books, traces), hopper
    )
    link.bind(service.snapshot, service.handle, service.on_disconnect, service.read_done)  # the link serves it
    parts.drain.settled = service.settle  # a drain's rows are settled before the read answers
    fleet = None if parts.shared.fleet is None else _fleet_host(parts, settings, keys, registry, service)
    fleet_view: FleetSource = (
        EmbeddedFleet(settings.host_id, parts.account_ids, keys.count_by_account, parts.routes.in_flight_by_account)
        if fleet is None
        else fleet.view()
    )
    metrics.watch(FleetGauges(fleet_view, None if parts.shared.fleet is None else parts.shared.fleet.entries))
    return Control(
        settings=settings,
        service=service,
        reads=reads,
        desk=desk,
        admin=parts.admin,
        revoke=service.end_account_keys if fleet is None else fleet.revocation.revoke_account,
        policy=parts.policy,
        metrics=metrics,
        spend=books.spend,
        budgets=books.budgets,
        fleet_view=fleet_view,
        headroom=books.headroom,
        upkeep=(books.budgets.background, books.headroom.background, parts.disabled.background),
        fleet=fleet,
        fleet_spend=books.fleet_spend,
        fleet_headroom=books.fleet_headroom,
        traces=traces,
    )


async def _nothing_to_settle() -> None:
    """A drain's settle until `wire` binds the service's."""


def _parts(settings: Settings, registry: Registry, keys: KeyTable, ledger: Ledger, prices: PriceTable) -> _Parts:
    """The shared state (in-process or the fleet's Redis, SPEC §16), the circuits, the chains,
    the link, the route and evidence books, and the books of spend, budgets and headroom."""
    events = EventHub()
    shared = backends_for(settings, keys)
    circuits = shared.circuits(settings.circuit_cooldown_seconds, lambda view: events.publish(EventKind.CIRCUIT, view))
    account_ids = [a.id for a in registry.accounts]
    admin, policy = _chains(settings, shared, events, account_ids)
    link = DataPlaneLink()
    disabled = DisabledAccounts(admin.overlay, link, account_ids)
    admin.settle = disabled.sync  # a PATCH answers once the data plane has the disable
    events.listen(disabled.on_event, frozenset({EventKind.ACCOUNT_STATE}))
    books = build_books(settings, shared, ledger, policy, keys, link, events, prices, account_ids)
    return _Parts(
        shared=shared,
        events=events,
        circuits=circuits,
        admin=admin,
        policy=policy,
        link=link,
        drain=ReportDrain(link, _nothing_to_settle),
        routes=RouteBook(),
        evidence=EvidenceBook(now_ms()),
        books=books,
        account_ids=account_ids,
        disabled=disabled,
    )


def _read_side(
    settings: Settings, registry: Registry, keys: KeyTable, ledger: Ledger, parts: _Parts, configured: Configured
) -> tuple[ControlReads, GatewayMetrics, Traces | None]:
    """What the read handlers and the metrics see of the daemon (its ports), the metrics over
    them, and the traces (SPEC §21: the span of each recorded row, off the hot path)."""
    reads = ControlReads(
        registry=registry,
        keys=keys,
        routes=parts.routes,
        evidence=parts.evidence,
        circuits=parts.circuits,
        link=parts.link,
        ledger=ledger,
        configured=configured,
        drain=parts.drain,
    )
    traces = Traces.of(settings, registry)
    books = parts.books
    metrics = GatewayMetrics(
        reads,
        parts.events,
        parts.circuits,
        parts.admin.state_of,
        spend=books.spend,
        budgets=books.budgets.watch,
        collectors=(books.headroom.gauges(), TraceCollector(traces)),
    )
    return reads, metrics, traces


def _desk(
    settings: Settings,
    registry: Registry,
    keys: KeyTable,
    parts: _Parts,
    grants: Grants,
    configured: Configured,
    metrics: GatewayMetrics,
    traces: Traces | None,
) -> tuple[MintDesk, Hopper]:
    """The mint desk and its hopper, their decisions and hops heard by the metrics and traces."""
    desk = MintDesk(
        settings=settings,
        registry=registry,
        keys=keys,
        decisions=parts.shared.decisions,
        lease_capacity=parts.shared.lease_capacity,
        circuits=parts.circuits,
        admin=parts.admin,
        policy=parts.policy,
        granter=grants,
        configured=configured,
        budgets=parts.books.budgets,
        headroom=parts.books.headroom,
        decision_listeners=(metrics.on_decision, *(() if traces is None else (traces.on_decision,))),
    )
    hopper = Hopper(
        keys=keys,
        routes=parts.routes,
        desk=desk,
        rebind=grants.rebind,
        events=parts.events,
        hop_listeners=(metrics.on_hop, *(() if traces is None else (traces.on_hop,))),
    )
    return desk, hopper


def _service(
    settings: Settings,
    registry: Registry,
    keys: KeyTable,
    ledger: Ledger,
    prices: PriceTable,
    parts: _Parts,
    grants: Grants,
    configured: Configured,
    row_sinks: tuple[RowSink, ...],
    hopper: Hopper,
) -> ControlService:
    """The service over them all: its row sinks in the order they run, the hops after each settle."""
    return ControlService(
        settings,
        registry,
        keys,
        ledger,
        prices,
        routes=parts.routes,
        lease_capacity=parts.shared.lease_capacity,
        circuits=parts.circuits,
        decisions=parts.shared.decisions,
        evidence=parts.evidence,
        events=parts.events,
        link=parts.link,
        grants=grants,
        budgets=parts.books.budgets,
        configured=configured,
        row_sinks=row_sinks,
        settle_hooks=(hopper.after_rows,),
        hooks_idle=hopper.idle,
        fold_together=parts.shared.fleet is not None,
    )


def _row_sinks(metrics: GatewayMetrics, books: Books, traces: Traces | None) -> tuple[RowSink, ...]:
    """Where each recorded row goes, in the order they run."""
    return (
        metrics.rows.add,
        books.spend.fold.add,  # the fold itself: one call per row, not two
        books.budgets.on_row,  # after the book: the watch reads a fold holding the row
        books.headroom.on_row,
        *(() if books.fleet_spend is None else (books.fleet_spend.note,)),
        *(() if traces is None else (traces.on_row,)),
    )


def _chains(
    settings: Settings, shared: backends.Backends, events: EventHub, account_ids: list[str]
) -> tuple[AccountAdminStore, PolicyStore]:
    """The account admin chain (its commits on the event feed) and the policy chain."""
    admin = AccountAdminStore(
        settings.state_dir,
        account_ids,
        on_commit=lambda record: events.publish(EventKind.ACCOUNT_STATE, record),
        storage=shared.admin_chain,
        recent_s=shared.chain_recent_s,
    )
    policy = PolicyStore(
        settings.state_dir,
        account_ids,
        Ceiling(fallback_on=frozenset(settings.fallback_on), max_fallback_hops=settings.max_fallback_hops),
        storage=shared.policy_chain,
        recent_s=shared.chain_recent_s,
    )
    return admin, policy


def _fleet_host(
    parts: _Parts, settings: Settings, keys: KeyTable, registry: Registry, seam: ControlService
) -> FleetHost:
    """Fleet mode (imported only here): this host's membership and loops (SPEC §16), reading the
    daemon through its ports and ending keys through the release seam."""
    from controlplane.fleet.host import FleetHost

    shared: Any = parts.shared.fleet
    return FleetHost(
        shared,
        settings=settings,
        keys=keys,
        routes=parts.routes,
        registry=registry,
        seam=seam,
        circuits=parts.circuits,
        admin=parts.admin,
        policy=parts.policy,
        events=parts.events,
    )
