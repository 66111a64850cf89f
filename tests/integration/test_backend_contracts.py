"""The contracts of the state fleet mode shares, run against every implementation.

Each interface's docstring states its contract; each test here checks one clause of it. The
suites are parametrised over `*_BACKENDS`: an implementation is added to a dict and must pass
every test unchanged: the in-process ones, the chain storage over real files, and the Redis
ones over a real `redis-server` (each test in a fresh key namespace of its own, `fleet`).
Redis-only behaviour (hosts, data loss, outages) is in `test_fleet_*.py`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from controlplane.circuits import CircuitRegistry, CircuitStore, CircuitView, LocalCircuits
from controlplane.core import circuit as rules
from controlplane.core.fallback import Lineage
from controlplane.decisions import Decision, DecisionStore, LocalDecisions
from controlplane.fleet.circuits import RedisCircuits
from controlplane.fleet.decisions import RedisDecisions
from shared.capacity import CapacityStore, LocalCapacity
from shared.chainstorage import ChainBusy, ChainStorage, FileChainStorage, RevisionConflict
from shared.codes import CircuitPhase, Condition, Outcome, Refusal
from shared.fleet.capacity import RedisCapacity
from shared.fleet.chains import RedisChainStorage
from shared.fleet.keys import Ceiling
from shared.fleet.mirror import MirroredChainStorage
from shared.wire import AttemptRow
from tests.support.fleet import Fleet
from tests.support.waits import until as wait_until_async

# A backend is built from a fleet (None for the in-process ones, which need no Redis).
CAPACITY_BACKENDS: dict[str, Callable[[Fleet | None], CapacityStore]] = {
    "local": lambda _: LocalCapacity(),
    "redis": lambda f: RedisCapacity(f.client, f.keys, Ceiling.LEASE, "host-a"),
}
CIRCUIT_BACKENDS: dict[str, Callable[[Fleet | None], CircuitStore]] = {
    "local": lambda _: LocalCircuits(),
    "redis": lambda f: RedisCircuits(f.client, f.keys, entries=f.entries),
}
DECISION_BACKENDS: dict[str, Callable[[Fleet | None], DecisionStore]] = {
    "local": lambda _: LocalDecisions(),
    "redis": lambda f: RedisDecisions(f.client, f.keys, entries=f.entries),
}
CHAIN_BACKENDS: dict[str, Callable[[Path, Fleet | None], ChainStorage]] = {
    "file": lambda d, _: FileChainStorage(str(d / "chain.jsonl"), str(d / "chain.anchor")),
    "redis": lambda d, f: RedisChainStorage(f.sync, f.keys, "chain"),
    "mirrored": lambda d, f: MirroredChainStorage(
        RedisChainStorage(f.sync, f.keys, "chain"), FileChainStorage(str(d / "mirror.jsonl"), str(d / "mirror.anchor"))
    ),
}
NEEDS_REDIS = {"redis", "mirrored"}


class Bound:
    """How a decision store forgets, in its own terms: `pass_over(store)` makes the bound pass
    for `md_0`, which the test recorded first (the in-process table records newer decisions
    past its cap; the Redis one waits out its TTL, and proves it did not forget early)."""

    def __init__(self, pass_over: Callable[[DecisionStore], Awaitable[None]]) -> None:
        self.pass_over = pass_over


async def _past_the_cap(store: DecisionStore) -> None:
    for n in range(1, 11):  # cap 8: md_0 is evicted, oldest first
        await store.record(_decision(n, key=f"K{n}"))


def _past_the_ttl(ttl_s: float, started: list[float]) -> Callable[[DecisionStore], Awaitable[None]]:
    async def pass_over(store: DecisionStore) -> None:
        async def forgotten() -> bool:
            return await store.get("md_0") is None

        await wait_until_async(forgotten, ttl_s + 10, "md_0 to expire")
        assert time.monotonic() - started[0] >= ttl_s * 0.95, "forgotten before its TTL"

    return pass_over


@asynccontextmanager
async def _fleet_for(request: pytest.FixtureRequest, name: str) -> AsyncIterator[Fleet | None]:
    """A fresh fleet namespace for a Redis backend (the server is asked for only then)."""
    if name not in NEEDS_REDIS:
        yield None
        return
    fleet = Fleet(request.getfixturevalue("redis_server"))
    try:
        yield fleet
    finally:
        await fleet.close()


@pytest.fixture(params=sorted(CAPACITY_BACKENDS))
async def capacity(request) -> AsyncIterator[CapacityStore]:
    async with _fleet_for(request, request.param) as fleet:
        yield CAPACITY_BACKENDS[request.param](fleet)


@pytest.fixture(params=sorted(CIRCUIT_BACKENDS))
async def circuit_store(request) -> AsyncIterator[CircuitStore]:
    async with _fleet_for(request, request.param) as fleet:
        yield CIRCUIT_BACKENDS[request.param](fleet)


@pytest.fixture(params=sorted(DECISION_BACKENDS))
async def decisions(request) -> AsyncIterator[DecisionStore]:
    async with _fleet_for(request, request.param) as fleet:
        yield DECISION_BACKENDS[request.param](fleet)


REDIS_TTL_S = 1.5


@pytest.fixture(params=sorted(DECISION_BACKENDS))
async def bounded_decisions(request) -> AsyncIterator[tuple[DecisionStore, Bound, list[float]]]:
    """A store with a small bound of its own kind: a count cap, or a lifetime."""
    started = [time.monotonic()]
    async with _fleet_for(request, request.param) as fleet:
        if fleet is None:
            yield LocalDecisions(cap=8, refused_cap=4), Bound(_past_the_cap), started
        else:
            store = RedisDecisions(
                fleet.client, fleet.keys, entries=fleet.entries, ttl_s=REDIS_TTL_S, refused_ttl_s=REDIS_TTL_S
            )
            yield store, Bound(_past_the_ttl(REDIS_TTL_S, started)), started


@pytest.fixture(params=sorted(CHAIN_BACKENDS))
def chain(request, tmp_path: Path) -> Iterator[ChainStorage]:
    fleet = Fleet(request.getfixturevalue("redis_server")) if request.param in NEEDS_REDIS else None
    yield CHAIN_BACKENDS[request.param](tmp_path, fleet)
    if fleet is not None:
        fleet.close_sync()


# ---- CapacityStore -------------------------------------------------------------------------


async def test_capacity_reserves_up_to_the_ceiling_and_no_further(capacity: CapacityStore) -> None:
    assert [await capacity.reserve("a", f"h{i}", 2) for i in range(3)] == [True, True, False]
    assert await capacity.count("a") == 2 and not await capacity.holds("h2")


async def test_capacity_reserving_a_holder_twice_takes_one_slot(capacity: CapacityStore) -> None:
    assert await capacity.reserve("a", "h", 2) and await capacity.reserve("a", "h", 2)
    assert await capacity.count("a") == 1


async def test_capacity_a_holder_holds_one_slot_anywhere(capacity: CapacityStore) -> None:
    assert await capacity.reserve("a", "h", None)
    assert not await capacity.reserve("b", "h", None)
    assert (await capacity.count("a"), await capacity.count("b")) == (1, 0)


async def test_capacity_release_is_idempotent_and_ignores_strangers(capacity: CapacityStore) -> None:
    await capacity.reserve("a", "h", 1)
    assert await capacity.release("h") is True
    assert await capacity.release("h") is False and await capacity.release("never") is False
    assert await capacity.count("a") == 0 and await capacity.reserve("a", "h2", 1)


async def test_capacity_no_ceiling_is_no_ceiling(capacity: CapacityStore) -> None:
    assert all([await capacity.reserve("a", f"h{i}", None) for i in range(50)])
    assert await capacity.count("a") == 50


async def test_capacity_concurrent_reservers_never_exceed_the_ceiling(capacity: CapacityStore) -> None:
    results = await asyncio.gather(*(capacity.reserve("a", f"h{i}", 3) for i in range(20)))
    assert sum(results) == 3 and await capacity.count("a") == 3


# ---- CircuitStore --------------------------------------------------------------------------


OPEN = rules.Circuit(
    phase=CircuitPhase.OPEN, consecutive=3, opened_at_ms=1, retry_at_ms=2, opened_by=Condition.RATE_LIMITED, open_ms=1
)


async def test_circuit_store_answers_closed_for_an_account_never_stored(circuit_store: CircuitStore) -> None:
    assert await circuit_store.load("a") == rules.CLOSED


async def test_circuit_store_swaps_only_from_the_expected_state(circuit_store: CircuitStore) -> None:
    assert await circuit_store.swap("a", rules.CLOSED, OPEN)
    assert await circuit_store.load("a") == OPEN
    assert not await circuit_store.swap("a", rules.CLOSED, rules.CLOSED)  # stale expectation
    assert await circuit_store.load("a") == OPEN and await circuit_store.load("b") == rules.CLOSED


async def test_circuit_store_of_two_swaps_from_one_state_one_wins(circuit_store: CircuitStore) -> None:
    other = rules.Circuit(consecutive=1)
    results = await asyncio.gather(
        circuit_store.swap("a", rules.CLOSED, OPEN), circuit_store.swap("a", rules.CLOSED, other)
    )
    assert sorted(results) == [False, True]


def _row(key_id: str, condition: Condition | None, **over: Any) -> AttemptRow:
    base = dict(
        attempt_id="att_" + key_id,
        key_id=key_id,
        account_id="a",
        mint_decision_id=None,
        dispatch_id=None,
        repo_slug="r",
        principal_id="p",
        wire="anthropic",
        path="/v1/messages",
        requested_model="m",
        served_model=None,
        stream=False,
        started_at="s",
        finished_at="f",
        status="upstream-error" if condition else "completed",
        http_status=429 if condition else 200,
        condition=None if condition is None else str(condition),
        refusal_reason=None,
        usage=None,
        cost_usd=None,
        cost_reason=None,
        overhead_ms=None,
    )
    base.update(over)
    return AttemptRow(**base)


async def test_circuit_registry_over_a_store_admits_one_probe(circuit_store: CircuitStore) -> None:
    """The registry's rules hold whichever store keeps the state: three failures open it, the
    cooldown passes, exactly one of many concurrent claims becomes the probe, its success closes."""
    seen: list[CircuitView] = []
    registry = CircuitRegistry(circuit_store, cooldown_s=1, on_transition=seen.append)
    for n in range(3):
        await registry.on_row(_row(f"k{n}", Condition.RATE_LIMITED), now_ms=1_000)
    assert (await registry.get("a", 1_000)).phase == CircuitPhase.OPEN and not await registry.admits("a", 1_500)
    claims = await asyncio.gather(*(registry.claim_probe("a", f"p{i}", 2_100) for i in range(5)))
    assert sum(claims) == 1
    probe = f"p{claims.index(True)}"
    await registry.on_row(_row(probe, None), now_ms=2_200)
    assert (await registry.get("a", 2_200)).phase == CircuitPhase.CLOSED
    assert [v.state for v in seen] == ["open", "closed"] and seen[0].account_id == "a"


# ---- DecisionStore -------------------------------------------------------------------------


LINEAGE = Lineage("d1", "r", "m")


def _decision(n: int, key: str | None = None, outcome: Outcome = Outcome.SELECTED) -> Decision:
    return Decision(
        mint_decision_id=f"md_{n}",
        outcome=outcome,
        lineage=LINEAGE,
        at_ms=n,
        key_id=key,
        account_id=None if key is None else "a",
        fallback_position=0,
        refusal_reason=None if key else Refusal.NO_ELIGIBLE_ACCOUNT,
    )


async def test_decisions_keep_a_lease_bearing_decision_by_id_and_by_key(decisions: DecisionStore) -> None:
    chosen = _decision(1, key="K1")
    await decisions.record(chosen)
    assert await decisions.get("md_1") == chosen and await decisions.for_key("K1") == chosen
    assert await decisions.get("md_none") is None and await decisions.for_key("K_none") is None


async def test_decisions_keep_only_the_outcome_of_a_refused_one(decisions: DecisionStore) -> None:
    await decisions.record(_decision(2, outcome=Outcome.HELD))
    assert await decisions.get("md_2") is None
    assert await decisions.refused_outcome("md_2") == Outcome.HELD
    assert await decisions.refused_outcome("md_never") is None


async def test_decisions_are_bounded_oldest_first(bounded_decisions) -> None:
    store, bound, started = bounded_decisions
    started[0] = time.monotonic()
    await store.record(_decision(0, key="K0"))
    await store.add_evidence("md_0", Condition.RATE_LIMITED)
    await store.record(_decision(100, outcome=Outcome.HELD))
    assert await store.get("md_0") is not None  # kept until its bound passes
    await bound.pass_over(store)
    assert await store.get("md_0") is None and await store.for_key("K0") is None
    assert await store.evidence("md_0") == ()
    await store.record(_decision(11, key="K11"))
    assert await store.get("md_11") is not None and await store.for_key("K11") is not None


async def test_decisions_evidence_arrives_in_order_for_known_decisions_only(decisions: DecisionStore) -> None:
    await decisions.record(_decision(3, key="K3"))
    await decisions.add_evidence("md_3", Condition.RATE_LIMITED)
    await decisions.add_evidence("md_3", None)
    await decisions.add_evidence("md_unknown", Condition.OVERLOADED)
    assert await decisions.evidence("md_3") == (Condition.RATE_LIMITED, None)
    assert await decisions.evidence("md_unknown") == ()


async def test_decisions_one_live_lease_per_dispatch(decisions: DecisionStore) -> None:
    assert await decisions.claim_live("K1", "r", "d1")
    assert not await decisions.claim_live("K2", "r", "d1")  # another key is live
    assert await decisions.claim_live("K3", "r", "d1", allowing="K1")  # a renewal's successor
    assert await decisions.live_keys("r", "d1") == {"K1", "K3"}
    assert await decisions.claim_live("K9", "r", "d2")  # another dispatch
    await decisions.end_key("K1")
    await decisions.end_key("K1")  # idempotent
    await decisions.end_key("K3")
    assert await decisions.live_keys("r", "d1") == set()
    assert await decisions.claim_live("K2", "r", "d1")


async def test_decisions_concurrent_claims_for_one_dispatch_admit_one(decisions: DecisionStore) -> None:
    results = await asyncio.gather(*(decisions.claim_live(f"K{i}", "r", "d7") for i in range(10)))
    assert sum(results) == 1 and len(await decisions.live_keys("r", "d7")) == 1


async def test_decisions_note_live_restores_unconditionally(decisions: DecisionStore) -> None:
    await decisions.note_live("K1", "r", "d1")
    await decisions.note_live("K2", "r", "d1")
    assert await decisions.live_keys("r", "d1") == {"K1", "K2"}


# ---- ChainStorage --------------------------------------------------------------------------


def test_chain_storage_reads_an_empty_chain(chain: ChainStorage) -> None:
    read = chain.read()
    assert (read.data, read.anchor_before, read.anchor_after) == (b"", None, None)
    assert chain.tail() == b""


def test_chain_storage_appends_at_the_expected_size_only(chain: ChainStorage) -> None:
    with chain.writer():
        chain.append(b'{"seq":1}\n', 0)
        chain.append(b'{"seq":2}\n', 10)
        with pytest.raises(RevisionConflict):
            chain.append(b'{"seq":3}\n', 10)
    assert chain.read().data == b'{"seq":1}\n{"seq":2}\n'
    assert chain.tail().endswith(b'{"seq":2}\n')


def test_chain_storage_anchor_replaces_and_the_version_moves(chain: ChainStorage) -> None:
    empty = chain.version()
    with chain.writer():
        chain.append(b'{"seq":1}\n', 0)
        after_append = chain.version()
        chain.write_anchor(b"anchor-1")
    after_anchor = chain.version()
    assert len({empty, after_append, after_anchor}) == 3
    read = chain.read()
    assert read.anchor_before == read.anchor_after == b"anchor-1"
    assert chain.version() == after_anchor  # unchanged bytes, unchanged version


def test_chain_storage_writer_is_exclusive(chain: ChainStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    import shared.chainstorage as chainstorage

    monkeypatch.setattr(chainstorage, "LOCK_TIMEOUT_S", 0.2)
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with chain.writer():
            entered.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert entered.wait(10)
        with pytest.raises(ChainBusy):
            with chain.writer():
                pass
    finally:
        release.set()
        holder.join(10)
    with chain.writer():  # free again once the holder left
        pass


async def test_decisions_a_staged_decision_is_recorded_or_forgotten(decisions: DecisionStore) -> None:
    """A mint stages its decision with its claims: `record(staged=True)` keeps it as `record`
    does; `unstage` (a claim refused or failed) leaves nothing of it anywhere."""
    kept, dropped = _decision(21, key="K21"), _decision(22, key="K22")
    for decision in (kept, dropped):
        await decisions.stage(decision)
    await decisions.record(kept, staged=True)
    await decisions.unstage(dropped)
    assert await decisions.get("md_21") == kept and await decisions.for_key("K21") == kept
    assert await decisions.get("md_22") is None and await decisions.for_key("K22") is None
    await decisions.add_evidence("md_22", Condition.RATE_LIMITED)
    assert await decisions.evidence("md_22") == ()
