"""`fold_overlay` by table: the overlay is the fold of the chain's records."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from controlplane.core.overlay import AdminAction, Overlay, disabled_accounts, fold_overlay, read_state
from shared.codes import AdminState


def rec(account_id: Any, action: str = "set-state", state: Any = "disabled") -> dict[str, Any]:
    return {"account_id": account_id, "action": action, "state": state, "reason": "r"}


class Case(msgspec.Struct, frozen=True):
    name: str
    records: list[dict[str, Any]]
    expect: dict[str, AdminState]  # account → state, for the accounts "a" and "b"


E, DR, DI = AdminState.ENABLED, AdminState.DRAINING, AdminState.DISABLED

CASES = [
    Case("no-records-everything-enabled", [], {"a": E, "b": E}),
    Case("disable-one", [rec("a")], {"a": DI, "b": E}),
    Case("drain-one", [rec("a", state="draining")], {"a": DR, "b": E}),
    Case("last-record-wins", [rec("a"), rec("a", state="draining"), rec("a", state="enabled")], {"a": E, "b": E}),
    Case(
        "revoke-leases-changes-no-state",
        [rec("a", state="draining"), rec("a", "revoke-leases", None)],
        {"a": DR, "b": E},
    ),
    Case("revoke-leases-with-a-state-still-changes-nothing", [rec("b", "revoke-leases", "disabled")], {"a": E, "b": E}),
    Case("unrecognised-state-reads-disabled", [rec("a", state="quarantined")], {"a": DI, "b": E}),
    Case("non-string-state-reads-disabled", [rec("a", state=3)], {"a": DI, "b": E}),
    Case("set-state-with-null-state-reads-disabled", [rec("a", state=None)], {"a": DI, "b": E}),
    Case("unknown-action-carrying-a-state-sets-it", [rec("b", action="suspend", state="paused")], {"a": E, "b": DI}),
    Case("unknown-action-without-state-changes-nothing", [rec("b", action="note", state=None)], {"a": E, "b": E}),
    Case("record-without-account-is-ignored", [rec(None), rec(7)], {"a": E, "b": E}),
    Case(
        "accounts-are-independent", [rec("a"), rec("b", state="draining"), rec("a", state="enabled")], {"a": E, "b": DR}
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fold_overlay(case: Case) -> None:
    overlay = fold_overlay(case.records)
    assert {k: overlay.state_of(k) for k in case.expect} == case.expect
    assert overlay.revision == len(case.records)


def test_overlay_lists_only_accounts_some_record_set() -> None:
    overlay = fold_overlay([rec("a"), rec("c", "revoke-leases", None)])
    assert overlay.states == {"a": DI}
    assert overlay.state_of("never-mentioned") is E


def test_read_state_knows_exactly_the_vocabulary() -> None:
    assert [read_state(s.value) for s in AdminState] == list(AdminState)
    assert read_state("ENABLED") is DI and read_state("") is DI


def test_vocabulary_spelling() -> None:
    assert [a.value for a in AdminAction] == ["set-state", "revoke-leases"]
    assert [s.value for s in AdminState] == ["enabled", "draining", "disabled"]
    assert isinstance(fold_overlay([]), Overlay)


@pytest.mark.parametrize(
    "records,expect",
    [
        ([], ()),
        ([rec("b"), rec("a")], ("a", "b")),  # registry order, not record order
        ([rec("a", state="draining")], ()),  # a drain is no disable (SPEC §20 closes on a disable)
        ([rec("a", state="quarantined")], ("a",)),  # an unknown state reads disabled
        ([rec("a"), rec("a", state="enabled")], ()),
        ([rec("ghost")], ()),  # an id the registry does not hold is not told
    ],
)
def test_disabled_accounts(records: list[dict[str, Any]], expect: tuple[str, ...]) -> None:
    assert disabled_accounts(fold_overlay(records), ["a", "b"]) == expect
