"""A fleet mint's decision record rides with its claims, and a revoke's Redis ends overlap its
data plane round (issue 27 §4, bench/README "Stop 31"). Real redis-server, controls wired as the
daemon is (`tests/support/fleethosts.py`).

- the selected decision is written in the same exchange as the lease slot's reserve and the
  dispatch's live claim (`MintDesk._claim`, `RedisDecisions.stage`), not in one of its own;
- a claim refused by a race with another host leaves nothing of that decision: not in Redis,
  not on the host; the mint is held and its held outcome recorded (SPEC §5);
- a revoke sends its Redis ends and the data plane's removal at once, and still lets the
  circuit's probe go only after the data plane acknowledged (SPEC §3).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from controlplane.decisions import Decision
from controlplane.fleet.owed import Owed
from shared.capacity import StateUnavailable
from shared.codes import Outcome, Refusal
from tests.support.fleethosts import FleetHosts, fleet_world, mint
from tests.support.redis_server import RedisServer

A = "acct-a"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[tuple[RedisServer, FleetHosts]]:
    async for pair in fleet_world(tmp_path, {A: 2}):
        yield pair


def _flat(args: tuple[Any, ...]) -> list[str]:
    return [a.decode(errors="replace") if isinstance(a, bytes) else str(a) for a in args]


async def test_the_decision_record_goes_in_the_claims_exchange(world) -> None:
    _server, hosts = world
    h1 = await hosts.add("h1")
    assert (await mint(h1, "warm")).status == 201
    batching = h1.fleet.b.batching
    exchanges: list[list[list[str]]] = []
    dispatch = batching._dispatch  # each exchange as it leaves for the line

    def noting(exchange: Any) -> None:
        exchanges.append([_flat(args) for args, _, _ in exchange.batch])
        dispatch(exchange)

    batching._dispatch = noting  # type: ignore[method-assign]
    answer = await mint(h1, "d1")
    assert answer.status == 201, answer.body
    keys = h1.fleet.b.keys
    record = keys.decision(answer.body["mint_decision_id"])
    claim = keys.live_of_key(answer.body["key_id"])
    with_record = [e for e in exchanges if any(record in command for command in e)]
    assert len(with_record) == 1, exchanges  # written once
    commands = with_record[0]
    assert any(claim in command for command in commands), commands  # beside the live claim
    naming_the_key = [c for c in commands if any(answer.body["key_id"] in arg for arg in c)]
    assert len(naming_the_key) >= 3, commands  # the slot's reserve, the live claim, the record


def _race_the_live_claim(host: Any, meanwhile: Callable[[str, str], Awaitable[None]]) -> list[Decision]:
    """`meanwhile(repo_slug, dispatch_id)` runs on `host`'s mints after the reads and just before
    the live claim (another host making a key live); the answer lists every decision staged."""
    staged: list[Decision] = []
    decisions = host.desk.decisions
    claim_live, stage = decisions.claim_live, decisions.stage

    async def racing_claim(key_id: str, repo_slug: str, dispatch_id: str, *, allowing: str | None = None) -> bool:
        await meanwhile(repo_slug, dispatch_id)
        return await claim_live(key_id, repo_slug, dispatch_id, allowing=allowing)

    async def noting_stage(decision: Decision) -> None:
        staged.append(decision)
        await stage(decision)

    decisions.claim_live = racing_claim
    decisions.stage = noting_stage
    return staged


async def test_a_claim_refused_by_another_host_leaves_no_decision(world) -> None:
    """Host h2 makes another key live for the dispatch after h1's mint read the live keys and
    before its claims ran: h1's live claim is refused, and the decision it staged beside the
    claim is deleted; the answer names a held decision, and only its held outcome is kept."""
    _server, hosts = world
    h1, h2 = await hosts.add("h1"), await hosts.add("h2")
    assert (await mint(h1, "warm")).status == 201

    async def h2_claims(repo_slug: str, dispatch_id: str) -> None:
        await h2.desk.decisions.note_live("key-of-h2", repo_slug, dispatch_id)

    staged = _race_the_live_claim(h1, h2_claims)
    answer = await mint(h1, "d-race")
    assert answer.status == 503, answer.body
    assert answer.body["refusal_reason"] == str(Refusal.FALLBACK_LEASE_STILL_HELD)
    assert len(staged) == 1 and staged[0].key_id is not None
    decision_id, key_id = staged[0].mint_decision_id, staged[0].key_id
    assert answer.body["mint_decision_id"] == decision_id
    keys, raw = h1.fleet.b.keys, h1.fleet.b.sync
    assert raw.exists(keys.decision(decision_id), keys.decision_of_key(key_id)) == 0
    for host in (h1, h2):
        assert await host.desk.decisions.get(decision_id) is None
        assert await host.desk.decisions.for_key(key_id) is None
        assert await host.desk.decisions.refused_outcome(decision_id) == Outcome.HELD
    assert h1.fleet.b.lease_decisions.get(decision_id) is None
    assert not await h1.service.lease_capacity.holds(key_id)
    assert await h1.desk.decisions.live_keys("acme/app", "d-race") == {"key-of-h2"}


async def test_a_revokes_redis_ends_and_data_plane_round_overlap_and_the_probe_waits(world) -> None:
    """The slot's release waits until the data plane's removal was sent: in turn, as before,
    it would wait forever (bounded here). The probe is let go only after the removal returned."""
    _server, hosts = world
    h1 = await hosts.add("h1")
    minted = await mint(h1, "d-rev")
    assert minted.status == 201, minted.body
    service = h1.service
    removal_sent = asyncio.Event()
    order: list[str] = []
    release, removed, ended = (
        service.lease_capacity.release,
        service.link.leases_removed,
        service.circuits.on_lease_ended,
    )

    async def release_after_the_removal_left(holder: str) -> bool:
        await asyncio.wait_for(removal_sent.wait(), 10)
        done = await release(holder)
        order.append("released")
        return done

    async def removing(key_ids: list[str]) -> bool:
        removal_sent.set()
        await asyncio.sleep(0)  # the data plane's round: others run meanwhile
        acked = await removed(key_ids)
        order.append("removed")
        return acked

    async def probe_end(account_id: str, key_id: str, now: int) -> None:
        order.append("probe")
        await ended(account_id, key_id, now)

    service.lease_capacity.release = release_after_the_removal_left  # type: ignore[method-assign]
    service.link.leases_removed = removing  # type: ignore[method-assign]
    service.circuits.on_lease_ended = probe_end  # type: ignore[method-assign]
    assert await service.revoke(minted.body["key_id"])
    assert order.index("probe") > order.index("removed") and order.index("probe") > order.index("released")
    assert not await h1.fleet.b.lease_capacity.holds(minted.body["key_id"])


async def test_a_refused_claims_decision_is_deleted_at_once_while_older_writes_are_owed(world) -> None:
    """Writes still owed from an outage (here: one that keeps failing) queue every newer owed
    write behind them, but not the staged decision's delete: the held answer (which names the
    decision's id) goes out with that decision already gone from Redis."""
    _server, hosts = world
    h1 = await hosts.add("h1")
    assert (await mint(h1, "warm")).status == 201

    async def failing() -> None:
        raise StateUnavailable("still away")

    owed = h1.fleet.b.owed
    await owed.write(Owed("stuck", failing))  # queued: Redis "failed" it
    assert len(owed) == 1
    keys, raw = h1.fleet.b.keys, h1.fleet.b.sync

    async def another_host_claims(repo_slug: str, dispatch_id: str) -> None:
        raw.sadd(keys.live(repo_slug, dispatch_id), "key-elsewhere")  # another host's, after the reads

    staged = _race_the_live_claim(h1, another_host_claims)
    answer = await mint(h1, "d-race-owed")
    assert answer.status == 503 and answer.body["refusal_reason"] == str(Refusal.FALLBACK_LEASE_STILL_HELD)
    (decision,) = staged
    assert decision.key_id is not None and answer.body["mint_decision_id"] == decision.mint_decision_id
    assert raw.exists(keys.decision(decision.mint_decision_id), keys.decision_of_key(decision.key_id)) == 0
    assert len(owed) >= 2  # the stuck write, and the slot's release queued behind it
