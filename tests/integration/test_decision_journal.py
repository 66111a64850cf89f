"""`lease-decisions.jsonl` over real files with an injected clock (SPEC §5): the decisions of
leases ended within the last hour, and their evidence, survive a restart, then are compacted
away; the journal stays bounded, 0600, and a hostile or unreadable journal never stops a start.
`JournalledDecisions` (embedded mode's table) answers a citation after a restart exactly as
before it. Never a sleep: time is the injected clock's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controlplane.core.fallback import Lineage
from controlplane.decisions import Decision
from controlplane.stores import leasedecisions
from controlplane.stores.decisions import JournalledDecisions
from controlplane.stores.leasedecisions import LEASE_DECISIONS_FILE, LeaseDecisions
from shared.codes import Condition, Outcome
from shared.wire import Lease

HOUR = 3_600_000
T0 = 1_000 * HOUR
RL = Condition.RATE_LIMITED


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _decision(n: int, key: str) -> Decision:
    return Decision(
        mint_decision_id=f"md_{n}",
        outcome=Outcome.SELECTED,
        lineage=Lineage("d", "r", "m"),
        at_ms=n,
        key_id=key,
        account_id="a",
        fallback_position=0,
    )


def _lease(key: str, decision: str, expires_at_ms: int = T0 + HOUR) -> Lease:
    return Lease(
        key_id=key,
        digest=b"",
        account_id="a",
        expires_at_ms=expires_at_ms,
        repo_slug="r",
        dispatch_id="d",
        mint_decision_id=decision,
    )


def _lines(path: str) -> int:
    with open(path, "rb") as handle:
        return len(handle.readlines())


def _journal(tmp_path: Path, live: dict[str, Lease], clock: Clock) -> tuple[str, LeaseDecisions]:
    path = str(tmp_path / LEASE_DECISIONS_FILE)
    journal = LeaseDecisions(path, live.get, clock)
    journal.load(list(live.values()))
    return path, journal


def _reload(path: str, live: dict[str, Lease], clock: Clock, ended: dict[str, int] | None = None) -> LeaseDecisions:
    again = LeaseDecisions(path, live.get, clock)
    again.load(list(live.values()), ended)
    return again


@pytest.mark.parametrize("after,kept", [(HOUR - 1, True), (HOUR, False)], ids=["59:59.999", "1:00:00"])
def test_an_ended_keys_decisions_and_evidence_outlive_a_restart_for_an_hour(
    tmp_path: Path, after: int, kept: bool
) -> None:
    live: dict[str, Lease] = {"K1": _lease("K1", "md_1")}
    clock = Clock()
    path, record = _journal(tmp_path, live, clock)
    record.add(_decision(1, "K1"))
    record.add(_decision(2, "K1"))  # a hop re-bound K1
    live["K1"] = _lease("K1", "md_2")
    record.add_evidence("md_1", RL)
    record.add_evidence("md_1", RL)  # a condition already in its evidence: no line
    record.add_evidence("md_2", None)
    del live["K1"]
    record.forget("K1")
    assert record.get("md_1") == _decision(1, "K1") and record.of_key("K1") is None
    record.close()

    clock.now = T0 + after
    again = _reload(path, live, clock)
    expected = {"md_1": _decision(1, "K1"), "md_2": _decision(2, "K1")} if kept else {}
    assert again.by_id() == expected
    assert again.evidence() == ({"md_1": (RL,), "md_2": (None,)} if kept else {})
    assert again.current() == {}
    again.close()
    assert _lines(path) == (5 if kept else 0)  # compacted at load: 2 decisions, 1 end, 2 evidence
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_a_key_the_key_table_found_expired_is_kept_an_hour_from_its_expiry(tmp_path: Path) -> None:
    live: dict[str, Lease] = {"K1": _lease("K1", "md_1"), "K2": _lease("K2", "md_2")}
    clock = Clock()
    path, record = _journal(tmp_path, live, clock)
    record.add(_decision(1, "K1"))
    record.add(_decision(2, "K2"))
    record.close()  # control stops; both leases expire while it is down
    clock.now = T0 + 2 * HOUR
    expired = {"K1": T0 + HOUR + 30 * 60_000, "K2": T0 + HOUR - 1}  # ended 30 min / 60 min ago
    again = _reload(path, {}, clock, expired)
    assert again.by_id() == {"md_1": _decision(1, "K1")}
    again.close()


def test_memory_lets_go_an_hour_after_the_end_without_a_restart(tmp_path: Path) -> None:
    live: dict[str, Lease] = {}
    clock = Clock()
    path, record = _journal(tmp_path, live, clock)
    record.add(_decision(1, "K1"))
    record.forget("K1")
    record.add_evidence("md_1", RL)
    clock.now += HOUR - 1
    record.add(_decision(2, "K2"))
    record.forget("K2")
    assert record.get("md_1") is not None and record.evidence() == {"md_1": (RL,)}
    clock.now += 1
    record.add(_decision(3, "K3"))
    record.forget("K3")  # an end lets go of those ended an hour ago or more
    assert record.get("md_1") is None and record.get("md_2") is not None and record.evidence() == {}
    record.close()


def test_the_journal_stays_bounded_under_mint_and_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leasedecisions, "COMPACT_MIN_LINES", 16)
    live: dict[str, Lease] = {}
    clock = Clock()
    path, record = _journal(tmp_path, live, clock)
    for n in range(400):  # a lease minted, served, ended, every 5 minutes for 33 hours
        clock.now += 5 * 60_000
        record.add(_decision(n, f"K{n}"))
        record.add_evidence(f"md_{n}", None)
        record.forget(f"K{n}")
        assert _lines(path) <= max(16, 2 * 3 * 13) + 3, n  # an hour's 12-13 ends, 3 lines each
    assert len(record.by_id()) <= 13
    record.close()


HOSTILE = [
    b'{"mint_decision_id": "md_x", "outc',  # torn
    b"\xff\xfe\x00garbage",
    b'{"mark": "ended", "key_id": "K1", "at_ms": "later"}',
    b'{"mark": "evidence", "mint_decision_id": "md_1", "condition": "nope"}',
    b'{"mark": "forged"}',
    b"[]",
    b"",
]


def test_hostile_lines_are_skipped_and_counted_never_fatal(tmp_path: Path) -> None:
    live: dict[str, Lease] = {"K1": _lease("K1", "md_1")}
    clock = Clock()
    path, record = _journal(tmp_path, live, clock)
    record.add(_decision(1, "K1"))
    record.add_evidence("md_1", RL)
    record.close()
    with open(path, "ab") as handle:
        handle.write(b"\n".join(HOSTILE) + b"\n")
    again = _reload(path, live, clock)
    assert again.skipped == len(HOSTILE)
    assert again.by_id() == {"md_1": _decision(1, "K1")} and again.evidence() == {"md_1": (RL,)}
    again.close()
    assert _lines(path) == 2


def test_an_unreadable_journal_never_stops_a_start(tmp_path: Path) -> None:
    path = tmp_path / LEASE_DECISIONS_FILE
    path.mkdir()  # a directory where the file should be
    record = LeaseDecisions(str(path), {}.get, Clock())
    assert record.load([_lease("K1", "md_1")]) == ["K1"]
    record.close()


async def test_a_citation_reads_the_same_after_a_restart(tmp_path: Path) -> None:
    """What `controlplane/mintfacts._cited` reads of a cited decision: the decision (outcome,
    lineage, hop, account), the key's decision, and its evidence."""
    live: dict[str, Lease] = {"K1": _lease("K1", "md_1")}
    clock = Clock()
    path = str(tmp_path / LEASE_DECISIONS_FILE)
    table = JournalledDecisions(LeaseDecisions(path, live.get, clock))
    table.restore(list(live.values()))
    await table.record(_decision(1, "K1"))
    await table.add_evidence("md_1", RL)
    del live["K1"]
    await table.end_key("K1")
    await table.add_evidence("md_1", None)  # a row settled after the end (the release seam's order)

    async def seen(t: JournalledDecisions) -> tuple[object, ...]:
        return (await t.get("md_1"), await t.for_key("K1"), await t.evidence("md_1"), await t.get("md_9"))

    before = await seen(table)
    table.close()
    clock.now += 30 * 60_000
    again = JournalledDecisions(LeaseDecisions(path, live.get, clock))
    again.restore([])
    assert await seen(again) == before == (_decision(1, "K1"), _decision(1, "K1"), (RL, None), None)
    again.close()
