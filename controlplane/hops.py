"""Dispatch keys' hops (SPEC §17): the gateway drives §8 for a worker that keeps one key.

Fed by each settle's rows (after they are folded into the circuits and the decision table, before
they are acknowledged):

1. a row of a dispatch key's current lease whose condition the lease hops on (`starts_hop`, the
   same rule the data plane applied when it stopped admitting attempts on the key) makes the
   key pending;
2. a pending key hops once no attempt of it is in flight (`hop_may_proceed`); until then every
   new attempt is answered `fallback-pending` by the data plane;
3. the hop is `MintDesk.hop`: the current lease through the release seam, a retry citing its
   decision (`decide_mint`), and the selected lease bound to the same token — pushed to the data
   plane, which switches the token atomically. A held or rejected hop re-binds the key where it
   was, and the push clears the data plane's pending mark.

Because this runs before the failed attempt's row is acknowledged, and the data plane answers
the worker only after that acknowledgement, a worker's own retry normally reaches the new
account without ever seeing `fallback-pending`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from controlplane.core.hop import hop_may_proceed, starts_hop
from controlplane.dispatchkeys import Hop
from controlplane.events import DispatchHop, EventHub, EventKind
from controlplane.mint import MintDesk
from controlplane.routebook import RouteBook
from controlplane.stores.keys import KeyTable
from shared.capacity import StateUnavailable
from shared.codes import Condition
from shared.logging import get_logger
from shared.wire import AttemptRow, Lease

log = get_logger("control")


class Hopper:
    def __init__(
        self,
        *,
        keys: KeyTable,
        routes: RouteBook,
        desk: MintDesk,
        rebind: Callable[[Lease], Awaitable[None]],
        events: EventHub,
        hop_listeners: tuple[Callable[[DispatchHop], None], ...] = (),
    ) -> None:
        self.keys = keys
        self.routes = routes
        self.desk = desk
        self.rebind = rebind
        self.events = events
        self.pending: dict[str, Condition] = {}  # key id → the condition that started its hop
        self.hop_listeners = hop_listeners  # each hop made, in this order

    def idle(self, rows: list[AttemptRow]) -> bool:
        """Whether `after_rows(rows)` would do nothing: no hop pending, and no row that could
        start one (a condition, not gateway-authored, on a lease that hops on some condition)."""
        if self.pending:
            return False
        for row in rows:  # a loop, not all(): most rows stop at the first test
            if row.condition and row.refusal_reason is None and self._hops_on(row.key_id):
                return False
        return True

    def _hops_on(self, key_id: str) -> bool:
        lease = self.keys.get(key_id)
        return lease is not None and bool(lease.hop_on)

    async def after_rows(self, rows: list[AttemptRow]) -> None:
        """A settle's hook: note the rows that start hops, then run every hop that may proceed."""
        for row in rows:
            if not row.condition or row.refusal_reason is not None:
                continue  # no condition, or gateway-authored: starts no hop (`starts_hop`), whatever the lease
            lease = self.keys.get(row.key_id)
            if lease is None or not lease.hop_on or row.key_id in self.pending:
                continue
            if row.mint_decision_id != lease.mint_decision_id:
                continue  # a row of the key's previous lease (it finished before the hop)
            condition = Condition(row.condition) if row.condition else None
            if starts_hop(frozenset(Condition(c) for c in lease.hop_on), condition, row.refusal_reason):
                assert condition is not None
                self.pending[row.key_id] = condition
        if not self.pending:
            return
        in_flight = self._in_flight()
        for key_id in list(self.pending):
            if hop_may_proceed(True, in_flight.get(key_id, 0)):
                await self._hop(key_id, self.pending.pop(key_id))

    def _in_flight(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for row in self.routes.active.values():
            if row.key_id in self.pending:
                counts[row.key_id] = counts.get(row.key_id, 0) + 1
        return counts

    async def _hop(self, key_id: str, condition: Condition) -> None:
        lease = self.keys.get(key_id)
        if lease is None:
            return  # revoked or expired while pending
        try:
            hop: Hop | None = await self.desk.hop(lease, condition)
        except StateUnavailable as exc:  # fleet mode, Redis gone: the key stays where it was
            log.warning("dispatch_hop_unavailable", key_id=key_id, condition=str(condition), error=str(exc))
            await self.rebind(lease)  # clears the data plane's pending mark
            return
        if hop is None:  # no decision to hop from (embedded: a control restart forgot it)
            log.warning("dispatch_hop_without_decision", key_id=key_id, condition=str(condition))
            await self.rebind(lease)  # clears the data plane's pending mark: the key stays put
            return
        await self.rebind(hop.lease)  # switches the token, or clears the data plane's pending mark
        if not hop.moved:
            log.info(
                "dispatch_hop_refused",
                key_id=key_id,
                condition=str(condition),
                refusal_reason=str(hop.decision.refusal_reason),
            )
            return
        event = DispatchHop(
            dispatch_id=lease.dispatch_id,
            key_id=key_id,
            from_account=lease.account_id,
            to_account=hop.lease.account_id,
            condition=str(condition),
            hop=hop.decision.hop,
            mint_decision_id=hop.decision.mint_decision_id,
        )
        log.info(
            "dispatch_hopped",
            key_id=key_id,
            from_account=event.from_account,
            to_account=event.to_account,
            condition=event.condition,
            hop=event.hop,
        )
        self.events.publish(EventKind.DISPATCH_HOP, event)
        for listener in self.hop_listeners:
            listener(event)
