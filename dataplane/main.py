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
from collections import Counter
from typing import TYPE_CHECKING, Any

import uvloop
from aiohttp import web

from dataplane.aiohttp_private import hand_over, handed_over_server
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
from shared.http1.app import Application
from shared.http1.errors import Refusal as Refused400
from shared.http1.errors import Refused
from shared.http1.limits import Limits
from shared.http1.protocol import Connection
from shared.http1.request import Request
from shared.http1.response import Response, StreamResponse
from shared.http1.server import Server
from shared.logging import configure_logging, get_logger
from shared.settings import Settings, SettingsError, load_settings
from shared.tokens import new_ulid

if TYPE_CHECKING:  # imported only in fleet mode (it brings redis-py)
    from dataplane.admission import FleetAdmission

log = get_logger("dataplane")

# Request header lines up to 16 KiB are accepted (SPEC §15); the limit leaves headroom.
MAX_HEADER_BYTES = 32 * 1024
MAX_HEAD_BYTES = 1024 * 1024  # a whole head (aiohttp bounded none: 128 lines of 32 KiB)
ROW_FLUSH_TIMEOUT_S = 3.0
# After the drain window: how long the stopped attempts get to write their rows and cuts.
STOP_GRACE_S = 2.0
COUNTS_REPORT_S = 1.0  # how often SPEC §19's connection counters are looked at for control


class ProxyApp(Application):
    """Every path to `Proxy.handle`: no router, no middleware. What aiohttp's router did besides
    routing is done here: `Expect: 100-continue` answered before the proxy runs (any other
    expectation 417), and bodies bounded by `GATEWAY_MAX_BODY_BYTES` (`client_max_size`). A
    request the server cannot read, and a failure outside the proxy, are answered in the wire's
    error shape (SPEC §15), not as plain text; a head that timed out is closed unanswered."""

    def __init__(self, proxy: Proxy, max_body_bytes: int) -> None:
        super().__init__(client_max_size=max_body_bytes)
        self.proxy = proxy

    async def handle(self, request: Request) -> tuple[StreamResponse, Refused | None]:
        try:
            expect = request.headers.get("Expect")
            if expect and request.version >= (1, 1):
                if expect.lower() != "100-continue":
                    return wire_error(request, 417, f"unknown expectation: Expect: {expect[:64]}"), None
                body = request.body
                if body.expects_continue:  # asked before the proxy reads (as aiohttp's router did)
                    body.expects_continue = False
                    body.flow.send_continue()
            response = await self.proxy.handle(request)
        except Exception:
            log.exception("http_handler_failed", method=request.method)
            failed = wire_error(request, 500, "the gateway failed this request")
            failed.force_close()
            return failed, Refused.HANDLER_FAILED
        broken = request.body.failed
        if isinstance(broken, Refused400) and not request.started:  # the body's framing broke mid-read
            answer = self.refusal_answer(broken)
            assert answer is not None
            return answer, None
        return response, None

    def refusal_answer(self, refusal: Refused400) -> StreamResponse | None:
        if refusal.reason is Refused.HEAD_TIMEOUT:  # slowloris: closed, nothing said
            return None
        reason = refusal.text.rstrip(".")
        limit = f"header lines are limited to {MAX_HEADER_BYTES} bytes"
        text = f"the request could not be read as HTTP/1.1 ({reason}; {limit})"
        answer = refusal_response(DEFAULT, ErrorCode.INVALID_REQUEST, text, "req_" + new_ulid(), 0.0, status=400)
        answer.force_close()
        return answer


def build_server(settings: Settings, proxy: Proxy) -> Server:
    """The daemon's HTTP server: `shared.http1` straight into `Proxy.handle`, under SPEC §19's
    bounds (the connection cap answered `connection_limit_answer`, the head deadline from the
    connection's opening, the keep-alive timeout), with aiohttp's `handler_cancellation` (a
    worker's close cancels its attempt: client-aborted). A WebSocket handshake (SPEC §20) is
    handed to aiohttp with its connection (`aiohttp_private.hand_over`), where
    `Proxy.upgrade` answers it; the connection still counts against the cap until it closes.
    Request bodies are forwarded as they came (nothing decodes them here: SPEC §15).
    """
    limits = Limits(
        max_line_bytes=MAX_HEADER_BYTES,
        max_field_bytes=MAX_HEADER_BYTES,
        max_head_bytes=MAX_HEAD_BYTES,
        head_timeout_s=settings.header_timeout_seconds,
        keepalive_s=settings.keepalive_seconds,
        body_timeout_s=settings.client_stall_seconds,  # a worker that stops sending its body
        shutdown_grace_s=STOP_GRACE_S,
        max_connections=settings.max_connections,
        head_from_open=True,
    )
    sockets = handed_over_server(_upgrade_handler(proxy), settings.max_body_bytes, MAX_HEADER_BYTES)

    def hand_off(conn: Connection, request: Request, tail: bytes) -> None:
        assert conn.transport is not None
        hand_over(sockets, conn.transport, request.head_bytes() + tail, conn.connection_lost)

    return Server(
        ProxyApp(proxy, settings.max_body_bytes),
        limits,
        handler_cancellation=True,
        hand_off=hand_off,
        over_cap=connection_limit_answer,
    )


def _upgrade_handler(proxy: Proxy) -> Any:
    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        response = await proxy.upgrade(request)  # type: ignore[arg-type]
        if isinstance(response, Response):  # a refusal: aiohttp's response of it
            response = web.Response(
                status=response.status, reason=response.reason, headers=response.headers, body=response.body
            )
        response.force_close()  # the connection ends with its socket, or its refusal
        return response

    return handle


def wire_error(request: Request, status: int, message: str) -> Response:
    """A request refused before the proxy saw it, in the wire's error shape (SPEC §15): the
    wire guessed from what was parsed, `invalid-request` with the status HTTP gives it."""
    code = ErrorCode.INVALID_REQUEST if status < 500 else Refusal.INTERNAL_ERROR
    return refusal_response(
        guess_wire(request.path, request.headers),  # type: ignore[arg-type]  # (any headers' `in`)
        code,
        message,
        "req_" + new_ulid(),
        0.0,
        status=status,
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


async def serve(settings: Settings) -> None:
    replica = LeaseReplica()
    link = ControlLink(settings.rpc_socket, replica)
    pools = UpstreamPools(settings)
    fleet = await _fleet_admission(settings)
    proxy = Proxy(settings, replica, link, pools, fleet)
    server = build_server(settings, proxy)
    try:
        await server.start(settings.dataplane_host, settings.dataplane_port, reuse_address=True, backlog=1024)
    except OSError as exc:
        await pools.close()
        raise StartupError(
            f"cannot listen on {settings.dataplane_host}:{settings.dataplane_port} (GATEWAY_DATAPLANE_LISTEN): {exc}"
        ) from exc
    # Dial control only once the site listens: control reporting this data plane connected then
    # means it also accepts requests (a restarted data plane is never reported before it can).
    link_task = asyncio.create_task(link.run())
    read_in_background(UPSTREAM_TLS)  # the CA bundle, off the path to ready (shared/deferred_ca.py)
    counts_task = asyncio.create_task(_report_counts(server.refused, link))
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
    await drain(settings, proxy, server)
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


async def _report_counts(refused: Counter[Refused], link: ControlLink) -> None:
    """SPEC §19's connection counters (the server's refusals over the cap, and of heads not
    complete in time) to control's `/metrics` when they change, once a second at most (a flood
    of refused connections costs one message a second, not one each)."""
    sent = (0, 0)
    while True:
        now = (refused[Refused.CONNECTION_LIMIT], refused[Refused.HEAD_TIMEOUT])
        if now != sent:
            link.connections(*now)
            sent = now
        await asyncio.sleep(COUNTS_REPORT_S)


async def drain(settings: Settings, proxy: Proxy, server: Server) -> None:
    """Stop accepting, let in-flight requests finish for the drain window, then end the rest."""
    proxy.draining = True
    log.info("dataplane_draining", in_flight=len(proxy.in_flight), drain_seconds=settings.drain_seconds)
    server.stop_listening()  # no new connections; idle keep-alive ones are closed by `close` below
    sockets = asyncio.ensure_future(proxy.sockets.drained(settings.drain_seconds))  # SPEC §20
    if not await proxy.drained(settings.drain_seconds):
        stopped = proxy.stop_all()
        log.warning("dataplane_drain_expired", stopped=stopped)
        await proxy.drained(STOP_GRACE_S)
    await sockets
    await server.close()
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
