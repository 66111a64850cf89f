"""The control daemon's operations: mint, revoke, the release seam, attempt reports.

HTTP handlers and the RPC call these; this module does the I/O ordering (key table → capacity
→ replication) and leaves decisions to `core`. Every path that ends a key goes through
`end_keys`, the one release seam.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import msgspec

from controlplane.circuits import CircuitRegistry
from controlplane.core.pricing import PriceLookup, PriceTable, cost_of
from controlplane.decisions import Decision, DecisionTable
from controlplane.events import EventHub
from controlplane.evidence import EvidenceBook
from controlplane.registry import AccountSpec, Registry, is_configured
from controlplane.replication import DataPlaneLink
from controlplane.routebook import RouteBook
from controlplane.stores.keys import KeyTable
from controlplane.stores.ledger import Ledger
from shared.capacity import CapacityTable
from shared.clock import iso_ms, now_ms
from shared.codes import AttemptStatus, Binding, Refusal
from shared.errors import GatewayError
from shared.logging import get_logger
from shared.rpc import Connection
from shared.settings import Settings
from shared.tokens import new_token
from shared.wire import (
    Ack, AccountRoute, AttemptFinished, AttemptRow, AttemptStarted, Lease, Message, Ping,
)

log = get_logger("control")

# How long routes of a lost data plane wait to be re-announced before they are closed.
LOST_ROUTE_GRACE_S = 5.0


class Minted(msgspec.Struct, frozen=True, kw_only=True):
    token: str
    lease: Lease
    account: AccountSpec
    base_url: str


class ControlService:
    def __init__(self, settings: Settings, registry: Registry, keys: KeyTable, ledger: Ledger,
                 prices: PriceTable, env: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.registry = registry
        self.keys = keys
        self.ledger = ledger
        self.prices = prices
        self._price_of = PriceLookup(prices)
        self.env = dict(os.environ if env is None else env)
        self.routes = RouteBook()
        self.lease_capacity = CapacityTable()
        self.circuits = CircuitRegistry(settings.circuit_cooldown_seconds)
        self.decisions = DecisionTable()
        self.evidence = EvidenceBook(now_ms())
        self.events = EventHub()
        self.decision_listeners: list[Callable[[Decision], None]] = []
        self.row_listeners: list[Callable[[AttemptRow], None]] = []  # each recorded terminal row
        self._unacked: list[tuple[Connection, int]] = []  # rows staged, to acknowledge once written
        self.circuits.on_transition = lambda account_id, _state: self.events.publish(
            "circuit", {"account_id": account_id, **self.circuits.view(account_id, now_ms())})
        self.link = DataPlaneLink(self._snapshot, self.on_message, self._on_disconnect)
        for lease in keys.all():
            account = registry.get(lease.account_id)
            self.lease_capacity.reserve(lease.account_id, lease.key_id,
                                        None if account is None else account.lease_capacity)
            if lease.dispatch_id is not None:
                self.decisions.note_live(lease.key_id, lease.repo_slug, lease.dispatch_id)

    # ---- facts --------------------------------------------------------------------------

    def configured(self, account: AccountSpec) -> bool:
        return is_configured(account, self.env)

    def base_url_for(self, account: AccountSpec) -> str:
        root = self.settings.dataplane_url
        return root + "/v1" if account.wire == "openai" else root

    def _snapshot(self) -> tuple[list[Lease], list[AccountRoute], bool]:
        return self.keys.all(), self.registry.routes(), self.ledger.ok

    # ---- mint and the release seam ------------------------------------------------------

    async def mint_v1(self, binding: Binding, principal_kind: str, principal_id: str,
                      repo_slug: str, ttl_seconds: int | None) -> Minted:
        account = self.registry.legacy_for(binding)
        if not self.configured(account):
            raise GatewayError(Refusal.ACCOUNT_NOT_CONFIGURED,
                               f"the legacy account for binding {binding!s} ({account.id}) has no "
                               f"credential: set {account.credential_env}")
        ttl_s = ttl_seconds or self.settings.key_ttl_seconds
        token, key_id, digest = new_token()
        lease = Lease(key_id=key_id, digest=digest, account_id=account.id,
                      expires_at_ms=now_ms() + ttl_s * 1000, principal_kind=principal_kind,
                      principal_id=principal_id, repo_slug=repo_slug)
        if not self.lease_capacity.reserve(account.id, lease.key_id, account.lease_capacity):
            raise GatewayError(Refusal.NO_ELIGIBLE_ACCOUNT, f"account {account.id} is at its lease capacity",
                               retry_after_s=1)
        return await self.grant(lease, account, token, reserved=True)

    async def grant(self, lease: Lease, account: AccountSpec, token: str, *, reserved: bool) -> Minted:
        """Store the lease (its slot already reserved) and wait until the data plane has it."""
        assert reserved and self.lease_capacity.holds(lease.key_id)
        self.keys.add(lease)
        await self.link.lease_added(lease)
        log.info("lease_granted", key_id=lease.key_id, account_id=account.id,
                 expires_at=iso_ms(lease.expires_at_ms), dataplane=self.link.connected)
        return Minted(token=token, lease=lease, account=account, base_url=self.base_url_for(account))

    async def end_keys(self, key_ids: list[str], reason: str) -> list[str]:
        """The release seam: forget each key, return its lease slot, tell the data plane.

        A circuit lets its probe go only once the data plane acknowledged the removal: it sends
        the rows of every attempt it finished on those keys ahead of that Ack (SPEC §3), so a
        probe's success is folded before the probe could be taken for one that never answered.
        """
        ended: list[Lease] = []
        for key_id in key_ids:
            lease = self.keys.remove(key_id)
            self.lease_capacity.release(key_id)
            self.decisions.on_key_ended(key_id)
            if lease is not None:
                ended.append(lease)
        if ended:
            await self.link.leases_removed([lease.key_id for lease in ended])
            now = now_ms()
            for lease in ended:
                self.circuits.on_lease_ended(lease.account_id, lease.key_id, now)
                log.info("lease_ended", key_id=lease.key_id, reason=reason)
        return [lease.key_id for lease in ended]

    async def revoke(self, key_id: str) -> bool:
        return bool(await self.end_keys([key_id], "revoked"))

    async def end_account_keys(self, account_id: str, reason: str) -> int:
        """Account-wide revocation (admin `revoke-leases`), through the same seam."""
        keys = [lease.key_id for lease in self.keys.all() if lease.account_id == account_id]
        return len(await self.end_keys(keys, reason))

    async def reap_expired(self, now: int | None = None) -> int:
        expired = self.keys.expired(now_ms() if now is None else now)
        return len(await self.end_keys(expired, "expired")) if expired else 0

    # ---- attempt reports ----------------------------------------------------------------

    async def on_message(self, conn: Connection, message: Message) -> None:
        if isinstance(message, AttemptStarted):
            if message.row.attempt_id not in self.routes.active:
                self.routes.started(message.row)
                self.events.publish("route.started", message.row)
        elif isinstance(message, AttemptFinished):
            self._finished(conn, message)
        elif isinstance(message, Ping):
            conn.send_nowait(Ack(req_id=message.req_id))
        else:
            log.warning("rpc_message_unexpected", op=type(message).__name__)

    def record(self, row: AttemptRow, *, flush: bool = True) -> bool:
        """Price the row, stage it in the ledger once, move it from active to recent; write it
        now (`flush`) or with the others of this batch (`write_staged`, which the caller then
        owes). Returns whether storage accepts writes."""
        if self.ledger.has(row.attempt_id):
            self.routes.active.pop(row.attempt_id, None)
            return self.write_staged() if flush else self.ledger.ok
        cost, reason = cost_of(self._price_of, row.served_model or row.requested_model, row.usage)
        row = msgspec.structs.replace(row, cost_usd=cost, cost_reason=str(reason))
        self.ledger.stage(row)
        now = now_ms()
        self.routes.finished(row)
        self.events.publish("route.finished", row)
        for listener in self.row_listeners:
            try:
                listener(row)
            except Exception:  # a listener's bug must not cost the row its Ack or its evidence
                log.exception("row_listener_failed", attempt_id=row.attempt_id)
        self.evidence.record(row, now)
        self.circuits.on_row(row, now)
        self.decisions.on_row(row)
        return self.write_staged() if flush else self.ledger.ok

    def write_staged(self) -> bool:
        """Write every staged row; tell the data plane when storage starts or stops failing."""
        was_ok = self.ledger.ok
        ok = self.ledger.flush()
        if ok != was_ok:
            self.link.storage_state(ok)
        return ok

    def _finished(self, conn: Connection, message: AttemptFinished) -> None:
        """A terminal row from the data plane. Its `Ack` says the row is on disk, so it is sent
        only after the write: rows of one RPC read are staged, then written with one `write`
        in a callback, which acknowledges them all (an unacknowledged row stays in the data
        plane's outbox and is re-sent after a reconnect, so a crash in between loses nothing)."""
        self.record(message.row, flush=False)
        self._unacked.append((conn, message.req_id))
        if len(self._unacked) == 1:
            asyncio.get_running_loop().call_soon(self._write_and_ack)

    def _write_and_ack(self) -> None:
        ok = self.write_staged()
        unacked, self._unacked = self._unacked, []
        for conn, req_id in unacked:
            try:
                conn.send_nowait(Ack(req_id=req_id, ok=ok))
            except ConnectionError:
                pass  # the link went away: the data plane re-sends the row, deduplicated here

    async def retry_storage(self) -> None:
        if not self.ledger.ok and self.write_staged():
            log.info("ledger_recovered")

    def log_decision(self, decision: Decision) -> None:
        for listener in self.decision_listeners:
            listener(decision)
        log.info("mint_decided", mint_decision_id=decision.mint_decision_id,
                 outcome=str(decision.outcome),
                 refusal_reason=None if decision.refusal_reason is None else str(decision.refusal_reason),
                 account_id=decision.account_id, position=decision.fallback_position, hop=decision.hop,
                 dispatch_id=decision.lineage.dispatch_id, repo_slug=decision.lineage.repo_slug)

    def _on_disconnect(self) -> None:
        """Routes in flight are forgotten now; any the data plane does not re-announce (or
        finish) within the grace period get a terminal row, so none stays streaming forever."""
        orphans = self.routes.forget_active()
        if orphans:
            asyncio.get_running_loop().call_later(LOST_ROUTE_GRACE_S, self._close_orphans, orphans)

    def _close_orphans(self, orphans: list[AttemptRow]) -> None:
        finished_at = iso_ms(now_ms())
        for row in orphans:
            if row.attempt_id in self.routes.active or self.ledger.has(row.attempt_id):
                continue
            log.warning("route_lost_with_dataplane", attempt_id=row.attempt_id, account_id=row.account_id)
            self.record(msgspec.structs.replace(
                row, finished_at=finished_at, status=str(AttemptStatus.TRANSPORT_ERROR),
                refusal_reason=str(Refusal.DATAPLANE_LOST), condition=None))
