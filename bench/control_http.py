"""Control's HTTP layer, this checkout against others: `python -m bench.control_http [-n 5] [TREE ...]`.

Control alone (no data plane) from each checkout, all up at once; rounds alternate between
them (A B A B ...). A round is `--requests` sequential requests on one keep-alive connection,
raw bytes: `GET /healthz` (public) and `GET /control/v2/routes/recent?limit=1` (the auth
middleware, a read port, JSON). Reported per round: requests a second, and control's CPU time a
request (/proc/PID/stat: less at the mercy of a busy machine than the wall clock); then medians.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import time
from pathlib import Path

from bench.procs import module_argv
from bench.startup import cpu_s
from tests.support.harness import Gateway, Proc, wait_until

PATHS = ("/healthz", "/control/v2/routes/recent?limit=1")


def one_round(gw: Gateway, requests: int) -> tuple[float, float]:
    """(requests a second, control's CPU microseconds a request) for one keep-alive connection."""
    asks = [f"GET {p} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {gw.control_token}\r\n\r\n".encode() for p in PATHS]
    cpu0 = cpu_s(gw.control.popen.pid)
    with socket.create_connection(("127.0.0.1", gw.control_port)) as sock:
        t0 = time.perf_counter()
        for n in range(requests):
            sock.sendall(asks[n % 2])
            _read_one(sock)
        wall = time.perf_counter() - t0
    return requests / wall, (cpu_s(gw.control.popen.pid) - cpu0) / requests * 1e6


def _read_one(sock: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", type=Path)
    parser.add_argument("-n", "--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=4000)
    args = parser.parse_args(argv)
    trees: list[Path | None] = [None, *(t.resolve() for t in args.trees)]
    names = ["current" if t is None else f"@{t.name}" for t in trees]
    results: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="leasehold-control-http-") as tmp:
        gateways = []
        try:
            for index, tree in enumerate(trees):
                gw = Gateway(Path(tmp) / str(index), None)
                gw.control = Proc(module_argv("controlplane.main", tree), gw.env, gw.workdir / "control.log")
                gateways.append(gw)
            for gw in gateways:
                wait_until(lambda gw=gw: gw.healthz() is not None, 30, "control healthz")
                one_round(gw, 500)  # warm-up
            for trial in range(args.rounds):
                for name, gw in zip(names, gateways, strict=True):
                    rate, cpu_us = one_round(gw, args.requests)
                    results[name].append((rate, cpu_us))
                    print(f"  round {trial} {name:24s} {rate:8.0f} req/s, control CPU {cpu_us:6.1f} µs/req", flush=True)
        finally:
            for gw in gateways:
                gw.stop()
    print("medians (min–max):")
    for name, samples in results.items():
        rates, cpus = [s[0] for s in samples], [s[1] for s in samples]
        print(
            f"  {name:24s} {statistics.median(rates):8.0f} req/s ({min(rates):.0f}–{max(rates):.0f}), "
            f"control CPU {statistics.median(cpus):.1f} µs/req ({min(cpus):.1f}–{max(cpus):.1f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
