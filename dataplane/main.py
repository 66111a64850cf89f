"""leasehold-dataplane: settings → logging → replica → control link → proxy → signals.

SIGTERM stops accepting connections, lets in-flight streams finish for
`GATEWAY_DRAIN_SECONDS` (new requests on open connections get 503 `gateway-shutdown`), cancels
what is left (each still ends in its row), then hands every queued row to control.
"""

from __future__ import annotations

import shared.deferred_ca  # noqa: F401  first: aiohttp's import-time TLS contexts read the CA bundle when used

# isort: split
import asyncio
import signal
import sys
from typing import TYPE_CHECKING, Any

import uvloop
from aiohttp import HttpVersion11, hdrs, web

from dataplane.aiohttp_private import BoundedRequestHandler, ConnectionBounds, server_class
from dataplane.bodies import close_readers
from dataplane.errors import refusal_response
from dataplane.leases import LeaseReplica
from dataplane.proxy import Proxy
from dataplane.rpc_client import ControlLink
from dataplane.upstream_client import UPSTREAM_TLS
from dataplane.upstreams import UpstreamPools
from dataplane.wires.table import DEFAULT, guess_wire
from shared.capacity import StateUnavailable
from shared.codes import ErrorCode, Refusal
from shared.deferred_ca import read_in_background
from shared.heap import settle_heap
from shared.logging import configure_logging, get_logger
from shared.settings import Settings, SettingsError, load_settings
from shared.tokens import new_ulid

if TYPE_CHECKING:  # imported only in fleet mode (it brings redis-py)
    from dataplane.admission import FleetAdmission

log = get_logger("dataplane")

# Request header lines up to 16 KiB are accepted (SPEC §15); the limit leaves headroom.
MAX_HEADER_BYTES = 32 * 1024
EXPECT = hdrs.EXPECT
ROW_FLUSH_TIMEOUT_S = 3.0
# After the drain window: how long the stopped attempts get to write their rows and cuts.
STOP_GRACE_S = 2.0
COUNTS_REPORT_S = 1.0  # how often SPEC §19's connection counters are looked at for control


def build_app(settings: Settings, proxy: Proxy) -> web.Application:
    """The proxy behind aiohttp's router: what in-process tests mount on an `AppRunner`."""
    app = web.Application(client_max_size=settings.max_body_bytes)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    return app


def build_server(settings: Settings, proxy: Proxy) -> web.Server:
    """The daemon's HTTP server: aiohttp's low-level server straight into `Proxy.handle`.

    Every path goes to one handler, so there is nothing for a router (or an Application's
    per-request resolution and match-info bookkeeping) to do. What the Application did besides
    routing is done here: `Expect: 100-continue` answered (any other expectation 417), and
    bodies bounded by `GATEWAY_MAX_BODY_BYTES`. auto_decompress=False: a compressed request
    body is forwarded as it came (SPEC §15).
    """
    loop = asyncio.get_running_loop()
    limit = settings.max_body_bytes

    def request_factory(
        message: Any, payload: Any, protocol: Any, writer: Any, task: asyncio.Task[None]
    ) -> web.BaseRequest:
        return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=limit)

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if request.headers.get(EXPECT) and not await expect_continue(request):
            return wire_error(request, 417, f"unknown expectation: Expect: {request.headers[EXPECT][:64]}")
        return await proxy.handle(request)  # type: ignore[arg-type]

    server = server_class(_Handler)(
        handle,
        request_factory=request_factory,
        handler_cancellation=True,
        access_log=None,
        auto_decompress=False,
        max_field_size=MAX_HEADER_BYTES,
        max_line_size=MAX_HEADER_BYTES,
        keepalive_timeout=settings.keepalive_seconds,
    )
    server.bounds = ConnectionBounds(  # type: ignore[attr-defined]
        settings.header_timeout_seconds,
        settings.max_connections,
        connection_limit_answer,
    )
    return server


async def expect_continue(request: web.BaseRequest) -> bool:
    """As aiohttp's router does: `100 Continue` for an HTTP/1.1 `Expect: 100-continue`; False
    for any other expectation (answered 417)."""
    if request.version == HttpVersion11:
        if request.headers.get(EXPECT, "").lower() != "100-continue":
            return False
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0
        await request.writer.drain()
    return True


def wire_error(request: web.BaseRequest, status: int, message: str) -> web.Response:
    """A request refused before the proxy saw it, in the wire's error shape (SPEC §15): the
    wire guessed from what was parsed, `invalid-request` with the status HTTP gives it."""
    code = ErrorCode.INVALID_REQUEST if status < 500 else Refusal.INTERNAL_ERROR
    return refusal_response(
        guess_wire(request.path, request.headers), code, message, "req_" + new_ulid(), 0.0, status=status
    )


def connection_limit_answer() -> bytes:
    """The whole answer to a connection over the cap: 503 `connection-limit`, closed after, in
    the default wire's shape (nothing of the request was read)."""
    request_id = "req_" + new_ulid()
    body = DEFAULT.error_body(
        503, str(Refusal.CONNECTION_LIMIT), "the gateway has too many open connections; retry in a second", request_id
    )
    return (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        b"retry-after: 1\r\nconnection: close\r\nx-should-retry: true\r\n"
        + DEFAULT.request_id_header.encode()
        + b": "
        + request_id.encode()
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


class _Handler(BoundedRequestHandler):
    """aiohttp's connection handler, with its error answers (a request it cannot parse — a
    header line over `MAX_HEADER_BYTES`, bad syntax — or a failure outside the proxy) in the
    wire's error shape instead of aiohttp's plain text. aiohttp still logs them (redacted, as
    every library line) and closes the connection after.

    It also holds SPEC §19's bounds: beyond the cap a connection gets `connection_limit_answer`
    and is closed before any request is read; a request head not complete
    `GATEWAY_HEADER_TIMEOUT_SECONDS` after the connection opened, or after the first byte of a
    later head, closes the connection (slowloris). The head's clock stops when aiohttp has
    parsed the head (no timer per request: `BoundedRequestHandler`)."""

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; raises if an answer began
        what = type(exc).__name__ if exc is not None else "error"
        text = (
            f"the request could not be read as HTTP/1.1 ({what}; header lines are limited to {MAX_HEADER_BYTES} bytes)"
            if status < 500
            else "the gateway failed this request"
        )
        response = wire_error(request, status, text)
        response.force_close()
        return response


async def serve(settings: Settings) -> None:
    replica = LeaseReplica()
    link = ControlLink(settings.rpc_socket, replica)
    pools = UpstreamPools(settings)
    fleet = await _fleet_admission(settings)
    proxy = Proxy(settings, replica, link, pools, fleet)
    server = build_server(settings, proxy)
    runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=STOP_GRACE_S)
    await runner.setup()
    site = web.TCPSite(runner, settings.dataplane_host, settings.dataplane_port, reuse_address=True, backlog=1024)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        await pools.close()
        raise StartupError(
            f"cannot listen on {settings.dataplane_host}:{settings.dataplane_port} (GATEWAY_DATAPLANE_LISTEN): {exc}"
        ) from exc
    # Dial control only once the site listens: control reporting this data plane connected then
    # means it also accepts requests (a restarted data plane is never reported before it can).
    link_task = asyncio.create_task(link.run())
    read_in_background(UPSTREAM_TLS)  # the CA bundle, off the path to ready (shared/deferred_ca.py)
    counts_task = asyncio.create_task(_report_counts(server.bounds, link))  # type: ignore[attr-defined]
    upkeep = _fleet_loops(fleet, link)  # supervised (SPEC §19)
    log.info(
        "dataplane_started",
        listen=f"{settings.dataplane_host}:{settings.dataplane_port}",
        rpc_socket=settings.rpc_socket,
    )
    settle_heap()  # start-up's objects never scanned again by the collector (issue 27)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await drain(settings, proxy, runner, site)
    left = await link.flush(ROW_FLUSH_TIMEOUT_S)
    if left:
        log.error("attempt_rows_unsent", count=left)
    link.stop()
    link_task.cancel()
    counts_task.cancel()
    if fleet is not None:
        for task in upkeep:
            task.cancel()
        await fleet.retry_pending()
        await fleet.close()
    await pools.close()
    await proxy.sockets.close()
    log.info("dataplane_stopped")


async def _report_counts(bounds: ConnectionBounds, link: ControlLink) -> None:
    """SPEC §19's connection counters to control's `/metrics` when they change, once a second at
    most (a flood of refused connections costs one message a second, not one each)."""
    sent = (0, 0)
    while True:
        now = (bounds.refused, bounds.head_timeouts)
        if now != sent:
            link.connections(*now)
            sent = now
        await asyncio.sleep(COUNTS_REPORT_S)


async def drain(settings: Settings, proxy: Proxy, runner: web.BaseRunner, site: web.TCPSite) -> None:
    """Stop accepting, let in-flight requests finish for the drain window, then end the rest."""
    proxy.draining = True
    log.info("dataplane_draining", in_flight=len(proxy.in_flight), drain_seconds=settings.drain_seconds)
    await site.stop()  # no new connections; idle keep-alive ones are closed by cleanup below
    sockets = asyncio.ensure_future(proxy.sockets.drained(settings.drain_seconds))  # SPEC §20
    if not await proxy.drained(settings.drain_seconds):
        stopped = proxy.stop_all()
        log.warning("dataplane_drain_expired", stopped=stopped)
        await proxy.drained(STOP_GRACE_S)
    await sockets
    await runner.cleanup()
    await close_readers()  # the body reader processes, if a large body started any


async def _fleet_admission(settings: Settings) -> FleetAdmission | None:
    """Fleet mode: request slots of ceilinged accounts are asked of the fleet's Redis."""
    if settings.fleet_redis_url is None:
        return None
    from dataplane.admission import FleetAdmission  # redis-py only in fleet mode
    from shared.fleet.entries import FleetEntries
    from shared.fleet.redis_client import connect, describe
    from shared.fleet.secret import Keyring

    assert settings.fleet_secret is not None  # settings require it (SPEC §19): beats always checked
    entries = FleetEntries(Keyring(settings.fleet_secret, settings.fleet_id, settings.fleet_verify_secret))
    fleet = FleetAdmission(
        connect(settings.fleet_redis_url), settings.fleet_id, settings.host_id, settings.fleet_host_ttl_seconds, entries
    )  # SPEC §19: sealed heartbeats
    try:
        await fleet.start()
    except StateUnavailable:  # ceilinged accounts answer fleet-state-unavailable until it is back
        log.warning("fleet_state_unavailable", at="start", redis=describe(settings.fleet_redis_url))
    except Exception as exc:  # SPEC §19: what Redis holds never stops the start; upkeep redoes it
        log.error("fleet_loop_failed", loop="upkeep", at="start", error_kind=type(exc).__name__)
    log.info("dataplane_fleet", redis=describe(settings.fleet_redis_url), host_id=settings.host_id)
    return fleet


def _fleet_loops(fleet: FleetAdmission | None, link: ControlLink) -> list[asyncio.Task[None]]:
    if fleet is None:
        return []
    from dataplane import fleetloops  # redis-py only in fleet mode

    return fleetloops.spawn(fleet, link.loops)


class StartupError(Exception):
    """The listener could not be opened; the message names the variable to fix."""


def main(argv: list[str] | None = None) -> int:
    del argv
    try:
        settings = load_settings(role="dataplane")
    except SettingsError as exc:
        print(f"leasehold-dataplane: {exc}", file=sys.stderr)
        return 2
    configure_logging(
        "leasehold-dataplane",
        settings.log_level,
        secrets=[settings.control_token, settings.mint_token, settings.read_token],
    )
    try:
        uvloop.run(serve(settings))
    except StartupError as exc:
        log.error("dataplane_start_failed", reason=str(exc))
        print(f"leasehold-dataplane: {exc}", file=sys.stderr)
        return 2
    return 0


def cli() -> None:
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    cli()
