"""The connection `BatchingRedis` writes its exchanges on (issue 27 §4): an asyncio protocol, so an
exchange is written in the loop turn it leaves (no task, no stream reader, no timer of its own)
and its callers are answered from `data_received`, as its replies arrive (no task woken between).

Exchanges are pipelined on the one connection: Redis answers a connection's commands in order, so
the replies arriving are the oldest exchange's, then the next one's; no exchange waits for
another's round trip before it is written. Replies are parsed in one pass (`shared/fleet/resp.py`)
once every reply of the oldest exchange is in.

Bounds (`BatchingRedis` states them): an exchange waits at most until its deadline (one timer, for
the oldest); a deadline passed fails every exchange on the connection (`TimeoutError`: their
outcome unknown, as a timed-out redis-py call's) and drops it, since a late reply would answer the
wrong caller. A connection that closes before an exchange's replies are all read (a restarted
server) gives it back to its owner to send once more on a fresh one (redis-py's one retry on a
connection error); so does an error reply redis-py raises as a `ConnectionError` (`LOADING`). A
reply that breaks the protocol, or one nobody asked for, fails every exchange on the connection.
A fresh connection's handshake (`AUTH`, `SELECT`: `LineTarget.handshake`) goes first, pipelined
with the exchanges that waited for it; a refused one fails them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import redis

from shared.fleet import resp


class Exchange:
    """Commands written together: their packed bytes, their callers, their deadline."""

    __slots__ = ("batch", "data", "count", "deadline", "sends")

    def __init__(self, batch: list[Any] | None, data: bytes, count: int, deadline: float) -> None:
        self.batch = batch  # None: a fresh connection's handshake
        self.data = data
        self.count = count
        self.deadline = deadline
        self.sends = 0


Answer = Callable[[Exchange, list[Any]], None]
Fail = Callable[[Exchange, BaseException, bool], None]  # (exchange, error, may it be sent again)


class BatchWire(asyncio.Protocol):
    """One connection; `answer` gets each exchange's replies, `fail` each exchange it cannot."""

    def __init__(self, answer: Answer, fail: Fail) -> None:
        self.loop = asyncio.get_running_loop()
        self.answer = answer
        self.on_fail = fail
        self.transport: asyncio.Transport | None = None
        self.pending: deque[Exchange] = deque()
        self.buffer = b""
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False

    @property
    def ready(self) -> bool:
        return not self.closed and self.transport is not None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, exchange: Exchange) -> None:
        assert self.transport is not None
        exchange.sends += 1
        self.pending.append(exchange)
        self.transport.write(exchange.data)
        if self.timer is None:
            self.timer = self.loop.call_at(self.pending[0].deadline, self._check)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        pos = 0
        try:
            while self.pending:
                exchange = self.pending[0]
                try:
                    replies, pos = resp.parse(buffer, exchange.count, pos)
                except resp.Incomplete:
                    break
                self.pending.popleft()
                if exchange.batch is None:
                    _handshaken(replies)
                else:
                    self.answer(exchange, replies)
            if pos < len(buffer) and not self.pending:
                raise redis.InvalidResponse("Protocol Error: more replies than commands")
        except redis.ConnectionError as exc:  # `LOADING` and the like: as a broken connection
            self.fail(exc, again=True)
            return
        except redis.RedisError as exc:
            self.fail(exc, again=False)
            return
        self.buffer = buffer[pos:]

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(redis.ConnectionError("Connection closed by server."), again=True)

    def _check(self) -> None:
        self.timer = None
        if not self.pending:
            return
        deadline = self.pending[0].deadline
        if self.loop.time() < deadline:
            self.timer = self.loop.call_at(deadline, self._check)
            return
        self.fail(TimeoutError("Timeout reading from Redis"), again=False)

    def fail(self, exc: BaseException, *, again: bool) -> None:
        """Drop the connection; each exchange still on it goes to `fail` (`again`: it may be sent
        once more, on a fresh connection)."""
        if self.closed:
            return
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.abort()
        pending, self.pending = self.pending, deque()
        for exchange in pending:
            if exchange.batch is not None:
                self.on_fail(exchange, exc, again)


def _handshaken(replies: list[Any]) -> None:
    for reply in replies:
        if isinstance(reply, redis.ResponseError):
            raise redis.AuthenticationError(f"handshake refused: {str(reply)[:200]}")
