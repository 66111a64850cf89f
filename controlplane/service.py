"""The control daemon's operations: mint, revoke, the release seam, attempt reports.

HTTP handlers and the RPC call these; this module does the I/O ordering (key table → capacity
→ replication) and leaves decisions to `core`. Every path that ends a key goes through
`end_keys`, the one release seam. Storing and pushing a lease is `controlplane/grants.Grants`'s.
Built by `controlplane.wiring.wire` with every collaborator, and seen by the rest of the daemon
only through the ports of `controlplane/ports.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import time_ns as _time_ns

import msgspec

from controlplane.circuits import CircuitRegistry
from controlplane.core.budgets import retry_after_s
from controlplane.core.budgetwatch import exhausted_levels
from controlplane.core.pricing import PriceLookup, PriceTable, cost_of
from controlplane.decisions import DecisionStore, evidence_of
from controlplane.events import EventHub, EventKind
from controlplane.evidence import EvidenceBook
from controlplane.grants import Grants, Minted
from controlplane.ports import BudgetPort, Configured, RowSink, SettleHook
from controlplane.registry import Registry
from controlplane.replication import DataPlaneLink
from controlplane.routebook import RouteBook
from controlplane.stores.keys import KeyTable
from controlplane.stores.ledger import Ledger
from shared.capacity import CapacityStore
from shared.clock import iso_ms, now_ms
from shared.codes import AttemptStatus, Binding, Condition, EndReason, Refusal
from shared.errors import GatewayError
from shared.logging import get_logger
from shared.rpc import Connection, send_acks
from shared.settings import Settings
from shared.tokens import new_token
from shared.wire import (
    AccountRoute,
    Ack,
    AttemptFinished,
    AttemptRow,
    AttemptStarted,
    ConnectionCounts,
    FleetLoops,
    Lease,
    Message,
    Ping,
    SocketsOpen,
)

log = get_logger("control")

# How long routes of a lost data plane wait to be re-announced before they are closed.
LOST_ROUTE_GRACE_S = 5.0
_ROUTE_STARTED, _ROUTE_FINISHED = EventKind.ROUTE_STARTED, EventKind.ROUTE_FINISHED  # read per attempt: ~90 ns saved
_set = msgspec.structs.force_setattr


class ControlService:
    """Keys, the release seam and the attempt rows. Built by `controlplane.wiring.wire`, which
    hands it every collaborator; it builds none of them, and binds none (the link is bound to it
    by `wire`)."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        keys: KeyTable,
        ledger: Ledger,
        prices: PriceTable,
        *,
        routes: RouteBook,
        lease_capacity: CapacityStore,
        circuits: CircuitRegistry,
        decisions: DecisionStore,
        evidence: EvidenceBook,
        events: EventHub,
        link: DataPlaneLink,
        grants: Grants,
        budgets: BudgetPort,
        configured: Configured,
        row_sinks: tuple[RowSink, ...] = (),
        settle_hooks: tuple[SettleHook, ...] = (),
        hooks_idle: Callable[[list[AttemptRow]], bool] = lambda _rows: False,
        fold_together: bool = False,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.keys = keys
        self.ledger = ledger
        self.prices = prices
        self._price_of = PriceLookup(prices).__getitem__  # the memo's bound look-up: the cheapest call per row
        self.configured = configured  # whether an account's credential is set
        self.routes = routes
        self.lease_capacity = lease_capacity
        self.circuits = circuits
        self.decisions = decisions
        self.evidence = evidence
        self.events = events
        self.link = link
        self.grants = grants
        self.budgets = budgets  # SPEC §18 (`BudgetGuard`): leases' budget gates, chains' exhausted budgets
        self.row_sinks = row_sinks  # each recorded terminal row, in this order
        self.settle_hooks = settle_hooks  # after a settle's folds, before its Acks (the dispatch keys' hops)
        self.hooks_idle = hooks_idle  # whether the hooks would do nothing with these rows (`Hopper.idle`)
        self.fold_together = fold_together  # fleet mode: a settle's Redis work in one exchange (`_fold`)
        self._unacked: list[tuple[Connection, int]] = []  # rows staged, to acknowledge once written
        self._unfolded: list[AttemptRow] = []  # rows recorded, not yet folded into circuits/decisions
        self._settling: asyncio.Task[None] | None = None

    async def restore(self) -> None:
        """Re-take the lease slots and live dispatch keys of the leases the key journal kept."""
        for lease in self.keys.all():
            account = self.registry.get(lease.account_id)
            await self.lease_capacity.reserve(
                lease.account_id, lease.key_id, None if account is None else account.lease_capacity
            )
            if lease.dispatch_id is not None:
                await self.decisions.note_live(lease.key_id, lease.repo_slug, lease.dispatch_id)

    # ---- facts --------------------------------------------------------------------------

    def snapshot(self) -> tuple[list[Lease], list[AccountRoute], bool]:
        """What the link sends a data plane that connects: every lease with its budget gate."""
        gate = self.budgets.gate
        return [gate(lease) for lease in self.keys.all()], self.registry.routes(), self.ledger.ok

    # ---- mint and the release seam ------------------------------------------------------

    async def mint_v1(
        self, binding: Binding, principal_kind: str, principal_id: str, repo_slug: str, ttl_seconds: int | None
    ) -> Minted:
        account = self.registry.legacy_for(binding)
        if not self.configured(account):
            raise GatewayError(
                Refusal.ACCOUNT_NOT_CONFIGURED,
                f"the legacy account for binding {binding!s} ({account.id}) has no "
                f"credential: set {account.credential_env}",
            )
        held = self.budgets.hold_of(repo_slug, None)  # a v1 mint names no model: its price is the request's check
        if held:
            raise GatewayError(
                Refusal.BUDGET_EXHAUSTED,
                f"the {exhausted_levels(held)} is exhausted; mints for this scope are held until it resets",
                retry_after_s=retry_after_s(held),
                extra={"budgets": [{"level": e.level, "window": str(e.window)} for e in held]},
            )
        ttl_s = ttl_seconds or self.settings.key_ttl_seconds
        token, key_id, digest = new_token()
        lease = Lease(
            key_id=key_id,
            digest=digest,
            account_id=account.id,
            expires_at_ms=now_ms() + ttl_s * 1000,
            principal_kind=principal_kind,
            principal_id=principal_id,
            repo_slug=repo_slug,
        )
        if not await self.lease_capacity.reserve(account.id, lease.key_id, account.lease_capacity):
            raise GatewayError(
                Refusal.NO_ELIGIBLE_ACCOUNT, f"account {account.id} is at its lease capacity", retry_after_s=1
            )
        return await self.grants.grant(lease, account, token)

    async def end_keys(self, key_ids: list[str], reason: EndReason) -> list[str]:
        """The release seam: forget each key, return its lease slot, tell the data plane.

        The shared state's releases (fleet: the slot and the live key, one Redis exchange per
        key) and the data plane's removal run at once, not in turn (issue 27): neither waits on
        the other's answer, and the revoke still returns only after both. A circuit lets its
        probe go only once the data plane acknowledged the removal: it sends the rows of every
        attempt it finished on those keys ahead of that Ack (SPEC §3), and they are settled
        (folded into the circuits) before the probe is let go, so a probe's success is folded
        before the probe could be taken for one that never answered.
        """
        ended = [lease for lease in map(self.keys.remove, key_ids) if lease is not None]
        if ended:
            await asyncio.gather(self._release(key_ids), self.link.leases_removed([lease.key_id for lease in ended]))
            await self.settle()
            now = now_ms()
            for lease in ended:
                await self.circuits.on_lease_ended(lease.account_id, lease.key_id, now)
                log.info("lease_ended", key_id=lease.key_id, reason=str(reason))
        else:
            await self._release(key_ids)
        return [lease.key_id for lease in ended]

    async def _release(self, key_ids: list[str]) -> None:
        """Each key's lease slot and live dispatch key, key after key (an account-wide revocation's thousands
        of keys never open a connection each), the two of one key at once (fleet: one round, not two)."""
        for key_id in key_ids:
            await asyncio.gather(self.lease_capacity.release(key_id), self.decisions.end_key(key_id))

    async def revoke(self, key_id: str) -> bool:
        return bool(await self.end_keys([key_id], EndReason.REVOKED))

    async def end_account_keys(self, account_id: str, reason: EndReason = EndReason.ACCOUNT_REVOKED) -> int:
        """Account-wide revocation (admin `revoke-leases`), through the same seam."""
        keys = [lease.key_id for lease in self.keys.all() if lease.account_id == account_id]
        return len(await self.end_keys(keys, reason))

    async def reap_expired(self, now: int | None = None) -> int:
        expired = self.keys.expired(now_ms() if now is None else now)
        return len(await self.end_keys(expired, EndReason.EXPIRED)) if expired else 0

    # ---- attempt reports ----------------------------------------------------------------

    async def on_message(self, conn: Connection, message: Message) -> None:
        """`handle`, its settle scheduled (for a caller that is not the link's reader)."""
        self.handle(conn, message)
        if isinstance(message, AttemptFinished):
            self._settle_soon()

    def handle(self, conn: Connection, message: Message) -> None:
        """One report of the data plane, taken at once (nothing here suspends): what the link's
        reader calls per frame, with no coroutine to make and await (`Connection.run`); it calls
        `read_done` after each read, which settles what the read's reports staged."""
        if isinstance(message, AttemptFinished):  # a terminal row, taken here (no call more per row)
            self._unacked.append((conn, message.req_id))  # its `Ack` is sent by the settle, after the write
            row = message.row
            self._take(row, row.attempt_id not in self.routes.active)
        elif isinstance(message, AttemptStarted):
            if message.row.attempt_id not in self.routes.active:
                self.routes.started(message.row)
                self.events.publish_row(_ROUTE_STARTED, message.row)
        elif isinstance(message, Ping):
            conn.send_nowait(Ack(req_id=message.req_id))
        elif isinstance(message, SocketsOpen):
            self.routes.sockets_open = {k: v for k, v in message.counts.items() if v > 0}
        elif isinstance(message, ConnectionCounts):
            self.routes.connections = message
        elif isinstance(message, FleetLoops):  # fleet mode: the data plane's Redis loops (SPEC §19)
            self.routes.dataplane_loops = list(message.loops)
        else:
            log.warning("rpc_message_unexpected", op=type(message).__name__)

    def record(self, row: AttemptRow) -> None:
        """`_take` a copy of the row (the caller's stays as it is), then the settle (`settle` awaits it)."""
        self._take(msgspec.structs.replace(row))
        self._settle_soon()

    def _take(self, row: AttemptRow, start_withdrawn: bool = False) -> None:
        """Price the row, stage it in the ledger once, move it from active to recent. The row is
        ours (decoded by the link's reader, or `record`'s copy): priced in place, no copy per row
        (issue 27); only its start's event holds it yet, and shows no cost (`as_started`)."""
        cost, reason = cost_of(
            self._price_of, row.served_model or row.requested_model, row.usage, row.path, row.http_status
        )
        _set(row, "cost_usd", cost)  # a re-sent copy too (dropped unread): `stage` is the one dedup check
        _set(row, "cost_reason", reason._value_)  # `str(reason)`, the member's own str, without the call
        if self.ledger.stage(row):
            if start_withdrawn:  # reported once, by this row (issue 27): the feed still has both events;
                self.events.publish_row(_ROUTE_STARTED, row)  # projected as its start was, on first read
            self.routes.finished(row)
            self.events.publish_row(_ROUTE_FINISHED, row)
            for sink in self.row_sinks:
                try:
                    sink(row)
                except Exception:  # a sink's bug must not cost the row its Ack or its evidence
                    log.exception("row_listener_failed", attempt_id=row.attempt_id)
            self.evidence.record(row, _time_ns() // 1_000_000)  # `now_ms()`, inline
            self._unfolded.append(row)
        else:
            self.routes.active.pop(row.attempt_id, None)

    def _settle_soon(self) -> None:
        if self._settling is None:
            self._settling = asyncio.get_running_loop().create_task(self._settle())

    def read_done(self) -> None:
        """The link's reader handled one read's reports: a settle that cannot suspend (in-process
        circuits, no decision's evidence, no hop) runs here, with no task (issue 27); else a task."""
        if self._settling is not None or not (self._unfolded or self._unacked):
            return  # none due, or one under way (it takes these rows after it)
        if not self.fold_together and self.circuits.folds_now and self.hooks_idle(self._unfolded):
            for row in self._unfolded:  # a loop, not any(): no generator per read
                if row.mint_decision_id is not None:  # a decision's evidence: awaited
                    break
            else:
                return self._settle_now()
        self._settle_soon()

    def _settle_now(self) -> None:
        """`_settle` of rows whose fold cannot suspend, with hooks that would do nothing."""
        ok = self.write_staged()
        rows, self._unfolded = self._unfolded, []
        unacked, self._unacked = self._unacked, []
        try:
            self.circuits.fold_now(rows, _time_ns() // 1_000_000)  # `now_ms()`, inline: per read
        except Exception:
            log.exception("row_fold_failed", into="circuits", rows=len(rows))
        send_acks(unacked, ok)  # the link gone: the data plane re-sends the rows

    async def settle(self) -> bool:
        """Wait until every row recorded so far is written, folded and acknowledged, not rows recorded
        later (a read's drain waits on a busy link no longer); answers whether storage accepts writes."""
        for _ in range(2):  # the settle under way, then the one it left what it did not take to
            if self._settling is not None:
                await asyncio.shield(self._settling)
        return self.ledger.ok

    async def _settle(self) -> None:
        """The rows recorded since the last settle (one RPC read's, typically): written with one
        `write`, folded into the circuits and the decision table, then acknowledged, so an
        `Ack` means the row is on disk and a fallback citation right after it finds its
        evidence. (An unacknowledged row stays in the data plane's outbox and is re-sent after
        a reconnect, so a crash in between loses nothing.)"""
        try:
            ok = self.write_staged()
            rows, self._unfolded = self._unfolded, []
            unacked, self._unacked = self._unacked, []
            await self._fold(rows, now_ms())
            for hook in self.settle_hooks:
                try:
                    await hook(rows)
                except Exception:
                    log.exception("settle_hook_failed")
            send_acks(unacked, ok)  # the link gone: the data plane re-sends the rows
        finally:
            self._settling = None
            if self._unfolded or self._unacked:  # recorded while this settle awaited
                self._settling = asyncio.get_running_loop().create_task(self._settle())

    async def _fold(self, rows: list[AttemptRow], now: int) -> None:
        """A settle's rows into the circuits (one read-modify-write per account) and the decisions'
        evidence; with `fold_together` (fleet mode) all at once when a row is evidence the circuit
        folds now, so their Redis commands go as one exchange (`BatchingRedis`; issue 27 §4), else
        in turn (in-process nothing suspends; a quiet row's fold waits, `CircuitRegistry.is_quiet`)."""
        evidence = [
            (row.attempt_id, *found)
            for row in rows
            if row.mint_decision_id is not None and (found := evidence_of(row)) is not None
        ]
        if self.fold_together and evidence and any(map(self._folds_now, rows)):
            await asyncio.gather(self._fold_circuits(rows, now), *(self._fold_evidence(*e) for e in evidence))
            return
        await self._fold_circuits(rows, now)
        for each in evidence:
            await self._fold_evidence(*each)

    def _folds_now(self, row: AttemptRow) -> bool:
        return row.refusal_reason is None and not self.circuits.is_quiet(row)

    async def _fold_circuits(self, rows: list[AttemptRow], now: int) -> None:
        try:
            await self.circuits.on_rows(rows, now)
        except Exception:
            log.exception("row_fold_failed", into="circuits", rows=len(rows))

    async def _fold_evidence(self, attempt_id: str, mint_decision_id: str, condition: Condition | None) -> None:
        try:
            await self.decisions.add_evidence(mint_decision_id, condition)
        except Exception:
            log.exception("row_fold_failed", into="decisions", attempt_id=attempt_id)

    def write_staged(self) -> bool:
        """Write every staged row; tell the data plane when storage starts or stops failing."""
        was_ok = self.ledger.ok
        ok = self.ledger.flush()
        if ok != was_ok:
            self.link.storage_state(ok)
        return ok

    async def retry_storage(self) -> None:
        if not self.ledger.ok and self.write_staged():
            log.info("ledger_recovered")

    def on_disconnect(self) -> None:
        """Routes in flight are forgotten now; any the data plane does not re-announce (or
        finish) within the grace period get a terminal row, so none stays streaming forever."""
        orphans = self.routes.forget_active()
        self.routes.sockets_open = {}  # they closed with the data plane's connection
        self.routes.dataplane_loops = []
        if orphans:
            asyncio.get_running_loop().call_later(LOST_ROUTE_GRACE_S, self._close_orphans, orphans)

    def _close_orphans(self, orphans: list[AttemptRow]) -> None:
        finished_at = iso_ms(now_ms())
        for row in orphans:
            if row.attempt_id in self.routes.active or self.ledger.has(row.attempt_id):
                continue
            log.warning("route_lost_with_dataplane", attempt_id=row.attempt_id, account_id=row.account_id)
            self.record(
                msgspec.structs.replace(
                    row,
                    finished_at=finished_at,
                    status=str(AttemptStatus.TRANSPORT_ERROR),
                    refusal_reason=str(Refusal.DATAPLANE_LOST),
                    condition=None,
                )
            )
