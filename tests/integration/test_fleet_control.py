"""Control daemons of one fleet in one process, over a real redis-server (SPEC §16): each host's
standing and its repair, owed writes across an outage, missed revocations, the chains.

Each test starts its own redis-server (some stop, pause or flush it) and builds its hosts with
the daemon's own `wire` (`tests/support/fleethosts.py`). Host TTLs are the minimum (3 s), so a
reap is waited for in test time; every wait is a condition with a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.core import circuit as rules
from controlplane.core.fallback import Lineage
from controlplane.decisions import Decision
from controlplane.wiring import Control
from shared.capacity import StateUnavailable
from shared.clock import now_ms
from shared.codes import AdminState, CircuitPhase, FleetState, Outcome, Refusal, Skip, Standing
from shared.wire import AttemptRow
from tests.support.fleethosts import FleetHosts, accounts, mint
from tests.support.redis_server import RedisServer
from tests.support.waits import until

A, B = "acct-a", "acct-b"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[tuple[RedisServer, FleetHosts]]:
    server = RedisServer(tmp_path / "redis").start()
    hosts = FleetHosts(tmp_path, server.url, "t", accounts({A: 2, B: None}))
    try:
        yield server, hosts
    finally:
        if not server.alive:
            server.start()
        server.resume()
        await hosts.stop_all()
        server.stop()


def _row(n: int, key_id: str, decision: str | None, status: int) -> AttemptRow:
    return AttemptRow(
        attempt_id=f"att_{n:04d}",
        key_id=key_id,
        account_id=A,
        mint_decision_id=decision,
        dispatch_id="d",
        repo_slug="acme/app",
        principal_id="p",
        wire="anthropic",
        path="/v1/messages",
        requested_model="m-1",
        served_model=None,
        stream=False,
        started_at="2026-11-30T12:00:00.000Z",
        finished_at="2026-11-30T12:00:00.010Z",
        status="completed" if status < 300 else "upstream-error",
        http_status=status,
        condition=None if status < 300 else "overloaded",
        refusal_reason=None,
        usage=None,
        cost_usd=None,
        cost_reason=None,
        overhead_ms=0.1,
    )


async def test_the_lease_ceiling_holds_across_hosts_and_a_duplicate_id_is_refused(world) -> None:
    _server, fleet = world
    h1, h2 = await fleet.add("h1"), await fleet.add("h2")
    first, second, third = await mint(h1, "d1"), await mint(h2, "d2"), await mint(h1, "d3")
    assert [a.body["account_id"] for a in (first, second, third)] == [A, A, B]
    assert third.body["skipped"] == [{"account_id": A, "position": 0, "code": str(Skip.LEASE_CAPACITY_EXHAUSTED)}]
    # one live lease per dispatch, fleet-wide
    again = await mint(h2, "d1")
    assert (again.status, again.body["refusal_reason"]) == (503, str(Refusal.FALLBACK_LEASE_STILL_HELD))
    from shared.fleet.membership import HostIdTaken

    with pytest.raises(HostIdTaken):
        await fleet.build("h1").fleet.membership.join(wait=False)


async def test_redis_lost_then_back_empty_holds_then_re_registers_and_re_seeds(world) -> None:
    server, fleet = world
    h1, h2 = await fleet.add("h1"), await fleet.add("h2")
    await h1.admin.set_state(B, AdminState.DRAINING, reason="r", actor=None, authenticated_by="t")
    keys = [(await mint(h, f"d{i}")).body["key_id"] for i, h in enumerate((h1, h2))]
    server.stop()
    held = await mint(h1, "d-held")
    assert (held.status, held.body["outcome"], held.body["refusal_reason"], held.retry_after_s) == (
        503,
        "held",
        str(Refusal.FLEET_STATE_UNAVAILABLE),
        1,
    )
    assert (await h2.fleet_view.snapshot(now_ms())).state == FleetState.UNAVAILABLE
    assert await h1.service.revoke(keys[0])  # ends here at once; the release is owed
    assert len(h1.fleet.b.owed) >= 1
    server.start()  # same port, nothing kept

    async def recovered() -> bool:
        return (await mint(h1, "d-new")).status == 201

    await until(recovered, 15, "mints to recover by themselves")

    async def both_registered() -> bool:  # h2's lease re-registered (its own next beat), h1's new one
        return await h2.service.lease_capacity.counts_by_host(A) == {"h1": 1, "h2": 1}

    await until(both_registered, 10, "h2 to re-register its holder")
    assert len(h1.fleet.b.owed) == 0
    view = await h2.admin.read_async()  # the chain re-seeded from a mirror, never empty
    assert view.check.revision == 1 and view.state.state_of(B) == AdminState.DRAINING


async def test_a_host_declared_dead_ends_the_leases_it_lost_when_it_returns(world) -> None:
    _server, fleet = world
    h1, h2 = await fleet.add("h1"), await fleet.add("h2")
    lost = (await mint(h1, "d1")).body["key_id"]
    beat = next(t for t in h1.fleet._tasks if t.get_name() == "fleet:heartbeat")
    beat.cancel()  # h1 stops heartbeating (a pause, a partition)

    async def reaped() -> bool:
        return not await h2.service.lease_capacity.holds(lost)

    await until(reaped, 10, "h2 to reap h1's slot")
    assert (await mint(h2, "d2")).body["account_id"] == A and (await mint(h2, "d3")).body["account_id"] == A
    assert await h1.fleet.membership.beat() == Standing.REAPED  # h1 returns: repaired in the beat
    assert h1.service.keys.get(lost) is None  # its worker gets 401 and re-mints
    assert await h2.service.lease_capacity.count(A) == 2  # no ceiling exceeded
    assert (await mint(h1, "d4")).body["account_id"] == B


async def test_a_superseded_host_fails_closed(world) -> None:
    _server, fleet = world
    h1 = await fleet.add("h1")
    key = (await mint(h1, "d1")).body["key_id"]
    next(t for t in h1.fleet._tasks if t.get_name() == "fleet:heartbeat").cancel()
    twin = fleet.build("h1")  # a second pair with h1's id, once h1 looks dead
    await twin.fleet.start()
    try:
        assert await h1.fleet.membership.beat() == Standing.SUPERSEDED
        await until(lambda: h1.service.keys.get(key) is None, 5, "h1 to end its leases")
        held = await mint(h1, "d2")
        assert held.body["refusal_reason"] == str(Refusal.FLEET_STATE_UNAVAILABLE)
        assert (await h1.fleet_view.snapshot(now_ms())).state == FleetState.UNAVAILABLE
        assert (await mint(twin, "d3")).status == 201
    finally:
        await twin.fleet.stop()


async def test_evidence_and_releases_owed_through_a_hang_are_delivered_in_order(world) -> None:
    """SIGSTOP past the reply timeout: three failures of a lease are recorded and acknowledged
    on h1 meanwhile; after SIGCONT they open the circuit h2 reads, and the revoke's release lands."""
    server, fleet = world
    h1, h2 = await fleet.add("h1"), await fleet.add("h2")
    minted = await mint(h1, "d1")
    key, decision = minted.body["key_id"], minted.body["mint_decision_id"]
    server.pause()
    try:
        for n in range(3):
            h1.service.record(_row(n, key, decision, 529))
        assert await asyncio.wait_for(h1.service.settle(), 5)  # written and acked without Redis
        await h1.service.revoke(key)
        assert len(h1.fleet.b.owed) >= 6
    finally:
        server.resume()

    async def delivered() -> bool:
        return len(h1.fleet.b.owed) == 0

    await until(delivered, 10, "the owed writes")
    assert (await h2.service.circuits.get(A, now_ms())).phase == CircuitPhase.OPEN
    assert not await h2.service.lease_capacity.holds(key)
    assert await h2.service.decisions.evidence(decision) == ("overloaded",) * 3
    assert (await mint(h2, "d2")).body["skipped"][0]["code"] == str(Skip.CIRCUIT_OPEN)


async def test_a_revocation_made_while_a_host_was_down_ends_its_leases_when_it_returns(world) -> None:
    _server, fleet = world
    h1, h2 = await fleet.add("h1"), await fleet.add("h2")
    kept = (await mint(h2, "d1")).body["key_id"]
    await fleet.crash("h2")  # its key journal stays on disk
    h1.fleet.b.revocations.ack_timeout_s = 0.5
    done = await h1.admin.revoke_leases(
        A, h1.fleet.revocation.revoke_account, reason="r", actor=None, authenticated_by="t"
    )
    assert done.unacknowledged_hosts == ("h2",)  # still live by its last heartbeat, silent
    back = await fleet.add("h2")  # restarts from the same state dir
    assert back.service.keys.get(kept) is None


async def test_a_policy_write_on_one_host_is_read_by_the_next_mint_on_another(world) -> None:
    _server, fleet = world
    h1, h2 = await fleet.add("h1"), await fleet.add("h2")
    await h1.policy.put_level(
        "platform", {"account_order": [B, A]}, expected_revision=0, reason="r", actor=None, authenticated_by="t"
    )
    assert (await mint(h2, "d1")).body["account_id"] == B
    from shared.errors import GatewayError

    with pytest.raises(GatewayError) as stale:
        await h2.policy.put_level(
            "platform", {"account_order": [A]}, expected_revision=0, reason="r", actor=None, authenticated_by="t"
        )
    assert stale.value.status == 409


async def test_an_account_state_on_one_host_reaches_the_others_feed(world) -> None:
    _server, fleet = world
    h1, h2 = await fleet.add("h1"), await fleet.add("h2")
    await h1.admin.set_state(A, AdminState.DISABLED, reason="r", actor=None, authenticated_by="t")

    def seen() -> bool:
        return any(e.kind == "account.state" for e in h2.service.events.replay)

    await until(seen, 5, "h1's account.state in h2's feed")
    assert sum(e.kind == "account.state" for e in h1.service.events.replay) == 1  # never re-published
    assert rules.CLOSED == await h2.service.circuits.store.load(A)


async def test_after_a_data_loss_no_host_admits_before_its_siblings_re_registered(world) -> None:
    """h2 serves both slots of acct-a; Redis loses everything; h1 notices first. h1 must not fill
    acct-a before h2 has taken its holders back (else four leases would serve a ceiling of two)."""
    _server, fleet = world
    h1, h2 = await fleet.add("h1"), await fleet.add("h2")
    for task in (*h1.fleet._tasks, *h2.fleet._tasks):
        if task.get_name() == "fleet:heartbeat":
            task.cancel()  # the beats are driven by hand below
    assert [(await mint(h2, f"d{i}")).body["account_id"] for i in range(2)] == [A, A]
    await until(lambda: "h2" in h1.fleet.recovery.live_seen, 5, "h1 to have seen h2 live (its beat's look)")
    h1.fleet.b.sync.flushall()
    assert await h1.fleet.membership.beat() == Standing.STATE_LOST  # h1 re-registers (nothing) first
    held = await mint(h1, "d-early")
    assert held.body["refusal_reason"] == str(Refusal.FLEET_STATE_UNAVAILABLE)  # waiting for h2
    assert await h2.fleet.membership.beat() == Standing.STATE_LOST
    await until(lambda: h1.fleet.b.lease_capacity.admitting, 5, "h1 to admit once h2 registered")
    after = await mint(h1, "d-late")
    assert (after.body["account_id"], after.body["skipped"][0]["code"]) == (B, str(Skip.LEASE_CAPACITY_EXHAUSTED))


async def test_a_lease_claim_redis_ran_after_its_timeout_is_undone(world) -> None:
    """A mint's slot reserve sent to a hung Redis times out (the mint is held), but Redis runs
    it when it resumes: the undo is owed and delivered, so the slot is never leaked."""
    server, fleet = world
    h1 = await fleet.add("h1")
    warm = await mint(h1, "warm")  # the client's pool holds connections ready to send on
    assert warm.status == 201 and await h1.service.revoke(warm.body["key_id"])
    account = h1.service.registry.get(A)
    assert account is not None
    server.pause()
    try:
        with pytest.raises(StateUnavailable):
            await h1.desk._claim(
                account, "key-hung", 2, _lineage("d-hung"), None, staged=_selected("key-hung", "d-hung")
            )
    finally:
        server.resume()

    async def undone() -> bool:
        capacity = h1.service.lease_capacity
        return not len(h1.fleet.b.owed) and await capacity.count(A) == 0 and not await capacity.holds("key-hung")

    await until(undone, 15, "the timed-out claim undone once Redis answers")
    await _none_staged(h1, "key-hung")  # the decision staged with the claims: deleted (owed) too
    assert (await mint(h1, "after")).body["account_id"] == A


async def test_a_claim_refused_on_one_count_leaves_none_of_the_three_taken(world) -> None:
    """Issue 27: the slot, the dispatch's live key and the circuit's probe are claimed at once;
    whichever is refused, what the others took is given back (and the refusal is the first in
    the order slot, dispatch, probe)."""
    _server, fleet = world
    h1 = await fleet.add("h1")
    account = h1.service.registry.get(A)
    assert account is not None
    capacity, decisions, circuits = h1.service.lease_capacity, h1.service.decisions, h1.service.circuits
    held = await mint(h1, "d-live")
    assert held.body["account_id"] == A

    # the dispatch already holds a live key: the slot taken alongside is released
    refused = await h1.desk._claim(account, "key-1", 2, _lineage("d-live"), None, staged=_selected("key-1", "d-live"))
    assert refused == (Refusal.FALLBACK_LEASE_STILL_HELD, None)
    assert await capacity.count(A) == 1 and not await capacity.holds("key-1")
    await _none_staged(h1, "key-1")

    # a half-open circuit whose probe is out: the slot and the live key taken alongside go back
    now = now_ms()
    probing = rules.Circuit(
        phase=CircuitPhase.HALF_OPEN,
        opened_at_ms=now - 60_000,
        retry_at_ms=now - 1,
        open_ms=30_000,
        probe_key="key-probe",
    )
    assert await circuits.store.swap(A, rules.CLOSED, probing)
    refused = await h1.desk._claim(account, "key-2", 2, _lineage("d-2"), None, staged=_selected("key-2", "d-2"))
    assert refused == (Refusal.NO_ELIGIBLE_ACCOUNT, Skip.CIRCUIT_OPEN)
    assert await capacity.count(A) == 1 and not await capacity.holds("key-2")
    assert await decisions.live_keys("acme/app", "d-2") == set()
    assert (await circuits.store.load(A)).probe_key == "key-probe"
    await _none_staged(h1, "key-2")

    # the slots are full: the live key and the probe taken alongside are given back
    assert await circuits.store.swap(
        A,
        probing,
        rules.Circuit(phase=CircuitPhase.OPEN, opened_at_ms=now - 60_000, retry_at_ms=now - 1, open_ms=30_000),
    )
    assert await capacity.reserve(A, "key-filler", 2)
    refused = await h1.desk._claim(account, "key-3", 2, _lineage("d-3"), None, staged=_selected("key-3", "d-3"))
    assert refused == (Refusal.NO_ELIGIBLE_ACCOUNT, Skip.LEASE_CAPACITY_EXHAUSTED)
    assert await decisions.live_keys("acme/app", "d-3") == set()
    assert rules.current(await circuits.store.load(A), now_ms()).probe_key is None
    assert await capacity.count(A) == 2
    await _none_staged(h1, "key-3")


def _lineage(dispatch_id: str) -> Lineage:
    return Lineage(dispatch_id, "acme/app", "m-1")


def _selected(key_id: str, dispatch_id: str) -> Decision:
    """The selected decision a mint stages with its claims (its id derived from its key)."""
    return Decision(
        mint_decision_id="md_" + key_id,
        outcome=Outcome.SELECTED,
        lineage=_lineage(dispatch_id),
        at_ms=now_ms(),
        account_id=A,
        fallback_position=0,
        key_id=key_id,
        effective_model="m-1",
    )


async def _none_staged(host: Control, key_id: str) -> None:
    """Nothing of the staged decision is left, in Redis or on the host: a refused or failed
    claim leaves no decision anyone could cite (SPEC §5)."""
    keys, raw = host.fleet.b.keys, host.fleet.b.sync
    assert raw.exists(keys.decision("md_" + key_id), keys.decision_of_key(key_id)) == 0
    assert await host.service.decisions.get("md_" + key_id) is None
    assert await host.service.decisions.for_key(key_id) is None


async def test_extend_keeps_a_dispatch_keys_decision_and_live_set_in_redis_as_long_as_the_key(world) -> None:
    server, fleet = world
    h1 = await fleet.add("h1")
    minted = await mint(h1, "d-ext", fallback_driver="gateway")
    key_id, decision_id = minted.body["key_id"], minted.body["mint_decision_id"]
    keys = h1.fleet.b.keys
    admin = h1.fleet.b.sync
    names = [
        keys.decision(decision_id),
        keys.decision_of_key(key_id),
        keys.live_of_key(key_id),
        keys.live("acme/app", "d-ext"),
    ]
    for name in names:
        admin.pexpire(name, 5_000)  # as if the key had outlived Redis's copy (25 h)
    assert (await h1.desk.extend(key_id, 600)).status == 200
    assert all(admin.pttl(name) > 3_600_000 for name in names), [admin.pttl(n) for n in names]
