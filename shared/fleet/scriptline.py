"""`ScriptLine`: one dedicated, pipelined Redis connection for the data plane's hot scripts
(issue 27): a ceilinged request's reserve (its owed releases riding along) and the window's
release. Every other Redis call keeps going through redis-py's pooled client.

Why: through redis-py's pool a script's round trip cost ~2-3x the bare socket's on loopback (the
pool's lock and checkout, its per-command observability, the retry wrapper, a pure-Python
parser), ~0.25 ms more per request at rest and ~0.8 ms more after an idle gap on a busy host
(bench/README, "Stop 30"). Here a call is one `write` of the packed command and one future,
resolved in order by the connection's own reader; concurrent calls share the connection
(Redis answers in order), so no call waits for another's round trip.

The same bounds and the same failure vocabulary as `shared/fleet/redis_client.py`:
- a reply waits at most `timeout_s`: a timeout fails every call still waiting on the connection
  (`StateUnavailable`; their outcome is unknown, as a timed-out redis-py call's) and drops the
  connection (a late reply would answer the wrong call); never retried;
- a connection opens within `connect_timeout_s` (an open that timed out sent nothing: it is
  tried once more), with the client's own settings (TLS with its three files, the ACL user and
  password, the database): `LineTarget.of` reads them from the redis-py pool the rest of the
  process uses, so both connect alike;
- a call that finds its connection broken (a restarted server) is sent once more on a fresh one,
  as redis-py's one retry on a connection error; every hot script is idempotent (holder-keyed);
- a script Redis does not know (`NOSCRIPT`: a restart, `SCRIPT FLUSH`) is sent once as `EVAL`;
- an error reply, or a reply that breaks the protocol (strictly parsed, bounded), is
  `StateUnavailable`; the latter also drops the connection.
A cancelled caller's reply is read and dropped, so the connection stays in step.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from shared.capacity import StateUnavailable
from shared.fleet.linetarget import LineTarget, establish, pack

MAX_BULK = 1 << 20  # the longest bulk reply accepted (the hot scripts answer integers)
MAX_ITEMS = 1 << 16  # the longest array reply accepted
MAX_DEPTH = 4  # nested arrays
MAX_LINE = 4096  # the longest header or status line


class ProtocolError(Exception):
    """A reply that is not RESP2 within the bounds above."""


class ErrorReply(msgspec.Struct, frozen=True):
    """An error reply (`-ERR ...`); `message` is its first line."""

    message: str


Reply = int | bytes | None | list[Any] | ErrorReply


def parse(buf: bytes | bytearray, pos: int = 0, depth: int = 0) -> tuple[Reply, int] | None:
    """The reply starting at `pos` and where the next one starts; None when it is incomplete.
    `ProtocolError` on anything that is not a bounded RESP2 reply."""
    end = buf.find(b"\r\n", pos, pos + MAX_LINE + 2)
    if end < 0:
        if len(buf) - pos > MAX_LINE + 1:
            raise ProtocolError("a reply line is too long")
        return None
    kind, line = buf[pos : pos + 1], bytes(buf[pos + 1 : end])
    after = end + 2
    if kind == b"+":
        return line, after
    if kind == b"-":
        return ErrorReply(line.decode(errors="replace")), after
    if kind == b":":
        return _integer(line), after
    if kind == b"$":
        size = _integer(line)
        if size == -1:
            return None, after
        if not 0 <= size <= MAX_BULK:
            raise ProtocolError(f"a bulk reply of {size} bytes")
        if len(buf) < after + size + 2:
            return None
        if buf[after + size : after + size + 2] != b"\r\n":
            raise ProtocolError("a bulk reply not ended by CRLF")
        return bytes(buf[after : after + size]), after + size + 2
    if kind == b"*":
        return _array(buf, _integer(line), after, depth)
    raise ProtocolError(f"an unknown reply type {kind!r}")


def _array(buf: bytes | bytearray, count: int, pos: int, depth: int) -> tuple[Reply, int] | None:
    if count == -1:
        return None, pos
    if not 0 <= count <= MAX_ITEMS or depth >= MAX_DEPTH:
        raise ProtocolError(f"an array reply of {count} items at depth {depth}")
    items: list[Any] = []
    for _ in range(count):
        got = parse(buf, pos, depth + 1)
        if got is None:
            return None
        item, pos = got
        items.append(item)
    return items, pos


def _integer(line: bytes) -> int:
    digits = line[1:] if line[:1] == b"-" else line
    if not digits.isdigit() or len(digits) > 19:
        raise ProtocolError("a malformed integer")
    return int(line)


class Script(Protocol):
    """What a registered redis-py script gives: its SHA1 and its text."""

    sha: str
    script: str | bytes


class _Broken(Exception):
    """The connection closed before the reply: the call may be sent again."""


class _Wire(asyncio.Protocol):
    """One connection: each reply resolves the oldest waiting call; one timer watches the oldest."""

    def __init__(self, timeout_s: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.timeout_s = timeout_s
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[tuple[float, asyncio.Future[Reply]]] = deque()
        self.buffer = bytearray()
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, command: bytes) -> asyncio.Future[Reply]:
        if self.closed or self.transport is None:
            raise _Broken()
        future: asyncio.Future[Reply] = self.loop.create_future()
        self.waiting.append((self.loop.time() + self.timeout_s, future))
        self.transport.write(command)
        if self.timer is None:
            self.timer = self.loop.call_at(self.waiting[0][0], self._check)
        return future

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        pos = 0
        try:
            while buffer:
                got = parse(buffer, pos)
                if got is None:
                    break
                if not self.waiting:
                    raise ProtocolError("a reply no call waits for")
                reply, pos = got
                future = self.waiting.popleft()[1]
                if not future.done():  # a cancelled caller's reply is dropped, in step
                    future.set_result(reply)
                if pos == len(buffer):
                    break
        except ProtocolError as exc:
            self.fail(StateUnavailable(f"script line: ProtocolError {exc}"))
            return
        del buffer[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(_Broken())

    def _check(self) -> None:
        self.timer = None
        if not self.waiting:
            return
        deadline = self.waiting[0][0]
        if self.loop.time() < deadline:
            self.timer = self.loop.call_at(deadline, self._check)
            return
        self.fail(StateUnavailable(f"script line: TimeoutError no reply within {self.timeout_s} s"))

    def fail(self, exc: Exception) -> None:
        """Drop the connection; every call still waiting on it fails with `exc`."""
        if self.closed:
            return
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.abort()
        waiting, self.waiting = self.waiting, deque()
        for _deadline, future in waiting:
            if not future.done():
                future.set_exception(exc)


class ScriptLine:
    """The dedicated connection (opened on first use, reopened after a failure)."""

    def __init__(self, target: LineTarget) -> None:
        self.target = target
        self.closed = False
        self._wire: _Wire | None = None
        self._opening: asyncio.Task[_Wire] | None = None

    @classmethod
    def of(cls, client: Any) -> ScriptLine:
        """A line connecting as `client` (a redis-py asyncio client) does."""
        pool = client.connection_pool
        return cls(LineTarget.of(pool.connection_class.__name__, dict(pool.connection_kwargs)))

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[str | int]) -> Reply:
        """`EVALSHA` (`EVAL` once when Redis lost the script); an error reply is `StateUnavailable`."""
        return await self.send(script, keys, args).reply()

    def send(self, script: Script, keys: Sequence[str], args: Sequence[str | int]) -> Sent:
        """Write the script's `EVALSHA` now, when the connection is open, and answer its handle:
        `Sent.reply` reads the reply later with every bound of `run` (issue 27: a reserve's round
        trip overlapped with the upstream request's preparation). No task per call; a connection
        still to open is opened then (its opening started now)."""
        tail = [len(keys), *keys, *args]
        command = pack(["EVALSHA", script.sha, *tail])
        wire = self._wire
        future: asyncio.Future[Reply] | None = None
        if wire is not None and not wire.closed:
            future = wire.send(command)  # (an open wire's `send` raises nothing)
        elif not self.closed and self._opening is None:
            self._start_opening()
        return Sent(self, script, tail, command, future)

    async def _call(self, command: bytes, attempts: tuple[int, ...] = (1, 2)) -> Reply:
        for attempt in attempts:
            wire = self._wire
            if wire is None or wire.closed:
                wire = await self._open()
            try:
                return await wire.send(command)
            except _Broken:
                if attempt == 2:
                    break
        raise StateUnavailable("script line: ConnectionError the connection closed before the reply")

    async def _open(self) -> _Wire:
        if self.closed:
            raise StateUnavailable("script line: closed")
        opening = self._opening or self._start_opening()
        return await asyncio.shield(opening)

    def _start_opening(self) -> asyncio.Task[_Wire]:
        opening = self._opening = asyncio.get_running_loop().create_task(self._connect())
        opening.add_done_callback(self._opened)
        return opening

    def _opened(self, task: asyncio.Task[_Wire]) -> None:
        self._opening = None
        # (an exception is its callers'; one nobody awaited, `send`'s, is read here: no warning)
        if not task.cancelled() and task.exception() is None:
            self._wire = task.result()
            if self.closed:  # closed while it opened
                self._wire.fail(StateUnavailable("script line: closed"))

    async def _connect(self) -> _Wire:
        target = self.target
        wire = _Wire(target.timeout_s)
        try:
            try:
                await self._establish(wire)
            except TimeoutError:  # an open that timed out sent nothing: tried once more
                wire.fail(_Broken())
                wire = _Wire(target.timeout_s)
                await self._establish(wire)
            for command in target.handshake():
                reply = await wire.send(command)
                if isinstance(reply, ErrorReply):
                    raise StateUnavailable(f"script line: handshake refused: {reply.message[:200]}")
        except (OSError, TimeoutError, _Broken) as exc:  # ssl.SSLError is an OSError
            wire.fail(_Broken())
            raise StateUnavailable(f"script line: connect {type(exc).__name__}") from exc
        except BaseException:
            wire.fail(_Broken())
            raise
        return wire

    async def _establish(self, wire: _Wire) -> None:
        await establish(self.target, wire)

    def close(self) -> None:
        """Close the connection (calls still waiting fail `StateUnavailable`); no reopening."""
        self.closed = True
        if self._opening is not None:
            self._opening.cancel()
        if self._wire is not None:
            self._wire.fail(StateUnavailable("script line: closed"))


class Sent:
    """A script written on the line (`ScriptLine.send`), its reply still to read."""

    __slots__ = ("line", "script", "tail", "command", "future")

    def __init__(
        self, line: ScriptLine, script: Script, tail: list[Any], command: bytes, future: asyncio.Future[Reply] | None
    ) -> None:
        self.line = line
        self.script = script
        self.tail = tail
        self.command = command
        self.future = future  # None: not written yet (the connection was not open)

    async def reply(self) -> Reply:
        """The reply, with `run`'s bounds: the timeout counted from the write, one resend on a
        broken connection, `NOSCRIPT` answered by one `EVAL`; an error reply is `StateUnavailable`."""
        line, future = self.line, self.future
        if future is None:
            reply = await line._call(self.command)
        else:
            self.future = None
            try:
                reply = await future
            except _Broken:  # the connection closed before the reply: sent once more
                reply = await line._call(self.command, (2,))
        if isinstance(reply, ErrorReply) and reply.message.startswith("NOSCRIPT"):
            reply = await line._call(pack(["EVAL", self.script.script, *self.tail]))
        if isinstance(reply, ErrorReply):
            raise StateUnavailable(f"script line: ResponseError {reply.message[:200]}")
        return reply

    def cancel(self) -> None:
        """The reply will not be read: it is dropped when it comes (the connection stays in step)."""
        future, self.future = self.future, None
        if future is not None and not future.cancel() and not future.cancelled():
            future.exception()  # already failed: read, so no "never retrieved" warning
