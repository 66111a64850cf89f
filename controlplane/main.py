"""leasehold-control: settings → logging → registry → stores → servers → signals.

`main(argv) -> int` is plain and callable from tests; `cli()` is the console script.
"""

from __future__ import annotations

import shared.deferred_ca  # noqa: F401  first: aiohttp's import-time TLS contexts read the CA bundle when used

# isort: split
import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec
import uvloop
from aiohttp import web

from controlplane.books import build_books
from controlplane.budgetguard import BudgetGuard
from controlplane.circuits import CircuitRegistry
from controlplane.core.policy import Ceiling
from controlplane.core.pricing import PriceTable
from controlplane.events import EventHub, EventKind
from controlplane.evidence import EvidenceBook
from controlplane.fleet import backends
from controlplane.fleet.gauges import FleetGauges
from controlplane.fleet.snapshot import EmbeddedFleet, FleetSource
from controlplane.grants import Grants
from controlplane.headroom import HeadroomBook
from controlplane.hops import Hopper
from controlplane.http import accounts as accounts_http
from controlplane.http import admin as admin_http
from controlplane.http import dashboard as dashboard_http
from controlplane.http import events as events_http
from controlplane.http import fleet as fleet_http
from controlplane.http import keys as keys_http
from controlplane.http import metrics as metrics_http
from controlplane.http import mint as mint_http
from controlplane.http import policy as policy_http
from controlplane.http import spend as spend_http
from controlplane.http import traces as traces_http
from controlplane.http import views as views_http
from controlplane.http.appkeys import DESK, FLEET, HEADROOM, READS, TRACES, V1_KEYS
from controlplane.http.common import TokenRing, auth_middleware
from controlplane.metrics import GatewayMetrics
from controlplane.mint import MintDesk
from controlplane.ports import ControlReads, RowSink
from controlplane.prices import PricesError, load_prices
from controlplane.registry import Registry, RegistryError, is_configured
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
from shared.heap import settle_heap
from shared.logging import configure_logging, get_logger
from shared.private import private_dir
from shared.rpc import start_unix_server
from shared.settings import Settings, SettingsError, load_settings, unknown_variables

if TYPE_CHECKING:  # fleet mode's modules (and the Redis client) load only in fleet mode: `backends_for`
    from controlplane.fleet.headroom import FleetHeadroom
    from controlplane.fleet.host import FleetHost
    from controlplane.fleet.spend import FleetSpend

log = get_logger("control")

REAPER_INTERVAL_S = 1.0
HEAP_TRIM_EVERY_PASSES = 5
CONTROL_BODY_LIMIT = 1024 * 1024


Upkeep = Callable[[web.Application], AsyncIterator[None]]   # an aiohttp cleanup context: a loop while the app runs


class Control(msgspec.Struct, frozen=True, kw_only=True):
    """The control daemon's collaborators, wired once by `wire` (tests build theirs with it too)."""

    settings: Settings
    service: ControlService
    reads: ControlReads                 # what the read handlers and the metrics see of the daemon
    desk: MintDesk
    admin: AccountAdminStore
    revoke: Revoker                     # `revoke-leases`: this host's seam, or every live host's (SPEC §16)
    policy: PolicyStore
    metrics: GatewayMetrics
    spend: SpendBook
    budgets: BudgetGuard
    fleet_view: FleetSource
    headroom: HeadroomBook
    upkeep: tuple[Upkeep, ...] = ()     # the background loops the HTTP app runs (budgets, headroom)
    fleet: FleetHost | None = None      # fleet mode (SPEC §16): this host's membership and loops
    fleet_spend: FleetSpend | None = None   # fleet mode (SPEC §18): the spend counters in Redis
    traces: Traces | None = None        # SPEC §21: set when an OTLP endpoint is
    fleet_headroom: FleetHeadroom | None = None   # fleet mode (SPEC §22): observations shared


def backends_for(settings: Settings, keys: KeyTable) -> backends.Backends:
    """In-process tables, or the fleet's Redis (SPEC §16). Fleet mode's modules are imported here,
    only when `GATEWAY_FLEET_REDIS_URL` is set: an embedded daemon never loads the Redis client
    (~9 MiB of RSS and ~130 modules at start; tests/unit/test_lazy_imports.py keeps it so)."""
    if not settings.fleet_redis_url:
        return backends.embedded(settings, keys)
    from controlplane.fleet.wiring import fleet
    return fleet(settings, keys)


def wire(settings: Settings, registry: Registry, keys: KeyTable, ledger: Ledger, prices: PriceTable,
         env: dict[str, str] | None = None) -> Control:
    """Every collaborator, in reading order, each handed the ports it uses: the shared state and
    the chains; spend, budgets and headroom; the read side; the desk and its hops; then the
    service over them all, its row sinks in the order they run, and the link bound to it; last,
    fleet mode's host, which ends keys through the service's release seam."""
    events = EventHub()
    shared = backends_for(settings, keys)  # in-process tables, or the fleet's Redis (SPEC §16)
    circuits = shared.circuits(settings.circuit_cooldown_seconds,
                               lambda view: events.publish(EventKind.CIRCUIT, view))
    account_ids = [a.id for a in registry.accounts]
    admin, policy = _chains(settings, shared, events, account_ids)
    link, routes, evidence = DataPlaneLink(), RouteBook(), EvidenceBook(now_ms())
    books = build_books(settings, shared, ledger, policy, keys, link, events, prices, account_ids)
    configured = partial(is_configured, env=dict(os.environ if env is None else env))
    reads = ControlReads(registry=registry, keys=keys, routes=routes, evidence=evidence, circuits=circuits,
                         link=link, ledger=ledger, configured=configured)
    traces = Traces.of(settings, registry)  # SPEC §21: the span of each recorded row, off the hot path
    metrics = GatewayMetrics(reads, events, circuits, admin.state_of, spend=books.spend, budgets=books.budgets.watch,
                             collectors=(books.headroom.gauges(), TraceCollector(traces)))
    grants = Grants(settings, keys=keys, link=link, gate=books.budgets.gate, lease_capacity=shared.lease_capacity,
                    decisions=shared.decisions, circuits=circuits)
    desk = MintDesk(settings=settings, registry=registry, keys=keys, decisions=shared.decisions,
                    lease_capacity=shared.lease_capacity, circuits=circuits, admin=admin, policy=policy,
                    granter=grants, configured=configured, budgets=books.budgets, headroom=books.headroom,
                    decision_listeners=(metrics.on_decision, *(() if traces is None else (traces.on_decision,))))
    hopper = Hopper(keys=keys, routes=routes, desk=desk, rebind=grants.rebind, events=events,
                    hop_listeners=(metrics.on_hop, *(() if traces is None else (traces.on_hop,))))
    row_sinks: tuple[RowSink, ...] = (
        metrics.rows.add, books.spend.add,
        books.budgets.on_row,   # after the book: the watch reads a fold holding the row
        books.headroom.on_row,
        *(() if books.fleet_spend is None else (books.fleet_spend.note,)),
        *(() if traces is None else (traces.on_row,)))
    service = ControlService(
        settings, registry, keys, ledger, prices, routes=routes, lease_capacity=shared.lease_capacity,
        circuits=circuits, decisions=shared.decisions, evidence=evidence, events=events, link=link, grants=grants,
        budgets=books.budgets, configured=configured, row_sinks=row_sinks, settle_hooks=(hopper.after_rows,))
    link.bind(service.snapshot, service.on_message, service.on_disconnect)  # the link serves the service
    fleet = None if shared.fleet is None else _fleet_host(shared.fleet, settings, keys, routes, registry, service,
                                                          circuits, admin, policy, events)
    fleet_view: FleetSource = (EmbeddedFleet(settings.host_id, account_ids, keys.count_by_account,
                                             routes.in_flight_by_account) if fleet is None else fleet.view())
    metrics.watch(FleetGauges(fleet_view, None if shared.fleet is None else shared.fleet.entries))
    return Control(settings=settings, service=service, reads=reads, desk=desk, admin=admin,
                   revoke=service.end_account_keys if fleet is None else fleet.revocation.revoke_account,
                   policy=policy, metrics=metrics, spend=books.spend, budgets=books.budgets, fleet_view=fleet_view,
                   headroom=books.headroom, upkeep=(books.budgets.background, books.headroom.background),
                   fleet=fleet, fleet_spend=books.fleet_spend, fleet_headroom=books.fleet_headroom, traces=traces)


def _chains(settings: Settings, shared: backends.Backends, events: EventHub,
            account_ids: list[str]) -> tuple[AccountAdminStore, PolicyStore]:
    """The account admin chain (its commits on the event feed) and the policy chain."""
    admin = AccountAdminStore(settings.state_dir, account_ids,
                              on_commit=lambda record: events.publish(EventKind.ACCOUNT_STATE, record),
                              storage=shared.admin_chain, recent_s=shared.chain_recent_s)
    policy = PolicyStore(settings.state_dir, account_ids,
                         Ceiling(fallback_on=frozenset(settings.fallback_on),
                                 max_fallback_hops=settings.max_fallback_hops),
                         storage=shared.policy_chain, recent_s=shared.chain_recent_s)
    return admin, policy


def _fleet_host(shared: Any, settings: Settings, keys: KeyTable, routes: RouteBook, registry: Registry,
                seam: ControlService, circuits: CircuitRegistry, admin: AccountAdminStore, policy: PolicyStore,
                events: EventHub) -> FleetHost:
    """Fleet mode (imported only here): this host's membership and loops (SPEC §16), reading the
    daemon through its ports and ending keys through the release seam."""
    from controlplane.fleet.host import FleetHost
    return FleetHost(shared, settings=settings, keys=keys, routes=routes, registry=registry, seam=seam,
                     circuits=circuits, admin=admin, policy=policy, events=events)


def build_app(control: Control) -> web.Application:
    """The HTTP app over what `wire` built: each handler module given the ports it reads."""
    app = web.Application(
        middlewares=[auth_middleware(TokenRing(control.settings), control.settings.metrics_public)],
        client_max_size=CONTROL_BODY_LIMIT,
    )
    app[READS] = control.reads
    app[V1_KEYS] = control.service
    app[DESK] = control.desk
    app[FLEET] = control.fleet_view
    app[TRACES] = control.traces
    app[HEADROOM] = control.headroom
    admin_http.add_routes(app, control.admin, control.revoke)
    fleet_http.add_routes(app)
    keys_http.add_routes(app)
    mint_http.add_routes(app)
    accounts_http.add_routes(app)
    views_http.add_routes(app)
    traces_http.add_routes(app)
    policy_http.add_routes(app, control.policy)
    spend_http.add_routes(app, control.spend, control.policy)
    app.cleanup_ctx.extend(control.upkeep)
    events_http.add_routes(app, control.service.events)
    metrics_http.add_routes(app, control.metrics)
    dashboard_http.add_routes(app)
    return app


class RpcListener:
    """The RPC socket, re-bound if its file disappears (a tmp cleaner, an operator's rm)."""

    def __init__(self, settings: Settings, service: ControlService) -> None:
        self.path = settings.rpc_socket
        self.service = service
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.server = await start_unix_server(self.path, self.service.link.on_client)

    async def ensure(self) -> None:
        if not os.path.exists(self.path):
            log.warning("rpc_socket_missing", path=self.path, action="rebinding")
            self.close()
            await self.start()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def _heap_trimmer() -> Callable[[], None]:
    """glibc keeps freed heap pages of traffic bursts; hand them back so RSS follows the live
    set rather than the peak (a no-op where malloc_trim does not exist)."""
    import ctypes  # here, not at start (no `ctypes.util.find_library`: it runs `ldconfig -p`)

    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    return lambda: trim(0)


async def _reaper(service: ControlService, listener: RpcListener) -> None:
    trim_heap = _heap_trimmer()
    passes = 0
    while True:
        await asyncio.sleep(REAPER_INTERVAL_S)
        passes += 1
        if passes % HEAP_TRIM_EVERY_PASSES == 0:
            trim_heap()
        try:
            await service.reap_expired()
            await service.retry_storage()
            await listener.ensure()
        except Exception:  # the reaper must outlive any one bad pass
            log.exception("reaper_pass_failed")


class StartupError(Exception):
    """A listener could not be opened, or the fleet refused this pair; the message names the
    variable to fix."""


async def _join_fleet(fleet: FleetHost, settings: Settings) -> None:
    """SPEC §16: claim the host id and re-register what the key journal kept, before anything
    is served (a duplicate host id never serves its data plane)."""
    from controlplane.fleet.recovery import FleetUnreachable
    from shared.fleet.membership import HostIdTaken
    try:
        await fleet.start()
    except HostIdTaken as exc:
        raise StartupError(f"GATEWAY_HOST_ID={settings.host_id} is already held by a live pair of fleet "
                           f"{settings.fleet_id} ({exc}); give this pair its own GATEWAY_HOST_ID, or stop "
                           "the other pair") from exc
    except FleetUnreachable as exc:
        raise StartupError(f"{exc} (GATEWAY_FLEET_REDIS_URL)") from exc


async def serve(control: Control) -> None:
    settings, service = control.settings, control.service
    if control.traces is not None:
        control.traces.start()  # the SDK is imported here, only when export is on
    if control.fleet is None:
        await service.restore()
    else:
        await _join_fleet(control.fleet, settings)
        if control.fleet_spend is not None:
            await control.fleet_spend.start()
        if control.fleet_headroom is not None:
            await control.fleet_headroom.start()
    listener = RpcListener(settings, service)
    try:
        await listener.start()
    except OSError as exc:
        raise StartupError(f"cannot open the RPC socket {settings.rpc_socket} "
                           f"(GATEWAY_RPC_SOCKET / GATEWAY_RUNTIME_DIR): {exc}") from exc
    runner = web.AppRunner(build_app(control), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, settings.control_host, settings.control_port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        listener.close()
        raise StartupError(f"cannot listen on {settings.control_host}:{settings.control_port} "
                           f"(GATEWAY_CONTROL_LISTEN): {exc}") from exc
    reaper = asyncio.create_task(_reaper(service, listener))
    log.info("control_started", listen=f"{settings.control_host}:{settings.control_port}",
             rpc_socket=settings.rpc_socket, state_dir=settings.state_dir,
             accounts=[a.id for a in service.registry.accounts])
    settle_heap()  # start-up's objects never scanned again by the collector (issue 27)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("control_stopping")
    reaper.cancel()
    listener.close()
    if service.link.conn is not None:
        service.link.conn.close()
    await runner.cleanup()
    await service.settle()  # every row recorded is written before the ledger closes
    if control.fleet_spend is not None:
        await control.fleet_spend.stop()  # the last rows' spend published
    if control.fleet_headroom is not None:
        await control.fleet_headroom.stop()
    if control.fleet is not None:
        await control.fleet.stop()  # leaves the fleet: a restart claims the host id at once
    if control.traces is not None:  # the last spans, waiting for the collector 2 s at most
        await asyncio.to_thread(control.traces.shutdown)
    service.ledger.close()
    service.keys.close()
    try:
        os.unlink(settings.rpc_socket)
    except OSError:
        pass
    log.info("control_stopped")


def main(argv: list[str] | None = None) -> int:
    del argv  # no flags: everything is GATEWAY_* (SPEC §2)
    try:
        settings = load_settings(role="control")
        registry = Registry.from_settings(settings)
        prices = load_prices(settings.prices_file)
    except (SettingsError, RegistryError, PricesError) as exc:
        print(f"leasehold-control: {exc}", file=sys.stderr)
        return 2
    credential_values = [os.environ.get(a.credential_env) for a in registry.accounts]
    collector_keys = [value for _, value in settings.traces.headers] if settings.traces else []
    configure_logging("leasehold-control", settings.log_level,
                      secrets=[settings.control_token, settings.mint_token, settings.read_token,
                               *credential_values, *collector_keys])
    for name in unknown_variables(os.environ):
        if name not in {a.credential_env for a in registry.accounts}:
            log.warning("setting_unknown", variable=name)
    private_dir(settings.state_dir)   # 0700, even when it already existed (SPEC §19)
    keys = KeyTable(os.path.join(settings.state_dir, "keys.jsonl"))
    keys.load(now_ms())
    ledger = Ledger(os.path.join(settings.state_dir, "ledger.jsonl"), retention_days=settings.ledger_retention_days)
    ledger.open()
    control = wire(settings, registry, keys, ledger, prices)
    try:
        uvloop.run(serve(control))
    except StartupError as exc:
        log.error("control_start_failed", reason=str(exc))
        print(f"leasehold-control: {exc}", file=sys.stderr)
        return 2
    return 0


def cli() -> None:
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    cli()
