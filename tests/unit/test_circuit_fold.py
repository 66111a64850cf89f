"""`CircuitRegistry._fold` (a settle's rows of one account) is `on_terminal` row after row, from
every kind of circuit state, over every short sequence of the rows that reach it (its closed
circuit's answers are judged inline, without the call: this proves the shortcut changes nothing)."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from controlplane.circuits import CircuitRegistry, LocalCircuits
from controlplane.core import circuit as c
from shared.codes import AttemptStatus, Condition
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
