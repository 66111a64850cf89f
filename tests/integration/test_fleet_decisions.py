"""The decisions of a fleet host's live leases, kept by the host and re-registered into Redis
(SPEC §16: losing Redis's data must not lose a promise), over real files and a real redis-server:

- `LeaseDecisions`: its journal survives a restart and keeps each live lease's current decision;
- `RedisDecisions.reregister_live`: a dispatch's live set re-registered atomically, refused when
  another host holds a live lease of the dispatch, stale members dropped;
- hosts built by the daemon's own `wire` (`tests/support/fleethosts.py`): after a FLUSHALL the
  decisions and live sets are back before the host says it registered; a host restarted after it
  was declared dead yields a dispatch another host took meanwhile.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis

from controlplane.core.fallback import Lineage
from controlplane.core.hop import FallbackDriver
from controlplane.decisions import Decision, LiveGroup
from controlplane.fleet.decisions import LEASE_DECISIONS_FILE, LeaseDecisions, RedisDecisions
from controlplane.stores import leasedecisions as fleet_decisions
from controlplane.stores.decisionlines import ENDED_KEPT_MS
from shared.capacity import StateUnavailable
from shared.codes import Outcome, Refusal
from shared.fleet.capacity import RedisCapacity
from shared.fleet.keys import Ceiling
from shared.wire import Lease
from tests.support.fleet import Fleet
from tests.support.fleethosts import FleetHosts, fleet_world, mint
from tests.support.redis_server import RedisServer
from tests.support.waits import until

A, B = "acct-a", "acct-b"


class Case(NamedTuple):
    name: str
    given: Any
    expect: Any


def _decision(n: int, key: str) -> Decision:
    return Decision(
        mint_decision_id=f"md_{n}",
        outcome=Outcome.SELECTED,
        lineage=Lineage("d", "r", "m"),
        at_ms=n,
        key_id=key,
        account_id=A,
        fallback_position=0,
    )


def _lease(key: str, decision: str) -> Lease:
    return Lease(
        key_id=key, digest=b"", account_id=A, expires_at_ms=1, repo_slug="r", dispatch_id="d", mint_decision_id=decision
    )


# ---- the journal ---------------------------------------------------------------------------


def test_the_journal_keeps_each_live_leases_current_decision_across_a_restart(tmp_path: Path) -> None:
    path = str(tmp_path / LEASE_DECISIONS_FILE)
    leases = {"K1": _lease("K1", "md_1"), "K2": _lease("K2", "md_2")}
    record = LeaseDecisions(path, leases.get)
    assert record.load([]) == []
    for n, key in ((1, "K1"), (2, "K2"), (3, "K3"), (4, "K1")):  # K3 never granted; K1 hops to md_4
        record.add(_decision(n, key))
    leases["K1"] = _lease("K1", "md_4")
    record.forget("K1")  # a hop lets go of the lease, not of the key
    assert record.of_key("K1") == _decision(4, "K1") and record.get("md_1") == _decision(1, "K1")
    record.close()
    with open(path, "ab") as handle:
        handle.write(b'{"torn": ')  # a crash mid-line
    again = LeaseDecisions(path, leases.get)
    assert again.load(list(leases.values()) + [_lease("K9", "md_9")]) == ["K9"]
    assert again.current() == {"K1": _decision(4, "K1"), "K2": _decision(2, "K2")}
    assert again.by_id() == {"md_1": _decision(1, "K1"), "md_4": _decision(4, "K1"), "md_2": _decision(2, "K2")}
    assert os.stat(path).st_mode & 0o777 == 0o600
    del leases["K2"]
    again.forget("K2")  # the key ended: its decision is kept an hour (SPEC §5), no longer current
    assert again.of_key("K2") is None and again.get("md_2") == _decision(2, "K2")
    again.close()
    with open(path, "rb") as handle:  # rewritten at load: the live keys' 3 decisions; then K2's end
        assert len(handle.readlines()) == 3 + 1


def test_a_record_before_its_grant_leaves_the_previous_decision_for_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hop records its decision, then re-binds the lease; a crash between finds the old one,
    also when that record compacted the journal first."""
    monkeypatch.setattr(fleet_decisions, "COMPACT_MIN_LINES", 4)
    path = str(tmp_path / LEASE_DECISIONS_FILE)
    leases = {"K1": _lease("K1", "md_1")}
    clock = [0]
    record = LeaseDecisions(path, leases.get, lambda: clock[0])
    record.load([])
    record.add(_decision(1, "K1"))
    for n in range(2, 5):  # three mints that were never granted: 7 lines with their ends
        record.add(_decision(n, f"K{n}"))
        record.forget(f"K{n}")
    clock[0] += ENDED_KEPT_MS  # their hour is over
    record.add(_decision(5, "K5"))
    record.forget("K5")  # lets go of K2-K4: 9 lines, past twice the 3 kept; compacted
    record.add(_decision(6, "K1"))  # records; the key table still names md_1
    record.close()
    with open(path, "rb") as handle:
        assert len(handle.readlines()) == 4  # md_1, md_5, K5's end (compacted), md_6
    restored = LeaseDecisions(path, leases.get)
    assert restored.load(list(leases.values())) == []
    assert restored.of_key("K1") == _decision(1, "K1")
    restored.close()


def test_the_journal_is_compacted_past_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet_decisions, "COMPACT_MIN_LINES", 8)
    path = str(tmp_path / LEASE_DECISIONS_FILE)
    live: dict[str, Lease] = {}
    clock = [0]
    record = LeaseDecisions(path, live.get, lambda: clock[0])
    record.load([])
    for n in range(40):  # a lease minted and ended, forty times, half an hour apart
        clock[0] += 30 * 60_000
        live[f"K{n}"] = _lease(f"K{n}", f"md_{n}")
        record.add(_decision(n, f"K{n}"))
        del live[f"K{n}"]
        record.forget(f"K{n}")
    record.close()
    with open(path, "rb") as handle:
        assert len(handle.readlines()) <= 8 + 1


# ---- the live sets -------------------------------------------------------------------------


def _group(*keys: str) -> LiveGroup:
    return LiveGroup(repo_slug="r", dispatch_id="d", key_ids=keys)


LIVE_CASES = [
    Case("an empty set takes this host's keys", ([], [_group("K1")]), ([], {"K1"})),
    Case("a renewal's two keys together", ([], [_group("K1", "K2")]), ([], {"K1", "K2"})),
    Case("already there (Redis kept its data)", (["K1"], [_group("K1")]), ([], {"K1"})),
    Case("a member holding no slot ended: dropped", (["K0"], [_group("K1")]), ([], {"K1"})),
    Case("a member of this host's that is no longer live ended: dropped", (["Kmine"], [_group("K1")]), ([], {"K1"})),
    Case(
        "another host holds a live lease of the dispatch: refused, nothing changed",
        (["Kother"], [_group("K1", "K2")]),
        (["K1", "K2"], {"Kother"}),
    ),
]


@pytest.mark.parametrize("case", LIVE_CASES, ids=[c.name for c in LIVE_CASES])
async def test_reregister_live(case: Case, fleet: Fleet) -> None:
    present, groups = case.given
    refused, members = case.expect
    table = RedisDecisions(fleet.client, fleet.keys, entries=fleet.entries)
    await RedisCapacity(fleet.client, fleet.keys, Ceiling.LEASE, "h2").reserve(A, "Kother", None)
    await RedisCapacity(fleet.client, fleet.keys, Ceiling.LEASE, "h1").reserve(A, "Kmine", None)
    for key in present:
        await table.note_live(key, "r", "d")
    assert await table.reregister_live(groups, "h1") == refused
    assert await table.live_keys("r", "d") == members
    if not refused:  # each key's entry names its set: `end_key` finds it
        await table.end_key(groups[0].key_ids[0])
        assert groups[0].key_ids[0] not in await table.live_keys("r", "d")


async def test_reregister_records_the_decisions_by_id_and_key(fleet: Fleet) -> None:
    table = RedisDecisions(fleet.client, fleet.keys, entries=fleet.entries)
    await table.reregister([_decision(1, "K1"), _decision(2, "K2")])
    assert await table.get("md_1") == _decision(1, "K1") and await table.for_key("K2") == _decision(2, "K2")
    assert await table.stored(["md_2", "md_9"]) == {"md_2": _decision(2, "K2")}
    assert 0 < fleet.admin().pttl(fleet.keys.decision("md_1")) <= table.ttl_ms


# ---- hosts ---------------------------------------------------------------------------------


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[tuple[RedisServer, FleetHosts]]:
    async for opened in fleet_world(tmp_path, {A: 2, B: None}):
        yield opened


async def test_after_a_flush_the_decisions_are_back_before_the_host_registers(world) -> None:
    server, fleet = world
    h1, h2 = await fleet.add("h1"), await fleet.add("h2")
    minted = (await mint(h1, "d1", fallback_driver=FallbackDriver.GATEWAY)).body
    keys = h1.fleet.b.keys
    with redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=2) as admin:
        admin.flushall()  # the data lost, as a restart without persistence
        await until(
            lambda: any(m.startswith(b"h1:") for m in admin.smembers(keys.registered)),
            10,
            "h1 to re-register after the flush",
        )  # members are `<host>:<mac>` (SPEC §19)
        # `registered` is written last: by then the decision and the dispatch's live key are back
        assert admin.get(keys.decision_of_key(minted["key_id"])) == minted["mint_decision_id"].encode()
        assert admin.smembers(keys.live("acme/app", "d1")) == {minted["key_id"].encode()}

    async def cited_on_h2() -> str:  # h2 answers by the decision's lineage and lease
        answer = await mint(h2, "d1", retry_of_mint_decision_id=minted["mint_decision_id"])
        return answer.body["refusal_reason"]

    assert await until(cited_on_h2, 10, "h2 to answer the citation") == str(Refusal.FALLBACK_LEASE_STILL_HELD)
    foreign = await mint(h2, "d-other", retry_of_mint_decision_id=minted["mint_decision_id"])
    assert (foreign.status, foreign.body["refusal_reason"]) == (409, str(Refusal.FALLBACK_LINEAGE_MISMATCH))
    await until(lambda: h1.fleet.registered, 10, "h1 admitting again (h2 re-registered too)")
    renewed = await h1.desk.renew(minted["key_id"], None)
    assert (renewed.status, renewed.body["account_id"]) == (201, minted["account_id"]), renewed.body


async def test_a_host_restarted_after_it_was_reaped_yields_a_dispatch_taken_meanwhile(world) -> None:
    _server, fleet = world
    h1, h2 = await fleet.add("h1"), await fleet.add("h2")
    lost = (await mint(h1, "d1")).body["key_id"]
    kept = (await mint(h1, "d2")).body["key_id"]
    await fleet.crash("h1")

    async def reaped() -> bool:  # the slot, then (the reaper's next step) the dispatch's live key
        try:
            return not await h2.service.lease_capacity.holds(lost) and not await h2.service.decisions.live_keys(
                "acme/app", "d1"
            )
        except StateUnavailable:
            return False

    await until(reaped, 15, "h2 to reap h1's slots and its dispatch claims")
    taken = await mint(h2, "d1")
    assert taken.status == 201, taken.body  # h1's claim on d1 went with its slots
    h1 = await fleet.add("h1")  # its key journal restores both leases
    assert h1.service.keys.get(lost) is None  # d1 is h2's now: h1's key ended (401)
    assert h1.service.keys.get(kept) is not None
    assert await h2.service.decisions.live_keys("acme/app", "d1") == {taken.body["key_id"]}
    again = await mint(h1, "d1")
    assert again.body["refusal_reason"] == str(Refusal.FALLBACK_LEASE_STILL_HELD)
