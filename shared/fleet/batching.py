"""`BatchingRedis`: an asyncio client whose commands awaited at the same moment go to Redis as one
exchange (issue 27: a fleet mint + revoke's Redis commands, from outside).

Why: through redis-py's asyncio client each command costs its caller ~200 µs of CPU on this
machine (a pooled connection taken and given back, a task per write and a timer per reply, a
wakeup, a parse), and a mint's commands are sent by concurrent tasks of several backends (the
dispatch's live keys, both chains' versions, every candidate's circuit and lease count; then the
three claims, the decision's record, the revoke's two ends).

Rule: a command of `BATCHED` is queued, not sent; `HOPS` loop turns after the first one queued
(so the concurrent tasks of one `asyncio.gather`, and those they start in turn, queue theirs
too) the queue goes out as one exchange, at most `MAX_BATCH` commands: every command written at
once, every reply read in order (off the connection's stream and parsed in one pass,
`shared/fleet/resp.py`, then each command's response callback, as redis-py would: ~30 µs less
per reply than its reader on this machine; a decoding client keeps redis-py's reader). The
exchange runs on this client's own connection (made as the
pool makes its connections, but kept: no pool round per exchange) under one deadline, the
client's reply bound (`socket_timeout`), instead of a timer per write and per reply; while that
connection is busy, an exchange takes one from the pool, so concurrent exchanges never wait on
each other. Every caller gets its own reply, or its own error reply (`NoScriptError` included:
a registered script then loads itself and runs again, as it does alone); a failure of the whole
exchange (the deadline, a broken connection: retried once, as the client's policy says) is
every caller's, and leaves the connection closed (it reconnects at its next use).

Nothing changes in what is sent, only how: each script stays one atomic script, the commands of
one exchange run in the order they were queued (concurrent commands had no order before), and
every wait keeps its bound. A caller cancelled before the exchange goes out sends nothing; one
cancelled after it drops its reply. Any other command (a blocking read, a script's load) and
every `pipeline()` go through the plain client, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aredis
from redis.client import EMPTY_RESPONSE, NEVER_DECODE

from shared.fleet import resp

# Commands a backend awaits on the mint's and the revoke's path, and the spend's publish and pulls
# (none of them blocks on the server).
BATCHED = frozenset(
    {"EVALSHA", "GET", "SET", "DEL", "SMEMBERS", "HLEN", "HEXISTS", "MGET", "LRANGE", "HGETALL", "HMGET"}
)
HOPS = 2  # loop turns a batch waits for the rest of its moment (a mint's nested reads need 2)
MAX_BATCH = 64  # commands per exchange; more go in the next one, at once
READ_SIZE = 65_536  # bytes per read of an exchange's replies
DEFAULT_TIMEOUT_S = 1.0  # the exchange's deadline when the pool's connections have no reply bound

Queued = tuple[tuple[Any, ...], dict[str, Any], "asyncio.Future[Any]"]  # a command, its options, its caller


class BatchingRedis(aredis.Redis):  # type: ignore[misc,unused-ignore]  # untyped under --strict
    """A client over `client`'s pool whose `BATCHED` commands are sent per moment, together."""

    def __init__(self, client: aredis.Redis, *, hops: int = HOPS, max_batch: int = MAX_BATCH) -> None:
        super().__init__(connection_pool=client.connection_pool)
        self.plain = client
        self.hops = hops
        self.max_batch = max_batch
        pool = client.connection_pool
        self.timeout_s: float = pool.connection_kwargs.get("socket_timeout") or DEFAULT_TIMEOUT_S
        # Its own connection: no reply timer of its own (the exchange's deadline bounds it)
        self._own = pool.connection_class(**{**pool.connection_kwargs, "socket_timeout": None})
        self._own_busy = False
        self._queue: list[Queued] = []
        self._sending: set[asyncio.Task[None]] = set()
        self.batches = 0  # exchanges of more than one command (tests and bench count them)

    @property
    def in_flight(self) -> int:
        """Exchanges sent whose replies are not all read yet."""
        return sum(not task.done() for task in self._sending)

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if args[0] not in BATCHED:
            return await self.plain.execute_command(*args, **options)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append((args, options, future))
        if len(self._queue) == 1:
            loop.call_soon(self._turn, self.hops)
        return await future

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        return self.plain.pipeline(transaction=transaction, shard_hint=shard_hint)

    def _turn(self, hops: int) -> None:
        if hops > 1:
            asyncio.get_running_loop().call_soon(self._turn, hops - 1)
            return
        queued, self._queue = self._queue, []
        live = [entry for entry in queued if not entry[2].done()]  # a cancelled caller sends nothing
        for start in range(0, len(live), self.max_batch):
            task = asyncio.ensure_future(self._send(live[start : start + self.max_batch]))
            self._sending.add(task)
            task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        if not task.cancelled():
            task.exception()  # a failure was every caller's already; retrieved, not logged again

    async def _send(self, batch: list[Queued]) -> None:
        """One exchange, on the own connection when it is free, else on a pooled one."""
        own = not self._own_busy
        self._own_busy = self._own_busy or own
        conn = self._own if own else None
        try:
            async with asyncio.timeout(self.timeout_s):
                if conn is None:
                    conn = await self.connection_pool.get_connection()
                replies = await conn.retry.call_with_retry(
                    lambda: self._exchange(conn, batch), lambda _error: conn.disconnect()
                )
        except BaseException as exc:  # the whole exchange failed: every caller's failure
            _fail(batch, exc)
            if conn is not None:
                await conn.disconnect()  # replies may be left unread: never reused as it is
            raise
        finally:
            if own:
                self._own_busy = False
            elif conn is not None:
                await self.connection_pool.release(conn)
        self.batches += len(batch) > 1
        for (_, _, future), reply in zip(batch, replies, strict=True):
            _settle(future, reply)

    async def _exchange(self, conn: Any, batch: list[Queued]) -> list[Any]:
        await conn.send_packed_command(pack([args for args, _, _ in batch]), check_health=False)
        reader = getattr(conn, "_reader", None)
        if isinstance(reader, asyncio.StreamReader) and not conn.encoder.decode_responses:
            return [
                self._answer(args[0], reply, options)
                for (args, options, _), reply in zip(batch, await _read(reader, len(batch)), strict=True)
            ]
        replies: list[Any] = []  # a decoding client: redis-py's reader, one reply at a time
        for args, options, _ in batch:
            try:
                replies.append(await self.parse_response(conn, args[0], **options))
            except redis.ResponseError as exc:  # an error reply: its caller's alone, the connection in step
                replies.append(exc)
        return replies

    def _answer(self, command: str, reply: Any, options: dict[str, Any]) -> Any:
        """What `parse_response` makes of a parsed reply: an error reply is its caller's alone
        (or the command's stated empty answer); otherwise the command's response callback."""
        if isinstance(reply, redis.ResponseError):
            return options[EMPTY_RESPONSE] if EMPTY_RESPONSE in options else reply
        callback = self.response_callbacks.get(command)
        if callback is None:
            return reply
        extra = {k: v for k, v in options.items() if k not in (EMPTY_RESPONSE, NEVER_DECODE, "keys")}
        return callback(reply, **extra)

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Callers still waiting are cancelled; the own connection is closed (the pool is the
        plain client's, closed with it)."""
        for _, _, future in self._queue:
            future.cancel()
        self._queue = []
        sending = list(self._sending)
        for task in sending:
            task.cancel()
        await asyncio.gather(*sending, return_exceptions=True)
        await self._own.disconnect()


async def _read(reader: asyncio.StreamReader, count: int) -> list[Any]:
    """`count` replies read off `reader` (one read when they arrived together, as they do),
    parsed in one pass (`resp.parse`). A closed connection is redis-py's `ConnectionError`."""
    data = b""
    while True:
        try:
            chunk = await reader.read(READ_SIZE)
        except OSError as exc:
            raise redis.ConnectionError(f"Error while reading from Redis: {exc}") from exc
        if not chunk:
            raise redis.ConnectionError("Connection closed by server.")
        data += chunk
        try:
            replies, end = resp.parse(data, count)
        except resp.Incomplete:
            continue
        if end != len(data):  # bytes nobody asked for: the connection is out of step
            raise redis.InvalidResponse("Protocol Error: more replies than commands")
        return replies


def pack(commands: Sequence[Sequence[object]]) -> bytes:
    """The RESP encoding of `commands`, byte for byte what redis-py's `pack_command` writes for
    single-word commands (those of `BATCHED`), in one pass (tested against it): bytes as they
    are, str as UTF-8, int and float by `repr`; anything else (a bool, None) is refused as
    redis-py refuses it, `DataError`, and nothing of the batch is sent."""
    out = []
    for args in commands:
        out.append(b"*%d\r\n" % len(args))
        for arg in args:
            if isinstance(arg, bytes):
                data = arg
            elif isinstance(arg, str):
                data = arg.encode()
            elif isinstance(arg, (int, float)) and not isinstance(arg, bool):
                data = repr(arg).encode()
            elif isinstance(arg, (bytearray, memoryview)):
                data = bytes(arg)
            else:
                raise redis.DataError(
                    f"Invalid input of type: '{type(arg).__name__}'. Convert to a bytes, string, int or float first."
                )
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _fail(batch: list[Queued], exc: BaseException) -> None:
    """Every caller of `batch` fails with `exc` (a cancelled exchange: every caller cancelled)."""
    for _, _, future in batch:
        if isinstance(exc, Exception):
            _settle(future, exc)
        elif not future.done():
            future.cancel()


def _settle(future: asyncio.Future[Any], reply: Any) -> None:
    if future.done():  # its caller was cancelled: the reply is dropped
        return
    if isinstance(reply, BaseException):
        future.set_exception(reply)
    else:
        future.set_result(reply)
