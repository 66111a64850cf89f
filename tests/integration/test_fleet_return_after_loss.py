"""A host that was down while Redis lost its data holds new holders when it comes back, as a
host that saw the loss does (SPEC §16: a ceiling is never exceeded fleet-wide; losing Redis's
data must not lose a promise). Its siblings' live leases are not registered again until their
next beat, so admitting at once could fill an account they already fill: the seeded random
interleavings found exactly that (`FLEET_SEED=504824953`: 3 leases served on a ceiling of 2).

The fleet's incarnation the host last registered into is kept in its state directory
(`controlplane/fleet/incarnationfile.py`); a first start, or the same incarnation, is no loss.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controlplane.fleet.incarnationfile import INCARNATION_FILE, read_known, returned_after_loss, write_known
from tests.support.fleethosts import FleetHosts, accounts, mint
from tests.support.redis_server import RedisServer


@pytest.mark.parametrize(
    "known, current, lost",
    [
        (None, "inc-1", False),  # a first start
        ("inc-1", "inc-1", False),  # an ordinary restart
        ("inc-1", "inc-2", True),  # Redis lost its data while this host was away
    ],
)
def test_a_return_after_a_loss_is_told_by_the_incarnation(known, current, lost) -> None:
    assert returned_after_loss(known, current) is lost


@pytest.mark.parametrize("content", [b"", b"x" * 65, b"inc 1", b"inc\n", b"\xff\xfe", b"../etc"])
def test_an_incarnation_file_that_does_not_read_is_no_loss(tmp_path: Path, content: bytes) -> None:
    (tmp_path / INCARNATION_FILE).write_bytes(content)
    assert read_known(str(tmp_path)) is None


def test_the_incarnation_is_kept_private(tmp_path: Path) -> None:
    write_known(str(tmp_path), "01ABCDEF")
    assert read_known(str(tmp_path)) == "01ABCDEF"
    assert os.stat(tmp_path / INCARNATION_FILE).st_mode & 0o777 == 0o600


async def test_a_host_back_after_a_loss_does_not_fill_what_its_siblings_hold(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    fleet = FleetHosts(tmp_path, server.url, "r", accounts({"acct-a": 2}))
    try:
        h1 = await fleet.add("h1")
        await fleet.add("h2")
        assert [(await mint(h1, f"d{n}")).status for n in range(2)] == [201, 201]  # acct-a full
        await fleet.crash("h2")
        h1.fleet.b.sync.flushall()  # Redis loses everything while h2 is away; h1 has not beaten yet
        h2 = await fleet.add("h2")  # a new incarnation: h2 registers its own (none) and holds
        answer = await mint(h2, "d-late")
        assert answer.status == 503, answer.body  # held, never a third lease on a ceiling of 2
        served = sum(c.service.keys.count_by_account().get("acct-a", 0) for c in fleet.hosts.values())
        assert served == 2
    finally:
        await fleet.stop_all()
        server.stop()
