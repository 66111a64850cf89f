"""`OwedCircuits`' quiet rows (issue 27 §4) over an in-process store: held back until the delay,
folded then; a fold that fails with a bug is logged and the next rows still fold; one that
fails because Redis is away is owed, as any row."""

from __future__ import annotations

from structlog.testing import capture_logs

from controlplane.circuits import LocalCircuits
from controlplane.core import circuit as rules
from controlplane.fleet.owed import OwedCircuits, OwedWrites
from shared.capacity import StateUnavailable
from shared.clock import now_ms
from shared.wire import AttemptRow
from tests.support.rows import row
from tests.support.waits import until

A = "acct-a"


class Store(LocalCircuits):
    def __init__(self) -> None:
        super().__init__()
        self.fail: BaseException | None = None

    async def load(self, account_id: str) -> rules.Circuit:
        if self.fail is not None:
            raise self.fail
        return await LocalCircuits.load(self, account_id)


async def _registry(store: Store, owed: OwedWrites) -> OwedCircuits:
    registry = OwedCircuits(store, 30, owed, quiet_delay_s=0.01)
    assert await store.swap(A, rules.CLOSED, rules.Circuit(consecutive=2))
    assert await registry.claim_probe(A, "key_1", now_ms())  # admitted, not the probe
    return registry


def _answer() -> AttemptRow:
    return row("2026-12-01T10:00:00.000Z", cost=0.0, account=A)  # a 2xx of lease key_1


async def test_a_quiet_fold_that_fails_with_a_bug_is_logged_and_the_next_rows_fold() -> None:
    store, owed = Store(), OwedWrites(lambda _k: False)
    registry = await _registry(store, owed)
    store.fail = RuntimeError("a bug")
    with capture_logs() as logs:
        await registry.on_rows([_answer()], now_ms())
        await until(lambda: any(e["event"] == "row_fold_failed" for e in logs), 5, "the failure logged")
    store.fail = None
    await registry.on_rows([_answer()], now_ms())
    await until(lambda: store._state.get(A, rules.CLOSED) == rules.CLOSED, 5, "the next rows folded")


async def test_a_quiet_fold_while_redis_is_away_is_owed() -> None:
    store, owed = Store(), OwedWrites(lambda _k: False)
    registry = await _registry(store, owed)
    store.fail = StateUnavailable("away")
    await registry.on_rows([_answer()], now_ms())
    await until(lambda: len(owed) == 1, 5, "the quiet fold owed")
    assert store._state[A] == rules.Circuit(consecutive=2)
    store.fail = None
    assert await owed.deliver() == 1 and store._state.get(A, rules.CLOSED) == rules.CLOSED
