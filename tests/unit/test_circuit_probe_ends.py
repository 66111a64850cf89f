"""A lease's end asks the circuit store only when the lease may be the half-open probe (issue 27:
fleet mode's revoke spent a Redis round trip on it after every data plane ack). A lease the
registry admitted without making it the probe ends without a read; the probe, a key claimed
again that became the probe, and a key this registry never admitted are read and released."""

from __future__ import annotations

from controlplane.circuits import CircuitRegistry, LocalCircuits
from controlplane.core import circuit as rules
from shared.codes import CircuitPhase

NOW = 1_800_000_000_000
HALF_OPEN = rules.Circuit(phase=CircuitPhase.HALF_OPEN, opened_at_ms=NOW - 60_000, retry_at_ms=NOW - 1, open_ms=30_000)


class Counting(LocalCircuits):
    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    async def load(self, account_id: str) -> rules.Circuit:
        self.loads += 1
        return await super().load(account_id)


async def test_a_lease_admitted_as_no_probe_ends_without_a_read() -> None:
    store = Counting()
    registry = CircuitRegistry(store, 30)
    assert await registry.claim_probe("a", "k1", NOW)
    before = store.loads
    await registry.on_lease_ended("a", "k1", NOW)
    assert store.loads == before
    await registry.on_lease_ended("a", "k1", NOW)  # a second end: unknown now, read
    await registry.on_lease_ended("b", "k1", NOW)  # another account's: read
    assert store.loads == before + 2


async def test_the_probe_is_read_and_released_at_its_end() -> None:
    store = Counting()
    store._state["a"] = HALF_OPEN
    registry = CircuitRegistry(store, 30)
    assert await registry.claim_probe("a", "probe", NOW)
    assert store._state["a"].probe_key == "probe"
    assert not await registry.claim_probe("a", "other", NOW)  # one probe out
    await registry.on_lease_ended("a", "probe", NOW)
    assert store._state["a"].probe_key is None
    assert await registry.claim_probe("a", "next", NOW) and store._state["a"].probe_key == "next"


async def test_a_key_that_becomes_the_probe_later_is_released_at_its_end() -> None:
    """A renewal that lost its slot claims again: admitted as no probe at its mint (closed), the
    same key becomes the probe once the circuit is half-open, and its end must release it."""
    store = Counting()
    registry = CircuitRegistry(store, 30)
    assert await registry.claim_probe("a", "k", NOW)
    store._state["a"] = HALF_OPEN
    assert await registry.claim_probe("a", "k", NOW) and store._state["a"].probe_key == "k"
    await registry.on_lease_ended("a", "k", NOW)
    assert store._state["a"].probe_key is None
