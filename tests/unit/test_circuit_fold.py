"""`CircuitRegistry._fold` (a settle's rows of one account) is `on_terminal` row after row, from
every kind of circuit state, over every short sequence of the rows that reach it (its closed
circuit's answers are judged inline, without the call: this proves the shortcut changes nothing)."""

from __future__ import annotations

import asyncio
import itertools

import msgspec
import pytest

from controlplane.circuits import CircuitRegistry, LocalCircuits
from controlplane.core import circuit as c
from shared.codes import AttemptStatus, Condition, Refusal
from tests.support.rows import row
from tests.unit.test_circuit_quiet import COOL, NOW, STATES

BASE = msgspec.structs.replace(row("2026-11-30T12:00:00.000Z"), key_id="probe", retry_after_s=90.0)
ROWS = [
    BASE,  # a 2xx of the probe
    msgspec.structs.replace(BASE, key_id="other"),  # a 2xx of another lease
    msgspec.structs.replace(BASE, status=str(AttemptStatus.CLIENT_ABORTED)),
    msgspec.structs.replace(BASE, status="upstream_error", condition=str(Condition.OVERLOADED)),
    msgspec.structs.replace(BASE, key_id="other", status="upstream_error", condition=str(Condition.CREDIT_EXHAUSTED)),
    msgspec.structs.replace(BASE, status=str(AttemptStatus.CLIENT_ABORTED), condition=str(Condition.RATE_LIMITED)),
]


def _one_by_one(state: c.Circuit, rows: tuple) -> c.Circuit:
    for each in rows:
        condition = Condition(each.condition) if each.condition else None
        aborted = each.status == AttemptStatus.CLIENT_ABORTED
        state = c.on_terminal(state, NOW, each.key_id, condition, aborted, each.retry_after_s, COOL)
    return state


@pytest.mark.parametrize("name", STATES)
@pytest.mark.parametrize("length", [1, 2, 3, 4])
def test_a_settles_fold_is_on_terminal_row_after_row(name: str, length: int) -> None:
    registry = CircuitRegistry(LocalCircuits(), COOL)
    for sequence in itertools.product(ROWS, repeat=length):
        state = STATES[name]
        assert registry._fold(state, list(sequence), NOW) == _one_by_one(state, sequence), (name, sequence)


# A settle's rows over two accounts, with a gateway-authored one (never evidence).
SETTLE_ROWS = [
    BASE,
    msgspec.structs.replace(BASE, account_id="other-account"),
    msgspec.structs.replace(BASE, status=str(AttemptStatus.CLIENT_ABORTED)),
    msgspec.structs.replace(BASE, status="upstream_error", condition=str(Condition.OVERLOADED)),
    msgspec.structs.replace(
        BASE, status="refused", refusal_reason=str(Refusal.REQUEST_CAPACITY_EXHAUSTED), condition=None
    ),
]


def _settled(rows: list, start: c.Circuit, now: bool) -> tuple[dict[str, c.Circuit], list]:
    told: list = []
    registry = CircuitRegistry(LocalCircuits(), COOL, on_transition=told.append)
    store = registry.store
    assert isinstance(store, LocalCircuits)
    for account_id in {r.account_id for r in SETTLE_ROWS}:
        store.store_now(account_id, start)
    if now:
        registry.fold_now(rows, NOW)
    else:
        asyncio.run(registry.on_rows(rows, NOW))
    return {a: store.load_now(a) for a in sorted({r.account_id for r in SETTLE_ROWS})}, told


@pytest.mark.parametrize("name", STATES)
def test_fold_now_stores_and_tells_what_on_rows_does(name: str) -> None:
    """`fold_now` skips a settle of answers and aborts on circuits closed at rest (issue 27): from
    every kind of state, every settle of up to three rows leaves each account's circuit as the
    swap-by-swap fold does (`on_rows`), the same object when nothing changed, and tells the same
    transitions."""
    start = STATES[name]
    for length in (1, 2, 3):
        for sequence in itertools.product(SETTLE_ROWS, repeat=length):
            now, told_now = _settled(list(sequence), start, True)
            swapped, told = _settled(list(sequence), start, False)
            assert now == swapped and told_now == told, (name, sequence)
            assert all(now[a] is start for a in now if swapped[a] == start), (name, sequence)
