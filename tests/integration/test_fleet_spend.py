"""`FleetSpend` over a real redis-server (SPEC §18 "Fleet mode"): each host publishes its own
totals, every other host reads them, a republish never counts twice, and spend that Redis lost
comes back from the hosts' own folds. Each test in its own fleet namespace (`fleet`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.core.spend import COST, Dim
from controlplane.fleet.spend import FleetSpend
from controlplane.spend import SpendBook
from controlplane.stores.ledger import Ledger
from shared.fleet.batching import BatchingRedis
from tests.support.fleet import Fleet
from tests.support.ledgerfiles import FakeClock, stamp_of
from tests.support.rows import row

DAY = "2026-12-01"


class Host:
    """One control's spend side: a real ledger, its book, and its `FleetSpend` (loops not run:
    each test drives `publish` and `pull` itself)."""

    def __init__(self, root: Path, name: str, fleet: Fleet, clock: FakeClock) -> None:
        (root / name).mkdir()
        self.clock = clock
        self.ledger = Ledger(str(root / name / "ledger.jsonl"), clock=clock)
        self.ledger.open()
        self.book = SpendBook.rebuild(self.ledger)
        self.client = BatchingRedis(fleet.client)  # as the daemon's (`controlplane/books.py`)
        self.spend = FleetSpend(self.client, fleet.keys, name, self.book, entries=fleet.entries)
        self.heard: list[bool] = []
        self.spend.listeners.append(self.heard.append)

    def serve(self, cost: float, **fields) -> None:
        r = row(stamp_of(self.clock.now), cost=cost, **fields)
        self.ledger.stage(r)
        self.book.add(r)
        self.spend.note(r)

    def spent(self, dim: Dim = Dim.PLATFORM, key: str | None = "") -> float:
        return self.book.cells.cell(DAY, dim, key)[COST]

    async def close(self) -> None:
        self.ledger.close()
        await self.client.aclose()


@pytest.fixture
async def hosts(tmp_path: Path, fleet: Fleet):
    clock = FakeClock("2026-12-01T10:00:00")
    made: list[Host] = []

    def make(name: str) -> Host:
        made.append(Host(tmp_path, name, fleet, clock))
        return made[-1]

    yield make
    for host in made:
        await host.close()


async def test_a_host_reads_what_the_others_spent(hosts) -> None:
    a, b, c = hosts("gw-a"), hosts("gw-b"), hosts("gw-c")
    a.serve(0.5, account="team-a")
    b.serve(0.25, account="team-b")
    for host in (a, b, c):
        await host.spend.publish()
    exchanges = c.client.batches
    assert await c.spend.pull() is True and c.heard == [False]
    assert c.client.batches == exchanges + 2  # the mark and versions together, then both hosts' windows
    assert c.spent() == pytest.approx(0.75)
    assert {k: v[COST] for k, v in c.book.cells.cells(DAY, Dim.ACCOUNT).items()} == {"team-a": 0.5, "team-b": 0.25}
    assert await a.spend.pull() is True and a.spent() == pytest.approx(0.75)  # its own and b's
    assert a.book.fold.cell(DAY, Dim.PLATFORM, "")[COST] == pytest.approx(0.5)  # its fold: only its rows
    assert await c.spend.pull() is False and c.heard == [False]  # nothing moved


async def test_only_moved_hosts_are_read_and_a_republish_never_counts_twice(hosts) -> None:
    a, b = hosts("gw-a"), hosts("gw-b")
    a.serve(0.5)
    await a.spend.publish()
    await b.spend.pull()
    a.spend._whole = True  # a restart's publish: everything again, replacing
    await a.spend.publish()
    await a.spend.publish()
    assert await b.spend.pull() is False and b.spent() == pytest.approx(0.5)
    a.serve(0.125)
    await a.spend.publish()  # only the dirty windows
    assert await b.spend.pull() is True and b.spent() == pytest.approx(0.625)


async def test_spend_redis_lost_is_published_again_from_each_hosts_fold(hosts, fleet: Fleet) -> None:
    a, b = hosts("gw-a"), hosts("gw-b")
    a.serve(0.5)
    b.serve(0.25)
    await a.spend.publish()
    await b.spend.publish()
    for key in fleet.key_names():
        fleet.admin().delete(key)  # Redis came back empty
    a.serve(0.125)
    await a.spend.publish()  # a partial publish into a lost hash is refused ...
    assert a.spend._whole is True
    await a.spend.publish()  # ... and the next one is whole
    await b.spend.pull()  # b finds its own hash gone: whole at its next publish
    assert b.spend._whole is True
    await b.spend.publish()
    late = hosts("gw-c")  # a host that starts after the loss sees all of it
    assert await late.spend.pull() is True and late.spent() == pytest.approx(0.875)


async def test_what_is_published_names_no_credential(hosts, fleet: Fleet) -> None:
    a = hosts("gw-a")
    a.serve(0.5, principal="w-1", repo="acme/pay", account="team-a")
    await a.spend.publish()
    admin = fleet.admin()
    names = fleet.key_names()
    assert names == sorted([(fleet.keys.spend_host("gw-a")).encode(), fleet.keys.spend_versions.encode()])
    values = b"".join(v for name in names for v in admin.hgetall(name).values())
    assert b"sk-" not in values and b"key_1" not in values  # sums and names only, never a key id


async def test_forged_negative_and_garbage_spend_is_rejected_the_last_good_value_stays(hosts, fleet: Fleet) -> None:
    """SPEC §19: a negative cost under any host id, a window with a forged MAC, garbage and a key
    that is not a hash are each skipped and counted; the fleet's spend is not erased."""
    import msgspec

    from controlplane.fleet.spend import _encode
    from shared.fleet.entries import EntryKind

    a, b = hosts("gw-a"), hosts("gw-b")
    a.serve(5.0, account="team-a")
    await a.spend.publish()
    assert await b.spend.pull() is True and b.spent() == pytest.approx(5.0)
    admin, month, hour = fleet.admin(), DAY[:7], DAY + "T10"
    negative = _encode([("platform", "", [-999.99, 1, 0, 0, 0, 0, 0])])
    forged_mac = b.spend.entries.mac(EntryKind.SPEND, ["gw-x", DAY, negative])  # right key, wrong host
    admin.hset(
        fleet.keys.spend_host("gw-a"),
        mapping={  # gw-a's own windows overwritten by a writer
            DAY: msgspec.msgpack.encode(("A" * 43, negative)),
            month: b"\xc1garbage",
            hour: b"",
        },
    )
    admin.hset(fleet.keys.spend_host("gw-x"), mapping={DAY: msgspec.msgpack.encode((forged_mac, negative)), "_": "1"})
    admin.set(fleet.keys.spend_host("gw-y"), "not a hash")
    admin.hset(fleet.keys.spend_versions, mapping={"gw-a": "forged-1", "gw-x": "1", "gw-y": "1", b"\xff": "1"})
    await b.spend.pull()
    assert b.spent() == pytest.approx(5.0)
    assert b.spend.entries.rejected[EntryKind.SPEND] >= 4
    admin.hset(
        fleet.keys.spend_host("gw-a"),
        DAY,
        msgspec.msgpack.encode((b.spend.entries.mac(EntryKind.SPEND, ["gw-a", DAY, negative]), negative)),
    )  # even MAC'd: out of range
    admin.hset(fleet.keys.spend_versions, "gw-a", "forged-2")
    await b.spend.pull()
    assert b.spent() == pytest.approx(5.0)
