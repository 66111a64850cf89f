"""The open sockets of the data plane, and the upgrade that opens one (SPEC §20).

`upgrade` answers `GET /v1/responses` with `Upgrade: websocket`: authentication first (401
before the upgrade, as any request), then 426 for an upgrade the gateway does not proxy (any
other path, or a lease off the OpenAI wire), then the request gates (one refused row, answered
before the upgrade), then the upstream socket (a refused handshake answers as HTTP would; 404,
405 and 426 answer 426 so the client falls back to HTTP at once). Only then is the worker's
socket accepted, and a `SocketSession` relays it.

A sweep checks every open socket's rights every `SWEEP_S` (revoke, expiry, disable, hop,
budget, drain), so a socket with nothing in flight closes within it; each `response.create` checks
them again at once. `sockets_open` counts open sockets per account.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from multidict import CIMultiDictProxy

from dataplane.errors import refusal_response, refuse
from dataplane.leases import LeaseReplica
from dataplane.ratelimits import rate_limits_of
from dataplane.relay import await_ack
from dataplane.rpc_client import ControlLink
from dataplane.upstreams import downstream_headers, upstream_path_qs
from dataplane.websocket import gates
from dataplane.websocket.session import PATH, SocketAttempt, SocketSession
from dataplane.websocket.upstream import HandshakeRefused, UpstreamSockets
from dataplane.wires.table import NOT_PROXIED, WIRES, guess_wire
from shared.capacity import CapacityTable
from shared.clock import now_ms
from shared.codes import AttemptStatus, ErrorCode, Refusal
from shared.http1.response import Response
from shared.logging import get_logger
from shared.settings import Settings
from shared.tokens import new_ulid
from shared.tracecontext import trace_headers
from shared.wire import Lease, RateLimits

log = get_logger("dataplane")

SWEEP_S = 0.25
# SPEC §19's stall bound where the settings do not carry it yet.
# An upstream answering the handshake with these has no WebSocket there: the client falls back.
NO_WEBSOCKET = frozenset({404, 405, 426})


class ProxyPort(Protocol):
    """What the socket side reads of the HTTP proxy: the same replica, link, slots and drain."""

    settings: Settings
    replica: LeaseReplica
    link: ControlLink
    capacity: CapacityTable
    fleet: Any
    draining: bool

    def authenticate(self, request: Any) -> tuple[Lease | None, str]: ...


def early(request: web.Request, t0: float, code: Refusal, message: str, retry_after_s: float | None = None) -> Response:
    """A refusal before any lease: no attempt, no row (as the HTTP proxy answers one)."""
    return refusal_response(
        guess_wire(request.path, request.headers),
        code,
        message,
        "req_" + new_ulid(),
        (time.perf_counter() - t0) * 1000,
        retry_after_s=retry_after_s,
    )


class Sockets:
    def __init__(self, proxy: ProxyPort) -> None:
        self.proxy = proxy
        self.settings = proxy.settings
        self.replica = proxy.replica
        self.link = proxy.link
        self.capacity = proxy.capacity
        self.fleet = proxy.fleet
        self.stall_s = float(proxy.settings.client_stall_seconds)
        self.upstreams = UpstreamSockets(proxy.settings)
        self.open: set[SocketSession] = set()
        self.by_account: collections.Counter[str] = collections.Counter()
        self._sweeper: asyncio.Task[None] | None = None
        self._empty = asyncio.Event()
        self._empty.set()

    @property
    def draining(self) -> bool:
        return self.proxy.draining

    def sockets_open(self) -> dict[str, int]:
        return {account: n for account, n in self.by_account.items() if n > 0}

    # ---- the upgrade --------------------------------------------------------------------

    async def upgrade(self, request: web.Request, t0: float) -> web.StreamResponse | Response:
        proxy = self.proxy
        if not self.replica.ready:
            return early(
                request,
                t0,
                Refusal.CONTROL_UNAVAILABLE,
                "the gateway has lost its control daemon; retry shortly",
                retry_after_s=1,
            )
        lease, presented = proxy.authenticate(request)
        if lease is None:
            log.info("key_refused", path=request.path)  # never the presented string
            return early(request, t0, Refusal.UNKNOWN_KEY, "unknown, expired or revoked virtual key")
        account = self.replica.accounts.get(lease.account_id)
        spec = None if account is None else WIRES[account.wire]  # its wire, resolved once
        if (
            account is None or spec is None or request.path != spec.websocket_path or request.method != "GET"
        ):  # (a wire without a WebSocket has no path for it)
            return early(request, t0, Refusal.WEBSOCKET_NOT_SUPPORTED, NOT_PROXIED)
        attempt = SocketAttempt(self.link, lease, spec, PATH, trace_headers(request.headers))
        attempt.holds_slot = False
        refusal = await self._gates(attempt, account)
        if refusal is not None:
            return refuse(attempt, refusal.code, refusal.message, refusal.retry_after_s, refusal.status)
        credential = self.replica.credentials[account.id]
        accepted: list[CIMultiDictProxy[str]] = []  # the 101's headers (SPEC §22)
        try:
            upstream = await self.upstreams.connect(
                account,
                upstream_path_qs(request.rel_url, presented),
                request.headers,
                credential,
                self.settings.max_body_bytes * 2 + (1 << 20),
                accepted,
            )
        except HandshakeRefused as exc:
            return await self._handshake_refused(attempt, exc)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("upstream_socket_unreachable", account_id=account.id, error=type(exc).__name__)
            return await _failed(attempt, ErrorCode.UPSTREAM_UNREACHABLE, "the upstream socket could not be opened")
        limits = rate_limits_of(accepted[0], attempt.spec.rate_limits, now_ms) if accepted else None
        return await self._serve(request, lease, account, upstream, limits)

    async def _gates(self, attempt: SocketAttempt, account: object) -> gates.Refused | None:
        """The handshake's gates, as an HTTP request on the lease would pass them (§20)."""
        assert attempt.lease is not None
        if self.draining:
            return gates.refused(Refusal.GATEWAY_SHUTDOWN, "the gateway is shutting down", retry_after_s=1)
        if not self.replica.storage_ok:
            return gates.refused(
                Refusal.OBSERVATION_STORAGE_UNAVAILABLE, "the gateway cannot record attempts right now", retry_after_s=5
            )
        off = gates.disabled(self.replica, attempt.lease.account_id)  # SPEC §20: no socket to lose
        if off is not None:
            return off
        if attempt.lease.account_id not in self.replica.credentials:
            return gates.refused(
                Refusal.ACCOUNT_NOT_CONFIGURED,
                f"account {attempt.lease.account_id} has no credential on this data plane",
            )
        found = gates.hold(
            self.replica,
            attempt.lease,
            account,  # type: ignore[arg-type]
            None,
            now_ms(),
            self.fleet,
        )
        if found is not None:
            return found
        holder = "hs_" + attempt.attempt_id
        found = await gates.take_slot(self.capacity, self.fleet, account, holder)  # type: ignore[arg-type]
        if found is None:
            gates.give_slot(self.capacity, self.fleet, holder)
        return found

    async def _handshake_refused(self, attempt: SocketAttempt, exc: HandshakeRefused) -> web.StreamResponse | Response:
        """Evidence as that status (§20); 404/405/426 answer 426, any other passes through."""
        attempt.mark_overhead(0.0)
        attempt.rate_limits = rate_limits_of(exc.headers, attempt.spec.rate_limits, now_ms)  # SPEC §22
        await await_ack(attempt.finish(AttemptStatus.UPSTREAM_ERROR, exc.status, wait=True))
        if exc.status in NO_WEBSOCKET:
            return refuse_426(attempt)
        headers = downstream_headers(exc.headers)
        return web.Response(status=exc.status, headers=headers, body=exc.body)

    async def _serve(
        self,
        request: web.Request,
        lease: object,
        account: object,
        upstream: aiohttp.ClientWebSocketResponse,
        limits: RateLimits | None,
    ) -> web.StreamResponse:
        protocols = (upstream.protocol,) if upstream.protocol else ()
        client = web.WebSocketResponse(
            autoping=False,
            autoclose=False,
            compress=True,
            protocols=protocols,
            heartbeat=None,
            max_msg_size=self.settings.max_body_bytes * 2 + (1 << 20),
        )
        try:
            await client.prepare(request)
        except (ConnectionError, web.HTTPException):
            await upstream.close()
            raise
        session = SocketSession(self, lease, account, client, upstream)  # type: ignore[arg-type]
        session.trace = trace_headers(request.headers)
        session.rate_limits = limits  # the handshake's, for the socket's first attempt (SPEC §22)
        self._opened(session)
        try:
            await session.run()
        finally:
            self._closed(session)
        return client

    # ---- the open sockets ---------------------------------------------------------------

    def _opened(self, session: SocketSession) -> None:
        self.open.add(session)
        self.by_account[session.account.id] += 1
        self.link.sockets(self.sockets_open())
        self._empty.clear()
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def _closed(self, session: SocketSession) -> None:
        self.open.discard(session)
        self.by_account[session.account.id] -= 1
        if self.by_account[session.account.id] <= 0:
            del self.by_account[session.account.id]
        self.link.sockets(self.sockets_open())
        if not self.open:
            self._empty.set()

    async def _sweep(self) -> None:
        """Every open socket's rights, every `SWEEP_S`, while any is open."""
        idle_s, stall_s = self.settings.upstream_idle_timeout, self.stall_s
        while self.open:
            now, mono = now_ms(), time.monotonic()
            for session in list(self.open):
                try:
                    session.check(now)
                    session.bound(mono, idle_s, stall_s)
                except Exception:  # a bug in one socket never stops the others' sweep
                    log.exception("socket_sweep_failed")
            await asyncio.sleep(SWEEP_S)

    async def drained(self, timeout_s: float) -> bool:
        """SIGTERM: each socket finishes what is in flight, then closes 1001 (bounded);
        what is left when the window ends is stopped (`gateway-shutdown`)."""
        for session in list(self.open):
            session.check(now_ms())
        try:
            async with asyncio.timeout(timeout_s):
                await self._empty.wait()
        except TimeoutError:
            for session in list(self.open):
                session.stop()
            try:
                async with asyncio.timeout(2.0):
                    await self._empty.wait()
            except TimeoutError:
                pass
        return not self.open

    async def close(self) -> None:
        await self.upstreams.close()


def refuse_426(attempt: SocketAttempt) -> Response:
    """The upstream has no WebSocket here: 426, so the client falls back to HTTP at once."""
    return refusal_response(
        attempt.spec,
        Refusal.WEBSOCKET_NOT_SUPPORTED,
        f"the upstream does not serve WebSocket here; use HTTP POST {attempt.path}",
        attempt.attempt_id,
        attempt.overhead_ms or 0.0,
    )


async def _failed(attempt: SocketAttempt, code: ErrorCode, message: str) -> Response:
    """No upstream socket: a transport-error row (evidence), acknowledged first."""
    response = refusal_response(attempt.spec, code, message, attempt.attempt_id, attempt.mark_overhead(0.0))
    await await_ack(attempt.finish(AttemptStatus.TRANSPORT_ERROR, response.status, wait=True))
    return response
