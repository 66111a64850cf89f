"""Circuit transitions by table (SPEC §7): each case folds a history of events into a closed
circuit and checks the state, as of the last event (or `at`), that history leaves."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from controlplane.core import circuit as c
from shared.codes import CircuitPhase, Condition

COOL = 30  # GATEWAY_CIRCUIT_COOLDOWN_SECONDS
S = 1000  # ms in a second
CLOSED, OPEN, HALF_OPEN = CircuitPhase.CLOSED, CircuitPhase.OPEN, CircuitPhase.HALF_OPEN
UNAVAILABLE, CREDIT = Condition.UPSTREAM_UNAVAILABLE, Condition.CREDIT_EXHAUSTED


class Fail(NamedTuple):
    """A qualifying terminal of lease `key`."""

    at_ms: int
    condition: Condition = UNAVAILABLE
    key: str = "k"
    retry_after_s: float | None = None

    def apply(self, state: c.Circuit) -> c.Circuit:
        return c.on_terminal(state, self.at_ms, self.key, self.condition, False, self.retry_after_s, COOL)


class Ok(NamedTuple):
    """A terminal that is no evidence (2xx, another 4xx)."""

    at_ms: int
    key: str = "k"

    def apply(self, state: c.Circuit) -> c.Circuit:
        return c.on_terminal(state, self.at_ms, self.key, None, False, None, COOL)


class Abort(NamedTuple):
    """The worker went away (whatever the upstream had said)."""

    at_ms: int
    key: str = "k"
    condition: Condition | None = None

    def apply(self, state: c.Circuit) -> c.Circuit:
        return c.on_terminal(state, self.at_ms, self.key, self.condition, True, 600, COOL)


class Lease(NamedTuple):
    at_ms: int
    key: str = "probe"

    def apply(self, state: c.Circuit) -> c.Circuit:
        return c.on_lease(state, self.at_ms, self.key)


class Ended(NamedTuple):
    """A lease ended (revoked, expired) without a terminal."""

    at_ms: int
    key: str = "probe"

    def apply(self, state: c.Circuit) -> c.Circuit:
        return c.on_lease_ended(state, self.at_ms, self.key)


class Case(NamedTuple):
    name: str
    given: list[Any]  # events, oldest first, from a closed circuit
    expect: dict[str, Any]  # fields of the state as of `at` (default: the last event's time);
    # "admits": may a lease be minted then; "state": the whole state


CREDIT_OPEN = [Fail(0, CREDIT)]  # open at 0 until COOL, opened by credit-exhausted
PROBE_OUT = [*CREDIT_OPEN, Lease(COOL * S)]  # half-open at COOL, its probe lease out
# Opened for COOL, then each failed probe re-opens for twice the last open time, capped at
# 15 min; each probe is leased (and fails) when the circuit before it half-opens.
PROBE_TIMES_S = [30, 90, 210, 450, 930, 1830, 2730]
REOPENS_S = [60, 120, 240, 480, 900, 900, 900]


def failed_probes(n: int) -> list[Any]:
    return [
        *CREDIT_OPEN,
        *(event for t in PROBE_TIMES_S[:n] for event in (Lease(t * S, "p"), Fail(t * S, Condition.OVERLOADED, "p"))),
    ]


CASES = [
    # closed: three consecutive qualifying terminals, or one credit-exhausted, open it
    Case("two failures stay closed", [Fail(0), Fail(1)], {"phase": CLOSED, "consecutive": 2, "admits": True}),
    Case(
        "three consecutive failures open",
        [Fail(0), Fail(1), Fail(2)],
        {"phase": OPEN, "opened_by": UNAVAILABLE, "opened_at_ms": 2, "retry_at_ms": 2 + COOL * S, "admits": False},
    ),
    Case("one credit-exhausted opens", CREDIT_OPEN, {"phase": OPEN, "opened_by": CREDIT, "retry_at_ms": COOL * S}),
    Case("an abort leaves the count", [Fail(0), Fail(1), Abort(2)], {"phase": CLOSED, "consecutive": 2}),
    Case(
        "an abort of a qualifying answer is no failure",
        [Fail(0), Fail(1), Abort(2, condition=UNAVAILABLE)],
        {"phase": CLOSED, "consecutive": 2},
    ),
    Case("a success resets the count", [Fail(0), Fail(1), Abort(2), Ok(3)], {"state": c.CLOSED}),
    # the open time: the cooldown, or a longer Retry-After, capped at 15 min
    Case("a longer retry-after is honoured", [Fail(0, CREDIT, retry_after_s=120)], {"retry_at_ms": 120 * S}),
    Case("a shorter retry-after is the cooldown", [Fail(0, CREDIT, retry_after_s=5)], {"retry_at_ms": COOL * S}),
    Case(
        "retry-after is capped at 15 min",
        [Fail(0, CREDIT, retry_after_s=10_000)],
        {"retry_at_ms": c.MAX_OPEN_MS, "open_ms": c.MAX_OPEN_MS},
    ),
    # open: the reopen time only ever moves later
    Case(
        "a shorter answer while open never moves retry_at earlier",
        [Fail(0, CREDIT, retry_after_s=300), Fail(10 * S, Condition.RATE_LIMITED, retry_after_s=5)],
        {"phase": OPEN, "retry_at_ms": 300 * S, "opened_at_ms": 0, "opened_by": CREDIT},
    ),
    Case(
        "a longer answer while open moves retry_at later",
        [Fail(0, CREDIT, retry_after_s=300), Fail(10 * S, Condition.RATE_LIMITED, retry_after_s=600)],
        {"phase": OPEN, "retry_at_ms": 610 * S, "opened_at_ms": 0, "opened_by": CREDIT},
    ),
    Case(
        "a success while open changes nothing",
        [*CREDIT_OPEN, Ok(5 * S)],
        {"phase": OPEN, "retry_at_ms": COOL * S, "admits": False},
    ),
    Case(
        "an abort while open never moves retry_at",
        [*CREDIT_OPEN, Abort(5 * S, condition=CREDIT)],
        {"phase": OPEN, "retry_at_ms": COOL * S, "open_ms": COOL * S},
    ),
    Case("open admits no lease before retry_at", CREDIT_OPEN, {"at": COOL * S - 1, "phase": OPEN, "admits": False}),
    # half-open: exactly one lease, the probe, and only its first terminal decides
    Case(
        "at retry_at it is half-open and admits one",
        CREDIT_OPEN,
        {"at": COOL * S, "phase": HALF_OPEN, "probe_key": None, "admits": True},
    ),
    Case(
        "with the probe out it admits no other",
        PROBE_OUT,
        {"at": COOL * S + 1, "phase": HALF_OPEN, "probe_key": "probe", "admits": False},
    ),
    Case(
        "a lease granted after the probe is not the probe",
        [*PROBE_OUT, Lease(COOL * S + 1, "second")],
        {"probe_key": "probe", "admits": False},
    ),
    Case(
        "the probe ended without a terminal frees the probe",
        [*PROBE_OUT, Ended(COOL * S + 2)],
        {"phase": HALF_OPEN, "probe_key": None, "admits": True},
    ),
    Case(
        "another lease ending keeps the probe out",
        [*PROBE_OUT, Ended(COOL * S + 2, "older")],
        {"probe_key": "probe", "admits": False},
    ),
    Case("the probe's success closes", [*PROBE_OUT, Ok(COOL * S + 5, "probe")], {"state": c.CLOSED}),
    Case(
        "the probe's abort decides nothing",
        [*PROBE_OUT, Abort(COOL * S + 5, "probe", CREDIT)],
        {"phase": HALF_OPEN, "probe_key": "probe", "retry_at_ms": COOL * S, "admits": False},
    ),
    Case(
        "an older lease's answer decides nothing",
        [*PROBE_OUT, Fail(COOL * S + 5, key="older")],
        {
            "state": c.Circuit(
                phase=HALF_OPEN,
                consecutive=1,
                opened_at_ms=0,
                retry_at_ms=COOL * S,
                opened_by=CREDIT,
                open_ms=COOL * S,
                probe_key="probe",
            )
        },
    ),
    Case(
        "an older lease's success closes nothing",
        [*PROBE_OUT, Ok(COOL * S + 5, "older")],
        {"phase": HALF_OPEN, "probe_key": "probe"},
    ),
    Case(
        "a failed probe re-opens for twice the open time",
        [*PROBE_OUT, Fail(COOL * S + 5, Condition.RATE_LIMITED, "probe")],
        {
            "phase": OPEN,
            "opened_by": Condition.RATE_LIMITED,
            "opened_at_ms": COOL * S + 5,
            "retry_at_ms": COOL * S + 5 + 2 * COOL * S,
            "open_ms": 2 * COOL * S,
            "probe_key": None,
        },
    ),
    Case(
        "a failed probe's longer retry-after wins over the doubling",
        [*PROBE_OUT, Fail(COOL * S, Condition.RATE_LIMITED, "probe", retry_after_s=200)],
        {"phase": OPEN, "retry_at_ms": COOL * S + 200 * S},
    ),
    *(
        Case(
            f"failed probe {n + 1} re-opens for {reopen_s} s (doubling, capped at 15 min)",
            failed_probes(n + 1),
            {"phase": OPEN, "open_ms": reopen_s * S, "retry_at_ms": (PROBE_TIMES_S[n] + reopen_s) * S},
        )
        for n, reopen_s in enumerate(REOPENS_S)
    ),
]


def settle(case: Case) -> tuple[c.Circuit, int]:
    state = c.CLOSED
    for event in case.given:
        state = event.apply(state)
    return state, case.expect.get("at", case.given[-1].at_ms)


def observe(state: c.Circuit, at_ms: int, field: str) -> Any:
    if field == "admits":
        return c.admits(state, at_ms)
    if field == "state":
        return c.current(state, at_ms)
    return getattr(c.current(state, at_ms), field)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_transition(case: Case) -> None:
    state, at_ms = settle(case)
    expect = {field: value for field, value in case.expect.items() if field != "at"}
    assert {field: observe(state, at_ms, field) for field in expect} == expect
