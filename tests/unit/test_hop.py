"""Dispatch keys' pure parts by table: which lease hops on what, which terminal starts a hop,
and when a pending hop may run (SPEC §17)."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from controlplane.core.hop import FallbackDriver, hop_conditions, hop_may_proceed, starts_hop
from shared.codes import Condition

ALL = frozenset(Condition)
GATEWAY, CALLER = FallbackDriver.GATEWAY, FallbackDriver.CALLER


class Conditions(NamedTuple):
    name: str
    driver: FallbackDriver
    fallback_on: frozenset
    hop: int
    max_hops: int
    expect: frozenset


CONDITIONS = [
    Conditions("a dispatch key with budget hops on fallback_on", GATEWAY, ALL, 0, 1, ALL),
    Conditions(
        "a narrowed fallback_on narrows the hop",
        GATEWAY,
        frozenset({Condition.RATE_LIMITED}),
        0,
        1,
        frozenset({Condition.RATE_LIMITED}),
    ),
    Conditions("the budget spent: never", GATEWAY, ALL, 1, 1, frozenset()),
    Conditions("zero hops: never", GATEWAY, ALL, 0, 0, frozenset()),
    Conditions("a second hop within a budget of two", GATEWAY, ALL, 1, 2, ALL),
    Conditions("a caller-driven lease is never moved", CALLER, ALL, 0, 5, frozenset()),
]


@pytest.mark.parametrize("case", CONDITIONS, ids=[c.name for c in CONDITIONS])
def test_hop_conditions(case: Conditions) -> None:
    assert hop_conditions(case.driver, case.fallback_on, case.hop, case.max_hops) == case.expect


class Starts(NamedTuple):
    name: str
    conditions: frozenset
    condition: Condition | None
    refusal: str | None
    expect: bool


STARTS = [
    Starts("429 on a dispatch key", ALL, Condition.RATE_LIMITED, None, True),
    Starts("529 on a dispatch key", ALL, Condition.OVERLOADED, None, True),
    Starts("a cut stream on a dispatch key", ALL, Condition.TRANSPORT_ERROR, None, True),
    Starts(
        "a condition outside fallback_on",
        frozenset({Condition.RATE_LIMITED}),
        Condition.UPSTREAM_UNAVAILABLE,
        None,
        False,
    ),
    Starts("a 400 carries no condition", ALL, None, None, False),
    Starts("a client abort carries no condition", ALL, None, None, False),
    Starts("a 2xx carries no condition", ALL, None, None, False),
    Starts("a gateway-authored refusal is never evidence", ALL, None, "request-capacity-exhausted", False),
    Starts("a refusal with a condition still never hops", ALL, Condition.TRANSPORT_ERROR, "dataplane-lost", False),
    Starts("no hop conditions (budget spent, caller-driven)", frozenset(), Condition.RATE_LIMITED, None, False),
]


@pytest.mark.parametrize("case", STARTS, ids=[c.name for c in STARTS])
def test_starts_hop(case: Starts) -> None:
    assert starts_hop(case.conditions, case.condition, case.refusal) is case.expect


@pytest.mark.parametrize(
    "pending,in_flight,expect",
    [(True, 0, True), (True, 1, False), (True, 3, False), (False, 0, False), (False, 2, False)],
    ids=[
        "pending, nothing in flight",
        "pending, one in flight",
        "pending, several in flight",
        "not pending",
        "not pending, in flight",
    ],
)
def test_hop_may_proceed(pending: bool, in_flight: int, expect: bool) -> None:
    assert hop_may_proceed(pending, in_flight) is expect
