"""`on_quiet_terminals` (issue 27 §4: fleet mode folds quiet rows late and together) is what
`on_terminal` makes of any sequence of quiet terminals — answers of leases that are not the probe
and aborts of any lease — from every kind of circuit state, by table and by exhaustive sequences."""

from __future__ import annotations

import itertools
from typing import NamedTuple

import pytest

from controlplane.core import circuit as c
from shared.codes import CircuitPhase, Condition

COOL = 30
S = 1000
NOW = 40 * S  # past the open states' retry time below when they say so

STATES = {
    "closed": c.CLOSED,
    "closed, two failures counted": c.Circuit(consecutive=2),
    "open": c.Circuit(
        phase=CircuitPhase.OPEN,
        consecutive=3,
        opened_at_ms=NOW - 1,
        retry_at_ms=NOW + COOL * S,
        opened_by=Condition.OVERLOADED,
        open_ms=COOL * S,
    ),
    "open past its retry time (half-open)": c.Circuit(
        phase=CircuitPhase.OPEN, consecutive=3, opened_at_ms=0, retry_at_ms=COOL * S, open_ms=COOL * S
    ),
    "half-open, the probe out": c.Circuit(
        phase=CircuitPhase.HALF_OPEN, opened_at_ms=0, retry_at_ms=COOL * S, open_ms=COOL * S, probe_key="probe"
    ),
}


class Quiet(NamedTuple):
    key: str
    aborted: bool
    condition: Condition | None = None

    def apply(self, state: c.Circuit) -> c.Circuit:
        return c.on_terminal(state, NOW, self.key, self.condition, self.aborted, 600, COOL)


QUIET = [
    Quiet("other", aborted=False),  # a 2xx of a lease that is not the probe
    Quiet("other", aborted=True),
    Quiet("probe", aborted=True, condition=Condition.CREDIT_EXHAUSTED),  # the probe's abort decides nothing
    Quiet("other", aborted=True, condition=Condition.RATE_LIMITED),
]


@pytest.mark.parametrize("name", STATES)
@pytest.mark.parametrize("length", [1, 2, 3])
def test_quiet_terminals_fold_as_one(name: str, length: int) -> None:
    for sequence in itertools.product(QUIET, repeat=length):
        state = STATES[name]
        folded = state
        for row in sequence:
            folded = row.apply(folded)
        answered = any(not row.aborted for row in sequence)
        assert c.on_quiet_terminals(state, NOW, answered) == folded, (name, sequence)


@pytest.mark.parametrize(
    ("name", "answered", "expect"),
    [
        ("closed, two failures counted", True, c.CLOSED),
        ("closed, two failures counted", False, c.Circuit(consecutive=2)),
        ("half-open, the probe out", True, STATES["half-open, the probe out"]),
        ("open", True, STATES["open"]),
    ],
)
def test_an_answer_resets_only_a_closed_count(name: str, answered: bool, expect: c.Circuit) -> None:
    assert c.on_quiet_terminals(STATES[name], NOW, answered) == expect


def test_a_quiet_fold_takes_the_state_as_of_now() -> None:
    folded = c.on_quiet_terminals(STATES["open past its retry time (half-open)"], NOW, True)
    assert folded.phase == CircuitPhase.HALF_OPEN and folded.probe_key is None
