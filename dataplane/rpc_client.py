"""The data plane's side of the RPC: dial control, hold the replica exact, report attempts.

Connect → `Hello` → `Welcome` → `Snapshot` (ack) → pushes. On any loss the replica is cleared
at once (fail closed) and the link redials with capped, jittered backoff. Attempt reports never
block the hot path: `AttemptStarted` is a fire-and-forget frame; each `AttemptFinished` is sent
at once (no task, no wait) and stays in an outbox until control's Ack for it arrives; whatever
is still there after a reconnect is re-sent (control deduplicates by attempt id), so a control
restart loses no row. Only a caller that must wait (the §7 evidence row) gets a future.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import OrderedDict

from dataplane.leases import LeaseReplica
from shared.logging import get_logger
from shared.rpc import Connection, FrameError
from shared.wire import (
    PROTOCOL_VERSION,
    AccountsDisabled,
    Ack,
    AttemptFinished,
    AttemptRow,
    AttemptStarted,
    ConnectionCounts,
    Drain,
    FleetLoops,
    Hello,
    LeaseAdded,
    LeaseGates,
    LeaseRemoved,
    LoopReport,
    Message,
    Refused,
    Snapshot,
    SocketsOpen,
    StorageState,
    Welcome,
)

log = get_logger("dataplane.rpc")

BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
# Before the first link, control is most likely starting beside us (systemd starts both units
# at once): dial every STARTUP_POLL_S for STARTUP_FAST_S, so the link comes up within a poll of
# control's socket opening rather than within a doubled backoff (up to ~0.3 s more to ready).
STARTUP_POLL_S = 0.01
STARTUP_FAST_S = 10.0
# Rows waiting for control while it is away; past this the oldest are dropped, loudly.
OUTBOX_CAP = 100_000
# A short request's start waits this long to one twice as long before it is sent (issue 27): one
# that ends sooner, most of them, is reported once, by its finished row, and control decodes and
# records one report instead of two. Only a non-streaming HTTP attempt of a lease that cannot hop
# is held (`Attempt.announce`): a worker reading a stream, a WebSocket, and the hop's in-flight
# wait (SPEC §17) see their starts as before; the active routes see a held one this late.
START_HOLD_S = 0.01


def redial_wait(delay: float, linked: bool, since_start_s: float, jitter: float) -> tuple[float, float]:
    """How long to wait before the next dial, and the next backoff: a short fixed poll while the
    daemon has never been linked and is young, else the capped jittered backoff
    (`jitter` in [0, 1))."""
    if not linked and since_start_s < STARTUP_FAST_S:
        return STARTUP_POLL_S, delay
    return delay * (0.5 + jitter), min(BACKOFF_MAX_S, delay * 2)


class ControlLink:
    def __init__(self, socket_path: str, replica: LeaseReplica) -> None:
        self.socket_path = socket_path
        self.replica = replica
        self.conn: Connection | None = None
        self.in_flight: dict[str, AttemptRow] = {}
        self.outbox: OrderedDict[str, AttemptRow] = OrderedDict()
        self._sending: set[str] = set()  # rows sent on the live link, their Ack not yet in
        self._waiters: dict[str, asyncio.Future[bool]] = {}
        self.synced = asyncio.Event()
        self.sockets_open: dict[str, int] = {}  # open Responses WebSockets per account (§20)
        self.connection_counts: ConnectionCounts | None = None  # SPEC §19's, the last reported
        self.fleet_loops: list[LoopReport] = []  # fleet mode: this data plane's Redis loops (§19)
        self._stopping = False
        # Held starts (`START_HOLD_S`): those held since the last tick, and those before it.
        self._held: dict[str, AttemptRow] = {}
        self._held_older: dict[str, AttemptRow] = {}
        self._hold_timer: asyncio.TimerHandle | None = None

    # ---- connection lifecycle -----------------------------------------------------------

    async def run(self) -> None:
        delay = BACKOFF_MIN_S
        started, linked = time.monotonic(), False
        while not self._stopping:
            try:
                reader, writer = await asyncio.open_unix_connection(self.socket_path)
            except OSError:
                wait, delay = redial_wait(delay, linked, time.monotonic() - started, random.random())
                await asyncio.sleep(wait)
                continue
            delay, linked = BACKOFF_MIN_S, True
            conn = Connection(reader, writer, "control")
            try:
                await self._session(conn)
            finally:
                self._lost(conn)

    async def _session(self, conn: Connection) -> None:
        try:
            await conn.send(Hello(version=PROTOCOL_VERSION, role="dataplane", pid=os.getpid()))
            answer = await asyncio.wait_for(conn.read_message(), 5.0)
        except (TimeoutError, FrameError, asyncio.IncompleteReadError, OSError) as exc:
            log.warning("control_handshake_failed", reason=getattr(exc, "reason", type(exc).__name__))
            return
        if isinstance(answer, Refused) or not isinstance(answer, Welcome):
            log.error("control_refused_link", reason=getattr(answer, "reason", "unexpected-answer"))
            await asyncio.sleep(BACKOFF_MAX_S / 4)
            return
        self.conn = conn
        await conn.run(self._on_message)

    def _lost(self, conn: Connection) -> None:
        conn.close()
        if self.conn is conn:
            self.conn = None
            self.synced.clear()
            self._forget_held()  # the resync announces them
            had = len(self.replica)
            self.replica.clear()
            log.warning("control_link_lost", leases_dropped=had, rows_waiting=len(self.outbox))

    async def _on_message(self, conn: Connection, message: Message) -> None:
        if isinstance(message, Snapshot):
            self.replica.load(message.leases, message.accounts, message.storage_ok, message.priced, message.disabled)
            conn.send_nowait(Ack(req_id=message.req_id))
            self.synced.set()
            self._resend(conn)
            log.info("control_synchronised", leases=len(message.leases), accounts=len(message.accounts))
        elif isinstance(message, LeaseAdded):
            self.replica.add(message.lease)
            conn.send_nowait(Ack(req_id=message.req_id))
        elif isinstance(message, LeaseRemoved):
            for key_id in message.key_ids:
                self.replica.remove(key_id)
            self._send_rows_of(set(message.key_ids))
            conn.send_nowait(Ack(req_id=message.req_id))  # flushes the lazy rows ahead of it
        elif isinstance(message, Drain):  # a control read waits: everything held back goes first
            self._announce_held(conn)
            conn.send_nowait(Ack(req_id=message.req_id))  # flushes the lazy reports ahead of it
        elif isinstance(message, LeaseGates):  # SPEC §18: requests from now on see them
            self.replica.regate(message.gates)
            conn.send_nowait(Ack(req_id=message.req_id))
        elif isinstance(message, AccountsDisabled):  # SPEC §20: their sockets close (the sweep)
            self.replica.disabled = frozenset(message.account_ids)
            conn.send_nowait(Ack(req_id=message.req_id))
            log.info("accounts_disabled", accounts=sorted(message.account_ids))
        elif isinstance(message, StorageState):
            self.replica.storage_ok = message.ok
            log.warning("observation_storage_state", ok=message.ok)
        else:
            log.warning("rpc_message_unexpected", op=type(message).__name__)

    def _send_rows_of(self, key_ids: set[str]) -> None:
        """SPEC §3: a removal is acknowledged only after the rows of every attempt finished on
        those keys were sent, on this connection, ahead of the Ack — so when a revoke returns,
        control holds them (a probe's success is never lost to its revoke). A row already on its
        way (queued lazily, a write still to come) is ahead of the Ack in the same ordered
        buffer; one not sent on this link yet is sent now."""
        if not self.outbox:
            return
        for attempt_id, row in list(self.outbox.items()):
            if row.key_id in key_ids:
                self._transmit(attempt_id)

    def _resend(self, conn: Connection) -> None:
        """After a resync: re-announce what is in flight and re-deliver unacknowledged rows."""
        self._forget_held()  # every attempt in flight is announced here
        for row in self.in_flight.values():
            conn.send_nowait(AttemptStarted(row=row))
        if self.sockets_open:
            conn.send_nowait(SocketsOpen(counts=dict(self.sockets_open)))
        if self.connection_counts is not None:
            conn.send_nowait(self.connection_counts)
        if self.fleet_loops:
            conn.send_nowait(FleetLoops(loops=list(self.fleet_loops)))
        for attempt_id in list(self.outbox):
            self._transmit(attempt_id)

    # ---- attempt reports ----------------------------------------------------------------

    def started(self, row: AttemptRow, hold: bool = False) -> None:
        """Announce an attempt; with `hold`, only after `START_HOLD_S` if it is still running."""
        self.in_flight[row.attempt_id] = row
        conn = self.conn
        if conn is None or not self.synced.is_set():
            return  # the resync announces every attempt in flight
        if hold:
            self._held[row.attempt_id] = row
            if self._hold_timer is None:
                self._hold_timer = asyncio.get_running_loop().call_later(START_HOLD_S, self._hold_tick)
            return
        self._announce(conn, row)

    def _announce(self, conn: Connection, row: AttemptRow) -> None:
        try:  # withdrawn if the attempt ends before it leaves: one report (`finished`)
            conn.send_withdrawable(row.attempt_id, AttemptStarted(row=row))
        except ConnectionError:
            pass

    def _hold_tick(self) -> None:
        """Announce the starts held since before the last tick; the rest wait one more."""
        older, self._held_older, self._held = self._held_older, self._held, {}
        conn = self.conn
        if conn is not None:
            for row in older.values():
                self._announce(conn, row)
        self._hold_timer = None
        if self._held_older:
            self._hold_timer = asyncio.get_running_loop().call_later(START_HOLD_S, self._hold_tick)

    def _announce_held(self, conn: Connection) -> None:
        """Every held start now (a `Drain`): control's read sees every attempt in flight."""
        if self._held or self._held_older:
            held = [*self._held_older.values(), *self._held.values()]
            self._forget_held()
            for row in held:
                self._announce(conn, row)

    def _unhold(self, attempt_id: str) -> bool:
        """Forget a held start (its attempt ended first); False when it was not held."""
        return self._held.pop(attempt_id, None) is not None or self._held_older.pop(attempt_id, None) is not None

    def _forget_held(self) -> None:
        self._held.clear()
        self._held_older.clear()

    def sockets(self, counts: dict[str, int]) -> None:
        """The open sockets per account changed: control's accounts view hears it (lazily)."""
        self.sockets_open = counts
        self._tell(SocketsOpen(counts=dict(counts)))

    def connections(self, refused: int, head_timeouts: int) -> None:
        """SPEC §19's connection counters changed: control's `/metrics` hears them (lazily)."""
        self.connection_counts = ConnectionCounts(refused=refused, head_timeouts=head_timeouts)
        self._tell(self.connection_counts)

    def loops(self, reports: list[LoopReport]) -> None:
        """Fleet mode: this data plane's Redis loops changed; control's fleet view hears it."""
        self.fleet_loops = reports
        self._tell(FleetLoops(loops=list(reports)))

    def _tell(self, message: Message) -> None:
        """A state report, sent lazily when synced; otherwise the next resync sends the latest."""
        conn = self.conn
        if conn is not None and self.synced.is_set():
            try:
                conn.send_nowait(message, lazy=True)
            except ConnectionError:
                pass

    def finished(self, row: AttemptRow, wait: bool = False) -> asyncio.Future[bool] | None:
        """Queue the terminal row and send it; nothing waits for control's Ack unless `wait`.

        With `wait` the returned future resolves True once control holds the row, False when
        it cannot get there now (no link, or the link was lost first); the row stays queued
        either way until acknowledged.
        """
        attempt_id = row.attempt_id
        if self.in_flight.pop(attempt_id, None) is not None and not self._unhold(attempt_id) and self.conn is not None:
            self.conn.withdraw(attempt_id)  # control learns of it from this row alone
        self.outbox[attempt_id] = row
        while len(self.outbox) > OUTBOX_CAP:
            dropped, _ = self.outbox.popitem(last=False)
            log.error("attempt_row_dropped", attempt_id=dropped, reason="outbox-full")
            self._resolve(dropped, False)
        future = self._waiter(attempt_id) if wait else None
        self._transmit(attempt_id)
        return future

    def _waiter(self, attempt_id: str) -> asyncio.Future[bool]:
        future = self._waiters.get(attempt_id)
        if future is None or future.done():
            future = self._waiters[attempt_id] = asyncio.get_running_loop().create_future()
        return future

    def _resolve(self, attempt_id: str, held: bool) -> None:
        future = self._waiters.pop(attempt_id, None)
        if future is not None and not future.done():
            future.set_result(held)

    def _transmit(self, attempt_id: str) -> None:
        """Send the queued row on the live link unless it is already on its way there."""
        conn = self.conn
        if attempt_id in self._sending or attempt_id not in self.outbox:
            return
        if conn is None or not self.synced.is_set():
            self._resolve(attempt_id, False)
            return
        row = self.outbox[attempt_id]
        try:
            conn.post(
                lambda rid: AttemptFinished(req_id=rid, row=row),
                lambda ack: self._acked(attempt_id, ack),
                lazy=attempt_id not in self._waiters,
            )  # someone waits: now
        except ConnectionError:
            self._resolve(attempt_id, False)
            return
        self._sending.add(attempt_id)

    def _acked(self, attempt_id: str, ack: Ack | None) -> None:
        self._sending.discard(attempt_id)
        if ack is not None:
            self.outbox.pop(attempt_id, None)
        self._resolve(attempt_id, ack is not None)

    async def flush(self, timeout_s: float) -> int:
        """Wait (bounded) for every queued row to be acknowledged; returns how many remain."""
        pending = []
        for attempt_id in list(self.outbox):
            future = self._waiter(attempt_id)
            self._transmit(attempt_id)
            if not future.done():
                pending.append(future)
        if self.conn is not None:
            self.conn.flush()  # rows sent lazily a moment ago go now, not at their timer
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)
        return len(self.outbox)

    def stop(self) -> None:
        self._stopping = True
        if self.conn is not None:
            self.conn.close()
