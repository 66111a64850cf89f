"""What fleet mode asks Redis, per operation: `python -m bench.fleet_trips`.

One fleet pair and one redis-server on loopback; a `MONITOR` connection records every command
Redis receives while a v2 mint, a request to an account with a request ceiling (two in a row:
the first's release rides with the second's reserve) and a revoke are sent one at a time, with
quiet gaps between them. Prints each operation's commands in arrival order with the gap before
each (commands sent at once arrive together: that is one round trip, several commands). Counts,
not timings: the same on a busy machine as on a quiet one. Background loops (heartbeats, chain
polls, the in-flight board) may land inside a window; they are marked by their client port.
"""

from __future__ import annotations

import http.client
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.fleet_requests import _mint, _timed
from tests.support.fleetpairs import FleetPairs, accounts_toml, mint
from tests.support.harness import Stub, credential_like
from tests.support.redis_server import RedisServer

CAPPED = """
[[account]]
id = "capped"
provider_binding = "anthropic"
base_url = "{url}"
auth_style = "x-api-key"
credential_env = "GATEWAY_TEAM_B_KEY"
models = ["capped-*"]
request_capacity = 8
"""


def monitor(port: int, lines: list[tuple[float, str]], stop: threading.Event) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"MONITOR\r\n")
        sock.settimeout(0.1)
        buffer = b""
        while not stop.is_set():
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                return
            *done, buffer = (buffer + data).split(b"\r\n")
            now = time.perf_counter()
            lines.extend((now, line.decode(errors="replace")) for line in done)


def show(name: str, window: list[tuple[float, str]]) -> None:
    sent = [line for _, line in window if "[0 lua]" not in line and line.startswith("+")]
    print(f"{name}: {len(sent)} commands from clients")
    last = None
    for line in sent:
        stamp, rest = line.split(" ", 1)
        at = float(stamp[1:])
        gap = "" if last is None else f"+{(at - last) * 1000:6.2f} ms"
        last = at
        print(f"  {gap:>10}  {rest[:110]}")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-trips-") as tmp:
        work = Path(tmp)
        stub = Stub(work / "stub", anthropic_key=credential_like("sk-ant-api03-"), openai_key=None)
        redis = RedisServer(work / "redis").start()
        accounts = accounts_toml(stub, lease_capacity=2, extra=CAPPED.format(url=stub.url))
        pairs = FleetPairs(work / "fleet", stub, redis, 1, accounts=accounts).start()
        gw = pairs[0]
        lines: list[tuple[float, str]] = []
        stop = threading.Event()
        try:
            for n in range(3):  # warm: scripts loaded, pools' connections open
                gw.revoke(mint(gw, f"warm-{n}", repo_slug="bench/trips")[2]["key_id"])
            host, port = gw.dataplane_url.removeprefix("http://").split(":")
            conn = http.client.HTTPConnection(host, int(port))
            token = _mint(gw, "capped-1")
            for _ in range(3):  # warm: both reserve scripts and the flush's loaded
                _timed(conn, token, "capped-1")
            time.sleep(0.05)
            _timed(conn, token, "capped-1")
            watcher = threading.Thread(target=monitor, args=(redis.port, lines, stop))
            watcher.start()
            time.sleep(0.3)  # a measurement's quiet gap, not synchronisation
            windows = []
            minted: dict = {}
            for name, op in (
                ("mint (v2)", lambda: mint(gw, "trip", repo_slug="bench/trips")[2]),
                ("two ceilinged requests", lambda: [_timed(conn, token, "capped-1") for _ in range(2)]),
                ("revoke", None),
            ):
                t0 = time.perf_counter()
                result = op() if op is not None else gw.revoke(minted["key_id"])
                if name.startswith("mint"):
                    minted = result
                time.sleep(0.01)
                windows.append((name, t0, time.perf_counter()))
                time.sleep(0.3)
            stop.set()
            watcher.join()
            conn.close()
            for name, t0, t1 in windows:
                show(name, [(t, line) for t, line in lines if t0 <= t <= t1])
        finally:
            stop.set()
            pairs.stop()
            redis.stop()
            stub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
