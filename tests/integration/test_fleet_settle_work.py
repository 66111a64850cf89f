"""A fleet settle's Redis work (issue 27 §4), over a real redis-server:

- quiet rows (a 2xx of a lease admitted as no probe, an abort) are folded late and together,
  within the delay, and before the account's next evidence row (so this host's rows still fold in
  order); a probe's answer is folded at once;
- a row's evidence equal to one this host appended lately is not sent again; an append to a
  decision Redis does not keep is not noted; a re-registration forgets every note.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from controlplane.core import circuit as rules
from controlplane.core.fallback import Lineage
from controlplane.decisions import Decision
from controlplane.fleet.circuits import RedisCircuits
from controlplane.fleet.owed import OwedCircuits, OwedDecisions, OwedWrites
from controlplane.stores.leasedecisions import LeaseDecisions
from shared.clock import now_ms
from shared.codes import CircuitPhase, Condition, Outcome
from shared.fleet.batching import BatchingRedis
from shared.wire import AttemptRow
from tests.support.fleet import Fleet
from tests.support.fleethosts import FleetHosts, fleet_world, mint
from tests.support.redis_server import RedisServer
from tests.support.rows import row
from tests.support.waits import until

A = "acct-a"
QUIET_DELAY_S = 0.3


def _row(n: int, key_id: str, status: str = "completed", condition: str | None = None) -> AttemptRow:
    """A terminal row of account A (`tests.support.rows.row`), a 529 when it names a condition."""
    done = row("2026-11-30T12:00:00.010Z", account=A, attempt_id=f"att_{n:04d}", status=status)
    return msgspec.structs.replace(
        done, key_id=key_id, dispatch_id="d", http_status=200 if condition is None else 529, condition=condition
    )


def _fail(n: int, key_id: str) -> AttemptRow:
    return _row(n, key_id, "upstream-error", str(Condition.OVERLOADED))


class Counting(RedisCircuits):
    loads = 0

    async def load(self, account_id: str) -> rules.Circuit:
        self.loads += 1
        return await RedisCircuits.load(self, account_id)


@pytest.fixture
async def circuits(fleet: Fleet) -> AsyncIterator[tuple[OwedCircuits, Counting]]:
    batching = BatchingRedis(fleet.client)
    store = Counting(batching, fleet.keys, entries=fleet.entries)
    try:
        yield OwedCircuits(store, 30, OwedWrites(lambda _k: False), quiet_delay_s=QUIET_DELAY_S), store
    finally:
        await batching.aclose()


async def test_quiet_rows_are_folded_together_within_the_delay(circuits: Any) -> None:
    registry, store = circuits
    assert await store.swap(A, rules.CLOSED, rules.Circuit(consecutive=2))  # another host's failures
    assert await registry.claim_probe(A, "k1", now_ms())  # closed: admitted, not the probe
    loads = store.loads
    for n in range(3):
        await registry.on_rows([_row(n, "k1"), _row(10 + n, "k1", status="client-aborted")], now_ms())
    assert store.loads == loads  # nothing asked of Redis per settle
    assert await store.load(A) == rules.Circuit(consecutive=2)

    async def reset() -> bool:
        return bool(await store.load(A) == rules.CLOSED)

    await until(reset, 5, "the held answers reset the count", interval_s=0.02)


async def test_a_quiet_row_is_folded_before_the_accounts_next_evidence(circuits: Any) -> None:
    registry, store = circuits
    assert await registry.claim_probe(A, "k1", now_ms())
    await registry.on_rows([_fail(0, "k1")], now_ms())
    await registry.on_rows([_fail(1, "k1")], now_ms())
    await registry.on_rows([_row(2, "k1")], now_ms())  # held back
    await registry.on_rows([_fail(3, "k1")], now_ms())  # the answer between resets the count first
    assert await store.load(A) == rules.Circuit(consecutive=1)


async def test_aborts_alone_leave_the_count(circuits: Any) -> None:
    registry, store = circuits
    assert await store.swap(A, rules.CLOSED, rules.Circuit(consecutive=2))
    await registry.on_rows([_row(0, "k9", status="client-aborted")], now_ms())  # any lease's abort is quiet
    await registry.fold_held()
    assert await store.load(A) == rules.Circuit(consecutive=2)


async def test_the_probes_answer_is_folded_at_once(circuits: Any) -> None:
    registry, store = circuits
    past = rules.Circuit(phase=CircuitPhase.OPEN, consecutive=3, opened_at_ms=0, retry_at_ms=1, open_ms=1000)
    assert await store.swap(A, rules.CLOSED, past)
    assert await registry.claim_probe(A, "probe", now_ms())  # half-open: the probe
    assert (await store.load(A)).probe_key == "probe"
    await registry.on_rows([_row(0, "probe")], now_ms())
    assert await store.load(A) == rules.CLOSED  # closed by the time the settle's fold returns


def _decision(n: int) -> Decision:
    return Decision(
        mint_decision_id=f"md_{n}",
        outcome=Outcome.SELECTED,
        lineage=Lineage("d", "r", "m"),
        at_ms=n,
        key_id=f"key-{n}",
        account_id=A,
        fallback_position=0,
    )


@pytest.fixture
async def decisions(fleet: Fleet) -> AsyncIterator[OwedDecisions]:
    batching = BatchingRedis(fleet.client)
    local = LeaseDecisions(None, lambda _key: None)
    try:
        yield OwedDecisions(batching, fleet.keys, OwedWrites(lambda _k: False), local, entries=fleet.entries)
    finally:
        await batching.aclose()


async def test_an_equal_condition_is_not_appended_again(decisions: OwedDecisions) -> None:
    await decisions.record(_decision(1))
    for _ in range(3):
        await decisions.add_evidence("md_1", None)
    await decisions.add_evidence("md_1", Condition.OVERLOADED)
    await decisions.add_evidence("md_1", Condition.OVERLOADED)
    assert await decisions.evidence("md_1") == (None, Condition.OVERLOADED)
    assert decisions.sent.skipped == 3


async def test_an_append_redis_did_not_keep_is_not_noted(decisions: OwedDecisions) -> None:
    await decisions.add_evidence("md_2", None)  # no such decision: nothing appended
    await decisions.record(_decision(2))
    await decisions.add_evidence("md_2", None)
    assert await decisions.evidence("md_2") == (None,) and decisions.sent.skipped == 0


async def test_a_re_registration_forgets_the_notes(fleet: Fleet, decisions: OwedDecisions) -> None:
    await decisions.record(_decision(3))
    await decisions.add_evidence("md_3", None)
    fleet.admin().delete(*fleet.key_names())  # Redis lost its data
    await decisions.reregister([_decision(3)])
    await decisions.add_evidence("md_3", None)
    assert await decisions.evidence("md_3") == (None,) and decisions.sent.skipped == 0


async def test_a_keys_end_forgets_its_decisions_notes(decisions: OwedDecisions) -> None:
    await decisions.record(_decision(4))
    await decisions.add_evidence("md_4", None)
    await decisions.end_key("key-4")
    assert not decisions.sent.fresh("md_4", None)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[tuple[RedisServer, FleetHosts]]:
    async for made in fleet_world(tmp_path, {A: 2}):
        yield made


async def test_a_settles_circuit_fold_and_evidence_go_as_one_exchange(world: Any) -> None:
    _server, hosts = world
    h1 = await hosts.add("h1")
    minted = await mint(h1, "d1")
    assert minted.status == 201, minted.body
    batching = h1.service.decisions.client
    assert isinstance(batching, BatchingRedis)
    before = batching.batches
    row = msgspec.structs.replace(_fail(0, minted.body["key_id"]), mint_decision_id=minted.body["mint_decision_id"])
    h1.service.record(row)
    await h1.service.settle()
    # the circuit's read and the evidence together, then the circuit's write alone
    assert batching.batches == before + 1
    assert await h1.service.decisions.evidence(row.mint_decision_id or "") == (Condition.OVERLOADED,)
    assert (await h1.service.circuits.store.load(A)).consecutive == 1


async def test_a_clean_stop_folds_the_quiet_rows_held_back(world: Any) -> None:
    server, hosts = world
    h1 = await hosts.add("h1")
    minted = await mint(h1, "d1")
    assert minted.status == 201, minted.body
    circuits = h1.service.circuits
    circuits.quiet_delay_s = 600.0  # only the stop can fold them
    key = minted.body["key_id"]
    h1.service.record(_fail(0, key))
    await h1.service.settle()
    h1.service.record(_row(1, key))  # quiet: held back
    await h1.service.settle()
    admin = redis.Redis(port=server.port)
    circuit_key = circuits.store.keys.circuit(A)
    assert admin.exists(circuit_key)  # the failure's count, not reset yet
    await hosts.stop("h1")
    assert not admin.exists(circuit_key)  # reset: closed, stored as absent
    admin.close()
