"""The hostile phase of `make bench` (issue 21, SPEC §19): what a hostile worker costs the others.

- `/healthz` latency (p50/p99/max over ~`seconds`) alone, then while 8 workers send gzip bombs
  back to back (64 KiB of gzip that inflates to 64 MiB);
- the same while 8 workers send near-limit bombs (Stop 30): ~32 KiB of gzip that inflates to
  just under `GATEWAY_MAX_BODY_BYTES` (32 MiB) of the costliest shape to parse, a model and
  `[0,0,0,...]`. Not refused 413, so each is read strictly (and forwarded);
- RSS per idle connection: the data plane's RSS before and after `idle` connections are opened
  (each sent nothing), and the cap 24 GiB would hold at that price;
- the connection cap held: `cap + 20` connections opened against a data plane started with
  `GATEWAY_MAX_CONNECTIONS=cap`: how many were refused (503 `connection-limit` or closed);
- the time to free a stalled client's slot: a worker that reads nothing of an 8 MiB stream on an
  account with request capacity 1, against `GATEWAY_CLIENT_STALL_SECONDS=1`: the seconds from
  its request until the account serves another request (bounded by `slot_wait_s`).

`python -m bench.hostile [--tree DIR]` runs it alone (against another checkout's daemons with
`--tree`, for a before/after); `bench.run` runs `measure` as its last phase.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.procs import rss_kib, start_gateway, start_stub
from tests.support.harness import Gateway, Stub, http

BOMB = gzip.compress(b'{"model":"claude-sonnet-4-6","x":"' + b"a" * (64 << 20) + b'"}', 9)
NEAR_LIMIT_BYTES = 32 * 1024 * 1024 - 1024  # under the default GATEWAY_MAX_BODY_BYTES
A_HEADERS = {"anthropic-version": "2023-06-01", "content-type": "application/json"}
GIB24_KIB = 24 * 1024 * 1024
ACCOUNTS = """
[[account]]
id = "bench-one-slot"
provider_binding = "anthropic"
base_url = "{url}"
auth_style = "x-api-key"
credential_env = "GATEWAY_BENCH_ONE_KEY"
models = ["claude-*"]
request_capacity = 1
"""


def near_limit_bomb(size: int = NEAR_LIMIT_BYTES) -> bytes:
    """gzip of `{"model":...,"max_tokens":8,"messages":[],"a":[0,0,...]}`, `size` bytes inflated."""
    head = b'{"model":"claude-sonnet-4-6","max_tokens":8,"messages":[],"a":['
    zeros = (size - len(head) - 3) // 2
    return gzip.compress(head + b"0," * zeros + b"0]}", 6)


def _quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(ordered[-1], 2),
    }


async def _healthz_latency(
    url: str, token: str, seconds: float, bombers: int, bomb_body: bytes = BOMB
) -> dict[str, Any]:
    stop = time.monotonic() + seconds
    samples: list[float] = []
    bombs = 0
    statuses: dict[int, int] = {}

    async def bomb(session: aiohttp.ClientSession) -> None:
        nonlocal bombs
        while time.monotonic() < stop:
            try:
                async with session.post(
                    url + "/v1/messages",
                    data=bomb_body,
                    headers={**A_HEADERS, "x-api-key": token, "content-encoding": "gzip"},
                ) as response:
                    await response.read()
                bombs += 1
                statuses[response.status] = statuses.get(response.status, 0) + 1
            except aiohttp.ClientError:
                pass

    async def probe(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            async with session.get(url + "/healthz") as response:
                await response.read()
            samples.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0.01)

    timeout = aiohttp.ClientTimeout(total=120)
    async with (
        aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as bombing,
        aiohttp.ClientSession(timeout=timeout) as probing,
    ):
        await asyncio.gather(probe(probing), *(bomb(bombing) for _ in range(bombers)))
    return {**_quantiles(samples), "bombers": bombers, "bombs_answered": bombs, "statuses": statuses}


def _idle_rss(gw: Gateway, count: int) -> dict[str, Any]:
    pid = gw.dataplane.popen.pid  # type: ignore[union-attr]
    before = rss_kib(pid) or 0
    held = [socket.create_connection(("127.0.0.1", gw.dataplane_port)) for _ in range(count)]
    time.sleep(1.0)  # let the data plane accept them all (a measurement, not a synchronisation)
    after = rss_kib(pid) or 0
    for sock in held:
        sock.close()
    per = max(0.01, (after - before) / count)
    return {
        "connections": count,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "kib_per_idle_connection": round(per, 2),
        "cap_24_gib_holds": int(GIB24_KIB / per),
    }


def _cap_held(gw: Gateway, cap: int) -> dict[str, Any]:
    held = [socket.create_connection(("127.0.0.1", gw.dataplane_port), timeout=2) for _ in range(cap + 20)]
    refused = 0
    for sock in held[cap:]:
        try:
            refused += sock.recv(64).startswith(b"HTTP/1.1 503") or 0
        except (TimeoutError, ConnectionResetError):
            pass
    for sock in held:
        sock.close()
    return {"cap": cap, "opened": cap + 20, "refused_503": refused}


def _mint_one_slot(gw: Gateway) -> str:
    """A v2 lease: the platform policy puts `bench-one-slot` (request capacity 1) first."""
    status, _, body = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": f"bench-{time.monotonic_ns()}",
            "repo_slug": "bench/run",
            "principal_kind": "worker",
            "principal_id": "bench",
            "model": "claude-sonnet-4-6",
        },
    )
    assert status == 201 and body["account_id"] == "bench-one-slot", body
    return body["token"]


def _stalled_slot(gw: Gateway, stub: Stub, wait_s: float) -> dict[str, Any]:
    token = _mint_one_slot(gw)
    event = "event: content_block_delta\ndata: " + json.dumps(
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x" * 65536}}
    )
    stub.script({"body": (event + "\n\n") * 128})
    body = json.dumps({"model": "claude-sonnet-4-6", "max_tokens": 8, "stream": True, "messages": []})
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", gw.dataplane_port))
    head = "".join(f"{k}: {v}\r\n" for k, v in {**A_HEADERS, "x-api-key": token}.items())
    t0 = time.monotonic()
    sock.send(f"POST /v1/messages HTTP/1.1\r\nHost: x\r\n{head}content-length: {len(body)}\r\n\r\n{body}".encode())
    freed = None
    plain = json.dumps({"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": []})
    time.sleep(0.2)  # the stalled stream has begun (a measurement pace, not a synchronisation)
    while time.monotonic() - t0 < wait_s:
        status, _, _ = http(
            "POST", gw.dataplane_url + "/v1/messages", plain.encode(), {**A_HEADERS, "x-api-key": token}
        )
        if status == 200:
            freed = round(time.monotonic() - t0, 2)
            break
        time.sleep(0.1)
    sock.close()
    return {"stall_bound_s": 1, "slot_freed_after_s": freed, "waited_up_to_s": wait_s}


def measure(
    stub: Stub,
    workdir: Path,
    tree: Path | None = None,
    seconds: float = 4.0,
    idle: int = 1000,
    cap: int = 64,
    slot_wait_s: float = 10.0,
    say=print,
    bombs_only: bool = False,
) -> dict[str, Any]:
    accounts = workdir / "accounts.toml"
    workdir.mkdir(parents=True, exist_ok=True)
    accounts.write_text(ACCOUNTS.format(url=stub.url))
    env = {
        "GATEWAY_ACCOUNTS_FILE": str(accounts),
        "GATEWAY_BENCH_ONE_KEY": stub.anthropic_key or "",
        "GATEWAY_MAX_CONNECTIONS": str(cap),
        "GATEWAY_CLIENT_STALL_SECONDS": "1",
    }
    gw = start_gateway(workdir / "gateway", stub, env, tree)
    try:
        status, _, body = gw.api(
            "PUT",
            "/control/v2/policy/level",
            {
                "name": "platform",
                "expected_revision": 0,
                "reason": "bench",
                "document": {"account_order": ["bench-one-slot"]},
            },
        )
        assert status == 200, body
        token = gw.mint("anthropic")["token"]
        say("hostile: /healthz alone, then under 8 gzip bombs ...")
        results: dict[str, Any] = {
            "healthz_alone": asyncio.run(_healthz_latency(gw.dataplane_url, token, seconds / 2, 0)),
            "healthz_under_bombs": asyncio.run(_healthz_latency(gw.dataplane_url, token, seconds, 8)),
        }
        say("hostile: /healthz under 8 near-limit bombs (Stop 30) ...")
        results["healthz_under_near_limit_bombs"] = asyncio.run(
            _healthz_latency(gw.dataplane_url, token, seconds, 8, near_limit_bomb())
        )
        if not bombs_only:
            say("hostile: the connection cap, the stalled client's slot ...")
            results["cap"] = _cap_held(gw, cap)
            results["stalled_slot"] = _stalled_slot(gw, stub, slot_wait_s)
    finally:
        gw.stop()
    if bombs_only:
        return results
    say(f"hostile: RSS of {idle} idle connections ...")
    gw = start_gateway(workdir / "idle", stub, {"GATEWAY_MAX_CONNECTIONS": str(idle + 100)}, tree)
    try:
        results["idle_rss"] = _idle_rss(gw, idle)
    finally:
        gw.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__.split("\n")[0])
    parser.add_argument("--tree", type=Path, default=None, help="run another checkout's daemons")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--bombs-only", action="store_true", help="only /healthz alone and under the bombs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="leasehold-hostile-") as tmp:
        stub = start_stub(Path(tmp) / "stub")
        try:
            results = measure(stub, Path(tmp) / "run", args.tree, args.seconds, bombs_only=args.bombs_only)
        finally:
            stub.stop()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
