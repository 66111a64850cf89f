"""The SSE route over a real loopback socket, in process: heartbeats, a stalled reader, shutdown.

The hub and the route are the real ones; the app is built with only the feed route and the auth
middleware so the test can set a short heartbeat and a small queue, and publish directly.
"""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
from structlog.testing import capture_logs

from controlplane.events import CloseReason, EventHub
from controlplane.http import events as events_http
from controlplane.http.common import TokenRing, auth_middleware
from shared.http1 import web
from shared.settings import load_settings
from tests.support.http1 import url_of
from tests.support.waits import until
from tests.unit.test_events_hub import row

READ_TOKEN = "read-token-for-feed-tests-0123456789"


def feed_app(hub: EventHub, heartbeat_s: float = 15.0) -> web.Application:
    settings = load_settings({"GATEWAY_CONTROL_TOKEN": "c" * 40, "GATEWAY_READ_TOKEN": READ_TOKEN})
    app = web.Application(middlewares=[auth_middleware(TokenRing(settings), settings.metrics_public)])
    events_http.add_routes(app, hub, heartbeat_s=heartbeat_s)
    return app


def request_bytes(port: int, token: str = READ_TOKEN) -> bytes:
    return (
        f"GET /control/v2/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
    ).encode()


async def test_idle_feed_gets_heartbeat_comments(app_server) -> None:
    hub = EventHub(epoch="t")
    server = await app_server(feed_app(hub, heartbeat_s=0.05))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(request_bytes(server.port))
    seen = b""
    deadline = time.monotonic() + 5
    while seen.count(b": ping") < 2:
        assert time.monotonic() < deadline, seen
        seen += await asyncio.wait_for(reader.read(4096), 5)
    assert seen.startswith(b"HTTP/1.1 200") and b"text/event-stream" in seen
    writer.close()


async def test_unauthenticated_reader_is_refused_before_subscribing(app_server) -> None:
    hub = EventHub(epoch="t")
    server = await app_server(feed_app(hub))
    async with aiohttp.ClientSession() as session:
        async with session.get(
            url_of(server, "/control/v2/events"), headers={"Authorization": "Bearer wrong"}
        ) as response:
            assert response.status == 401
    assert hub.subscribers == set() and sum(hub.closed_by_reason.values()) == 0


async def test_a_reader_that_never_reads_is_dropped_and_its_connection_aborted(app_server) -> None:
    hub = EventHub(epoch="t", queue_max=32)
    server = await app_server(feed_app(hub))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that stopped reading
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", server.port))
    await loop.sock_sendall(sock, request_bytes(server.port))
    await until(lambda: hub.subscribers, 5, "the reader to subscribe")

    published = 0
    with capture_logs() as logs:
        while hub.closed_by_reason[CloseReason.QUEUE_FULL] == 0:
            assert published < 20_000, "the stalled reader was never dropped"
            hub.publish("route.finished", row(f"att_{published}", status="completed"))
            published += 1
            await asyncio.sleep(0)  # let the handler write what the socket still takes
            assert all(len(s.queue) <= 32 for s in hub.subscribers)
    assert hub.queue_high_water == 32  # the queue filled to its bound, and not past it
    assert hub.subscribers == set()
    dropped = [e for e in logs if e["event"] == "event_subscriber_dropped"]
    assert len(dropped) == 1 and dropped[0]["reason"] == "queue-full"
    assert published > 32  # socket buffers took some first; the queue took the rest

    # The server aborted the connection: reading what was buffered ends in EOF or a reset.
    received = 0
    try:
        while chunk := await asyncio.wait_for(loop.sock_recv(sock, 65536), 5):
            received += len(chunk)
    except ConnectionResetError:
        pass
    sock.close()
    assert received > 0


async def test_shutdown_ends_open_feeds_at_once(app_server) -> None:
    hub = EventHub(epoch="t")
    server = await app_server(feed_app(hub))
    session = aiohttp.ClientSession()
    response = await session.get(
        url_of(server, "/control/v2/events"), headers={"Authorization": f"Bearer {READ_TOKEN}"}
    )
    assert response.status == 200
    hub.publish("policy", {"name": "platform", "revision": 1})
    first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 5)
    assert first.startswith(b"id: t-1\nevent: policy\ndata: ")
    started = time.monotonic()
    await server.close()
    rest = await asyncio.wait_for(response.content.read(), 5)  # the stream ends, cleanly
    assert rest == b"" and time.monotonic() - started < 5
    assert hub.closed_by_reason[CloseReason.SHUTDOWN] == 1 and hub.subscribers == set()
    response.release()
    await session.close()


async def test_a_reader_that_closes_leaves_the_hub_within_the_liveness_check(app_server) -> None:
    # Its FIN alone: no heartbeat is due (15 s) and no event is published, so no write fails.
    hub = EventHub(epoch="t")
    server = await app_server(feed_app(hub))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(request_bytes(server.port))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200")
    await until(lambda: len(hub.subscribers) == 1, 5, "the reader to subscribe")
    writer.close()
    await until(lambda: not hub.subscribers, 3 * events_http.LIVENESS_CHECK_S + 2, "the closed reader to leave")
