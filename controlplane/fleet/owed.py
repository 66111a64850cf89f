"""Owed writes: what the fleet's Redis could not take while it was unavailable, kept in order and
delivered once it answers again (SPEC §16).

Rule: a lease ends on this host whatever Redis answers (the data plane refuses its key at once),
and a row is written and acknowledged whatever Redis answers (the ledger is per host). What the
shared state is owed for them — the lease slot's release, the dispatch's live key, the circuit's
probe, the circuit's and the decision's evidence — is queued here and delivered first-in,
first-out: while anything is owed, a newer write queues behind it instead of running, so a
circuit folds its terminals in the order they happened. Nothing is tried inline while the queue
is not empty: the first failure costs one reply timeout (1 s), the rest none — a hung Redis
must not hold every row's acknowledgement for a timeout. `deliver` (the fleet host's loop, every
`DELIVER_INTERVAL_S`) empties it.

A write about a key that is live again when it comes due (a dispatch key whose hop failed and
that stayed where it was) is skipped: its slot, dispatch claim and probe are its own again.

Bound: releases are not bounded here — there is one per lease that ended, and no lease can be
minted while Redis is away — but evidence is, at `EVIDENCE_MAX` queued rows (an outage of
minutes at thousands of rows a second): past it, new evidence is dropped, counted and logged
(the rows themselves are in the ledger).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import msgspec
import redis.asyncio as aredis

from controlplane.circuits import CircuitRegistry, CircuitStore, CircuitView
from controlplane.decisions import Decision
from controlplane.fleet.decisions import LeaseDecisions, RedisDecisions
from controlplane.fleet.sentevidence import SentEvidence
from shared.capacity import StateUnavailable
from shared.clock import now_ms
from shared.codes import AttemptStatus, Condition
from shared.fleet.capacity import Incarnation, RedisCapacity
from shared.fleet.entries import FleetEntries
from shared.fleet.keys import Ceiling, FleetKeys
from shared.fleet.soon import failed
from shared.logging import get_logger
from shared.wire import AttemptRow

log = get_logger("fleet")

EVIDENCE_MAX = 65_536
DELIVER_INTERVAL_S = 0.25
QUIET_DELAY_S = 0.05  # quiet rows (`OwedCircuits`) are folded at most this late


class Owed(msgspec.Struct, frozen=True):
    what: str  # for the log: "release", "evidence", ...
    write: Callable[[], Awaitable[Any]]
    unless_live: str | None = None  # skipped when this key is live again by then
    evidence: bool = False


class OwedWrites:
    def __init__(self, is_live: Callable[[str], bool], evidence_max: int = EVIDENCE_MAX) -> None:
        self.is_live = is_live
        self.evidence_max = evidence_max
        self._queue: deque[Owed] = deque()
        self._evidence = 0
        self.dropped = 0  # evidence past the bound, since start
        self._delivering = asyncio.Lock()

    def __len__(self) -> int:
        return len(self._queue)

    async def write(self, owed: Owed) -> Any:
        """Run the write now when nothing is owed (its answer, or None once queued)."""
        if not self._queue:
            return await self.write_now(owed)
        self._append(owed)
        return None

    def write_soon(self, owed: Owed, then: Callable[[Any], Any]) -> Awaitable[Any]:
        """`write`, its answer through `then`, for a write whose command is queued at the call
        (`shared/fleet/soon.py`: a future, no task when the caller gathers it; issue 27 §4): sent now
        when nothing is owed, and owed, answering `then(None)`, when it fails `StateUnavailable`
        (as `write_now`); queued behind, answering `then(None)` at once, while anything is owed."""
        loop = asyncio.get_running_loop()
        outer: asyncio.Future[Any] = loop.create_future()
        if self._queue:
            self._append(owed)
            outer.set_result(then(None))
            return outer
        inner = asyncio.ensure_future(owed.write())

        def landed(done: asyncio.Future[Any]) -> None:
            if outer.done():  # its caller was cancelled
                if not done.cancelled():
                    done.exception()  # retrieved; owed nothing, as a cancelled `write` owes nothing
                return
            if done.cancelled():
                outer.cancel()
                return
            exc = done.exception()
            if isinstance(exc, StateUnavailable):
                log.warning("fleet_writes_owed", first=owed.what, error=str(exc))
                self._append(owed)
                outer.set_result(then(None))
            elif exc is not None:
                outer.set_exception(exc)
            else:
                outer.set_result(then(done.result()))

        def dropped(done: asyncio.Future[Any]) -> None:
            if done.cancelled():  # a cancelled caller sends nothing, when it is not sent yet
                inner.cancel()

        inner.add_done_callback(landed)
        outer.add_done_callback(dropped)
        return outer

    async def write_now(self, owed: Owed) -> Any:
        """Run the write now even while older writes are owed (for a write none of them can
        change: a staged decision's delete); owed, at the end of the queue, when it fails."""
        try:
            return await owed.write()
        except StateUnavailable as exc:
            log.warning("fleet_writes_owed", first=owed.what, error=str(exc))
        self._append(owed)
        return None

    def _append(self, owed: Owed) -> None:
        if owed.evidence:
            if self._evidence >= self.evidence_max:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.error("fleet_evidence_dropped", dropped=self.dropped, bound=self.evidence_max)
                return
            self._evidence += 1
        self._queue.append(owed)

    async def deliver(self) -> int:
        """Deliver in order what was owed when it started, until Redis fails again; answers how
        many landed. Bounded: writes owed meanwhile (they queue behind, in order) wait for the
        next call, so a caller's loop gets its turn however fast rows arrive."""
        delivered = 0
        async with self._delivering:
            for _ in range(len(self._queue)):
                if not self._queue:
                    break
                owed = self._queue[0]
                if owed.unless_live is None or not self.is_live(owed.unless_live):
                    try:
                        await owed.write()
                    except StateUnavailable:
                        return delivered
                    except Exception:  # a bug in one write must not wedge every later one
                        log.exception("fleet_owed_write_failed", what=owed.what)
                    delivered += 1
                self._queue.popleft()
                if owed.evidence:
                    self._evidence -= 1
            if delivered:
                log.info("fleet_writes_delivered", delivered=delivered)
        return delivered


class OwedCapacity(RedisCapacity):
    """The lease table: a release that cannot land now is owed, never lost; and, after Redis
    lost its data, no reserve until the fleet re-registered (`admitting`, set by the fleet host
    from `core/fleet.may_admit`)."""

    def __init__(
        self, client: aredis.Redis, keys: FleetKeys, host_id: str, incarnation: Incarnation, owed: OwedWrites
    ) -> None:
        super().__init__(client, keys, Ceiling.LEASE, host_id, incarnation)
        self.owed = owed
        self.admitting = True
        self.healthy: Callable[[], bool] = lambda: True  # the fleet host's supervised loops (SPEC §19)

    def reserve(
        self, account_id: str, holder: str, ceiling: int | None, releasing: Sequence[str] = ()
    ) -> Awaitable[bool]:
        if not self.admitting:
            return failed(StateUnavailable("lease capacity: waiting for the fleet's hosts to re-register"))
        if not self.healthy():
            return failed(StateUnavailable("lease capacity: a fleet loop keeps failing"))
        return RedisCapacity.reserve(self, account_id, holder, ceiling, releasing)

    def release(self, holder: str) -> Awaitable[bool]:
        return self.owed.write_soon(
            Owed("release", lambda: RedisCapacity.release(self, holder), unless_live=holder), bool
        )


class OwedDecisions(RedisDecisions):
    """The decision table: a key's end and a row's evidence are owed when they cannot land.
    The decisions of this host's live leases are also kept here (`local`, a `LeaseDecisions`):
    added once Redis took them, answered before asking Redis (they are this host's to write, and
    never change), forgotten when their key ends."""

    def __init__(
        self, client: aredis.Redis, keys: FleetKeys, owed: OwedWrites, local: LeaseDecisions, *, entries: FleetEntries
    ) -> None:
        super().__init__(client, keys, entries=entries)
        self.owed = owed
        self.local = local
        self.sent = SentEvidence()  # what this host appended to each decision's evidence lately

    async def record(self, decision: Decision, *, staged: bool = False) -> None:
        await RedisDecisions.record(self, decision, staged=staged)
        if decision.key_id is not None:  # no await from here to the grant: the key table agrees
            self.local.add(decision)

    async def unstage(self, decision: Decision, *, failed: bool = False) -> None:
        """A refused claim's: run at once, ahead of older owed writes (none of them writes this
        decision), so the held answer goes out with its staged decision already gone. A failed
        claim's (`failed`: Redis just did not answer): owed as any undo, tried now only when
        nothing is owed, so an outage's held answer waits no longer than before. Owed when Redis
        cannot take it, delivered when it answers again (a stage that timed out may land when a
        hung Redis resumes). Never kept locally: only `record` adds to `local`, after the claims."""
        owed = Owed("unstage", lambda: RedisDecisions.unstage(self, decision))
        await (self.owed.write(owed) if failed else self.owed.write_now(owed))

    async def get(self, mint_decision_id: str) -> Decision | None:
        return self.local.get(mint_decision_id) or await RedisDecisions.get(self, mint_decision_id)

    async def for_key(self, key_id: str) -> Decision | None:
        return self.local.of_key(key_id) or await RedisDecisions.for_key(self, key_id)

    def end_key(self, key_id: str) -> Awaitable[None]:
        decision = self.local.of_key(key_id)
        if decision is not None:
            self.sent.forget(decision.mint_decision_id)
        self.local.forget(key_id)
        return self.owed.write_soon(
            Owed("end key", lambda: RedisDecisions.end_key(self, key_id), unless_live=key_id), _nothing
        )

    async def add_evidence(self, mint_decision_id: str, condition: Condition | None) -> None:
        """Owed when Redis is away; nothing sent when the decision holds that condition already
        (`SentEvidence`: evidence is read as a set)."""
        if self.sent.fresh(mint_decision_id, condition):
            return
        await self.owed.write(Owed("evidence", lambda: self._append(mint_decision_id, condition), evidence=True))

    async def _append(self, mint_decision_id: str, condition: Condition | None) -> None:
        if await RedisDecisions.append_evidence(self, mint_decision_id, condition):
            self.sent.note(mint_decision_id, condition)

    async def reregister(self, decisions: Sequence[Decision]) -> None:
        """Redis lost its data, or this host starts: what arrives from now on is appended again."""
        self.sent.forget_all()
        await RedisDecisions.reregister(self, decisions)


class OwedCircuits(CircuitRegistry):
    """The circuits: a row's fold and a probe's end are owed when they cannot land. A row owed
    is folded at the time it was recorded (the circuit opens when the failures happened).

    Quiet rows (`is_quiet`: a 2xx of a lease that is not the probe, an abort) can only reset a
    closed circuit's count, so they are not folded one settle at a time — each fold a Redis
    round trip on the shared cores as the worker's next request arrives (issue 27 §4) — but held
    back per account, `QUIET_DELAY_S` at most, and folded together (`rules.on_quiet_terminals`):
    at the delay's end, or at once before the account's next row that is evidence, so this host's
    rows are still folded in the order they came. Every fold runs under one lock (a late quiet
    fold never overtakes a newer row). What a quiet row changes is a count no reader sees (a
    phase, the probe, a retry time never move by it): only another host's failures landing within
    the delay are counted without this host's answers between them."""

    def __init__(
        self,
        store: CircuitStore,
        cooldown_s: int,
        owed: OwedWrites,
        on_transition: Callable[[CircuitView], object] | None = None,
        quiet_delay_s: float = QUIET_DELAY_S,
    ) -> None:
        super().__init__(store, cooldown_s, on_transition)
        self.owed = owed
        self.quiet_delay_s = quiet_delay_s
        self._quiet: dict[str, bool] = {}  # account -> quiet rows held back (True: one was an answer)
        self._quiet_timer: asyncio.TimerHandle | None = None
        self._folding = asyncio.Lock()
        self._flushes: set[asyncio.Task[None]] = set()

    async def on_rows(self, rows: list[AttemptRow], now_ms: int, quiet_first: Mapping[str, bool] | None = None) -> None:
        by_account: dict[str, list[AttemptRow]] = {}
        for row in rows:
            if row.refusal_reason is None:  # never evidence: nothing to owe
                by_account.setdefault(row.account_id, []).append(row)
        loud: list[AttemptRow] = []
        for account_id, its in by_account.items():
            if all(map(self.is_quiet, its)):
                answered = any(row.status != AttemptStatus.CLIENT_ABORTED for row in its)
                self._quiet[account_id] = self._quiet.get(account_id, False) or answered
            else:
                loud += its
        if self._quiet and self._quiet_timer is None:
            self._quiet_timer = asyncio.get_running_loop().call_later(self.quiet_delay_s, self._quiet_due)
        if not loud:
            return
        async with self._folding:
            first = dict(quiet_first or {})
            for account_id in {row.account_id for row in loud} & self._quiet.keys():
                first[account_id] = first.get(account_id, False) or self._quiet.pop(account_id)
            await self.owed.write(
                Owed("circuit rows", lambda: CircuitRegistry.on_rows(self, loud, now_ms, first), evidence=True)
            )

    def _quiet_due(self) -> None:
        self._quiet_timer = None
        task = asyncio.get_running_loop().create_task(self.fold_held())
        self._flushes.add(task)
        task.add_done_callback(self._folded)

    def _folded(self, task: asyncio.Task[None]) -> None:
        self._flushes.discard(task)
        if not task.cancelled() and task.exception() is not None:  # a bug: the next rows go on
            log.error("row_fold_failed", into="circuits", quiet=True, error=repr(task.exception()))

    async def fold_held(self) -> None:
        """Fold the quiet rows held back now (owed when Redis is away, as any row)."""
        if self._quiet_timer is not None:
            self._quiet_timer.cancel()
            self._quiet_timer = None
        async with self._folding:
            quiet, self._quiet = self._quiet, {}
            if quiet:
                now = now_ms()
                await self.owed.write(
                    Owed("circuit quiet rows", lambda: CircuitRegistry.fold_quiet(self, quiet, now), evidence=True)
                )

    async def on_lease_ended(self, account_id: str, key_id: str, now_ms: int) -> None:
        await self.owed.write(
            Owed(
                "probe end",
                lambda: CircuitRegistry.on_lease_ended(self, account_id, key_id, now_ms),
                unless_live=key_id,
            )
        )


def _nothing(_answer: object) -> None:
    return None
