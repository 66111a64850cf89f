"""`DisabledAccounts` (SPEC §20): control tells its data plane the disabled set when it changes,
and only then; a chain it cannot read (corrupt, or not validated lately in fleet mode) lifts no
disable and adds none; an `account.state` event (this host's commit, or another host's relayed)
pushes without waiting for the tick."""

from __future__ import annotations

from typing import Any

from controlplane.core.overlay import Overlay, fold_overlay
from controlplane.disabled import DisabledAccounts
from controlplane.events import EventHub, EventKind
from shared.capacity import StateUnavailable
from tests.support.waits import until


class FakeLink:
    def __init__(self) -> None:
        self.disabled: tuple[str, ...] = ()
        self.pushed: list[tuple[str, ...]] = []

    async def accounts_disabled(self, account_ids: tuple[str, ...]) -> bool:
        self.disabled = account_ids
        self.pushed.append(account_ids)
        return True


class Chain:
    """The admin store's `overlay()`: a fold, None (corrupt), or `StateUnavailable`."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.fault: str | None = None

    def overlay(self) -> Overlay | None:
        if self.fault == "unavailable":
            raise StateUnavailable("not validated lately")
        return None if self.fault == "corrupt" else fold_overlay(self.records)

    def set(self, account_id: str, state: str) -> None:
        self.records.append({"account_id": account_id, "action": "set-state", "state": state})


async def test_pushed_on_change_only_and_a_fault_keeps_the_last_set() -> None:
    chain, link = Chain(), FakeLink()
    told = DisabledAccounts(chain.overlay, link, ["a", "b"])  # type: ignore[arg-type]
    assert await told.sync() and link.pushed == []  # nothing disabled: nothing to tell
    chain.set("b", "disabled")
    assert await told.sync() and link.pushed == [("b",)]
    assert await told.sync() and link.pushed == [("b",)]  # unchanged: no second push
    chain.set("a", "draining")
    assert await told.sync() and link.pushed == [("b",)]  # a drain is not a disable
    for fault in ("corrupt", "unavailable"):
        chain.fault = fault
        chain.set("b", "enabled")  # unreadable: the last set stands (a fault lifts no disable)
        assert await told.sync() and link.pushed == [("b",)]
    chain.fault = None
    assert await told.sync() and link.pushed == [("b",), ()]


async def test_an_account_state_event_pushes_at_once() -> None:
    chain, link, hub = Chain(), FakeLink(), EventHub()
    told = DisabledAccounts(chain.overlay, link, ["a", "b"])  # type: ignore[arg-type]
    hub.listen(told.on_event)
    chain.set("a", "disabled")
    hub.publish(EventKind.ACCOUNT_STATE, {"account_id": "a", "action": "set-state", "state": "disabled"})
    await until(lambda: link.pushed == [("a",)], 5, "the push after the event")
