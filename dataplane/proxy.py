"""The hot path: authenticate → admit → forward → relay → finish (SPEC §12).

The worker's request body is forwarded as the original bytes; only `model` and `stream` are
decoded from it. Response chunks are written as they arrive; the wire's scanner reads a copy to
find usage and the terminal event. Each upstream exchange is sent at most once. Every accepted
request ends in exactly one terminal row through `Attempt.finish`, also on exceptions and
cancellation, and its request-capacity slot is released in a `finally`.
"""

from __future__ import annotations

import asyncio
import time
import zlib

import aiohttp
import msgspec
from aiohttp import web
from yarl import URL

from dataplane.attempt import Attempt
from dataplane.errors import OVERHEAD_HEADER, guess_wire, refusal_response
from dataplane.leases import LeaseReplica
from dataplane.rpc_client import ControlLink
from dataplane.upstreams import UpstreamPools, downstream_headers, upstream_headers, upstream_url
from dataplane.wires import anthropic, openai
from dataplane.wires.sse import Decompressor, Observation, SseScanner
from shared.capacity import CapacityTable
from shared.clock import now_ms
from shared.codes import AttemptStatus, Refusal, Wire
from shared.logging import get_logger
from shared.settings import Settings
from shared.tokens import new_ulid
from shared.wire import Lease, Usage

log = get_logger("dataplane")

# How long a non-2xx answer waits for control to hold its row before going out anyway.
EVIDENCE_ACK_WAIT_S = 5.0
# A non-streaming 2xx body is kept (by reference) up to this size to read its usage.
USAGE_BODY_CAP = 8 * 1024 * 1024


class _Peek(msgspec.Struct):
    model: str | None = None
    stream: bool | None = None


_peek = msgspec.json.Decoder(_Peek).decode


def peek_request(body: bytes, encoding: str) -> tuple[str | None, bool]:
    """`(model, stream)` from the request body; the body itself is forwarded untouched."""
    if encoding:
        try:
            body = zlib.decompress(body, 16 + zlib.MAX_WBITS if "gzip" in encoding else zlib.MAX_WBITS)
        except zlib.error:
            return None, False
    try:
        peek = _peek(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None, False
    return (peek.model if isinstance(peek.model, str) else None), bool(peek.stream)


def _retry_after_s(headers: object) -> float | None:
    value = headers.get("retry-after")  # type: ignore[attr-defined]
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class Proxy:
    def __init__(self, settings: Settings, replica: LeaseReplica, link: ControlLink,
                 pools: UpstreamPools) -> None:
        self.settings = settings
        self.replica = replica
        self.link = link
        self.pools = pools
        self.capacity = CapacityTable()
        self.draining = False
        self.in_flight: set[Attempt] = set()

    # ---- entry --------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        t0 = time.perf_counter()
        path = request.path
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return self._early(request, t0, Refusal.WEBSOCKET_NOT_SUPPORTED,
                               "WebSocket is not proxied; use HTTP POST /v1/responses")
        if not self.replica.ready:
            return self._early(request, t0, Refusal.CONTROL_UNAVAILABLE,
                               "the gateway has lost its control daemon; retry shortly", retry_after_s=1)
        lease = self.authenticate(request)
        if lease is None:
            log.info("key_refused", path=path)
            return self._early(request, t0, Refusal.UNKNOWN_KEY,
                               "unknown, expired or revoked virtual key")
        account = self.replica.accounts.get(lease.account_id)
        wire = account.wire if account is not None else guess_wire(path, request.headers)
        attempt = Attempt(self.link, lease, wire, path)
        self.in_flight.add(attempt)
        try:
            return await self._serve(request, attempt)
        except asyncio.CancelledError:
            refusal = Refusal.GATEWAY_SHUTDOWN if self.draining else None
            status = AttemptStatus.TRANSPORT_ERROR if refusal else AttemptStatus.CLIENT_ABORTED
            attempt.finish(status, None, refusal=refusal, usage=_seen_usage(attempt))
            raise
        except Exception:
            log.exception("request_failed", attempt_id=attempt.attempt_id)
            return self._refuse(attempt, Refusal.INTERNAL_ERROR, "the gateway failed this request")
        finally:
            self.in_flight.discard(attempt)
            self.capacity.release(attempt.attempt_id)
            if not attempt.done:
                attempt.finish(AttemptStatus.REFUSED, 500, refusal=Refusal.INTERNAL_ERROR)

    def authenticate(self, request: web.Request) -> Lease | None:
        """x-api-key first, then Authorization: Bearer; the first live lease wins."""
        now = now_ms()
        key = request.headers.get("x-api-key")
        if key:
            lease = self.replica.lookup(key.strip(), now)
            if lease is not None:
                return lease
        auth = request.headers.get("Authorization")
        if auth and auth[:7].lower() == "bearer ":
            return self.replica.lookup(auth[7:].strip(), now)
        return None

    def _early(self, request: web.Request, t0: float, code: Refusal, message: str,
               retry_after_s: float | None = None) -> web.Response:
        """A refusal before any lease: no attempt, no row."""
        wire = guess_wire(request.path, request.headers)
        return refusal_response(wire, code, message, "req_" + new_ulid(),
                                (time.perf_counter() - t0) * 1000, retry_after_s=retry_after_s)

    def _refuse(self, attempt: Attempt, code: Refusal, message: str,
                retry_after_s: float | None = None) -> web.Response:
        overhead = attempt.mark_overhead(0.0)
        response = refusal_response(attempt.wire, code, message, attempt.attempt_id, overhead,
                                    retry_after_s=retry_after_s)
        attempt.finish(AttemptStatus.REFUSED, response.status, refusal=code, retry_after_s=retry_after_s)
        return response

    # ---- admission ----------------------------------------------------------------------

    async def _serve(self, request: web.Request, attempt: Attempt) -> web.StreamResponse:
        account = self.replica.accounts.get(attempt.lease.account_id)
        paths = anthropic.PATHS if attempt.wire == Wire.ANTHROPIC else openai.PATHS
        if account is None or attempt.path not in paths:
            return self._refuse(attempt, Refusal.PATH_NOT_SERVED,
                                f"{attempt.path} is not served on the {attempt.wire} wire")
        if self.draining:
            return self._refuse(attempt, Refusal.GATEWAY_SHUTDOWN, "the gateway is shutting down",
                                retry_after_s=1)
        if not self.replica.storage_ok:
            return self._refuse(attempt, Refusal.OBSERVATION_STORAGE_UNAVAILABLE,
                                "the gateway cannot record attempts right now", retry_after_s=5)
        credential = self.replica.credentials.get(account.id)
        if credential is None:
            return self._refuse(attempt, Refusal.ACCOUNT_NOT_CONFIGURED,
                                f"account {account.id} has no credential on this data plane")
        declared = request.content_length
        if declared is not None and declared > self.settings.max_body_bytes:
            return self._refuse(attempt, Refusal.BODY_TOO_LARGE,
                                f"the body exceeds {self.settings.max_body_bytes} bytes")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(attempt, Refusal.BODY_TOO_LARGE,
                                f"the body exceeds {self.settings.max_body_bytes} bytes")
        if body:
            attempt.requested_model, attempt.stream = peek_request(
                body, request.headers.get("Content-Encoding", ""))
        attempt.announce()
        if not self.capacity.reserve(account.id, attempt.attempt_id, account.request_capacity):
            return self._refuse(attempt, Refusal.REQUEST_CAPACITY_EXHAUSTED,
                                f"account {account.id} is at its request capacity", retry_after_s=1)
        return await self._exchange(request, attempt, account, credential, body)

    # ---- the upstream exchange ----------------------------------------------------------

    async def _exchange(self, request: web.Request, attempt: Attempt, account, credential: str,
                        body: bytes) -> web.StreamResponse:
        url = URL(upstream_url(account, request.path_qs), encoded=True)
        headers = upstream_headers(request.headers, account.auth_style, credential)
        session = self.pools.session_for(account.id)
        sent_at = time.perf_counter()
        try:
            async with asyncio.timeout(self.settings.upstream_headers_timeout):
                upstream = await session.request(request.method, url, data=body or None,
                                                 headers=headers, allow_redirects=False)
        except TimeoutError:
            return await self._failed_exchange(attempt, Refusal.UPSTREAM_TIMEOUT, 504,
                                               "the upstream did not answer in time")
        except (aiohttp.ClientError, OSError) as exc:
            log.warning("upstream_unreachable", account_id=account.id, error=type(exc).__name__)
            return await self._failed_exchange(attempt, Refusal.UPSTREAM_UNREACHABLE, 502,
                                               "the upstream could not be reached")
        upstream_wait = time.perf_counter() - sent_at
        try:
            if not 200 <= upstream.status < 300:
                return await self._relay_error(attempt, upstream, upstream_wait)
            return await self._relay(request, attempt, upstream, upstream_wait)
        finally:
            upstream.release()

    async def _failed_exchange(self, attempt: Attempt, code: Refusal, status: int,
                               message: str) -> web.Response:
        """No upstream answer: a transport-error row (evidence), acknowledged before we answer."""
        overhead = attempt.mark_overhead(0.0)
        response = refusal_response(attempt.wire, code, message, attempt.attempt_id, overhead,
                                    status=status)
        await _await_ack(attempt.finish(AttemptStatus.TRANSPORT_ERROR, status))
        return response

    async def _relay_error(self, attempt: Attempt, upstream: aiohttp.ClientResponse,
                           upstream_wait: float) -> web.StreamResponse:
        """A non-2xx answer: its row reaches control before the worker sees it (SPEC §7)."""
        try:
            async with asyncio.timeout(self.settings.upstream_idle_timeout):
                payload = await upstream.read()
        except (TimeoutError, aiohttp.ClientError, OSError):
            return await self._failed_exchange(attempt, Refusal.UPSTREAM_UNREACHABLE, 502,
                                               "the upstream's error answer was cut")
        headers = downstream_headers(upstream.headers)
        headers[OVERHEAD_HEADER] = f"{attempt.mark_overhead(upstream_wait):.3f}"
        attempt.bytes_out = len(payload)
        await _await_ack(attempt.finish(AttemptStatus.UPSTREAM_ERROR, upstream.status,
                                        retry_after_s=_retry_after_s(upstream.headers)))
        return web.Response(status=upstream.status, reason=upstream.reason, headers=headers,
                            body=payload)

    async def _relay(self, request: web.Request, attempt: Attempt,
                     upstream: aiohttp.ClientResponse, upstream_wait: float) -> web.StreamResponse:
        is_sse = upstream.content_type == "text/event-stream"
        headers = downstream_headers(upstream.headers)
        headers[OVERHEAD_HEADER] = f"{attempt.mark_overhead(upstream_wait):.3f}"
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        length = upstream.headers.get("Content-Length")
        if length is not None and not is_sse and length.isdigit():
            response.content_length = int(length)
        else:
            response.enable_chunked_encoding()
        encoding = upstream.headers.get("Content-Encoding", "")
        observer = _Observer(attempt, is_sse, encoding)
        await response.prepare(request)
        outcome = await self._pump(upstream, response, attempt, observer)
        seen = observer.result()
        if outcome == "client-gone":
            attempt.finish(AttemptStatus.CLIENT_ABORTED, upstream.status, usage=seen.usage,
                           served_model=seen.model)
            return response
        if outcome == "eof" and observer.complete():
            await response.write_eof()
            attempt.finish(AttemptStatus.COMPLETED, upstream.status, usage=seen.usage,
                           served_model=seen.model)
            return response
        await self._cut(request, response, attempt, is_sse and not encoding and not seen.upstream_error)
        attempt.finish(AttemptStatus.TRANSPORT_ERROR, upstream.status, usage=seen.usage,
                       served_model=seen.model)
        return response

    async def _pump(self, upstream: aiohttp.ClientResponse, response: web.StreamResponse,
                    attempt: Attempt, observer: _Observer) -> str:
        """Relay chunks as they arrive; 'eof', 'upstream-failed', 'idle-timeout' or 'client-gone'."""
        loop = asyncio.get_running_loop()
        idle_s = self.settings.upstream_idle_timeout
        read = upstream.content.readany
        write = response.write
        observe = observer.feed
        try:
            async with asyncio.timeout(None) as deadline:
                while True:
                    deadline.reschedule(loop.time() + idle_s)
                    try:
                        chunk = await read()
                    except (aiohttp.ClientError, OSError):
                        return "upstream-failed"
                    deadline.reschedule(None)
                    if not chunk:
                        return "eof"
                    observe(chunk)
                    try:
                        await write(chunk)
                    except (ConnectionError, aiohttp.ClientConnectionResetError):
                        return "client-gone"
                    attempt.bytes_out += len(chunk)
        except TimeoutError:
            return "idle-timeout"

    async def _cut(self, request: web.Request, response: web.StreamResponse, attempt: Attempt,
                   send_event: bool) -> None:
        """End a stream so no client can take it for complete: error event, then no terminator."""
        if send_event:
            message = "the upstream stream ended before its terminal event (transport-error)"
            event = (anthropic.cut_event(message) if attempt.wire == Wire.ANTHROPIC
                     else openai.cut_event(attempt.path, message))
            try:
                await response.write(event)
            except (ConnectionError, aiohttp.ClientConnectionResetError):
                pass
        transport = request.transport
        if transport is not None:
            transport.close()  # flushes what was written, never writes the chunked terminator


class _Observer:
    """Reads a copy of a 2xx response: an SSE scanner, or a bounded JSON body for usage."""

    def __init__(self, attempt: Attempt, is_sse: bool, encoding: str) -> None:
        self.attempt = attempt
        self.is_sse = is_sse
        self.decompress = Decompressor(encoding)
        self.scanner: SseScanner | None = None
        if is_sse:
            self.scanner = (anthropic.Scanner() if attempt.wire == Wire.ANTHROPIC
                            else openai.scanner_for(attempt.path))
        self.parts: list[bytes] | None = None if is_sse else []
        self.size = 0
        if self.scanner is not None:
            attempt.seen = self.scanner.seen  # partial usage, should the attempt be cancelled

    def feed(self, chunk: bytes) -> None:
        if self.scanner is not None:
            if self.decompress.supported:
                self.scanner.feed(self.decompress(chunk))
        elif self.parts is not None:
            self.size += len(chunk)
            if self.size <= USAGE_BODY_CAP:
                self.parts.append(chunk)
            else:
                self.parts = None

    def complete(self) -> bool:
        if self.scanner is None:
            return True
        seen = self.scanner.seen
        if not self.decompress.supported:
            return True  # unreadable encoding: a clean close is all we can judge by
        return seen.terminal or (seen.finish_seen and self.attempt.path == "/v1/chat/completions")

    def result(self) -> Observation:
        if self.scanner is not None:
            return self.scanner.seen
        seen = Observation()
        if self.parts and self.decompress.supported:
            body = self.decompress(b"".join(self.parts))
            extract = anthropic.usage_from_body if self.attempt.wire == Wire.ANTHROPIC else openai.usage_from_body
            seen.model, seen.usage = extract(body)
        return seen


def _seen_usage(attempt: Attempt) -> Usage | None:
    return None if attempt.seen is None else attempt.seen.usage


async def _await_ack(future: asyncio.Future[bool] | None) -> None:
    if future is None:
        return
    try:
        await asyncio.wait_for(asyncio.shield(future), EVIDENCE_ACK_WAIT_S)
    except (TimeoutError, asyncio.TimeoutError):
        log.warning("evidence_ack_timeout")
