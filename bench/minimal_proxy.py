"""The floor a Python proxy can reach: aiohttp in, one aiohttp ClientSession out, nothing else.

Rule: this proxy does only what any pass-through must — read the body, forward it with the
end-to-end headers, relay status, headers and body chunk by chunk as they arrive — and nothing
a gateway adds (no authentication, no accounting, no logging, no usage scan). Whatever
Leasehold costs beyond this is the price of its features; the benchmark shows that price.

Usage: ``python -m bench.minimal_proxy --upstream http://127.0.0.1:PORT [--port 0]
[--port-file PATH]``. It runs under uvloop and stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

import aiohttp
import uvloop
from aiohttp import web

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)


async def relay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
    session = request.app[SESSION]
    async with session.request(
        request.method,
        request.app[UPSTREAM] + request.path_qs,
        data=body or None,
        headers=headers,
        allow_redirects=False,
    ) as upstream:
        out = [(k, v) for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP]
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=out)
        length = upstream.headers.get("Content-Length")
        if length is not None and length.isdigit():
            response.content_length = int(length)
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def _session_ctx(app: web.Application):
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
    app[SESSION] = aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None),
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
    )
    yield
    await app[SESSION].close()


def make_app(upstream: str) -> web.Application:
    app = web.Application(client_max_size=32 * 1024 * 1024)
    app[UPSTREAM] = upstream.rstrip("/")
    app.cleanup_ctx.append(_session_ctx)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


async def serve(upstream: str, host: str, port: int, port_file: str | None) -> None:
    runner = web.AppRunner(
        make_app(upstream), access_log=None, handle_signals=False, handler_cancellation=True, shutdown_timeout=1.0
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    bound = runner.addresses[0][1]
    if port_file:
        tmp = f"{port_file}.tmp{os.getpid()}"
        with open(tmp, "w") as fh:
            fh.write(str(bound))
        os.replace(tmp, port_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.minimal_proxy", description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", default=None)
    args = parser.parse_args(argv)
    uvloop.run(serve(args.upstream, args.host, args.port, args.port_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
