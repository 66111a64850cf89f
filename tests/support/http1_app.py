"""The app the `shared.http1` tests serve: a few routes that show what the server did.

`/hello` answers JSON; `/echo` reads the body and answers it (counting reads in `READS`);
`/private/...` needs `Authorization: Bearer ok` (checked by a middleware before any handler, as
control's is) and answers 401 with `Connection: close` otherwise; `/gate` waits for `GATE`;
`/stream` writes `n` chunks of `size` bytes (counting them in `WRITTEN`); `/boom` raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from shared.http1 import web

GATE = web.AppKey("gate", asyncio.Event)
READS = web.AppKey("reads", list)
WRITTEN = web.AppKey("written", list)
LIFECYCLE = web.AppKey("lifecycle", list)


@web.middleware
async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
    if request.path.startswith("/private") and request.headers.get("Authorization") != "Bearer ok":
        return web.Response(
            body=b'{"error":"no"}', status=401, content_type="application/json", headers={"Connection": "close"}
        )
    return await handler(request)


async def hello(request: web.Request) -> web.Response:
    n = request.query.get("n", "")
    return web.Response(body=b'{"hello":"%s"}' % n.encode(), content_type="application/json")


async def echo(request: web.Request) -> web.Response:
    body = await request.read()
    request.app[READS].append(len(body))
    return web.Response(body=body, content_type="application/octet-stream")


async def gate(request: web.Request) -> web.Response:
    await request.app[GATE].wait()
    return web.Response(body=b"gate", content_type="text/plain")


async def stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    await response.prepare(request)
    size, n = int(request.query.get("size", "16")), int(request.query.get("n", "2"))
    for _ in range(n):
        await response.write(b"x" * size)
        request.app[WRITTEN].append(size)
    await response.write_eof()
    return response


async def boom(request: web.Request) -> web.Response:
    raise RuntimeError("a handler bug")


async def upkeep(app: web.Application) -> AsyncIterator[None]:
    app[LIFECYCLE].append("started")
    yield
    app[LIFECYCLE].append("cleaned")


async def on_shutdown(app: web.Application) -> None:
    app[LIFECYCLE].append("shutdown")
    app[GATE].set()


def build(max_size: int = 1024) -> web.Application:
    app = web.Application(middlewares=[auth], client_max_size=max_size)
    app[GATE], app[READS], app[WRITTEN], app[LIFECYCLE] = asyncio.Event(), [], [], []
    app.router.add_get("/hello", hello)
    app.router.add_post("/echo", echo)
    app.router.add_post("/private/echo", echo)
    app.router.add_get("/gate", gate)
    app.router.add_get("/stream", stream)
    app.router.add_get("/boom", boom)
    app.router.add_get("/breaks", breaks_midway)
    app.cleanup_ctx.append(upkeep)
    app.on_shutdown.append(on_shutdown)
    return app


def get(path: str, extra: str = "", version: str = "1.1") -> bytes:
    return f"GET {path} HTTP/{version}\r\nHost: t\r\n{extra}\r\n".encode()


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def breaks_midway(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    await response.write(b"partial")
    raise RuntimeError("a handler bug after its head went out")
