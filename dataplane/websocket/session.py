"""One proxied socket (SPEC §20): two pumps, and one attempt per `response.create`.

Client → upstream: each text message is held to §19 (`events.client_message`); a
`response.create` passes the gates (`gates.standing`, `gates.hold`, a request slot) or is
refused with an `error` event on the socket, which stays open. Upstream → client: text frames
go on unchanged and in order; each event is matched to its response by what it names
(`matching.Matcher`: the response id, an item id, FIFO only for `response.created`), and a
response's terminal event ends it: one row, acknowledged by control before a failure is
forwarded (§7); a response superseded without one ends with a 200 row without usage
(unpriced, SPEC §19). Pings, pongs and close
codes pass through. A socket whose lease lost its rights lets its responses finish, then both
sockets close (1008 / 1012 / 1001); an upstream that fails closes the worker's with 1011.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import aiohttp
import msgspec
from aiohttp import WSMsgType, web

from dataplane.attempt import Attempt
from dataplane.bodies import OFF_LOOP_BYTES, BodyRefused
from dataplane.relay import await_ack
from dataplane.websocket import events, gates, matching
from dataplane.wires.table import WIRES
from shared.clock import now_ms
from shared.codes import AttemptStatus, Refusal
from shared.logging import get_logger
from shared.wire import AccountRoute, AttemptRow, Lease, RateLimits

log = get_logger("dataplane")
PATH = "/v1/responses"


class SocketAttempt(Attempt):
    """An attempt whose row says `transport: "websocket"` and `stream: true` (SPEC §14, §20)."""

    __slots__ = ("holds_slot", "sent_at")
    holds_slot: bool  # this response holds a request slot (released once, at its end)
    sent_at: float  # perf_counter when its `response.create` went upstream (SPEC §14)

    def _started_row(self) -> AttemptRow:
        return msgspec.structs.replace(super()._started_row(), transport="websocket", stream=True)


class Closed(NamedTuple):
    """How a pump ended: who closed, with which code, and what that makes the responses cut."""

    by: str  # "client", "upstream" or "gateway"
    code: int
    cut: AttemptStatus  # what an attempt still in flight ends as


class SocketSession:
    """`sockets` is the `Sockets` that opened it (settings, replica, link, slots, drain)."""

    def __init__(
        self,
        sockets: Any,
        lease: Lease,
        account: AccountRoute,
        client: web.WebSocketResponse,
        upstream: aiohttp.ClientWebSocketResponse,
    ) -> None:
        self.sockets = sockets
        self.lease = lease
        self.account = account
        self.client = client
        self.upstream = upstream
        self.attempts: matching.Matcher[SocketAttempt] = matching.Matcher()
        self.ending: gates.Standing | None = None  # rights lost: finish, then close
        self.closing: Closed | None = None  # how the gateway ends the socket
        self.done = asyncio.Event()  # `closing` is set
        # The bounds, read by the sweep (no timer per message): when the upstream last sent
        # (or a create was sent to it), and since when a write to the worker has not returned.
        self.upstream_at = time.monotonic()
        self.writing_since: float | None = None
        self.trace: tuple[str | None, str | None] = (None, None)  # the handshake's (SPEC §21)
        self.rate_limits: RateLimits | None = None  # the 101's, until the first attempt takes it (§22)

    # ---- lifetime -----------------------------------------------------------------------

    async def run(self) -> None:
        pumps = [
            asyncio.ensure_future(self._from_client()),
            asyncio.ensure_future(self._from_upstream()),
            asyncio.ensure_future(self._ended()),
        ]
        try:
            finished, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            closed = next(iter(finished)).result()
        except asyncio.CancelledError:  # the worker's connection went away under the handler
            closed = Closed("client", 1006, AttemptStatus.CLIENT_ABORTED)
            await self._cancel(pumps)
            await self._close(closed)
            raise
        await self._cancel(pumps)
        await self._close(closed)

    async def _cancel(self, pumps: Sequence[asyncio.Future[Closed]]) -> None:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)

    async def _ended(self) -> Closed:
        await self.done.wait()
        assert self.closing is not None
        return self.closing

    def _finish(self, closed: Closed) -> None:
        if self.closing is None:
            self.closing = closed
            self.done.set()

    async def _close(self, closed: Closed) -> None:
        """Cut what is in flight (rows first), then close both sockets."""
        futures = [
            self._end(a, closed.cut, None, wait=closed.cut == AttemptStatus.TRANSPORT_ERROR)
            for a in self.attempts.attempts()
        ]
        for future in futures:
            await await_ack(future)
        code = closed.code
        if closed.by == "upstream" and (futures or code in (1005, 1006)):
            code = gates.INTERNAL_ERROR
        for ws in (self.upstream, self.client):
            try:
                async with asyncio.timeout(2.0):
                    await ws.close(code=code if code not in (1005, 1006) else 1000)
            except (TimeoutError, ConnectionError, RuntimeError):
                pass

    def stop(self) -> None:
        """The drain window ran out: what is in flight ends `gateway-shutdown`, then 1001."""
        for attempt in self.attempts.attempts():
            self._end(attempt, AttemptStatus.REFUSED, None, refusal=Refusal.GATEWAY_SHUTDOWN)
        self.check(now_ms())

    def check(self, now: int) -> None:
        """Whether the lease still has its rights (the sweep, and after each event or refusal
        went to the worker: the close never overtakes what it answers)."""
        self._judge(now)
        if self.ending is not None and not self.attempts:
            self._finish(Closed("gateway", self.ending.close_code, AttemptStatus.CLIENT_ABORTED))

    def bound(self, mono: float, idle_s: float, stall_s: float) -> None:
        """The sweep's bounds: the upstream silent past its idle timeout while a response is in
        flight (a transport-error, 1011), or the worker accepting nothing for the stall bound
        (client-aborted, SPEC §19). An idle socket with nothing in flight is held."""
        if self.attempts and mono - self.upstream_at > idle_s:
            log.warning("upstream_socket_idle", account_id=self.account.id)
            self._finish(Closed("upstream", gates.INTERNAL_ERROR, AttemptStatus.TRANSPORT_ERROR))
        elif self.writing_since is not None and mono - self.writing_since > stall_s:
            log.warning("client_socket_stalled", account_id=self.account.id)
            self._finish(Closed("client", 1006, AttemptStatus.CLIENT_ABORTED))

    def _judge(self, now: int) -> None:
        if self.ending is None:
            self.ending = gates.standing(self.sockets.replica, self.lease, now, self.sockets.draining)

    # ---- client → upstream ----------------------------------------------------------------

    async def _from_client(self) -> Closed:
        client, upstream = self.client, self.upstream
        while True:
            msg = await client.receive()
            kind = msg.type
            try:
                if kind == WSMsgType.TEXT:
                    await self._message(msg.data)
                elif kind == WSMsgType.PING:
                    await upstream.ping(msg.data)
                elif kind == WSMsgType.PONG:
                    await upstream.pong(msg.data)
                elif kind == WSMsgType.BINARY:
                    await self._refuse(
                        self._attempt(None),
                        gates.refused(Refusal.INVALID_REQUEST_BODY, "binary messages are not JSON text"),
                    )
                elif kind == WSMsgType.CLOSE:
                    return Closed("client", msg.data, AttemptStatus.CLIENT_ABORTED)
                else:  # CLOSING, CLOSED, ERROR: the worker's connection is gone
                    return Closed("client", 1006, AttemptStatus.CLIENT_ABORTED)
            except (ConnectionError, RuntimeError):  # the upstream socket is gone
                return Closed("upstream", 1006, AttemptStatus.TRANSPORT_ERROR)

    async def _message(self, text: str) -> None:
        data = text.encode()
        most = self.sockets.settings.max_body_bytes
        try:
            if len(data) < OFF_LOOP_BYTES:  # read in place: no await before it is judged
                message = events.client_message(data, most)
            else:  # read in a reader process; this socket's next message waits (in order)
                message = await events.read_message(data, most)
        except BodyRefused as exc:
            await self._refuse(self._attempt(None), gates.refused(exc.code, str(exc)))
            return
        if message.type != events.CREATE:
            await self.upstream.send_str(text)
            return
        attempt = self._attempt(message.model)
        refusal = await self._admit(attempt)
        if refusal is not None:
            await self._refuse(attempt, refusal)
            return
        if not self.attempts:
            self.upstream_at = time.monotonic()  # the idle bound counts from the send
        echo = message.echo if message.echo is not None else matching.create_echo(data)
        self.attempts.add(attempt, echo)
        attempt.mark_overhead(0.0)
        attempt.sent_at = time.perf_counter()
        await self.upstream.send_str(text)

    def _attempt(self, model: str | None) -> SocketAttempt:
        attempt = SocketAttempt(self.sockets.link, self.lease, WIRES[self.account.wire], PATH, self.trace)
        attempt.requested_model = model
        attempt.stream = True
        attempt.holds_slot = False
        attempt.rate_limits, self.rate_limits = self.rate_limits, None
        return attempt

    async def _admit(self, attempt: SocketAttempt) -> gates.Refused | None:
        now = now_ms()
        self._judge(now)
        if self.ending is not None:
            return self.ending.refusal
        sockets = self.sockets
        current = sockets.replica.lookup_by_key(self.lease.key_id) or self.lease
        found = gates.hold(sockets.replica, current, self.account, attempt.requested_model, now, sockets.fleet)
        if found is not None:
            return found
        attempt.announce()
        found = await gates.take_slot(sockets.capacity, sockets.fleet, self.account, attempt.attempt_id)
        attempt.holds_slot = found is None
        return found

    async def _refuse(self, attempt: SocketAttempt, refusal: gates.Refused) -> None:
        attempt.mark_overhead(0.0)
        attempt.finish(AttemptStatus.REFUSED, refusal.status, refusal=refusal.code, retry_after_s=refusal.retry_after_s)
        await self.client.send_str(events.error_event(str(refusal.code), refusal.message, refusal.status))
        if self.ending is not None:
            self.check(now_ms())

    # ---- upstream → client ----------------------------------------------------------------

    async def _from_upstream(self) -> Closed:
        client, upstream, clock = self.client, self.upstream, time.monotonic
        while True:
            msg = await upstream.receive()
            kind = msg.type
            self.upstream_at = self.writing_since = clock()
            try:
                if kind == WSMsgType.TEXT:
                    await self._event(msg.data)
                elif kind == WSMsgType.PING:
                    await client.ping(msg.data)
                elif kind == WSMsgType.PONG:
                    await client.pong(msg.data)
                elif kind == WSMsgType.BINARY:
                    await client.send_bytes(msg.data)
                elif kind == WSMsgType.CLOSE:
                    return Closed("upstream", msg.data, AttemptStatus.TRANSPORT_ERROR)
                else:
                    return Closed("upstream", 1006, AttemptStatus.TRANSPORT_ERROR)
            except (ConnectionError, RuntimeError):  # the worker is gone
                return Closed("client", 1006, AttemptStatus.CLIENT_ABORTED)
            self.writing_since = None

    async def _event(self, text: str) -> None:
        if self.attempts:
            event = matching.named(text)
            kind = event.type
            attempt, superseded = self.attempts.route(event, kind in events.TERMINAL)
            for earlier in superseded:  # served, but its end never came: usage unknown (§19)
                self._end(earlier, AttemptStatus.COMPLETED, 200)
            if attempt is not None:
                if attempt.first_byte_ms is None:  # its response's first upstream event (§14)
                    attempt.first_byte_ms = round((time.perf_counter() - attempt.sent_at) * 1000, 3)
                attempt.bytes_out += len(text)
                if kind in events.TERMINAL:
                    await self._terminal(attempt, events.terminal(kind, text))
                    await self.client.send_str(text)
                    self.check(now_ms())  # a hop or a lost right closes once nothing is in flight
                    return
        await self.client.send_str(text)

    async def _terminal(self, attempt: SocketAttempt, end: events.Terminal) -> None:
        if end.kind in (events.COMPLETED, events.INCOMPLETE):
            self._end(attempt, AttemptStatus.COMPLETED, 200, usage=end.usage, served_model=end.model)
            return
        # a failure: its row reaches control before the worker sees the event (SPEC §7, §20)
        await await_ack(
            self._end(
                attempt, AttemptStatus.UPSTREAM_ERROR, end.status, usage=end.usage, served_model=end.model, wait=True
            )
        )

    def _end(
        self, attempt: SocketAttempt, status: AttemptStatus, http_status: int | None, **row: object
    ) -> asyncio.Future[bool] | None:
        self.attempts.remove(attempt)
        if attempt.holds_slot:
            attempt.holds_slot = False
            gates.give_slot(self.sockets.capacity, self.sockets.fleet, attempt.attempt_id)
        return attempt.finish(status, http_status, **row)  # type: ignore[arg-type]
