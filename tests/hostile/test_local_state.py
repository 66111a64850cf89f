"""Local state (SPEC §19): control sets `$GATEWAY_STATE_DIR` to 0700 at start, even when it already
existed wider, and every file it creates there is 0600 from its creation (`shared/private.py`:
`os.open` with the mode, never a chmod after the fact) — so the test runs the daemons under a
permissive umask (022), under which a file opened the ordinary way would be 0644.

It walks the state directories after: an embedded run (a mint, requests, an admin write and a
policy write: the key and decision journals, the ledger, both chains, their anchors and lock
files), a day rotation and a live spend checkpoint on that directory (the rotated segment and
both kinds of `.spend.json`), and a fleet run on a real redis-server (the chains' mirrors, the
journals of a fleet host).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.spend import SpendBook
from controlplane.stores.ledger import Ledger
from tests.support.fleetpairs import FleetPairs
from tests.support.fleetpairs import call as fleet_call
from tests.support.fleetpairs import mint as fleet_mint
from tests.support.harness import Gateway, Stub, http
from tests.support.ledgerfiles import FakeClock, ledger_files, stamp_of
from tests.support.redis_server import RedisServer
from tests.support.rows import row

MODEL = "claude-sonnet-4-6"
BODY = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}


@pytest.fixture
def wide_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def modes(state_dir: Path) -> dict[str, str]:
    """Every entry under `state_dir` (itself included) → its permission bits, in octal."""
    found = {".": oct(stat.S_IMODE(state_dir.stat().st_mode))}
    for root, dirs, files in os.walk(state_dir):
        for name in dirs + files:
            path = Path(root) / name
            found[str(path.relative_to(state_dir))] = oct(stat.S_IMODE(path.lstat().st_mode))
    return found


def assert_private(state_dir: Path, expected: set[str]) -> None:
    found = modes(state_dir)
    assert expected <= set(found), (expected - set(found), sorted(found))
    wrong = {
        name: mode
        for name, mode in found.items()
        if mode != (oct(0o700) if (state_dir / name).is_dir() else oct(0o600))
    }
    assert wrong == {}, wrong


def policy_write(gw: Gateway, document: dict) -> None:
    revision = gw.api("GET", "/control/v2/policy")[2]["revision"]
    status, _, body = gw.api(
        "PUT",
        "/control/v2/policy/level",
        {"name": "repo:acme/app", "expected_revision": revision, "reason": "r", "document": document},
    )
    assert status == 200, body


def embedded_run(make_gateway) -> Gateway:
    gw = make_gateway()
    gw.state_dir.mkdir(parents=True, mode=0o755)
    os.chmod(gw.state_dir, 0o755)  # an operator's pre-existing, world-readable directory
    gw.start()
    policy_write(gw, {"budgets": [{"window": "day", "usd": 50.0}]})
    status, _, body = gw.api("PATCH", "/control/v2/accounts/legacy-openai/state", {"state": "draining", "reason": "r"})
    assert status == 200, body
    status, _, minted = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": "d-1",
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "w-1",
            "model": MODEL,
            "fallback_driver": "gateway",
        },
    )
    assert status == 201, minted
    for _ in range(2):
        assert http("POST", gw.dataplane_url + "/v1/messages", BODY, {"x-api-key": minted["token"]})[0] == 200
    gw.wait_rows(2)
    gw.stop()
    return gw


def rotate_and_checkpoint(state_dir: Path) -> None:
    """A day later: the ledger rotates at open (segment + its spend summary), then new rows and
    the live spend checkpoint."""
    clock = FakeClock("2026-11-30T10:00:00")
    os.utime(state_dir / "ledger.jsonl", (clock.now / 1000, clock.now / 1000))
    clock.set("2026-12-01T09:00:00")
    ledger = Ledger(str(state_dir / "ledger.jsonl"), clock=clock)
    ledger.open()
    ledger.wait_idle()
    for n in range(3):
        ledger.stage(row(stamp_of(clock.now), attempt_id=f"att-local-{n}", repo="acme/app", cost=0.25))
    assert ledger.flush()
    book = SpendBook.rebuild(ledger)
    book.checkpoint()
    ledger.wait_idle()
    ledger.close()


def test_every_state_file_is_0600_and_the_directory_0700(
    make_gateway, tmp_path: Path, stub: Stub, wide_umask: None
) -> None:
    gw = embedded_run(make_gateway)
    rotate_and_checkpoint(gw.state_dir)
    files = set(ledger_files(gw.state_dir))
    assert {"ledger-20261130.jsonl.gz", "ledger-20261130.spend.json", "ledger.spend.json"} <= files, files
    assert_private(
        gw.state_dir,
        {
            "keys.jsonl",
            "lease-decisions.jsonl",
            "ledger.jsonl",
            "ledger-20261130.jsonl.gz",
            "ledger-20261130.spend.json",
            "ledger.spend.json",
            "policy.jsonl",
            "account-admin.jsonl",
        },
    )

    server = RedisServer(tmp_path / "redis").start()
    fleet = FleetPairs(tmp_path / "fleet", stub, server, 1)
    try:
        fleet.start()
        a = fleet[0]
        policy_write(a, {"max_fallback_hops": 1})
        status, _, minted = fleet_mint(a, "f-1", fallback_driver="gateway")
        assert status == 201, minted
        assert fleet_call(a, minted["token"])[0] == 200
        a.wait_rows(1)
    finally:
        fleet.stop()
        server.stop()
    assert_private(fleet[0].state_dir, {"keys.jsonl", "lease-decisions.jsonl", "ledger.jsonl", "policy.jsonl"})
