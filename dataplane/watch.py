"""One timer per upstream exchange for both of its timeouts (SPEC §12).

`GATEWAY_UPSTREAM_HEADERS_TIMEOUT` bounds the wait for the answer's headers;
`GATEWAY_UPSTREAM_IDLE_TIMEOUT` bounds each silence between two chunks of its body. Neither
needs a timer per request step or per chunk: the watch arms one timer, at the earliest moment
either could run out, and on firing checks whether one has — if not, it re-arms for the next
such moment. A short exchange costs one `call_at` and one cancel.

- Headers phase: when the deadline has passed, the exchanging task is cancelled (as
  `asyncio.timeout` does it) and `expired` is set; `Relay._exchange` turns that cancellation into
  the headers timeout, and any other cancellation (the worker went away) stays one.
- Body phase (`body(content)`): the pump notes when its current read began (`reading_since`,
  None while it writes to the worker); a read idle for the timeout fails the upstream stream
  with `IdleTimeout`, which the pending read raises.
- The worker's side (`GATEWAY_CLIENT_STALL_SECONDS`, SPEC §19): the pump notes when its
  current write began (`writing_since`); a write the worker has not accepted (the transport
  stays paused) for the stall bound calls `on_stall`, which aborts the worker's connection:
  the attempt ends `client-aborted`, the upstream request is cancelled, the slot released.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

import aiohttp


class IdleTimeout(Exception):
    """The upstream sent nothing for the idle timeout while the relay was waiting on it."""


class ExchangeWatch:
    __slots__ = (
        "loop",
        "task",
        "cancelling",
        "headers_deadline",
        "idle_s",
        "content",
        "reading_since",
        "handle",
        "expired",
        "stall_s",
        "writing_since",
        "on_stall",
        "clocked",
    )

    # A timer may fire this much before its deadline (the loop's clock granularity).
    SLACK_S = 0.002

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        headers_s: float,
        idle_s: float,
        stall_s: float = float("inf"),
        clock: WatchClock | None = None,
        task: asyncio.Task | None = None,
    ) -> None:
        # `task`: the task that runs the exchange, when the caller holds it already (the relay:
        # the attempt's own; `asyncio.current_task()` is ~1.5k instructions, issue 27)
        task = task if task is not None else asyncio.current_task()
        assert task is not None
        self.loop = loop
        self.task = task
        self.cancelling = task.cancelling()
        now = loop.time()
        self.headers_deadline = now + headers_s
        self.idle_s = idle_s
        self.content: aiohttp.StreamReader | None = None  # set when the headers are in
        self.reading_since: float | None = None
        self.stall_s = stall_s
        self.writing_since: float | None = None
        self.on_stall: Callable[[], None] | None = None
        self.expired = False
        # Checked first at the earliest any bound could run out (the stall's too, so `body` need
        # not re-arm it). With a `clock` (the relay's), that first check is the clock's: no timer
        # of its own per short exchange (issue 27); else one `call_at` and one cancel.
        # (`min()` of three floats is ~1.5k instructions on 3.11: it parses keywords; issue 27)
        first = headers_s if headers_s < idle_s else idle_s
        due = now + (first if first < stall_s else stall_s)
        self.handle: asyncio.TimerHandle | None = None
        self.clocked = clock is not None and clock.add(self, due)  # its clock checks it first
        if not self.clocked:
            self.handle = loop.call_at(due, self._check)

    def body(self, content: aiohttp.StreamReader, on_stall: Callable[[], None] | None = None) -> None:
        """The headers are in: from now on the watch guards the body's silences (and, with
        `on_stall`, the worker's). The timer already runs at the stall's pace (`__init__`)."""
        self.content = content
        self.on_stall = on_stall

    def timed_out(self) -> bool:
        """After a CancelledError in the headers phase: was it this watch's? (then uncancelled)"""
        return self.expired and self.task.uncancel() <= self.cancelling

    def _check(self) -> None:
        now = self.loop.time()
        content = self.content
        if content is None:
            if now >= self.headers_deadline - self.SLACK_S:
                self.handle = None
                self.expired = True
                self.task.cancel()
                return
            # at the body's pace too: the body may begin before the headers deadline
            self.handle = self.loop.call_at(
                min(self.headers_deadline, now + min(self.idle_s, self.stall_s)), self._check
            )
            return
        since = self.reading_since
        if since is not None and now - since >= self.idle_s - self.SLACK_S:
            self.handle = None
            content.set_exception(IdleTimeout())
            return
        if self.on_stall is None:
            self.handle = self.loop.call_at((now if since is None else since) + self.idle_s, self._check)
            return
        writing = self.writing_since
        if since is None and writing is not None:
            if now - writing >= self.stall_s - self.SLACK_S:
                self.handle = None
                self.on_stall()
                return
            self.handle = self.loop.call_at(writing + self.stall_s, self._check)
            return
        # reading: the idle deadline, or sooner, to see a write that starts and stalls
        self.handle = self.loop.call_at(min(now + self.stall_s, (since or now) + self.idle_s), self._check)

    def stop(self) -> None:
        self.clocked = False
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        # a clock may hold this watch until its first due: it keeps nothing of the exchange
        self.content = None
        self.on_stall = None


# A clock's queue is compacted (stopped watches dropped) once it is this long, then at twice
# the live watches it kept: held watches stay bounded under any mix of short and long exchanges.
COMPACT_AT = 1024


class WatchClock:
    """One timer for the first check of every exchange of a loop (issue 27): exchanges begin in
    order and share one relay's bounds, so their first dues come in order; the clock keeps
    them in a queue and its one timer runs at the earliest live one's due. A watch stopped
    before then (every short exchange) costs an append; one still live at its due gets its
    `_check` there, which arms the watch's own timer from then on. A due earlier than the last
    queued one (other bounds) is refused: that watch arms its own timer at once."""

    __slots__ = ("loop", "queue", "handle", "compact_at")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: collections.deque[tuple[float, ExchangeWatch]] = collections.deque()
        self.handle: asyncio.TimerHandle | None = None
        self.compact_at = COMPACT_AT

    def add(self, watch: ExchangeWatch, due: float) -> bool:
        queue = self.queue
        if queue and due < queue[-1][0]:
            return False
        while queue and not queue[0][1].clocked:
            queue.popleft()  # stopped (or checked) already
        if len(queue) >= self.compact_at:
            self.queue = queue = collections.deque(entry for entry in queue if entry[1].clocked)
            self.compact_at = max(COMPACT_AT, 2 * len(queue))
        queue.append((due, watch))
        if self.handle is None:
            self.handle = self.loop.call_at(queue[0][0], self._fire)
        return True

    def _fire(self) -> None:
        self.handle = None
        queue = self.queue
        limit = self.loop.time() + ExchangeWatch.SLACK_S
        while queue and (not queue[0][1].clocked or queue[0][0] <= limit):
            _, watch = queue.popleft()
            if watch.clocked:
                watch.clocked = False
                watch._check()
        if queue:
            self.handle = self.loop.call_at(queue[0][0], self._fire)

    def stop(self) -> None:
        """The relay's loop is going away: no timer left behind (live watches keep none)."""
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.queue.clear()
