"""The control daemon's ports: the narrow faces its parts see of one another, instead of the hub.

`controlplane.wiring.wire` builds every collaborator and hands each the ports it uses, never the
`ControlService` itself; `tests/unit/test_ports.py` fails when a module outside `main.py` and
this one reaches `service.` for anything. What each port holds:
- reads: `AccountReads` (the registry), `LeaseReads` (the key table), `FlightReads` and
  `RouteReads` (the route book), `EvidenceReads`, `CircuitReads`, `LinkState` (the data plane's
  link), `LedgerState`, `Configured`, `RowDrain` (what a read awaits first) — bundled for the read
  handlers and the metrics as `ControlReads`;
- the release seam: `KeyEnder` (`ControlService.end_keys`, `end_account_keys`), what the fleet
  host's repairs and the fleet's revocation requests end keys through;
- the service's own: `RowSink` (each recorded terminal row, in the order `wire` gives),
  `SettleHook` (each settle's rows, after the folds, before the Acks), `BudgetPort` (SPEC §18:
  the budget gate of a lease and the exhausted budgets of a scope), `V1Keys` (SPEC §5's mint
  and revoke).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from shared.codes import Binding, EndReason
from shared.wire import AttemptRow, ConnectionCounts, Lease, LoopReport

if TYPE_CHECKING:
    from controlplane.circuits import CircuitView
    from controlplane.core.budgets import Exhausted
    from controlplane.core.health import EvidenceCounts
    from controlplane.grants import Minted
    from controlplane.registry import AccountSpec

RowSink = Callable[[AttemptRow], None]  # a recorded terminal row (a sink's bug never costs its Ack)
SettleHook = Callable[[list[AttemptRow]], Awaitable[None]]  # a settle's rows, folded, not yet acked
Configured = Callable[["AccountSpec"], bool]  # whether an account's credential is set


class AccountReads(Protocol):
    """The registry: the configured accounts, in their order."""

    @property
    def accounts(self) -> Sequence[AccountSpec]: ...
    def get(self, account_id: str) -> AccountSpec | None: ...


class LeaseReads(Protocol):
    """The key table's live leases."""

    def all(self) -> list[Lease]: ...
    def count_by_account(self) -> dict[str, int]: ...


class FlightReads(Protocol):
    """Attempts streaming now, per account."""

    def in_flight_by_account(self) -> dict[str, int]: ...


class RouteReads(FlightReads, Protocol):
    """The route book: attempts in flight, the recent ring, the sockets the data plane holds."""

    active: dict[str, AttemptRow]
    recent: deque[AttemptRow]
    sockets_open: dict[str, int]
    connections: ConnectionCounts  # the data plane's SPEC §19 counters, as last reported
    dataplane_loops: list[LoopReport]  # fleet mode: the data plane's Redis loops, as last reported

    def recent_view(self, limit: int) -> tuple[list[AttemptRow], bool, int, str | None]: ...


class EvidenceReads(Protocol):
    since_ms: int

    def window(self, account_id: str, since_ms: int) -> tuple[EvidenceCounts, int | None, bool]: ...


class CircuitReads(Protocol):
    async def view_or_last(self, account_id: str, now_ms: int) -> CircuitView: ...


class LinkState(Protocol):
    """The data plane's link, as the health probe and the gauges see it."""

    peer_pid: int | None
    ready: asyncio.Event

    @property
    def connected(self) -> bool: ...


class RowDrain(Protocol):
    """A read's barrier (`controlplane/drain.ReportDrain`): every report the data plane queued
    before the call is recorded and settled when it returns (bounded; False when it was not)."""

    rounds: int  # drains sent (`leasehold_dataplane_drains`)
    late: int  # of them, not answered within the deadline

    async def drain(self) -> bool: ...


class LedgerState(Protocol):
    @property
    def ok(self) -> bool: ...


class KeyEnder(Protocol):
    """The release seam (`ControlService.end_keys`): every path that ends a key goes through it."""

    async def end_keys(self, key_ids: list[str], reason: EndReason) -> list[str]: ...
    async def end_account_keys(self, account_id: str, reason: EndReason = ...) -> int: ...


class BudgetPort(Protocol):
    """SPEC §18 (`BudgetGuard`): a lease as the data plane must hold it now (its budget gate), and
    the exhausted budgets of a (repo, role)'s chain."""

    def gate(self, lease: Lease) -> Lease: ...
    def hold_of(self, repo_slug: str, worker_role: str | None) -> tuple[Exhausted, ...]: ...


class V1Keys(Protocol):
    """SPEC §5: the v1 mint and revoke (`POST`/`DELETE /control/v1/keys`)."""

    async def mint_v1(
        self, binding: Binding, principal_kind: str, principal_id: str, repo_slug: str, ttl_seconds: int | None
    ) -> Minted: ...
    async def revoke(self, key_id: str) -> bool: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlReads:
    """What the read handlers and the metrics read of the daemon, each a narrow port."""

    registry: AccountReads
    keys: LeaseReads
    routes: RouteReads
    evidence: EvidenceReads
    circuits: CircuitReads
    link: LinkState
    ledger: LedgerState
    configured: Configured
    drain: RowDrain  # awaited before a row-reading answer (`controlplane/http/common.requires`)
