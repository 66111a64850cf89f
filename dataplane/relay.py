"""One upstream exchange: pool slot → send once → relay the answer → classify how it ended.

The worker's body goes upstream as the original bytes, once; the data plane never retries.
Three timeouts bound the exchange (connect, headers, idle between chunks); there is no total
timeout. A 2xx answer is written to the worker chunk by chunk as it arrives while an `Observer`
reads a copy; a non-2xx answer is read whole and its row acknowledged by control before the
worker sees it (SPEC §7). An exchange that ends without its wire's terminal event is cut: the
wire's error event when the stream is readable plain SSE, then the connection is closed
without the chunked terminator (SPEC §12).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from dataplane.attempt import Attempt
from dataplane.endings import Ending, verdict
from dataplane.errors import OVERHEAD_HEADER, refusal_response, refuse
from dataplane.fleetanswer import FleetAnswer
from dataplane.observer import Observer
from dataplane.ratelimits import rate_limits_of
from dataplane.upstream_client import UpstreamClient, UpstreamResponse, Withheld
from dataplane.upstreams import (
    PoolTimeout,
    UpstreamPools,
    downstream_headers,
    upstream_headers,
)
from dataplane.usage_ask import UsageStrip
from dataplane.watch import ExchangeWatch, IdleTimeout, WatchClock
from shared.clock import now_ms
from shared.codes import AttemptStatus, ErrorCode, Refusal
from shared.http1.request import Request
from shared.http1.response import Response, StreamResponse
from shared.logging import get_logger
from shared.settings import Settings
from shared.wire import AccountRoute

log = get_logger("dataplane")

# How long a non-2xx answer waits for control to hold its row before going out anyway.
EVIDENCE_ACK_WAIT_S = 5.0
# What an exchange answers with: the lean client's response, or aiohttp's for a handed-over one.
Upstream = UpstreamResponse | aiohttp.ClientResponse
CUT_MESSAGE = "the upstream stream ended before its terminal event (transport-error)"
SHUTDOWN_MESSAGE = "the gateway is shutting down; retry the request"
# Enum members read per request, bound once: `Ending.EOF` is a ~1k-instruction class
# attribute lookup on Python 3.11's enum metaclass, a module global is one dict lookup.
_EOF = Ending.EOF
_CLIENT_GONE = Ending.CLIENT_GONE


def _retry_after_s(headers: object) -> float | None:
    value = headers.get("retry-after")  # type: ignore[attr-defined]
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class Relay:
    def __init__(self, settings: Settings, pools: UpstreamPools) -> None:
        self.settings = settings
        self.pools = pools
        self.clock: WatchClock | None = None  # every exchange's first timeout check (watch.py)

    async def exchange(
        self,
        request: Request,
        attempt: Attempt,
        account: AccountRoute,
        credential: str,
        body: bytes,
        path_qs: str,
        answer: FleetAnswer | None = None,
    ) -> StreamResponse:
        """With `answer` (a fleet admission still out), the request is prepared while Redis
        answers and the answer awaited right before its first byte upstream; or, when no pool
        slot is free, before waiting for one (a refused request never waits for a slot)."""
        gate = self.pools.gate_for(account.id)
        if not gate.take():  # (a free slot is taken without a coroutine: issue 27)
            if answer is not None:
                refused = await answer()
                if refused is not None:
                    return refused
                answer = None
            try:
                await gate.acquire(self.settings.upstream_pool_timeout)
            except PoolTimeout:
                return refuse(
                    attempt,
                    Refusal.POOL_TIMEOUT,
                    f"no upstream connection to {account.id} freed up in time",
                    retry_after_s=1,
                )
        try:  # the slot is held from here: every way out releases it
            url = self.pools.url_for(account, path_qs)
            headers = upstream_headers(request.headers, account.auth_style, credential)  # type: ignore[arg-type]
            if attempt.asked_usage:  # SPEC §19: the body goes decoded, and the answer must be readable
                headers.popall("Content-Encoding", None)
                headers["Accept-Encoding"] = "identity"
            client = self.pools.client_for(account.id)
            sent_at = time.perf_counter()
            loop = asyncio.get_running_loop()
            clock = self.clock
            if clock is None or clock.loop is not loop:  # one clock per loop the relay serves on
                clock = self.clock = WatchClock(loop)
            watch = ExchangeWatch(
                loop,
                self.settings.upstream_headers_timeout,
                self.settings.upstream_idle_timeout,
                self.settings.client_stall_seconds,
                clock,
                attempt.task,  # the handler's task, which runs this exchange (proxy.Proxy.handle)
            )
            if answer is not None:
                answer.watch = watch
            try:
                return await self._exchange(
                    request, attempt, account, client, url, headers, body, sent_at, watch, answer
                )
            finally:
                watch.stop()
        finally:
            gate.release()

    async def _exchange(
        self,
        request: Request,
        attempt: Attempt,
        account: AccountRoute,
        client: UpstreamClient,
        url: URL,
        headers: CIMultiDict[str],
        body: bytes,
        sent_at: float,
        watch: ExchangeWatch,
        answer: FleetAnswer | None = None,
    ) -> StreamResponse:
        try:
            try:
                upstream = await client.request(request.method, url, headers, body or None, answer)
            except asyncio.CancelledError:
                if watch.timed_out():
                    raise TimeoutError from None
                raise
        except Withheld as withheld:  # the fleet refused the slot: nothing went upstream
            return withheld.answer  # type: ignore[return-value]  # (FleetAnswer answers a response)
        except TimeoutError:
            return await self._failed(attempt, ErrorCode.UPSTREAM_TIMEOUT, "the upstream did not answer in time")
        except aiohttp.ClientResponseError as exc:
            log.warning("upstream_malformed", account_id=account.id, error=type(exc).__name__)
            return await self._failed(
                attempt, ErrorCode.UPSTREAM_PROTOCOL_ERROR, "the upstream sent a malformed response"
            )
        except (aiohttp.ClientError, OSError) as exc:
            log.warning("upstream_unreachable", account_id=account.id, error=type(exc).__name__)
            return await self._failed(attempt, ErrorCode.UPSTREAM_UNREACHABLE, "the upstream could not be reached")
        if answer is not None and answer.answered_at > sent_at:  # the fleet's wait is the gateway's
            sent_at = answer.answered_at
        watch.body(upstream.content, lambda: _stalled(request, attempt))
        upstream_wait = time.perf_counter() - sent_at  # the answer's head: its first byte (§14)
        attempt.first_byte_ms = round(upstream_wait * 1000, 3)
        # SPEC §22: the provider's rate-limit headers, as the attempt's wire names them
        attempt.rate_limits = rate_limits_of(upstream.headers, attempt.spec.rate_limits, now_ms)
        ended_clean = False
        try:
            if not 100 <= upstream.status <= 599:
                log.warning("upstream_malformed", account_id=account.id, error="status-out-of-range")
                return await self._failed(
                    attempt, ErrorCode.UPSTREAM_PROTOCOL_ERROR, "the upstream sent a malformed status line"
                )
            if not 200 <= upstream.status < 300:
                response = await self._relay_error(attempt, upstream, upstream_wait)
            else:
                response = await self._relay(request, attempt, upstream, upstream_wait, watch)
            ended_clean = upstream.content.is_eof()
            return response
        finally:
            if ended_clean:
                upstream.release()  # back to the account's keep-alive pool
            else:
                upstream.close()  # the upstream request is cancelled with its connection

    async def _failed(self, attempt: Attempt, code: ErrorCode, message: str) -> Response:
        """No usable upstream answer: a transport-error row (evidence), acknowledged first."""
        response = refusal_response(attempt.spec, code, message, attempt.attempt_id, attempt.mark_overhead(0.0))
        await await_ack(attempt.finish(AttemptStatus.TRANSPORT_ERROR, response.status, wait=True))
        return response

    async def _relay_error(self, attempt: Attempt, upstream: Upstream, upstream_wait: float) -> StreamResponse:
        """A non-2xx answer: its row reaches control before the worker sees it (SPEC §7)."""
        try:
            async with asyncio.timeout(self.settings.upstream_idle_timeout):
                payload = await upstream.read()
        except (TimeoutError, aiohttp.ClientError, OSError):
            return await self._failed(attempt, ErrorCode.UPSTREAM_UNREACHABLE, "the upstream's error answer was cut")
        headers = downstream_headers(upstream.headers)
        headers[OVERHEAD_HEADER] = attempt.overhead_header(upstream_wait)
        attempt.bytes_out = len(payload)
        await await_ack(
            attempt.finish(
                AttemptStatus.UPSTREAM_ERROR, upstream.status, retry_after_s=_retry_after_s(upstream.headers), wait=True
            )
        )
        return Response(status=upstream.status, reason=upstream.reason, headers=headers, body=payload)

    async def _relay(
        self, request: Request, attempt: Attempt, upstream: Upstream, upstream_wait: float, watch: ExchangeWatch
    ) -> StreamResponse:
        is_sse = upstream.content_type == "text/event-stream"
        encoding = upstream.headers.get("Content-Encoding", "")
        length = upstream.headers.get("Content-Length")
        sized = length is not None and not is_sse and length.isdigit()
        headers = downstream_headers(upstream.headers)  # (an upstream's repeats kept)
        headers[OVERHEAD_HEADER] = attempt.overhead_header(upstream_wait)
        response = StreamResponse(upstream.status, upstream.reason, headers)  # (positional: cheaper)
        if sized:  # its head leaves with its first body chunk: one write for an answer read whole
            response.content_length = int(length)  # type: ignore[arg-type]
            response.head_with_body = True
        # (else chunked; an HTTP/1.0 worker gets a close-delimited body)
        observer = Observer(attempt.spec, attempt.path, is_sse, encoding)
        attempt.seen = observer.seen
        attempt.http_status = upstream.status
        await response.prepare(request)
        attempt.response = response
        attempt.sse_plain = is_sse and observer.decompress.plain
        strip = UsageStrip() if attempt.asked_usage and attempt.sse_plain else None
        ending = await self._pump(upstream, response, attempt, observer, watch, strip)
        if strip is not None and strip.held and ending is not _CLIENT_GONE:
            try:
                await response.write(strip.flush())
            except ConnectionError:
                ending = _CLIENT_GONE
        complete = False
        if ending is _EOF:
            observer.finish()
            complete = observer.complete()
        result = verdict(ending, complete)
        if result.cut:
            await cut(request, attempt, CUT_MESSAGE)
        elif ending is _EOF:
            try:
                await response.write_eof()
            except ConnectionError:
                result = verdict(_CLIENT_GONE, complete)
        attempt.finish(result.status, upstream.status, refusal=result.refusal)
        return response

    async def _pump(
        self,
        upstream: Upstream,
        response: StreamResponse,
        attempt: Attempt,
        observer: Observer,
        watch: ExchangeWatch,
        strip: UsageStrip | None,
    ) -> Ending:
        """Relay chunks as they arrive, no buffering, no per-chunk logging or timer (a `strip`
        holds back only a partial SSE event)."""
        loop = watch.loop  # the running loop, as the watch took it (no second look-up)
        content = upstream.content
        read, at_eof, failed = content.readany, content.at_eof, content.exception
        write = response.write if strip is None else _stripping(response.write, strip)
        observe = observer.feed
        while True:
            watch.reading_since = loop.time()
            try:
                chunk = await read()
            except IdleTimeout:
                return Ending.IDLE_TIMEOUT
            except (aiohttp.ClientError, OSError):
                return Ending.UPSTREAM_FAILED
            watch.reading_since = None
            watch.writing_since = loop.time()
            if not chunk:
                return _EOF
            observe(chunk)
            try:
                await write(chunk)
            except ConnectionError:
                return _CLIENT_GONE
            attempt.bytes_out += len(chunk)
            if at_eof() and failed() is None:  # all read: the end `read()` would give (b""), no read
                watch.writing_since = loop.time()  # (the watch as that read would leave it)
                return _EOF


def _stalled(request: Request, attempt: Attempt) -> None:
    """The worker accepted no byte for GATEWAY_CLIENT_STALL_SECONDS (SPEC §19): its connection is
    aborted, so the handler is cancelled (client-aborted) and the upstream request with it."""
    log.warning("client_stalled", attempt_id=attempt.attempt_id)
    transport = request.transport
    if transport is not None:
        transport.abort()


def _stripping(write: Callable[[bytes], Awaitable[None]], strip: UsageStrip) -> Callable[[bytes], Awaitable[None]]:
    async def stripped(chunk: bytes) -> None:
        kept = strip.feed(chunk)
        if kept:
            await write(kept)

    return stripped


async def cut(request: Request, attempt: Attempt, message: str) -> None:
    """End a relayed answer so no client can take it for complete (SPEC §12).

    Readable plain SSE first gets the wire's error event (unless the upstream already sent
    one); then the connection is closed, which flushes what was written and never writes the
    chunked terminator (a length-delimited body simply ends short).
    """
    response = attempt.response
    seen = attempt.seen
    if response is not None and attempt.sse_plain and not (seen is not None and seen.upstream_error):
        try:
            async with asyncio.timeout(1.0):
                await response.write(attempt.spec.cut_event(attempt.path, message))
        except (ConnectionError, TimeoutError):
            pass
    transport = request.transport
    if transport is not None:
        transport.close()


async def await_ack(future: asyncio.Future[bool] | None) -> None:
    if future is None:
        return
    try:
        await asyncio.wait_for(asyncio.shield(future), EVIDENCE_ACK_WAIT_S)
    except TimeoutError:
        log.warning("evidence_ack_timeout")
