"""leasehold-control: settings → logging → registry → stores → servers → signals.

`main(argv) -> int` is plain and callable from tests; `cli()` is the console script.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import TYPE_CHECKING

import uvloop

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
from controlplane.prices import PricesError, load_prices
from controlplane.registry import Registry, RegistryError
from controlplane.service import ControlService
from controlplane.stores.keys import KeyTable
from controlplane.stores.ledger import Ledger
from controlplane.wiring import Control, wire
from shared.clock import now_ms
from shared.heap import HeapTrimmer, settle_heap
from shared.http1 import web
from shared.logging import configure_logging, get_logger
from shared.private import private_dir
from shared.rpc import start_unix_server
from shared.settings import Settings, SettingsError, load_settings, unknown_variables

if TYPE_CHECKING:  # fleet mode's modules (and the Redis client) load only in fleet mode: `backends_for`
    from controlplane.fleet.host import FleetHost

log = get_logger("control")

REAPER_INTERVAL_S = 1.0
HEAP_TRIM_EVERY_PASSES = 5
CONTROL_BODY_LIMIT = 1024 * 1024


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


async def _reaper(service: ControlService, listener: RpcListener) -> None:
    trim_heap = HeapTrimmer()  # trims only after traffic
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
        raise StartupError(
            f"GATEWAY_HOST_ID={settings.host_id} is already held by a live pair of fleet "
            f"{settings.fleet_id} ({exc}); give this pair its own GATEWAY_HOST_ID, or stop "
            "the other pair"
        ) from exc
    except FleetUnreachable as exc:
        raise StartupError(f"{exc} (GATEWAY_FLEET_REDIS_URL)") from exc


async def serve(control: Control) -> None:
    """Join or restore, open the RPC socket and the HTTP listener, run until SIGTERM or SIGINT,
    then close in the order that loses nothing."""
    settings, service = control.settings, control.service
    await _begin(control)
    listener = RpcListener(settings, service)
    try:
        await listener.start()
    except OSError as exc:
        raise StartupError(
            f"cannot open the RPC socket {settings.rpc_socket} (GATEWAY_RPC_SOCKET / GATEWAY_RUNTIME_DIR): {exc}"
        ) from exc
    server = web.Server(build_app(control), refused=control.metrics.http_refused)
    try:
        await server.start(settings.control_host, settings.control_port, reuse_address=True)
    except OSError as exc:
        listener.close()
        raise StartupError(
            f"cannot listen on {settings.control_host}:{settings.control_port} (GATEWAY_CONTROL_LISTEN): {exc}"
        ) from exc
    reaper = asyncio.create_task(_reaper(service, listener))
    log.info(
        "control_started",
        listen=f"{settings.control_host}:{settings.control_port}",
        rpc_socket=settings.rpc_socket,
        state_dir=settings.state_dir,
        accounts=[a.id for a in service.registry.accounts],
    )
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
    await server.close()
    await _end(control)
    log.info("control_stopped")


async def _begin(control: Control) -> None:
    """Before anything is served: traces on, and the keys restored (embedded) or the fleet
    joined with its spend and headroom publishers started."""
    if control.traces is not None:
        control.traces.start()  # the SDK is imported here, only when export is on
    if control.fleet is None:
        await control.service.restore()
        return
    await _join_fleet(control.fleet, control.settings)
    if control.fleet_spend is not None:
        await control.fleet_spend.start()
    if control.fleet_headroom is not None:
        await control.fleet_headroom.start()


async def _end(control: Control) -> None:
    """After the listeners closed: every row written, the fleet left, the files closed."""
    service = control.service
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
        os.unlink(control.settings.rpc_socket)
    except OSError:
        pass


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
    configure_logging(
        "leasehold-control",
        settings.log_level,
        secrets=[settings.control_token, settings.mint_token, settings.read_token, *credential_values, *collector_keys],
    )
    for name in unknown_variables(os.environ):
        if name not in {a.credential_env for a in registry.accounts}:
            log.warning("setting_unknown", variable=name)
    private_dir(settings.state_dir)  # 0700, even when it already existed (SPEC §19)
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
