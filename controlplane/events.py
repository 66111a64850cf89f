"""The event hub behind `GET /control/v2/events` (SPEC §11).

Rule: what leaves the hub is a sanitized read model, encoded at most once. Producers call
`publish(kind, data)` with whatever they hold — the raw `AttemptRow`, a circuit dict, an admin
or policy summary — and the hub projects it through that kind's model before anything else sees
it: a route event carries the `RouteView` (the same projection `/control/v2/routes/*` serves),
never the row; every other model declares only the fields it publishes, so a stray key in a
producer's dict is dropped, not forwarded.

Bounds, each with its reason:
- the replay buffer keeps the last `REPLAY_SIZE` (1,024) events (SPEC) for `Last-Event-ID`
  resumption; an id older than the buffer, or one this process never issued, is answered with
  one `gap` event first, so a resumed reader is told it missed something instead of believing
  its view is whole (seed 002: never render absence as a fact);
- each subscriber's queue holds at most `SUBSCRIBER_QUEUE_MAX` events. A feed reader that lets
  its queue fill has stopped reading (its socket buffers are already full behind it), so it is
  dropped with a logged reason rather than buffered without bound;
- event ids are `{epoch}-{seq}`: `epoch` names this process, so an id from before a control
  restart reads as never issued (a gap), not as a position in the new sequence.

Listeners (`listen`) are synchronous callbacks run at publish time for the kinds each asks for (a
route event, two per attempt, calls none that does not), given the event as subscribers are.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import deque
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import msgspec

from controlplane.circuits import CircuitView
from controlplane.routebook import RouteView, as_started, view_of
from shared.logging import get_logger
from shared.wire import AttemptRow

log = get_logger("events")

REPLAY_SIZE = 1024
# ~250 route events are ~200 KiB: far more than any burst a live reader falls behind by, far less
# than what a stalled reader would otherwise pin per connection.
SUBSCRIBER_QUEUE_MAX = 256


class EventKind(StrEnum):
    ROUTE_STARTED = "route.started"
    ROUTE_FINISHED = "route.finished"
    ACCOUNT_STATE = "account.state"
    CIRCUIT = "circuit"
    POLICY = "policy"
    DISPATCH_HOP = "dispatch.hop"
    BUDGET = "budget"
    HEADROOM = "headroom"
    GAP = "gap"


class GapReason(StrEnum):
    EVICTED = "evicted"  # the id was issued, but the buffer no longer holds what followed
    NEVER_ISSUED = "never-issued"  # not an id of this process (malformed, future, or pre-restart)


class CloseReason(StrEnum):
    QUEUE_FULL = "queue-full"  # the reader stopped reading: dropped
    DISCONNECTED = "disconnected"  # the reader went away
    SHUTDOWN = "shutdown"  # the control daemon is stopping


# ---- the sanitized models ------------------------------------------------------------------


class AccountStateEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An admin mutation: which account, what was done, the chain revision it produced."""

    account_id: str | None = None
    action: str | None = None
    state: str | None = None
    revision: int | None = None
    at: str | None = None
    revoked_leases: int | None = None


class PolicyEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A policy write: which level document changed and the revision it produced."""

    name: str | None = None
    revision: int | None = None
    at: str | None = None


class DispatchHop(msgspec.Struct, frozen=True, kw_only=True):
    """A dispatch key moved by the gateway (SPEC §17): from which account to which, on what."""

    dispatch_id: str | None
    key_id: str
    from_account: str
    to_account: str
    condition: str
    hop: int
    mint_decision_id: str


class BudgetEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A budget's spend reached 80 % or 100 % (`threshold`) of its `usd` in this window (SPEC
    §18): once per crossing per window."""

    level: str
    window: str
    usd: float
    spent_usd: float
    threshold: int
    window_start: str
    resets_at: str


class HeadroomEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An account crossed a `min_headroom_percent` floor some policy level sets (SPEC §22):
    `below` it (with the kinds below and when the skip lifts by itself), or `recovered`."""

    account_id: str
    floor_percent: int
    state: str
    kinds: list[str]
    lifts_at: str | None
    at: str


class GapEvent(msgspec.Struct, frozen=True, kw_only=True):
    """Events were missed: refetch the views, then follow the feed from here."""

    reason: str
    last_event_id: str | None
    oldest_retained_id: str | None


def _route_view(data: Any) -> msgspec.Struct:
    if isinstance(data, RouteView):
        return data
    return RouteView(**view_of(data))


def _started_view(data: Any) -> msgspec.Struct:
    """A `route.started` event shows the attempt as its start was. An attempt the data plane
    reported once, by its finished row (its start withdrawn, issue 27), publishes that row: the
    start is derived here, on first read, not per attempt at publish time."""
    if isinstance(data, AttemptRow) and data.status is not None:
        data = as_started(data)
    return _route_view(data)


def _model(kind: type[msgspec.Struct]) -> Callable[[Any], msgspec.Struct]:
    return lambda data: msgspec.convert(data, kind, from_attributes=True)


PROJECTIONS: dict[EventKind, Callable[[Any], msgspec.Struct]] = {
    EventKind.ROUTE_STARTED: _started_view,
    EventKind.ROUTE_FINISHED: _route_view,
    EventKind.CIRCUIT: _model(CircuitView),
    EventKind.ACCOUNT_STATE: _model(AccountStateEvent),
    EventKind.POLICY: _model(PolicyEvent),
    EventKind.BUDGET: _model(BudgetEvent),
    EventKind.HEADROOM: _model(HeadroomEvent),
    EventKind.GAP: _model(GapEvent),
    EventKind.DISPATCH_HOP: _model(DispatchHop),
}

_encode = msgspec.json.Encoder().encode


class Event(msgspec.Struct, gc=False, eq=False):
    """One published event. Its sanitized model (`data`) and that model's JSON (`payload`) are made
    on first use and kept: projected and encoded at most once, not at all when nobody reads it
    (two route events per attempt, most only retained for `Last-Event-ID` replay). Until then it
    holds the producer's value, which only this module sees. A Struct for its C `__init__` (issue
    27: ~1k instructions, a class's Python one ~2.5k), compared by identity, never encoded; untracked
    (`gc=False`): what it holds (rows, models, bytes, names) can never hold an event."""

    epoch: str
    seq: int
    kind: EventKind
    _source: Any
    _data: msgspec.Struct | None = None
    _payload: bytes | None = None

    @property
    def id(self) -> str:
        return f"{self.epoch}-{self.seq}"

    @property
    def data(self) -> msgspec.Struct:
        if self._data is None:
            self._data = PROJECTIONS[self.kind](self._source)
            self._source = None
        return self._data

    @property
    def payload(self) -> bytes:
        """`data` as JSON, encoded once for every reader."""
        if self._payload is None:
            self._payload = _encode(self.data)
        return self._payload


# Route events of an `AttemptRow` are projected on first read: a `RouteView` of a row cannot
# fail (it reads attributes the row always has). Anything else is projected at publish time, so
# a producer's bad shape is refused there, not on a reader's connection.
_KINDS = {str(kind): kind for kind in EventKind}  # a dict lookup, not the enum's call
LAZY_KINDS = frozenset({EventKind.ROUTE_STARTED, EventKind.ROUTE_FINISHED})
_ROUTE_FINISHED = EventKind.ROUTE_FINISHED  # bound once: an enum member is a slow class attribute


# ---- resumption (pure) ---------------------------------------------------------------------


def parse_event_id(text: str | None) -> tuple[str, int] | None:
    """`"{epoch}-{seq}"` → `(epoch, seq)`; anything else → None."""
    if not text:
        return None
    epoch, sep, seq = text.strip().rpartition("-")
    if not sep or not epoch or not seq.isdigit():
        return None
    return epoch, int(seq)


def resume_from(
    last_event_id: str | None, epoch: str, oldest_seq: int | None, next_seq: int
) -> tuple[GapReason | None, int]:
    """Where a reader presenting `last_event_id` resumes: `(gap reason or None, first seq)`.

    No id: live events only. An id of this epoch still covered by the buffer: what followed it.
    Otherwise a gap, then everything the buffer still holds.
    """
    first_held = next_seq if oldest_seq is None else oldest_seq
    if last_event_id is None:
        return None, next_seq
    parsed = parse_event_id(last_event_id)
    if parsed is None or parsed[0] != epoch or parsed[1] >= next_seq:
        return GapReason.NEVER_ISSUED, first_held
    if parsed[1] + 1 < first_held:
        return GapReason.EVICTED, first_held
    return None, parsed[1] + 1


# ---- subscribers and the hub ---------------------------------------------------------------


class Subscriber:
    """One feed reader: a bounded queue the hub fills and the HTTP handler drains."""

    def __init__(self, peer: str, queue_max: int) -> None:
        self.peer = peer
        self.queue_max = queue_max
        self.queue: deque[Event] = deque()
        self.closed: CloseReason | None = None
        self.on_close: Callable[[CloseReason], None] | None = None
        self._wakeup = asyncio.Event()

    def offer(self, event: Event) -> bool:
        """Queue `event`; False when the queue is full (the caller drops this reader)."""
        if self.closed is not None:
            return True
        if len(self.queue) >= self.queue_max:
            return False
        self.queue.append(event)
        self._wakeup.set()
        return True

    def close(self, reason: CloseReason) -> None:
        if self.closed is not None:
            return
        self.closed = reason
        self.queue.clear()
        self._wakeup.set()
        if self.on_close is not None:
            self.on_close(reason)

    async def next_batch(self) -> list[Event]:
        """Everything queued, waiting for at least one event; [] once closed."""
        while not self.queue and self.closed is None:
            self._wakeup.clear()
            await self._wakeup.wait()
        if self.closed is not None:
            return []
        batch = list(self.queue)
        self.queue.clear()
        return batch


class EventHub:
    def __init__(
        self, replay_size: int = REPLAY_SIZE, queue_max: int = SUBSCRIBER_QUEUE_MAX, epoch: str | None = None
    ) -> None:
        self.epoch = epoch or secrets.token_hex(4)
        self.replay: deque[Event] = deque(maxlen=replay_size)
        self.queue_max = queue_max
        self.subscribers: set[Subscriber] = set()
        self.closed_by_reason: dict[CloseReason, int] = {reason: 0 for reason in CloseReason}
        self.queue_high_water = 0  # deepest any subscriber's queue has been
        self._next_seq = 1
        self._listeners: list[tuple[Callable[[Event], None], frozenset[EventKind] | None]] = []
        self._listeners_of: dict[EventKind, tuple[Callable[[Event], None], ...]] = {kind: () for kind in EventKind}
        self._route_listeners: tuple[tuple[Callable[[Event], None], ...], ...] = ((), ())  # started, finished

    @property
    def published(self) -> int:
        return self._next_seq - 1  # every event published took the next seq (none per event to count)

    def id_of(self, seq: int) -> str:
        return f"{self.epoch}-{seq}"

    def _make(self, seq: int, kind: EventKind, data: Any) -> Event:
        if kind in LAZY_KINDS and isinstance(data, AttemptRow):
            return Event(self.epoch, seq, kind, data)
        return Event(self.epoch, seq, kind, None, PROJECTIONS[kind](data))

    def publish(self, kind: EventKind, data: Any) -> Event | None:
        """Retain and fan out one event (projected and encoded on first read). Never raises
        into the producer."""
        try:
            event = self._make(self._next_seq, _KINDS[kind], data)
        except Exception as exc:  # an unknown kind or a shape the model refuses: a producer bug
            log.error("event_unpublishable", kind=str(kind), error=type(exc).__name__)
            return None
        self._next_seq += 1
        self.replay.append(event)
        self._fan_out(event, self._listeners_of[event.kind])
        return event

    def publish_row(self, kind: EventKind, row: AttemptRow) -> None:
        """`publish` of an `AttemptRow`'s route event (two per attempt): no check, listeners by identity."""
        event = Event(self.epoch, self._next_seq, kind, row)
        self._next_seq += 1
        self.replay.append(event)
        listeners = self._route_listeners[kind is _ROUTE_FINISHED]
        if listeners or self.subscribers:
            self._fan_out(event, listeners)

    def _fan_out(self, event: Event, listeners: tuple[Callable[[Event], None], ...]) -> None:
        for listener in listeners:
            try:
                listener(event)
            except Exception:  # a listener's bug must not lose the event for everyone else
                log.exception("event_listener_failed", kind=event.kind)
        if self.subscribers:
            for subscriber in list(self.subscribers):
                if not subscriber.offer(event):
                    self._drop(subscriber, CloseReason.QUEUE_FULL)
                else:
                    self.queue_high_water = max(self.queue_high_water, len(subscriber.queue))

    def listen(self, listener: Callable[[Event], None], kinds: frozenset[EventKind] | None = None) -> None:
        """Run `listener` at each publish of an event of `kinds` (None: every kind), in order."""
        self._listeners.append((listener, kinds))
        self._listeners_of = {k: tuple(f for f, ks in self._listeners if ks is None or k in ks) for k in EventKind}
        self._route_listeners = (self._listeners_of[EventKind.ROUTE_STARTED], self._listeners_of[_ROUTE_FINISHED])

    def subscribe(self, last_event_id: str | None, peer: str = "") -> tuple[Subscriber, list[Event]]:
        """A new reader and its backlog (a `gap` first when one is due, then the replay).

        Synchronous on purpose: no event can be published between computing the backlog and
        registering the reader, so nothing is missed or sent twice.
        """
        oldest = self.replay[0].seq if self.replay else None
        gap, first_seq = resume_from(last_event_id, self.epoch, oldest, self._next_seq)
        backlog = [event for event in self.replay if event.seq >= first_seq]
        if gap is not None:
            gap_event = self._make(
                first_seq - 1,
                EventKind.GAP,
                GapEvent(
                    reason=str(gap),
                    last_event_id=last_event_id,
                    oldest_retained_id=None if oldest is None else self.id_of(oldest),
                ),
            )
            backlog.insert(0, gap_event)
            log.info("event_feed_gap", reason=str(gap), peer=peer, replayed=len(backlog) - 1)
        subscriber = Subscriber(peer, self.queue_max)
        self.subscribers.add(subscriber)
        return subscriber, backlog

    def unsubscribe(self, subscriber: Subscriber, reason: CloseReason = CloseReason.DISCONNECTED) -> None:
        if subscriber in self.subscribers:
            self.subscribers.discard(subscriber)
            self.closed_by_reason[reason] += 1
        subscriber.close(reason)

    def close_all(self, reason: CloseReason = CloseReason.SHUTDOWN) -> None:
        for subscriber in list(self.subscribers):
            self.unsubscribe(subscriber, reason)

    def _drop(self, subscriber: Subscriber, reason: CloseReason) -> None:
        queued, queue_max = len(subscriber.queue), subscriber.queue_max
        log.warning(
            "event_subscriber_dropped", reason=str(reason), peer=subscriber.peer, queued=queued, queue_max=queue_max
        )
        self.unsubscribe(subscriber, reason)
