"""The decision table: refused decisions are remembered apart from a lease's, each side bounded;
and what a fleet host re-registers of its live leases (`live_groups`, `lease_decisions`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from controlplane.core.fallback import Lineage
from controlplane.decisions import Decision, LiveGroup, LocalDecisions, lease_decisions, live_groups
from shared.codes import Outcome, Refusal
from shared.wire import Lease


async def test_refused_decisions_are_kept_apart_and_bounded() -> None:
    table = LocalDecisions(cap=4, refused_cap=2)
    lineage = Lineage("d", "r", "m")
    chosen = Decision(
        mint_decision_id="md_sel",
        outcome=Outcome.SELECTED,
        lineage=lineage,
        at_ms=0,
        key_id="K",
        account_id="a",
        fallback_position=0,
    )
    await table.record(chosen)
    for n in range(5):
        await table.record(
            Decision(
                mint_decision_id=f"md_held{n}",
                outcome=Outcome.HELD,
                lineage=lineage,
                at_ms=n,
                refusal_reason=Refusal.NO_ELIGIBLE_ACCOUNT,
            )
        )
    assert (
        await table.get("md_sel") == chosen and await table.for_key("K") == chosen
    )  # refusals never evict a lease's decision
    assert await table.refused_outcome("md_held4") == await table.refused_outcome("md_held3") == Outcome.HELD
    assert await table.refused_outcome("md_held0") is None and await table.get("md_held4") is None


# ---- what a fleet host re-registers after Redis lost its data (SPEC §16) ----------------------


class Case(NamedTuple):
    name: str
    given: Any
    expect: Any


def _lease(key: str, dispatch: str | None = "d", decision: str | None = None, repo: str = "r") -> Lease:
    return Lease(
        key_id=key,
        digest=b"",
        account_id="a",
        expires_at_ms=1,
        repo_slug=repo,
        dispatch_id=dispatch,
        mint_decision_id=decision if decision is not None else (None if dispatch is None else "md_" + key),
    )


def _held(n: str, key: str) -> Decision:
    return Decision(
        mint_decision_id="md_" + n,
        outcome=Outcome.SELECTED,
        lineage=Lineage("d", "r", "m"),
        at_ms=0,
        key_id=key,
        account_id="a",
        fallback_position=0,
    )


GROUP_CASES = [
    Case("none", [], []),
    Case("a v1 lease has no dispatch", [_lease("K1", dispatch=None)], []),
    Case(
        "one lease each",
        [_lease("K2", "d2"), _lease("K1", "d1")],
        [
            LiveGroup(repo_slug="r", dispatch_id="d1", key_ids=("K1",)),
            LiveGroup(repo_slug="r", dispatch_id="d2", key_ids=("K2",)),
        ],
    ),
    Case(
        "a renewal's successor and predecessor together, oldest first",
        [_lease("K3"), _lease("K1")],
        [LiveGroup(repo_slug="r", dispatch_id="d", key_ids=("K1", "K3"))],
    ),
    Case(
        "the same dispatch id in two repos is two dispatches",
        [_lease("K1", repo="a"), _lease("K2", repo="b")],
        [
            LiveGroup(repo_slug="a", dispatch_id="d", key_ids=("K1",)),
            LiveGroup(repo_slug="b", dispatch_id="d", key_ids=("K2",)),
        ],
    ),
]


@pytest.mark.parametrize("case", GROUP_CASES, ids=[c.name for c in GROUP_CASES])
def test_live_groups(case: Case) -> None:
    assert live_groups(case.given) == case.expect


DECISION_CASES = [
    Case(
        "each lease's own decision",
        ([_lease("K1", decision="md_1")], {"md_1": _held("1", "K1")}),
        ({"K1": _held("1", "K1")}, []),
    ),
    Case(
        "a hop re-bound the key: the lease names the newer decision",
        ([_lease("K1", decision="md_2")], {"md_1": _held("1", "K1"), "md_2": _held("2", "K1")}),
        ({"K1": _held("2", "K1")}, []),
    ),
    Case(
        "recorded, but the lease was never re-bound (a crash between): the older one",
        ([_lease("K1", decision="md_1")], {"md_1": _held("1", "K1"), "md_2": _held("2", "K1")}),
        ({"K1": _held("1", "K1")}, []),
    ),
    Case(
        "a decision naming another key is not this lease's",
        ([_lease("K1", decision="md_1")], {"md_1": _held("1", "K9")}),
        ({}, ["K1"]),
    ),
    Case("unknown: missing, sorted", ([_lease("K2"), _lease("K1")], {}), ({}, ["K1", "K2"])),
    Case("a v1 lease is in neither", ([_lease("K1", dispatch=None)], {}), ({}, [])),
]


@pytest.mark.parametrize("case", DECISION_CASES, ids=[c.name for c in DECISION_CASES])
def test_lease_decisions(case: Case) -> None:
    assert lease_decisions(*case.given) == case.expect
