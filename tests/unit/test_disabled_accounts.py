"""`DisabledAccounts` (SPEC §20): control tells its data plane the disabled set when it changes,
and only then; a chain it cannot read (corrupt, or not validated lately in fleet mode) lifts no
disable and adds none; an `account.state` event (this host's commit, or another host's relayed)
pushes without waiting for the tick."""

from __future__ import annotations

import asyncio
from typing import Any

from controlplane.core.overlay import Overlay, fold_overlay
from controlplane.disabled import DisabledAccounts
from controlplane.events import EventHub, EventKind
from shared.capacity import StateUnavailable
from tests.support.waits import until


class FakeLink:
    """`DataPlaneLink.accounts_disabled`; `acked` set: the data plane acknowledges at once."""

    def __init__(self) -> None:
        self.disabled: tuple[str, ...] = ()
        self.pushed: list[tuple[str, ...]] = []
        self.acked = asyncio.Event()
        self.acked.set()

    async def accounts_disabled(self, account_ids: tuple[str, ...]) -> bool:
        self.disabled = account_ids
        self.pushed.append(account_ids)
        await self.acked.wait()
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


async def test_a_sync_waits_for_the_push_an_event_started() -> None:
    """The commit's event starts the push; the PATCH's `sync` must still wait for its ack (else
    the PATCH could answer before the data plane has the disable)."""
    chain, link, hub = Chain(), FakeLink(), EventHub()
    told = DisabledAccounts(chain.overlay, link, ["a", "b"])  # type: ignore[arg-type]
    hub.listen(told.on_event)
    link.acked.clear()  # the data plane has not acknowledged yet
    chain.set("a", "disabled")
    hub.publish(EventKind.ACCOUNT_STATE, {"account_id": "a", "action": "set-state", "state": "disabled"})
    synced = asyncio.ensure_future(told.sync())
    await until(lambda: link.pushed == [("a",)], 5, "the event's push under way")
    for _ in range(20):  # loop turns, not time: with the ack withheld, sync never ends
        await asyncio.sleep(0)
    assert not synced.done()
    link.acked.set()
    assert await asyncio.wait_for(synced, 5) and link.pushed == [("a",)]  # one push, not two
