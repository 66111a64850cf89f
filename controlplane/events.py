"""The event hub behind `GET /control/v2/events` (SPEC §11).

Producers call `publish(kind, payload)`; the hub assigns a monotonically increasing id and keeps
the last `REPLAY_SIZE` events for `Last-Event-ID` resumption. (Subscribers and the SSE route are
built on top of this in `http/events.py`.)
"""

from __future__ import annotations

from collections import deque
from typing import Any

import msgspec

REPLAY_SIZE = 1024


class Event(msgspec.Struct, frozen=True):
    id: int
    kind: str
    data: Any


class EventHub:
    def __init__(self, replay_size: int = REPLAY_SIZE) -> None:
        self.replay: deque[Event] = deque(maxlen=replay_size)
        self._next_id = 1

    def publish(self, kind: str, data: Any) -> Event:
        event = Event(self._next_id, kind, data)
        self._next_id += 1
        self.replay.append(event)
        return event
