"""A forged heartbeat makes no dead host live and lifts no hold (SPEC §19), against two real pairs
sharing a real redis-server: while B's control is stopped (SIGSTOP), a Redis writer without the
fleet secret keeps B's heartbeat score fresh in `hosts:seen` and writes a seal with a made-up
MAC. B's data plane still refuses its ceilinged account (its place lapsed: no sealed heartbeat),
A does not count B live, and A counts the forged seal
(`leasehold_fleet_entries_rejected_total{kind="heartbeat"}`). Once B's control runs again its
own sealed heartbeats make it live and serving. Before heartbeats were sealed, the forged score
kept B's data plane serving the ceilinged account on a place it had lost. (And the data plane's
own Redis loops are listed, supervised, in its control's fleet view and metrics.)"""

from __future__ import annotations

import base64
import secrets
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from shared.fleet.keys import FleetKeys
from tests.support.fleetpairs import FleetPairs, call, fleet_of, mint
from tests.support.harness import Gateway, Stub
from tests.support.redis_server import RedisServer
from tests.support.waits import wait_until


@pytest.fixture
def two(tmp_path: Path, stub: Stub) -> Iterator[FleetPairs]:
    server = RedisServer(tmp_path / "redis").start()
    pairs = FleetPairs(tmp_path / "fleet", stub, server, 2)
    try:
        yield pairs.start()
    finally:
        pairs.stop()
        server.stop()


class Forger:
    """A writer without the secret: B's score made fresh, with a seal it cannot make, every 0.2 s."""

    def __init__(self, pairs: FleetPairs, host_id: str) -> None:
        self.keys = FleetKeys(pairs.fleet_id)
        self.client = redis.Redis(host="127.0.0.1", port=pairs.redis.port, socket_timeout=5)
        self.host_id = host_id
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            seconds, micros = self.client.time()
            now_ms = seconds * 1000 + micros // 1000
            tag = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
            self.client.zadd(self.keys.hosts_seen, {self.host_id: now_ms})
            self.client.hset(self.keys.hosts_beat, self.host_id, f"{now_ms}:{tag}")
            self.stop.wait(0.2)

    def __enter__(self) -> Forger:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)
        self.client.close()


def rejected_heartbeats(gw: Gateway) -> float:
    text = gw.api("GET", "/metrics")[2]
    for line in (text if isinstance(text, str) else "").splitlines():
        if line.startswith('leasehold_fleet_entries_rejected_total{kind="heartbeat"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_forged_heartbeat_neither_lifts_the_lapse_nor_makes_a_stopped_host_live(two: FleetPairs) -> None:
    a, b = two[0], two[1]
    capped = mint(b, "beat-1")[2]
    assert capped["account_id"] == "team-a", capped  # team-a has a lease ceiling
    assert call(b, capped["token"])[0] == 200
    assert rejected_heartbeats(a) == 0
    wait_until(
        lambda: {"dataplane:standing", "dataplane:upkeep"} <= {loop["name"] for loop in fleet_of(b)["loops"]},
        15,
        "B's control to list its data plane's supervised loops",
    )
    assert 'leasehold_fleet_loop_restarts_total{loop="dataplane:standing"} 0.0' in b.api("GET", "/metrics")[2]
    b.control.popen.send_signal(signal.SIGSTOP)  # B's data plane runs on, its control is silent
    try:
        with Forger(two, "gw-b"):

            def refused() -> bool:
                status, _, body = call(b, capped["token"])
                return status == 503 and body["error"]["code"] == "fleet-state-unavailable"

            wait_until(refused, 15, "B's data plane to hold team-a despite the forged heartbeat")
            wait_until(lambda: fleet_of(a)["hosts_live"] == 1, 15, "A to count only itself live")
            wait_until(lambda: rejected_heartbeats(a) > 0, 15, "A to count the forged seal")
            assert refused()  # still held, the forger still writing
    finally:
        b.control.popen.send_signal(signal.SIGCONT)
    two.wait_hosts_live(2, 20)
    wait_until(lambda: call(b, capped["token"])[0] in (200, 401), 15, "B serving again (or ending the lease)")
