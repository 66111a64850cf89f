"""The administrative overlay is the fold of its audit chain (SPEC §9); this is that fold.

Rule: an account with no record is `enabled`; each `set-state` record sets its account's state;
a `revoke-leases` record changes no state. A state value this build does not know reads as
`disabled`: every value the vocabulary has ever held is a withdrawal of some strength, so a
record from a newer build is far likelier a narrower withdrawal than a permission, and a
downgrade over-withdraws (loudly, reversibly) rather than resurrecting an account.

Pure: records (decoded JSON objects from a verified chain) in, a frozen `Overlay` out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

import msgspec

from shared.codes import AdminState


class AdminAction(StrEnum):
    SET_STATE = "set-state"
    REVOKE_LEASES = "revoke-leases"


class Overlay(msgspec.Struct, frozen=True, kw_only=True):
    revision: int  # the number of records folded
    states: dict[str, AdminState]  # only accounts some record set; read it through `state_of`

    def state_of(self, account_id: str) -> AdminState:
        return self.states.get(account_id, AdminState.ENABLED)


def read_state(value: Any) -> AdminState:
    """A recorded state value as this build understands it (unknown → `disabled`)."""
    if isinstance(value, str) and value in AdminState._value2member_map_:
        return AdminState(value)
    return AdminState.DISABLED


def sets_state(record: Mapping[str, Any]) -> bool:
    """Does this record set its account's state? (`revoke-leases` does not; an action from a
    newer build that carries a state is taken to set it, under the unknown-state rule.)"""
    if record.get("action") == AdminAction.REVOKE_LEASES:
        return False
    return record.get("action") == AdminAction.SET_STATE or record.get("state") is not None


def fold_overlay(records: Sequence[Mapping[str, Any]]) -> Overlay:
    states: dict[str, AdminState] = {}
    for record in records:
        account_id = record.get("account_id")
        if isinstance(account_id, str) and sets_state(record):
            states[account_id] = read_state(record.get("state"))
    return Overlay(revision=len(records), states=states)


def disabled_accounts(overlay: Overlay, account_ids: Sequence[str]) -> tuple[str, ...]:
    """The accounts of `account_ids` the overlay holds `disabled` (an unknown state included, by
    `read_state`), in registry order: what the data plane needs to close their sockets (§20)."""
    return tuple(a for a in account_ids if overlay.state_of(a) is AdminState.DISABLED)
