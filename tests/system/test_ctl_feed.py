"""`leaseholdctl events` against the control daemon's real feed (SPEC §11, `GET /control/v2/events`).

The client half (parsing, resume, refusals) is pinned by `tests/integration/test_ctl_events.py`.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import Gateway, Stub
from tests.support.waits import wait_until
from tests.system.test_ctl import CTL, call, ctl, ctl_env


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, stub: Stub) -> Iterator[Gateway]:
    gateway = Gateway(tmp_path_factory.mktemp("ctl-feed"), stub).start()
    try:
        yield gateway
    finally:
        gateway.stop()


class Tail:
    """`leaseholdctl events ...` running in the background, its output in files."""

    def __init__(self, gw: Gateway, workdir: Path, *argv: str) -> None:
        self.out, self.err = workdir / "events.out", workdir / "events.err"
        self.proc = subprocess.Popen(
            [*CTL, "events", *argv],
            env=ctl_env(gw),
            stdin=subprocess.DEVNULL,
            stdout=self.out.open("w"),
            stderr=self.err.open("w"),
        )

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]

    def stderr(self) -> str:
        return self.err.read_text()

    def wait_connected(self, times: int = 1) -> None:
        wait_until(lambda: self.stderr().count("connected to") >= times, 20, f"connection #{times} to the feed")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def mentions(event: dict[str, Any], text: str) -> bool:
    return text in json.dumps(event["data"])


def one_request(gw: Gateway) -> str:
    minted = gw.mint()
    assert call(gw, minted["token"]) == 200
    row = wait_until(lambda: [r for r in gw.ledger() if r["key_id"] == minted["key_id"]], 10, "the row")[0]
    gw.revoke(minted["key_id"])
    return row["attempt_id"]


def test_a_route_starts_then_finishes_and_a_resume_replays_it(gw: Gateway, clean_stub: Stub, tmp_path: Path) -> None:
    tail = Tail(gw, tmp_path)
    try:
        tail.wait_connected()
        attempt = one_request(gw)

        def both() -> list[dict[str, Any]] | None:
            seen = [e for e in tail.events() if mentions(e, attempt)]
            return seen if any(e["event"] == "route.finished" for e in seen) else None

        kinds = wait_until(both, 10, "route.finished on the feed")
    finally:
        tail.stop()
    assert [e["event"] for e in kinds[:2]] == ["route.started", "route.finished"]
    assert all(e["id"] is not None for e in kinds)

    resumed = ctl(gw, "events", "--last-event-id", kinds[0]["id"], "--max-events", "1", "--no-reconnect")
    assert resumed.returncode == 0, resumed.stderr
    first = json.loads(resumed.stdout.splitlines()[0])
    assert first["event"] == "route.finished" and mentions(first, attempt)


def test_an_unknown_id_yields_one_gap_first(gw: Gateway) -> None:
    done = ctl(gw, "events", "--last-event-id", "never-held-0", "--max-events", "1", "--no-reconnect")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[0])["event"] == "gap"


def test_events_reconnect_after_a_control_restart(make_gateway, clean_stub: Stub, tmp_path: Path) -> None:
    own = make_gateway().start()
    tail = Tail(own, tmp_path)
    try:
        tail.wait_connected()
        one_request(own)
        wait_until(lambda: any(e["id"] for e in tail.events()), 10, "an event with an id")
        own.control.kill()  # a crash drops the feed as surely as a restart, and fast
        own.start_control()
        tail.wait_connected(times=2)
        assert "reconnecting" in tail.stderr() and "resuming after id" in tail.stderr()
        wait_until(lambda: any(e["event"] == "gap" for e in tail.events()), 10, "a gap after the restart")
    finally:
        tail.stop()
