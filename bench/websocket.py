"""`make bench`'s WebSocket phase (SPEC §20): direct vs a naive aiohttp relay vs Leasehold.

Every column talks to the same stamped upstream (`bench/ws_servers.py upstream`): each delta
event carries its send time (`time.monotonic_ns()`, one clock for the machine), so the client
reads each message's one-way latency; the added latency of a relay is its figure minus the
direct one, measured in the same run. Per column:
- latency: one socket, `turns` turns of `events` deltas `gap_ms` apart (unloaded), p50/p99;
- messages/s through one socket (a turn of `burst` deltas, back to back) and across `sockets`
  sockets at once (a turn of `events` each);
- RSS per open socket: the server's RSS with `sockets` idle sockets open, minus before, per socket.
The aim (issue 23): Leasehold's p50 and p99 ≤ the naive relay's + 0.2 ms per message.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from bench.procs import rss_kib
from bench.stats import percentile
from tests.support.harness import Gateway, Proc, base_env, wait_until

AIM_ADDED_MS = 0.2


class WsPlan(msgspec.Struct, frozen=True, kw_only=True):
    turns: int = 5
    events: int = 200
    gap_ms: float = 1.0
    burst: int = 5000
    sockets: int = 200


def _server(kind: str, workdir: Path, upstream: str | None = None) -> tuple[Proc, str]:
    port_file = workdir / f"ws-{kind}.port"
    argv = [sys.executable, "-m", "bench.ws_servers", kind, "--port-file", str(port_file)]
    if upstream:
        argv += ["--upstream", upstream]
    proc = Proc(argv, base_env(), workdir / f"ws-{kind}.log")
    port = wait_until(
        lambda: proc.require_alive(f"ws {kind}") and port_file.exists() and port_file.read_text(), 20, f"ws {kind} port"
    )
    return proc, f"http://127.0.0.1:{int(port)}"


def _create(n: int, gap_ms: float) -> str:
    return msgspec.json.encode(
        {"type": "response.create", "model": "gpt-5", "input": "hi", "n": n, "gap_ms": gap_ms}
    ).decode()


async def _turn(ws: aiohttp.ClientWebSocketResponse, n: int, gap_ms: float, latencies: list[float] | None) -> int:
    """One turn; its message count (and each delta's one-way latency in ms, when asked)."""
    await ws.send_str(_create(n, gap_ms))
    count = 0
    while True:
        msg = await ws.receive(timeout=60)
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise RuntimeError(f"socket ended mid-turn: {msg.type} {msg.data!r}")
        now = time.monotonic_ns()
        count += 1
        data = msg.data
        if data.startswith('{"type":"response.completed"'):
            return count
        if latencies is not None:
            latencies.append((now - int(data[data.rindex(":") + 1 : -1])) / 1e6)


async def _column(url: str, token: str, pid: int | None, plan: WsPlan) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}", "openai-beta": "responses_websockets=2026-02-06"}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def connect() -> aiohttp.ClientWebSocketResponse:
            return await session.ws_connect(url + "/v1/responses", headers=headers, max_msg_size=0)

        ws = await connect()
        await _turn(ws, 20, 0, None)  # warm
        latencies: list[float] = []
        for _ in range(plan.turns):
            await _turn(ws, plan.events, plan.gap_ms, latencies)
        t0 = time.perf_counter()
        count = await _turn(ws, plan.burst, 0, None)
        one_socket = count / (time.perf_counter() - t0)
        await ws.close()
        rss0 = rss_kib(pid) if pid else None
        many = [await connect() for _ in range(plan.sockets)]
        rss1 = rss_kib(pid) if pid else None
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(_turn(w, plan.events, 0, None) for w in many))
        fan = sum(counts) / (time.perf_counter() - t0)
        await asyncio.gather(*(w.close() for w in many))
    latencies.sort()
    return {
        "p50_ms": round(percentile(latencies, 50), 4),
        "p99_ms": round(percentile(latencies, 99), 4),
        "messages": len(latencies),
        "msgs_per_s_one_socket": round(one_socket),
        f"msgs_per_s_{plan.sockets}_sockets": round(fan),
        "rss_kib_per_open_socket": None if rss0 is None or rss1 is None else round((rss1 - rss0) / plan.sockets, 1),
    }


def run(workdir: Path, plan: WsPlan, say=print) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    upstream, upstream_url = _server("upstream", workdir)
    relay, relay_url = _server("relay", workdir, upstream_url)
    key = "sk-bench-" + secrets.token_hex(12)
    gw = Gateway(
        workdir / "ws-gateway",
        None,
        {"GATEWAY_OPENAI_BASE_URL": upstream_url, "GATEWAY_OPENAI_API_KEY": key, "GATEWAY_LOG_LEVEL": "warning"},
    )
    try:
        gw.start()
        token = gw.mint("openai")["token"]
        columns = {
            "direct": (upstream_url, key, upstream.popen.pid),
            "naive relay": (relay_url, key, relay.popen.pid),
            "leasehold": (gw.dataplane_url, token, gw.dataplane.popen.pid),
        }
        out: dict[str, Any] = {"plan": msgspec.to_builtins(plan)}
        for name, (url, bearer, pid) in columns.items():
            say(f"websocket: {name} ...")
            out[name] = asyncio.run(_column(url, bearer, pid, plan))
        out["derived"] = derived(out)
        return out
    finally:
        gw.stop()
        relay.stop()
        upstream.stop()


def derived(out: dict[str, Any]) -> dict[str, Any]:
    """Added latency per message over direct, and the aim: Leasehold ≤ naive + 0.2 ms."""
    d, naive, ours = out["direct"], out["naive relay"], out["leasehold"]
    added = {
        f"{name}_added_{q}_ms": round(col[f"{q}_ms"] - d[f"{q}_ms"], 4)
        for name, col in (("naive", naive), ("leasehold", ours))
        for q in ("p50", "p99")
    }
    added["aim_met"] = all(ours[f"{q}_ms"] <= naive[f"{q}_ms"] + AIM_ADDED_MS for q in ("p50", "p99"))
    return added


if __name__ == "__main__":
    import json
    import tempfile

    quick = WsPlan(turns=2, events=100, burst=2000, sockets=50) if "--quick" in sys.argv else WsPlan()
    print(json.dumps(run(Path(tempfile.mkdtemp(prefix="leasehold-ws-bench-")), quick), indent=2))
