"""CPU per v2 mint + revoke, or per request to a ceilinged account, per process:
`python -m bench.fleet_cpu [--mode fleet|embedded] [--op mint|request] [-n N]`.

One pair (fleet mode: with its own redis-server on loopback; embedded: none), sequential mint +
revoke through an HTTP client from outside, N times; or (`--op request`) N sequential requests on
one keep-alive connection to an account with a request ceiling (`request_capacity`, so in fleet
mode the data plane asks Redis for each slot, and control folds each row into the fleet's circuit
and decision evidence). Prints the p50 of one operation and the CPU each process (control, data
plane, redis-server, the stub) spent per operation, read from
`/proc/<pid>/stat`, less what it spends idle (its background loops, measured over one second
before). CPU is the figure a loaded machine moves least: a wall-clock latency there is mostly
waiting for a time slice (issue 27 §4, bench/README "Stop 30").
"""

from __future__ import annotations

import argparse
import http.client
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import fleet_requests
from bench.fleet import CAPPED, CAPPED_MODEL
from tests.support.fleetpairs import FleetPairs, accounts_toml, mint
from tests.support.harness import Gateway, Stub, credential_like
from tests.support.redis_server import RedisServer

WARM = 30


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mint_op(gw: Gateway) -> Callable[[int], None]:
    def op(i: int) -> None:
        status, _, body = mint(gw, f"cpu-{i}", repo_slug="bench/cpu")
        assert status == 201, body
        assert gw.revoke(body["key_id"])

    return op


def request_op(gw: Gateway) -> Callable[[int], None]:
    host, port = gw.dataplane_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port))
    token = fleet_requests._mint(gw, CAPPED_MODEL)
    return lambda _i: None if fleet_requests._timed(conn, token, CAPPED_MODEL) else None


def measure(op: Callable[[int], None], pids: dict[str, int], n: int) -> dict[str, float]:
    for i in range(WARM):
        op(-1 - i)
    start = {name: cpu_s(pid) for name, pid in pids.items()}
    time.sleep(1.0)
    idle = {name: cpu_s(pid) - start[name] for name, pid in pids.items()}  # per second
    start = {name: cpu_s(pid) for name, pid in pids.items()}
    began = time.perf_counter()
    latencies = []
    for i in range(n):
        sent = time.perf_counter()
        op(i)
        latencies.append(time.perf_counter() - sent)
    wall = time.perf_counter() - began
    out = {"p50_ms": sorted(latencies)[n // 2] * 1000}
    for name, pid in pids.items():
        out[f"{name}_cpu_ms"] = (cpu_s(pid) - start[name] - idle[name] * wall) / n * 1000
    return out


def run(mode: str, n: int, work: Path, what: str = "mint") -> dict[str, float]:
    stub = Stub(work / "stub", anthropic_key=credential_like("sk-ant-api03-"), openai_key=None)
    redis = RedisServer(work / "redis").start()
    pairs = gw = None
    capped = CAPPED.format(url=stub.url)
    try:
        if mode == "fleet":
            pairs = FleetPairs(
                work / "fleet", stub, redis, 1, accounts=accounts_toml(stub, lease_capacity=None, extra=capped)
            ).start()
            gw = pairs[0]
        else:
            accounts = work / "accounts.toml"
            accounts.write_text(accounts_toml(stub, lease_capacity=None, extra=capped))
            gw = Gateway(
                work / "embedded",
                stub,
                {
                    "GATEWAY_ACCOUNTS_FILE": str(accounts),
                    "GATEWAY_TEAM_A_KEY": stub.anthropic_key or "",
                    "GATEWAY_TEAM_B_KEY": stub.anthropic_key or "",
                },
            ).start()
        assert gw.control is not None and gw.dataplane is not None and redis.popen is not None
        pids = {"control": gw.control.popen.pid, "dataplane": gw.dataplane.popen.pid}
        if mode == "fleet":
            pids["redis"] = redis.popen.pid
        pids["stub"] = stub.proc.popen.pid
        return measure(mint_op(gw) if what == "mint" else request_op(gw), pids, n)
    finally:
        if pairs is not None:
            pairs.stop()
        elif gw is not None:
            gw.stop()
        redis.stop()
        stub.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("fleet", "embedded"), default="fleet")
    parser.add_argument("--op", choices=("mint", "request"), default="mint")
    parser.add_argument("-n", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-fleet-cpu-") as tmp:
        result = run(args.mode, args.n, Path(tmp), args.op)
    print(args.mode, args.op, " ".join(f"{k} {v:.2f}" for k, v in result.items()))


if __name__ == "__main__":
    main()
