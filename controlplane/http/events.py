"""`GET /control/v2/events` (scope `read`): the hub's events as Server-Sent Events.

Every event goes out as `id: {epoch}-{seq}`, `event: {kind}`, `data: {sanitized JSON}`. A reader
resumes with `Last-Event-ID`; a `gap` event comes first when the hub cannot replay everything
that followed that id. Heartbeats are SSE comment lines (`: ping`) every `HEARTBEAT_S`, so idle
connections stay open through proxies; a reader that closed its connection is noticed within
`LIVENESS_CHECK_S` even when there is nothing to send. On shutdown every feed ends cleanly.

A reader that stops reading fills its kernel buffers, then the server's write buffer (a write
waits while the socket is full), then its hub queue; the hub then drops it, and this module
aborts its connection. The send buffer is capped (`FEED_SNDBUF_BYTES`) so that point comes
after a known amount of data, not after whatever the kernel would autotune to.
"""

from __future__ import annotations

import asyncio
import socket

from controlplane.events import CloseReason, Event, EventHub, Subscriber
from controlplane.http.appkeys import HEARTBEAT, HUB
from controlplane.http.common import requires
from shared.codes import Scope
from shared.http1 import web
from shared.logging import get_logger

log = get_logger("control.events")

HEARTBEAT_S = 15.0
LIVENESS_CHECK_S = 1.0
FEED_SNDBUF_BYTES = 32 * 1024
_DISCONNECTS = (ConnectionError, RuntimeError)  # RuntimeError: writing after EOF


@requires(Scope.READ, drains=False)
async def events(request: web.Request) -> web.StreamResponse:
    hub = request.app[HUB]
    peer = request.remote or ""
    subscriber, backlog = hub.subscribe(request.headers.get("Last-Event-ID"), peer=peer)
    response = web.EventSourceResponse(sep="\n")
    response.ping_interval = request.app.get(HEARTBEAT, HEARTBEAT_S)
    try:
        await response.prepare(request)
        _cap_send_buffer(request)
        subscriber.on_close = lambda reason: _on_close(request, reason)
        log.info("event_feed_opened", peer=peer, backlog=len(backlog))
        for event in backlog:
            await _send(response, event)
        await _relay(request, response, subscriber)
    except _DISCONNECTS:
        pass
    finally:
        hub.unsubscribe(subscriber, subscriber.closed or CloseReason.DISCONNECTED)
        if response.prepared:
            response.stop_streaming()
        log.info("event_feed_closed", peer=peer, reason=str(subscriber.closed))
    return response


async def _relay(request: web.Request, response: web.EventSourceResponse, subscriber: Subscriber) -> None:
    """Live events until the hub closes the reader or the peer is gone.

    The server does not cancel a handler whose peer went away (nor did aiohttp), so an idle
    feed checks every `LIVENESS_CHECK_S` (a closed connection, or the peer's EOF) rather than
    holding its place in the hub until the next heartbeat.
    """
    while subscriber.closed is None:
        try:
            batch = await asyncio.wait_for(subscriber.next_batch(), LIVENESS_CHECK_S)
        except TimeoutError:
            if request.peer_gone:
                return
            continue
        for event in batch:
            await _send(response, event)


async def _send(response: web.EventSourceResponse, event: Event) -> None:
    await response.send(event.payload.decode(), id=event.id, event=str(event.kind))


def _on_close(request: web.Request, reason: CloseReason) -> None:
    """A dropped reader's handler is blocked writing to it: abort the connection to free both."""
    if reason == CloseReason.QUEUE_FULL and request.transport is not None:
        request.transport.abort()


def _cap_send_buffer(request: web.Request) -> None:
    sock = None if request.transport is None else request.transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, FEED_SNDBUF_BYTES)
        except OSError:  # not a TCP socket (tests over a pipe): the queue bound still holds
            pass


async def _close_feeds(app: web.Application) -> None:
    """On shutdown every feed ends cleanly, so the daemon does not wait on open readers."""
    app[HUB].close_all(CloseReason.SHUTDOWN)


def add_routes(app: web.Application, hub: EventHub, heartbeat_s: float = HEARTBEAT_S) -> None:
    app[HUB] = hub
    app[HEARTBEAT] = heartbeat_s
    app.on_shutdown.append(_close_feeds)
    app.router.add_get("/control/v2/events", events)
