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
    )

    # A timer may fire this much before its deadline (the loop's clock granularity).
    SLACK_S = 0.002

    def __init__(
        self, loop: asyncio.AbstractEventLoop, headers_s: float, idle_s: float, stall_s: float = float("inf")
    ) -> None:
        task = asyncio.current_task()
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
        # Armed once, at the earliest any bound could run out (the stall's too, so `body` need
        # not re-arm it: one `call_at` and one cancel per short exchange, issue 27).
        self.handle: asyncio.TimerHandle | None = loop.call_at(now + min(headers_s, idle_s, stall_s), self._check)

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
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
