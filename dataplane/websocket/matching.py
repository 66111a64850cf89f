"""Which response in flight an upstream event belongs to (SPEC §20). Pure: no I/O, no clock.

A socket may carry several responses at once (a client that multiplexes, or a `response.create`
that continues or supersedes one in flight). Each event is matched by what the protocol names:
- the response id (`response.id` of `response.created` / `in_progress` / `completed` / …, or a
  top-level `response_id`): an id not seen yet binds to a `response.create` not yet answered.
  Nothing the upstream sends before `response.created` names its create, so that first binding
  is in order (FIFO among the unanswered creates), narrowed by what the created response
  echoes of its create (`previous_response_id`, `metadata`) where it echoes them; an id that
  is neither known nor bindable (every create answered, or its response already ended) belongs
  to no attempt: it is forwarded and ends nothing;
- an item id (`item_id`, `item.id`): the response whose events first carried it;
- the `sequence_number` (each response numbers its events from 0): an event naming nothing
  else goes to the response whose next number it is (the last one spoken to on a tie);
- an `error` event's `error.event_id`, echoing the create's `event_id`; an `error` naming
  nothing ends the oldest unanswered create (an error in lieu of `response.created`), else the
  response the last event went to;
- anything else goes to the response the last event went to (a response streams in bursts).
Every response that went upstream ends in exactly one row: at its terminal event, at the
socket's close, or when it is superseded: a create that continues it (`previous_response_id`
naming it) was answered, or, on a socket that has not interleaved responses, a later response
ended while it said nothing (the upstream serves one at a time: it dropped this one).
"""

from __future__ import annotations

from typing import Any, Generic, NamedTuple, TypeVar

import msgspec

T = TypeVar("T")
KEEP_RESPONSES = 256  # response ids remembered per socket (the oldest forgotten first)
KEEP_ITEMS = 1024


def _trim(known: dict[str, Any], keep: int) -> None:
    while len(known) > keep:
        del known[next(iter(known))]


class Echo(NamedTuple):
    """What a `response.create` carries that identifies it when echoed back."""

    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    event_id: str | None = None


class Named(NamedTuple):
    """What an upstream event names."""

    type: str | None
    response_id: str | None = None
    item_id: str | None = None
    event_id: str | None = None  # an error's `error.event_id`
    echo: Echo | None = None  # what its response object echoes of the create
    seq: int | None = None  # its `sequence_number`


class _Head(msgspec.Struct):
    id: Any = None
    metadata: Any = None
    previous_response_id: Any = None
    event_id: Any = None


class _Route(msgspec.Struct):
    type: Any = None
    response_id: Any = None
    item_id: Any = None
    response: _Head | None = None
    item: _Head | None = None
    error: Any = None
    sequence_number: Any = None


class _CreateHead(msgspec.Struct):
    previous_response_id: Any = None
    metadata: Any = None
    event_id: Any = None


_route = msgspec.json.Decoder(_Route).decode
_create = msgspec.json.Decoder(_CreateHead).decode


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _meta(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) and value else None


def create_echo(data: bytes) -> Echo:
    """The identifying fields of a client `response.create` (already held to SPEC §19)."""
    try:
        head = _create(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return Echo()
    return Echo(_str(head.previous_response_id), _meta(head.metadata), _str(head.event_id))


def named(data: bytes | str) -> Named:
    """What an upstream event names (only its `type` when it is not the expected shape)."""
    try:
        event = _route(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return Named(None)
    kind = _str(event.type)
    response, item = event.response, event.item
    rid = _str(response.id) if response is not None else None
    echo = Echo(_str(response.previous_response_id), _meta(response.metadata)) if response is not None else None
    iid = _str(event.item_id) or (_str(item.id) if item is not None else None)
    error = event.error if isinstance(event.error, dict) else {}
    seq = event.sequence_number
    seq = seq if isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0 else None
    return Named(kind, rid or _str(event.response_id), iid, _str(error.get("event_id")), echo, seq)


class _Slot(Generic[T]):
    __slots__ = ("attempt", "echo", "response_id", "bound_at", "next_seq")

    def __init__(self, attempt: T, echo: Echo) -> None:
        self.attempt = attempt
        self.echo = echo
        self.response_id: str | None = None
        self.bound_at: int | None = None  # the tick its response was named
        self.next_seq = 0  # the `sequence_number` its next event should carry


class Matcher(Generic[T]):
    """The responses in flight on one socket, oldest create first."""

    def __init__(self) -> None:
        self._slots: list[_Slot[T]] = []
        self._by_response: dict[str, _Slot[T]] = {}
        self._by_item: dict[str, _Slot[T]] = {}
        self._current: _Slot[T] | None = None
        self._tick = 0
        self.interleaved = False  # an older response spoke after a newer one began

    def __len__(self) -> int:
        return len(self._slots)

    def attempts(self) -> list[T]:
        return [slot.attempt for slot in self._slots]

    def add(self, attempt: T, echo: Echo) -> None:
        self._slots.append(_Slot(attempt, echo))

    def remove(self, attempt: T) -> bool:
        for slot in self._slots:
            if slot.attempt is attempt:
                self._slots.remove(slot)
                if self._current is slot:
                    self._current = None
                _trim(self._by_response, KEEP_RESPONSES)  # an ended id stays known a while:
                _trim(self._by_item, KEEP_ITEMS)  # its late events match nothing
                return True
        return False

    def route(self, event: Named, terminal: bool) -> tuple[T | None, list[T]]:
        """The attempt `event` belongs to (None with nothing in flight), and the attempts it
        shows superseded (to end now; never the matched one)."""
        self._tick += 1
        slot = self._match(event)
        if slot is None:
            return None, []
        superseded: list[_Slot[T]] = []
        if event.response_id is not None and slot.response_id is None:
            self._bind(slot, event.response_id)
            superseded = [
                s
                for s in self._slots
                if s.response_id is not None and s is not slot and s.response_id == slot.echo.previous_response_id
            ]
        if event.item_id is not None:
            self._by_item.setdefault(event.item_id, slot)
        if event.seq is not None:
            slot.next_seq = event.seq + 1
        if slot.bound_at is not None and any(
            s.bound_at is not None and s.bound_at > slot.bound_at for s in self._slots
        ):
            self.interleaved = True
        self._current = slot
        if terminal and not self.interleaved and slot.bound_at is not None:
            superseded += [
                s for s in self._slots if s not in superseded and s.bound_at is not None and s.bound_at < slot.bound_at
            ]
        return slot.attempt, [s.attempt for s in superseded]

    def _bind(self, slot: _Slot[T], response_id: str) -> None:
        slot.response_id = response_id
        slot.bound_at = self._tick
        self._by_response[response_id] = slot

    def _match(self, event: Named) -> _Slot[T] | None:
        if not self._slots:
            return None
        live = self._slots
        if event.response_id is not None:
            known = self._by_response.get(event.response_id)
            if known is not None:
                return known if known in live else None
            return self._unanswered(event.echo)  # None: a response no create here asked for
        if event.item_id is not None:
            known = self._by_item.get(event.item_id)
            if known is not None and known in live:
                return known
        if event.event_id is not None:
            found = next((s for s in live if s.echo.event_id == event.event_id), None)
            if found is not None:
                return found
        if event.type == "error" and event.response_id is None:
            fresh = self._unanswered(None)
            if fresh is not None:
                return fresh
        current = self._current if self._current in live else None
        if event.seq is not None:
            due = [s for s in live if s.response_id is not None and s.next_seq == event.seq]
            if due:
                return current if current in due else due[0]
        return current or live[0]

    def _unanswered(self, echo: Echo | None) -> _Slot[T] | None:
        """The oldest create not answered yet whose fields the response echoes (FIFO where it
        echoes nothing that tells them apart)."""
        fresh = [s for s in self._slots if s.response_id is None]
        if echo is not None and echo.previous_response_id is not None:
            fresh = [s for s in fresh if s.echo.previous_response_id == echo.previous_response_id] or fresh
        if echo is not None and echo.metadata is not None:
            fresh = [s for s in fresh if s.echo.metadata == echo.metadata] or fresh
        return fresh[0] if fresh else None
