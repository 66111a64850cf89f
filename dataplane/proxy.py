"""The hot path: authenticate → admit → relay → finish (SPEC §12, §14).

Each accepted request is one `Attempt` that ends in exactly one terminal row through
`Attempt.finish`, on every path: an answer, an exception, a client abort (the server cancels the
handler when the worker goes away) or the end of the drain window (`stop_all`). Its
request-capacity slot is released in a `finally`. Refusals before an authenticated lease have
no row, and nothing about the presented key is logged.

Which header carries the virtual key: `x-api-key` is looked at first, then
`Authorization: Bearer`; the first value that names a live lease wins (Claude Code may send
both, with different values). Both headers are always stripped before the request goes upstream.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web
from yarl import URL

from dataplane.attempt import Attempt
from dataplane.bodies import (
    OFF_LOOP_BYTES,
    BodyRefused,
    coding_of,
    decode_body,
    peek_body,
    strict_peek,
)
from dataplane.budget import budget_hold
from dataplane.endings import Ending, verdict
from dataplane.errors import refusal_response, refuse
from dataplane.fleetanswer import FleetAnswer, capacity_exhausted, ceiling_unchecked
from dataplane.fleethold import fleet_held
from dataplane.health import HEALTHZ_PATH, health_of, healthz_response
from dataplane.leases import LeaseReplica
from dataplane.relay import SHUTDOWN_MESSAGE, Relay, cut
from dataplane.rpc_client import ControlLink
from dataplane.scope import refuses
from dataplane.upstreams import UpstreamPools, upstream_path_qs
from dataplane.usage_ask import asks_usage, with_usage, with_usage_off_loop
from dataplane.websocket.sockets import Sockets
from dataplane.wires.table import WIRES, guess_wire
from shared.capacity import CapacityTable, StateUnavailable
from shared.clock import now_ms
from shared.codes import AttemptStatus, ErrorCode, Refusal
from shared.http1.errors import HTTPRequestEntityTooLarge, HTTPRequestTimeout
from shared.http1.request import Request
from shared.http1.response import Response, StreamResponse
from shared.logging import get_logger
from shared.settings import Settings
from shared.tokens import new_ulid
from shared.tracecontext import trace_headers
from shared.wire import AccountRoute, Lease

if TYPE_CHECKING:  # imported only in fleet mode (it brings redis-py)
    from dataplane.admission import FleetAdmission

log = get_logger("dataplane")
_NO_TRACE: tuple[str | None, str | None] = (None, None)  # `trace_headers` of a request without one


def _body_stalled(request: Request) -> ConnectionResetError:
    """No byte of the body for `GATEWAY_CLIENT_STALL_SECONDS`: the connection is cut, and the
    attempt ends as a worker that went away does (client-aborted)."""
    transport = request.transport
    if transport is not None:
        transport.abort()
    return ConnectionResetError("the request body stalled")


def _not_permitted(account: AccountRoute, model: str | None) -> str:
    served = ", ".join(account.models or ())
    return f"model {str(model)[:128]!r} is not served by account {account.id} (its models: {served})"


class Proxy:
    def __init__(
        self,
        settings: Settings,
        replica: LeaseReplica,
        link: ControlLink,
        pools: UpstreamPools,
        fleet: FleetAdmission | None = None,
    ) -> None:
        self.settings = settings
        self.replica = replica
        self.link = link
        self.pools = pools
        self.relay = Relay(settings, pools)
        self.capacity = CapacityTable()
        self.fleet = fleet  # fleet mode: ceilinged accounts' request slots are fleet-wide (Redis)
        self.draining = False
        self.in_flight: set[Attempt] = set()
        self.sockets = Sockets(self)  # the Responses API over WebSocket (SPEC §20)
        self._idle = asyncio.Event()
        self._idle.set()

    # ---- entry --------------------------------------------------------------------------

    async def handle(self, request: Request) -> StreamResponse:
        """An HTTP request (one carrying `Upgrade: websocket` goes to `upgrade` instead: the
        server hands its connection to aiohttp)."""
        if request.path == HEALTHZ_PATH:  # no key, never proxied, no row
            return self.healthz(request)
        t0 = time.perf_counter()
        if not self.replica.ready:
            return self._early(
                request,
                t0,
                Refusal.CONTROL_UNAVAILABLE,
                "the gateway has lost its control daemon; retry shortly",
                retry_after_s=1,
            )
        lease, presented = self.authenticate(request)
        if lease is None:
            log.info("key_refused", path=request.path)  # never the presented string
            return self._early(request, t0, Refusal.UNKNOWN_KEY, "unknown, expired or revoked virtual key")
        account = self.replica.accounts.get(lease.account_id)
        # the request's wire, resolved once: everything after reads `attempt.spec`
        headers: Any = request.headers  # (read as the multidict the helpers are typed for)
        spec = WIRES[account.wire] if account is not None else guess_wire(request.path, headers)
        trace = trace_headers(headers) if "traceparent" in headers else _NO_TRACE  # SPEC §21
        attempt = Attempt(self.link, lease, spec, request.path, trace)
        if not self.in_flight:  # (set exactly while none is in flight: cleared by the first)
            self._idle.clear()
        self.in_flight.add(attempt)
        try:
            return await self._serve(request, attempt, presented)
        except asyncio.CancelledError:
            if not attempt.stopping:
                attempt.finish(AttemptStatus.CLIENT_ABORTED, attempt.http_status)
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]  # our own stop_all
            return await self._shut(request, attempt)
        except ConnectionError:  # the worker went away while we wrote to it
            attempt.finish(AttemptStatus.CLIENT_ABORTED, attempt.http_status)
            return attempt.response or Response(status=400)  # never reaches anyone
        except Exception as exc:
            return await self._failed_internally(request, attempt, exc)
        finally:
            self.in_flight.discard(attempt)
            if not self.in_flight:
                self._idle.set()
            self.capacity.release(attempt.attempt_id)
            if self.fleet is not None:
                self.fleet.release_soon(attempt.attempt_id)
            if not attempt.done:
                attempt.finish(AttemptStatus.REFUSED, 500, refusal=Refusal.INTERNAL_ERROR)

    async def upgrade(self, request: web.Request) -> web.StreamResponse | Response:
        """A WebSocket handshake (SPEC §20, §15: 426 off its path), on aiohttp's request."""
        if request.path == HEALTHZ_PATH:
            return self.healthz(request)
        return await self.sockets.upgrade(request, time.perf_counter())

    def healthz(self, request: Request | web.BaseRequest) -> Response:
        status, health = health_of(self.replica.ready, self.link.conn is not None, self.draining, len(self.replica))
        return healthz_response(request.method, status, health)

    async def _failed_internally(self, request: Request, attempt: Attempt, exc: Exception) -> StreamResponse:
        """A bug, not a fault of the worker or the upstream: logged (redacted), answered, cut."""
        log.error("request_failed", attempt_id=attempt.attempt_id, error=type(exc).__name__, exc_info=exc)
        if attempt.response is None:
            return refuse(attempt, Refusal.INTERNAL_ERROR, "the gateway failed this request")
        await cut(request, attempt, "the gateway failed this request")
        attempt.finish(AttemptStatus.REFUSED, attempt.http_status, refusal=Refusal.INTERNAL_ERROR)
        return attempt.response

    def authenticate(self, request: Request | web.BaseRequest) -> tuple[Lease | None, str]:
        """x-api-key first, then Authorization: Bearer; the first live lease wins.

        Returns the lease and the string that named it (kept only to scrub it from the URL).
        """
        now = now_ms()
        key = request.headers.get("x-api-key", "").strip()
        if key:
            lease = self.replica.lookup(key, now)
            if lease is not None:
                return lease, key
        auth = request.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            token = auth[7:].strip()
            return self.replica.lookup(token, now), token
        return None, ""

    def _early(
        self,
        request: Request,
        t0: float,
        code: Refusal | ErrorCode,
        message: str,
        retry_after_s: float | None = None,
    ) -> Response:
        """A refusal before any lease: no attempt, no row."""
        return refusal_response(
            guess_wire(request.path, request.headers),  # type: ignore[arg-type]
            code,
            message,
            "req_" + new_ulid(),
            (time.perf_counter() - t0) * 1000,
            retry_after_s=retry_after_s,
        )

    # ---- admission ----------------------------------------------------------------------

    async def _serve(self, request: Request, attempt: Attempt, presented: str) -> StreamResponse:
        account = self.replica.accounts.get(attempt.lease.account_id)
        spec = attempt.spec
        if account is None or attempt.path not in spec.paths:
            return refuse(attempt, Refusal.PATH_NOT_SERVED, f"{attempt.path} is not served on the {attempt.wire} wire")
        if self.draining:
            return refuse(attempt, Refusal.GATEWAY_SHUTDOWN, SHUTDOWN_MESSAGE, retry_after_s=1)
        if not self.replica.storage_ok:
            return refuse(
                attempt,
                Refusal.OBSERVATION_STORAGE_UNAVAILABLE,
                "the gateway cannot record attempts right now",
                retry_after_s=5,
            )
        credential = self.replica.credentials.get(account.id)
        if credential is None:
            return refuse(
                attempt, Refusal.ACCOUNT_NOT_CONFIGURED, f"account {account.id} has no credential on this data plane"
            )
        too_large = f"the body exceeds {self.settings.max_body_bytes} bytes"
        declared = request.content_length
        if declared is not None and declared > self.settings.max_body_bytes:
            return refuse(attempt, Refusal.BODY_TOO_LARGE, too_large)
        try:
            body = await request.read()
        except HTTPRequestEntityTooLarge:
            return refuse(attempt, Refusal.BODY_TOO_LARGE, too_large)
        except HTTPRequestTimeout:  # the worker stopped sending its body (SPEC §19's stall bound)
            raise _body_stalled(request) from None
        if attempt.path in spec.model_paths and (body or request.method == "POST"):
            strict = await self._read_strictly(request, attempt, account, body)
            if isinstance(strict, Response):  # refused: no upstream call, never evidence
                return strict
            body = strict
        if attempt.lease.hop_on and self.replica.is_moving(attempt.lease):
            # SPEC §17: the gateway is moving this dispatch key. Checked with no await before the
            # announce, so every attempt control counts in flight was announced before the hop.
            return refuse(
                attempt,
                Refusal.FALLBACK_PENDING,
                "the gateway is moving this dispatch to another account; retry in a second",
                retry_after_s=1,
            )
        if attempt.lease.budgeted:  # SPEC §18; a lease with no budget pays this one test
            hold = budget_hold(attempt.lease, attempt.requested_model, now_ms(), self.replica.priced)
            if hold is not None:
                return refuse(attempt, hold.code, hold.message, hold.retry_after_s, hold.status)
        admitted = self._admit_here(attempt, account) if self.fleet is None else await self._admit(attempt, account)
        if admitted is not None and not isinstance(admitted, FleetAnswer):
            return admitted
        path_qs = request.path_qs
        if presented and presented in request.query_string:  # the key in the query: dropped
            path_qs = upstream_path_qs(URL(path_qs, encoded=True), presented)
        if admitted is None:
            return await self.relay.exchange(request, attempt, account, credential, body, path_qs)
        try:  # the fleet's answer is awaited right before the first byte upstream (fleetanswer.py)
            return await self.relay.exchange(request, attempt, account, credential, body, path_qs, admitted)
        finally:
            admitted.abandon()  # never asked (a failure before the write): its holder released

    def _admit_here(self, attempt: Attempt, account: AccountRoute) -> StreamResponse | None:
        """Embedded mode's `_admit`: announce, then the request slot on this host (SPEC §16), or
        the refusal. Nothing to await, so no coroutine per request (issue 27)."""
        attempt.announce()
        if self.capacity.reserve(account.id, attempt.attempt_id, account.request_capacity):
            return None
        return capacity_exhausted(attempt, account)

    async def _admit(self, attempt: Attempt, account: AccountRoute) -> StreamResponse | FleetAnswer | None:
        """Announce the attempt and take its request slot (SPEC §16: fleet-wide in Redis when the
        account has a ceiling); the refusal when the slot cannot be taken, else None — or, on a
        fleet-wide ceiling, the reserve written to Redis, its answer still to await
        (`FleetAnswer`: the relay prepares the upstream request meanwhile). Fleet mode's; embedded
        mode's is `_admit_here`."""
        fleet = self.fleet
        held = fleet_held(fleet, account)
        if held is not None and fleet is not None:  # a lapse read before control's first beat ends here
            held = await fleet.hold_now()
        if held is not None:  # SPEC §16, §19: a lapsed place or a failing loop: never stale state
            return refuse(
                attempt,
                Refusal.FLEET_STATE_UNAVAILABLE,
                f"{held}: account {account.id}'s fleet-wide ceiling cannot be honoured here",
                retry_after_s=1,
            )
        attempt.announce()
        if fleet is not None and account.request_capacity is not None:
            # SPEC §16: a fleet-wide ceiling, asked of Redis; never a silent per-host one
            if not fleet.started:  # (a data plane whose fleet start has not succeeded yet)
                try:
                    await fleet.start()
                except StateUnavailable:
                    return ceiling_unchecked(attempt, account)
            return FleetAnswer(
                attempt, account, fleet.send_reserve(account.id, attempt.attempt_id, account.request_capacity)
            )
        if self.capacity.reserve(account.id, attempt.attempt_id, account.request_capacity):
            return None
        return capacity_exhausted(attempt, account)

    async def _read_strictly(
        self, request: Request, attempt: Attempt, account: AccountRoute, body: bytes
    ) -> bytes | Response:
        """The body's model as the upstream reads it (SPEC §19), held to the lease's account
        (§12); the body to send upstream: as it came, or decoded with `include_usage` set on a
        chat stream that did not ask for usage; or the refusal."""
        try:  # a plain body of the usual size is read with no coroutine between (issue 27)
            coding = (
                ""
                if "Content-Encoding" not in request.headers
                else coding_of(request.headers.getall("Content-Encoding"))
            )
            decoded = await decode_body(body, coding, self.settings.max_body_bytes) if coding else body
            peek = strict_peek(decoded) if len(decoded) < OFF_LOOP_BYTES else await peek_body(decoded)
        except BodyRefused as refused:
            return refuse(attempt, refused.code, refused.message)
        attempt.requested_model = peek.model
        attempt.stream = peek.stream
        if refuses(peek.model, account.models):
            return refuse(attempt, Refusal.MODEL_NOT_PERMITTED, _not_permitted(account, peek.model))
        if not asks_usage(attempt.path, peek):
            return body
        if peek.stream_options and len(decoded) >= OFF_LOOP_BYTES:  # a scan of the top level
            asked = await with_usage_off_loop(decoded, peek)  # its scan holds the GIL
        else:
            asked = with_usage(decoded, peek)
        if asked is None:
            return body
        attempt.asked_usage = True
        return asked

    # ---- graceful shutdown --------------------------------------------------------------

    async def drained(self, timeout_s: float) -> bool:
        """Wait (bounded) until no attempt is in flight; True if none is left."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            pass
        return not self.in_flight

    def stop_all(self) -> int:
        """End every attempt still in flight (the drain window ran out); each writes its row."""
        stopped = 0
        for attempt in list(self.in_flight):
            if attempt.task is not None and not attempt.task.done() and not attempt.stopping:
                attempt.stopping = True
                attempt.task.cancel()
                stopped += 1
        return stopped

    async def _shut(self, request: Request, attempt: Attempt) -> StreamResponse:
        result = verdict(Ending.SHUTDOWN, False)
        if attempt.response is None:
            return refuse(attempt, Refusal.GATEWAY_SHUTDOWN, SHUTDOWN_MESSAGE, retry_after_s=1)
        await cut(request, attempt, SHUTDOWN_MESSAGE)
        attempt.finish(result.status, attempt.http_status, refusal=result.refusal)
        return attempt.response
