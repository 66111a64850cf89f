"""select_account by table: every live filter, their order, start positions, the two refusals."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from controlplane.core.selection import Candidate, LiveFacts, select_account
from shared.codes import AdminState, Refusal, Skip

IDS = ("a", "b", "c")
CANDIDATES = tuple(
    Candidate(account_id=i, position=n, provider_binding="anthropic", effective_model="m") for n, i in enumerate(IDS)
)
OK = LiveFacts(configured=True)


class Case(NamedTuple):
    name: str
    live: dict
    start: int
    chosen: str | None
    skipped: list[tuple[str, Skip]]
    refusal: Refusal | None


CASES = [
    Case("first-eligible", {"a": OK, "b": OK, "c": OK}, 0, "a", [], None),
    Case("start-position-skips-earlier", {"a": OK, "b": OK, "c": OK}, 1, "b", [], None),
    Case(
        "not-configured",
        {"a": LiveFacts(configured=False), "b": OK, "c": OK},
        0,
        "b",
        [("a", Skip.NOT_CONFIGURED)],
        None,
    ),
    Case(
        "disabled",
        {"a": LiveFacts(configured=True, administrative_state=AdminState.DISABLED), "b": OK, "c": OK},
        0,
        "b",
        [("a", Skip.ADMINISTRATIVE_DISABLED)],
        None,
    ),
    Case(
        "draining",
        {"a": LiveFacts(configured=True, administrative_state=AdminState.DRAINING), "b": OK, "c": OK},
        0,
        "b",
        [("a", Skip.ADMINISTRATIVE_DRAINING)],
        None,
    ),
    Case(
        "circuit-open",
        {"a": LiveFacts(configured=True, circuit_admits=False), "b": OK, "c": OK},
        0,
        "b",
        [("a", Skip.CIRCUIT_OPEN)],
        None,
    ),
    Case(
        "lease-capacity",
        {"a": LiveFacts(configured=True, lease_room=False), "b": OK, "c": OK},
        0,
        "b",
        [("a", Skip.LEASE_CAPACITY_EXHAUSTED)],
        None,
    ),
    Case(
        "first-filter-wins: unconfigured and disabled and full",
        {
            "a": LiveFacts(configured=False, administrative_state=AdminState.DISABLED, lease_room=False),
            "b": OK,
            "c": OK,
        },
        0,
        "b",
        [("a", Skip.NOT_CONFIGURED)],
        None,
    ),
    Case(
        "disabled beats circuit and capacity",
        {
            "a": LiveFacts(
                configured=True, administrative_state=AdminState.DISABLED, circuit_admits=False, lease_room=False
            ),
            "b": OK,
            "c": OK,
        },
        0,
        "b",
        [("a", Skip.ADMINISTRATIVE_DISABLED)],
        None,
    ),
    Case(
        "circuit beats capacity",
        {"a": LiveFacts(configured=True, circuit_admits=False, lease_room=False), "b": OK, "c": OK},
        0,
        "b",
        [("a", Skip.CIRCUIT_OPEN)],
        None,
    ),
    Case(
        "all ruled out is held with every skip",
        {
            "a": LiveFacts(configured=False),
            "b": LiveFacts(configured=True, circuit_admits=False),
            "c": LiveFacts(configured=True, lease_room=False),
        },
        0,
        None,
        [("a", Skip.NOT_CONFIGURED), ("b", Skip.CIRCUIT_OPEN), ("c", Skip.LEASE_CAPACITY_EXHAUSTED)],
        Refusal.NO_ELIGIBLE_ACCOUNT,
    ),
    Case("unknown account reads unconfigured", {"b": OK}, 0, "b", [("a", Skip.NOT_CONFIGURED)], None),
    Case("past the end is pool exhausted", {"a": OK, "b": OK, "c": OK}, 3, None, [], Refusal.FALLBACK_POOL_EXHAUSTED),
    Case(
        "rest of the list ruled out from a hop",
        {"a": OK, "b": OK, "c": LiveFacts(configured=False)},
        2,
        None,
        [("c", Skip.NOT_CONFIGURED)],
        Refusal.NO_ELIGIBLE_ACCOUNT,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_select_account(case: Case) -> None:
    result = select_account(CANDIDATES, case.live, case.start)
    assert (result.chosen.account_id if result.chosen else None) == case.chosen
    assert [(s.account_id, s.code) for s in result.skipped] == case.skipped
    assert result.refusal == case.refusal
    if result.chosen is not None:
        assert result.chosen.position >= case.start


# ---- SPEC §22: rate-limit-headroom-low, last in the table --------------------------------------

LOW = LiveFacts(configured=True, headroom_low=True)
HEADROOM_CASES = [
    Case("headroom low is skipped", {"a": LOW, "b": OK, "c": OK}, 0, "b", [("a", Skip.RATE_LIMIT_HEADROOM_LOW)], None),
    Case(
        "every other filter comes first",
        {
            "a": LiveFacts(configured=True, lease_room=False, headroom_low=True),
            "b": LiveFacts(configured=True, circuit_admits=False, headroom_low=True),
            "c": OK,
        },
        0,
        "c",
        [("a", Skip.LEASE_CAPACITY_EXHAUSTED), ("b", Skip.CIRCUIT_OPEN)],
        None,
    ),
    Case(
        "all low is held, each skip named",
        {"a": LOW, "b": LOW, "c": LOW},
        0,
        None,
        [(i, Skip.RATE_LIMIT_HEADROOM_LOW) for i in IDS],
        Refusal.NO_ELIGIBLE_ACCOUNT,
    ),
    Case("a hop past the low one", {"a": OK, "b": LOW, "c": OK}, 1, "c", [("b", Skip.RATE_LIMIT_HEADROOM_LOW)], None),
]


@pytest.mark.parametrize("case", HEADROOM_CASES, ids=[c.name for c in HEADROOM_CASES])
def test_select_account_headroom(case: Case) -> None:
    test_select_account(case)


def test_the_filter_table_ends_with_headroom_and_explain_reads_every_hit() -> None:
    from controlplane.core.selection import LIVE_FILTERS, live_filters

    assert [code for code, _ in LIVE_FILTERS] == list(Skip)
    both = LiveFacts(configured=True, lease_room=False, headroom_low=True)
    assert live_filters(both) == (Skip.LEASE_CAPACITY_EXHAUSTED, Skip.RATE_LIMIT_HEADROOM_LOW)
