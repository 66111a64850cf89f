"""A fleet mint + revoke in process, against an embedded one: `python -m bench.fleet_inproc
[--mode both|fleet|embedded] [-n N] [--sets S] [--profile FILE]`.

One control daemon's collaborators wired by the daemon's own `wire` (`tests/support/fleethosts`,
no listeners, no data plane): fleet mode over a real redis-server on loopback, embedded mode over
the in-process tables. N sequential v2 mints, each revoked at once (the account has a lease
ceiling, so the mint counts and reserves a slot), in S sets alternating the modes; prints per set
the p50 wall time and the process's CPU per mint + revoke (ms). No HTTP, no data plane, no other
pair: what fleet mode adds to control's own path, the figure a shared machine moves least
(bench/README "Stop 31: fleet mint + revoke cost", "Stop 32"). `--profile FILE` writes a
cProfile of each mode's sets (`FILE.fleet`, `FILE.embedded`; `python -m pstats FILE.fleet`).
`--exchange` times `BatchingRedis` alone instead: N gathers of 5 commands (one exchange each).
`--instructions` counts instead the instructions the process executes per mint + revoke of each
mode (callgrind, collection on around one set of N: `bench.instructions`' method), a figure the
shared machine's load does not move (user space only: the same writes cost the same either way).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.instructions import _callgrind, _control, _total
from controlplane.registry import Registry
from controlplane.wiring import Control
from shared.fleet.batching import BatchingRedis
from shared.fleet.redis_client import connect
from shared.logging import configure_logging
from tests.support.control import close_control, make_control
from tests.support.fleethosts import FleetHosts, accounts, mint
from tests.support.redis_server import RedisServer

WARM = 30
CEILINGS: dict[str, int | None] = {"acct-a": 8}


async def ops(control: Control, n: int, tag: str) -> tuple[float, float]:
    """p50 wall ms and CPU ms per mint + revoke over `n` of them."""
    walls = []
    cpu = time.process_time()
    for i in range(n):
        began = time.perf_counter()
        answer = await mint(control, f"{tag}-{i}")
        assert answer.status == 201, answer.body
        assert await control.service.revoke(answer.body["key_id"])
        walls.append(time.perf_counter() - began)
    return statistics.median(walls) * 1000, (time.process_time() - cpu) / n * 1000


async def exchanges(args: argparse.Namespace, work: Path) -> None:
    """p50 wall and CPU per 5-command exchange (`BatchingRedis`, a real redis-server)."""
    server = RedisServer(work / "redis").start()
    plain = connect(server.url)
    client = BatchingRedis(plain)
    try:
        await client.set("k", "v")
        for s in range(args.sets):
            walls = []
            cpu = time.process_time()
            for _ in range(args.n):
                began = time.perf_counter()
                await asyncio.gather(
                    client.get("k"), client.get("k"), client.hlen("h"), client.smembers("s"), client.get("k")
                )
                walls.append(time.perf_counter() - began)
            per = (time.process_time() - cpu) / args.n * 1e6
            print(f"set {s}: exchange p50 {statistics.median(walls) * 1e6:.0f} us cpu {per:.0f} us", flush=True)
    finally:
        await client.aclose()
        await plain.aclose()
        server.stop()


async def run(args: argparse.Namespace, work: Path) -> None:
    server = RedisServer(work / "redis").start()
    hosts = FleetHosts(work / "fleet", server.url, "b", accounts(CEILINGS))
    specs = accounts(CEILINGS)
    embedded = make_control(
        work / "embedded", env={s.credential_env: "sk-test-" + s.id for s in specs}, registry=Registry(specs)
    )
    profiles = {mode: cProfile.Profile() for mode in ("fleet", "embedded")} if args.profile else {}
    try:
        fleet = await hosts.add("h1")
        controls = {"fleet": fleet, "embedded": embedded}
        modes = ("fleet", "embedded") if args.mode == "both" else (args.mode,)
        for mode in modes:
            await ops(controls[mode], WARM, f"warm-{mode}")
        for s in range(args.sets):
            line = []
            for mode in modes:
                if profiles:
                    profiles[mode].enable()
                _gate(args)
                p50, cpu = await ops(controls[mode], args.n, f"{mode}-{s}")
                _gate(args)
                if profiles:
                    profiles[mode].disable()
                line.append(f"{mode} p50 {p50:.2f} cpu {cpu:.2f}")
            print(f"set {s}: " + "  ".join(line), flush=True)
    finally:
        await hosts.stop_all()
        close_control(embedded)
        server.stop()
        for mode, profile in profiles.items():
            profile.dump_stats(f"{args.profile}.{mode}")


def _gate(args: argparse.Namespace) -> None:
    """`--gate` (the child of `--instructions`): say so, and wait until collection is switched."""
    if args.gate:
        print("gate", flush=True)
        sys.stdin.readline()


def instructions(args: argparse.Namespace, work: Path) -> None:
    """Instructions per mint + revoke of each mode, each in a process of its own under callgrind."""
    for mode in ("fleet", "embedded") if args.mode == "both" else (args.mode,):
        out = work / f"callgrind.{mode}"
        argv = [sys.executable, "-m", "bench.fleet_inproc", "--mode", mode, "-n", str(args.n), "--sets", "1", "--gate"]
        child = subprocess.Popen(_callgrind(argv, out), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdin is not None and child.stdout is not None
        for switch in ("on", "off"):
            while child.stdout.readline().strip() != "gate":
                if child.poll() is not None:
                    raise RuntimeError(f"the {mode} child exited {child.returncode}")
            _control(child.pid, "-i", switch)
            child.stdin.write("go\n")
            child.stdin.flush()
        child.stdout.read()
        child.wait(timeout=600)
        print(f"{mode}: {_total(out) / args.n / 1000:.1f}k instructions per mint + revoke", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("both", "fleet", "embedded"), default="both")
    parser.add_argument("-n", type=int, default=300)
    parser.add_argument("--sets", type=int, default=3)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--exchange", action="store_true")
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--gate", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    configure_logging("control", stream=open(os.devnull, "w"))  # the daemon's JSON lines, unread
    with tempfile.TemporaryDirectory(prefix="bench-fleet-inproc-") as tmp:
        if args.instructions:
            instructions(args, Path(tmp))
            return
        asyncio.run((exchanges if args.exchange else run)(args, Path(tmp)))


if __name__ == "__main__":
    main()
