"""The event feed's bytes on the wire are aiohttp-sse's: the same handler, once on aiohttp with
`aiohttp_sse.EventSourceResponse(sep="\\n")` and once on `shared.http1` with ours, answers the
same head (Date and Server aside) and the same framed body, pings included."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web as aioweb
from aiohttp_sse import EventSourceResponse as TheirSSE

from shared.http1 import web
from tests.support.http1 import Answer

EVENTS = [
    ("line one\nline two", "t-1", "route.finished"),
    ("x", "t-2", "policy"),
    ("crlf\r\nand\rcr", None, None),
    ("", "t-4", "gap"),
]
REQUEST = b"GET /feed HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n"


def feed(kind: Any, ping_s: float) -> Any:
    async def handler(request: Any) -> Any:
        response = kind(sep="\n")
        response.ping_interval = ping_s
        await response.prepare(request)
        for data, event_id, event in EVENTS:
            await response.send(data, id=event_id, event=event)
        if ping_s < 1:
            await asyncio.sleep(ping_s * 3.5)  # a wait the pings fill: what is compared is their bytes
        response.stop_streaming()
        return response

    return handler


async def fetch(port: int) -> Answer:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(REQUEST)
    answer = await Answer.read(reader)
    writer.close()
    return answer


async def theirs(ping_s: float) -> Answer:
    app = aioweb.Application()
    app.router.add_get("/feed", feed(TheirSSE, ping_s))
    runner = aioweb.AppRunner(app)
    await runner.setup()
    site = aioweb.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        return await fetch(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def ours(app_server: Any, ping_s: float) -> Answer:
    app = web.Application()
    app.router.add_get("/feed", feed(web.EventSourceResponse, ping_s))
    return await fetch((await app_server(app)).port)


def head_without_date_and_server(answer: Answer) -> list[tuple[str, str]]:
    return [(k, v) for k, v in answer.headers.items() if k not in ("date", "server")]


async def test_events_are_framed_byte_for_byte_as_aiohttp_sse_frames_them(app_server: Any) -> None:
    a, b = await theirs(60), await ours(app_server, 60)
    assert b.status_line == a.status_line == "HTTP/1.1 200 OK"
    assert head_without_date_and_server(b) == head_without_date_and_server(a)
    first = b"id: t-1\nevent: route.finished\ndata: line one\ndata: line two\n\n"
    assert b.body == a.body and b.body.startswith(first)
    wire = b.raw.split(b"\r\n\r\n", 1)[1]
    assert wire == a.raw.split(b"\r\n\r\n", 1)[1]  # the chunks' framing too: one chunk per event
    assert wire.startswith(b"%x\r\n%b\r\n" % (len(first), first)) and wire.endswith(b"\r\n0\r\n\r\n")


async def test_pings_are_aiohttp_sses(app_server: Any) -> None:
    a, b = await theirs(0.05), await ours(app_server, 0.05)
    for answer in (a, b):
        assert answer.body.count(b"\n\n: ping\n\n") >= 1 or answer.body.endswith(b": ping\n\n")
    assert b.body.split(b": ping")[0] == a.body.split(b": ping")[0]
