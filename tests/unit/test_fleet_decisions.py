"""`controlplane/core/fleet.py` by tables: a host's repair for each standing, when the fleet's
state is available, admission after a data loss, missed revocations, the per-host read rows."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from controlplane.core.fleet import (
    END_REASONS,
    REPAIRS,
    HostRow,
    MissedRevocation,
    Repair,
    RestoredLease,
    fleet_state,
    host_rows,
    may_admit,
    missed_revocations,
    repair_for,
    reregistration_order,
)
from shared.codes import EndReason, FleetState, Standing


class Case(NamedTuple):
    name: str
    given: Any
    expect: Any


REPAIR_CASES = [
    Case("live: nothing to repair", Standing.LIVE, Repair.NONE),
    Case("reaped: end what was released", Standing.REAPED, Repair.END_RELEASED),
    Case("state lost: re-register", Standing.STATE_LOST, Repair.REREGISTER),
    Case("superseded: fail closed", Standing.SUPERSEDED, Repair.FAIL_CLOSED),
]


@pytest.mark.parametrize("case", REPAIR_CASES, ids=[c.name for c in REPAIR_CASES])
def test_repair_for_each_standing(case: Case) -> None:
    assert repair_for(case.given) is case.expect


def test_the_repair_table_is_total_and_every_ending_repair_names_its_reason() -> None:
    assert set(REPAIRS) == set(Standing)
    assert set(END_REASONS) == set(Repair) - {Repair.NONE}
    assert END_REASONS[Repair.REREGISTER] is EndReason.REREGISTRATION_REFUSED


STATE_CASES = [
    Case("reachable, live, registered", (True, Standing.LIVE, True), FleetState.AVAILABLE),
    Case("unreachable", (False, Standing.LIVE, True), FleetState.UNAVAILABLE),
    Case("not registered yet (re-registering)", (True, Standing.LIVE, False), FleetState.UNAVAILABLE),
    Case("never beat", (True, None, True), FleetState.UNAVAILABLE),
    Case("state lost", (True, Standing.STATE_LOST, True), FleetState.UNAVAILABLE),
    Case("superseded", (True, Standing.SUPERSEDED, True), FleetState.UNAVAILABLE),
    Case("reaped", (True, Standing.REAPED, True), FleetState.UNAVAILABLE),
]


@pytest.mark.parametrize("case", STATE_CASES, ids=[c.name for c in STATE_CASES])
def test_fleet_state(case: Case) -> None:
    assert fleet_state(*case.given) is case.expect


F = frozenset
ADMIT_CASES = [  # (now, earliest, latest, expected, registered)
    Case("before one beat: never, even with everyone back", (5, 10, 40, F(), F({"b"})), False),
    Case("after a beat, everyone back", (10, 10, 40, F({"b", "c"}), F({"a", "b", "c"})), True),
    Case("after a beat, a sibling not back", (20, 10, 40, F({"b", "c"}), F({"b"})), False),
    Case("alone after a beat", (10, 10, 40, F(), F()), True),
    Case("the TTL passed: a silent sibling is dead", (40, 10, 40, F({"b"}), F()), True),
]


@pytest.mark.parametrize("case", ADMIT_CASES, ids=[c.name for c in ADMIT_CASES])
def test_may_admit_after_a_data_loss(case: Case) -> None:
    assert may_admit(*case.given) is case.expect


def test_reregistration_is_oldest_first() -> None:
    assert reregistration_order(["01M8Z", "01M8A", "01M8M"]) == ["01M8A", "01M8M", "01M8Z"]


def _lease(key: str, account: str, at: int) -> RestoredLease:
    return RestoredLease(key_id=key, account_id=account, minted_at_ms=at)


MISSED_CASES = [
    Case(
        "minted before a revoke of its account: ended",
        ([_lease("k1", "a", 10)], [MissedRevocation(account_id="a", at_ms=20)]),
        ["k1"],
    ),
    Case("minted after it: kept", ([_lease("k1", "a", 30)], [MissedRevocation(account_id="a", at_ms=20)]), []),
    Case("another account's revoke: kept", ([_lease("k1", "b", 10)], [MissedRevocation(account_id="a", at_ms=20)]), []),
    Case(
        "the latest revoke of the account counts",
        (
            [_lease("k1", "a", 25), _lease("k2", "a", 35)],
            [MissedRevocation(account_id="a", at_ms=20), MissedRevocation(account_id="a", at_ms=30)],
        ),
        ["k1"],
    ),
    Case("no revoke", ([_lease("k1", "a", 10)], []), []),
]


@pytest.mark.parametrize("case", MISSED_CASES, ids=[c.name for c in MISSED_CASES])
def test_missed_revocations(case: Case) -> None:
    assert missed_revocations(*case.given) == case.expect


def test_host_rows_list_live_hosts_and_unreaped_holders_with_this_hosts_own_in_flight() -> None:
    rows = host_rows(
        "a",
        1000,
        live={"a": 900, "b": 950},
        leases={"a": 1, "c": 2},
        in_flight={"a": 7, "b": 3, "c": 9},
        local_in_flight=2,
    )
    assert rows == [
        HostRow(host_id="a", lease_count=1, in_flight_count=2, last_seen_ms=1000),  # exact, now
        HostRow(host_id="b", lease_count=0, in_flight_count=3, last_seen_ms=950),
        HostRow(host_id="c", lease_count=2, in_flight_count=0, last_seen_ms=None),  # dead, not reaped
    ]
