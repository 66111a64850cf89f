"""The WebSocket phase's two servers (SPEC §20): a stamped upstream and a naive relay.

- ``upstream``: a Responses WebSocket that answers each ``response.create`` with ``n`` delta
  events (``"n"``, ``"gap_ms"`` in the create), each stamped with ``time.monotonic_ns()`` at send
  (``"t"``: one clock for every process on the machine), then ``response.completed`` with usage.
- ``relay``: the floor a Python WebSocket proxy can reach: aiohttp in, ``ws_connect`` out, text
  frames relayed both ways, nothing else (no authentication, no gates, no rows, no parsing).

Usage: ``python -m bench.ws_servers upstream|relay [--upstream URL] --port-file PATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time

import aiohttp
import uvloop
from aiohttp import WSMsgType, web

DELTA = (
    '{"type":"response.output_text.delta","sequence_number":%d,"item_id":"msg_bench0000000001",'
    '"output_index":0,"content_index":0,"delta":"token ","logprobs":[],"t":%d}'
)
COMPLETED = json.dumps(
    {
        "type": "response.completed",
        "response": {
            "id": "resp_bench",
            "object": "response",
            "status": "completed",
            "model": "gpt-5",
            "output": [],
            "usage": {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 1},
        },
    },
    separators=(",", ":"),
)
UPSTREAM = web.AppKey("upstream", str)
SESSION = web.AppKey("session", aiohttp.ClientSession)


async def upstream(request: web.Request) -> web.StreamResponse:
    ws = web.WebSocketResponse(max_msg_size=64 * 1024 * 1024)
    await ws.prepare(request)
    async for msg in ws:
        if msg.type != WSMsgType.TEXT:
            continue
        create = json.loads(msg.data)
        gap_s = float(create.get("gap_ms", 0)) / 1000
        for i in range(int(create.get("n", 100))):
            if gap_s:
                await asyncio.sleep(gap_s)
            await ws.send_str(DELTA % (i, time.monotonic_ns()))
        await ws.send_str(COMPLETED)
    return ws


async def relay(request: web.Request) -> web.StreamResponse:
    headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "openai-beta")}
    up = await request.app[SESSION].ws_connect(
        request.app[UPSTREAM] + request.path_qs, headers=headers, max_msg_size=64 * 1024 * 1024
    )
    down = web.WebSocketResponse(max_msg_size=64 * 1024 * 1024)
    await down.prepare(request)

    async def pump(src, dst) -> None:
        async for msg in src:
            if msg.type == WSMsgType.TEXT:
                await dst.send_str(msg.data)
            elif msg.type == WSMsgType.BINARY:
                await dst.send_bytes(msg.data)

    tasks = [asyncio.ensure_future(pump(down, up)), asyncio.ensure_future(pump(up, down))]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()
    await up.close()
    await down.close()
    return down


async def _session_ctx(app: web.Application):
    app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    yield
    await app[SESSION].close()


async def serve(kind: str, upstream_url: str | None, port_file: str) -> None:
    app = web.Application()
    if kind == "relay":
        app[UPSTREAM] = upstream_url.replace("http://", "ws://")  # type: ignore[union-attr]
        app.cleanup_ctx.append(_session_ctx)
        app.router.add_get("/{tail:.*}", relay)
    else:
        app.router.add_get("/{tail:.*}", upstream)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    port = runner.addresses[0][1]
    tmp = f"{port_file}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(str(port))
    os.replace(tmp, port_file)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ws_servers")
    parser.add_argument("kind", choices=("upstream", "relay"))
    parser.add_argument("--upstream", default=None)
    parser.add_argument("--port-file", required=True)
    args = parser.parse_args(argv)
    uvloop.run(serve(args.kind, args.upstream, args.port_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
