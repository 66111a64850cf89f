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
once, every reply read in order and parsed in one pass (`shared/fleet/resp.py`), then each
command's response callback applied, as redis-py's `parse_response` would.

The exchange is written on this client's line (`shared/fleet/batchwire.py`): one connection of
its own, an asyncio protocol, made with the pool's own settings (`LineTarget`, TLS, ACL user,
database, RESP version: the handshake redis-py's connection sends). The exchange is written in
the loop turn it leaves, and its callers are answered from the connection's `data_received` as
its replies arrive: no task, stream reader or timer per exchange (issue 27 §4: ~45 µs of CPU
less per 5-command exchange than on redis-py's connection). Exchanges are pipelined on the line:
one never waits for another's round trip before it is written. Each has one deadline, the
client's reply bound (`socket_timeout`) from when it left; a deadline passed fails every
exchange on the line (`TimeoutError`) and drops it. A pool that decodes replies keeps redis-py's
connection and reader for its exchanges (`_send`: its own connection, or a pooled one while that
is busy), as before.

Every caller gets its own reply, or its own error reply (`NoScriptError` included: a registered
script then loads itself and runs again, as it does alone); a failure of the whole exchange (the
deadline, a broken connection: sent once more on a fresh one, as the client's policy retries
once) is every caller's, and leaves the connection closed (it reconnects at its next use).

Nothing changes in what is sent, only how: each script stays one atomic script, the commands of
one exchange run in the order they were queued (concurrent commands had no order before), and
every wait keeps its bound. A caller cancelled before the exchange goes out sends nothing; one
cancelled after it drops its reply. Any other command (a blocking read, a script's load) and
every `pipeline()` go through the plain client, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

import redis
import redis.asyncio as aredis
from redis.client import EMPTY_RESPONSE, NEVER_DECODE
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from shared.fleet import linetarget, resp
from shared.fleet.batchwire import BatchWire, Exchange
from shared.fleet.linetarget import LineTarget, establish
from shared.fleet.redis_client import guard, unavailable

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
_SOON = "_leasehold_soon"  # a queued command's option: answered by its `Answers` (`soon.py`), no callback


class Answers(Protocol):
    """How a command queued by `BatchingRedis.queue` is answered (`shared/fleet/soon.Soon`)."""

    what: str

    def answer(self, client: BatchingRedis, args: tuple[Any, ...], future: asyncio.Future[Any], reply: Any) -> None: ...


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
        self._target = _line_target(pool)  # None: redis-py's connection (`_send`) for every exchange
        self._wire: BatchWire | None = None
        self._opening: list[Exchange] = []  # exchanges waiting for a fresh connection
        self._opener: asyncio.Task[None] | None = None  # opening it

    @property
    def in_flight(self) -> int:
        """Exchanges sent whose replies are not all read yet."""
        wire = 0 if self._wire is None else sum(e.batch is not None for e in self._wire.pending)
        return wire + len(self._opening) + sum(not task.done() for task in self._sending)

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if args[0] not in BATCHED:
            return await self.plain.execute_command(*args, **options)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append((args, options, future))
        if len(self._queue) == 1:
            loop.call_soon(self._turn, self.hops)
        return await future

    def queue(self, args: tuple[Any, ...], soon: Answers) -> asyncio.Future[Any]:
        """`args` queued now, in the caller's own loop turn (no coroutine, no task: `soon`); the
        future answered by `soon` from the reply, as it arrives (`shared/fleet/soon.py`)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append((args, {_SOON: soon}, future))
        if len(self._queue) == 1:
            loop.call_soon(self._turn, self.hops)
        return future

    @property
    def queues(self) -> bool:
        """Whether `queue` may be used: the exchanges go on the line (replies never decoded)."""
        return self._target is not None

    def register_script(self, script: Any) -> BatchedScript:
        return BatchedScript(self, script)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        return self.plain.pipeline(transaction=transaction, shard_hint=shard_hint)

    def _turn(self, hops: int) -> None:
        if hops > 1:
            asyncio.get_running_loop().call_soon(self._turn, hops - 1)
            return
        queued, self._queue = self._queue, []
        live = [entry for entry in queued if not entry[2].done()]  # a cancelled caller sends nothing
        for start in range(0, len(live), self.max_batch):
            batch = live[start : start + self.max_batch]
            if self._target is None:
                task = asyncio.ensure_future(self._send(batch))
                self._sending.add(task)
                task.add_done_callback(self._sent)
                continue
            try:
                data = resp.pack([args for args, _, _ in batch])
            except redis.DataError as exc:
                _fail(batch, exc)
                continue
            self._dispatch(Exchange(batch, data, len(batch), asyncio.get_running_loop().time() + self.timeout_s))

    # ---- the line: exchanges written at once, answered as their replies arrive (`batchwire.py`)

    def _dispatch(self, exchange: Exchange) -> None:
        wire = self._wire
        if wire is not None and wire.ready:
            wire.send(exchange)
            return
        self._opening.append(exchange)
        if self._opener is None:
            self._opener = asyncio.ensure_future(self._open())
            self._opener.add_done_callback(self._opened)

    def _opened(self, task: asyncio.Task[None]) -> None:
        self._opener = None
        if not task.cancelled():
            task.exception()  # a failure was every waiting caller's already; retrieved

    async def _open(self) -> None:
        """A fresh connection (within the connect bound, as `ScriptLine` opens its own), its
        handshake first, then every exchange that waited for it."""
        assert self._target is not None
        wire = BatchWire(self._answered, self._failed)
        try:
            await establish(self._target, wire)
        except BaseException as exc:
            waiting, self._opening = self._opening, []
            wire.fail(exc, again=False)
            failure = (
                exc
                if not isinstance(exc, (OSError, TimeoutError))
                else redis.ConnectionError(f"Error connecting to Redis: {type(exc).__name__}")
            )
            _fail([entry for exchange in waiting for entry in exchange.batch or ()], failure)
            if not isinstance(exc, Exception):
                raise
            return
        self._wire = wire
        handshake = _handshake(self._target, int(self._own.protocol))
        if handshake:
            deadline = asyncio.get_running_loop().time() + self.timeout_s
            wire.send(Exchange(None, b"".join(handshake), len(handshake), deadline))
        waiting, self._opening = self._opening, []
        for exchange in waiting:
            self._dispatch(exchange)

    def _answered(self, exchange: Exchange, replies: list[Any]) -> None:
        assert exchange.batch is not None
        self.batches += exchange.count > 1
        for (args, options, future), reply in zip(exchange.batch, replies, strict=True):
            if future.done():  # its caller was cancelled: the reply is dropped
                continue
            soon = options.get(_SOON)
            if soon is not None:
                soon.answer(self, args, future, reply)
                continue
            try:
                answer = self._answer(args[0], reply, options)
            except Exception as exc:  # a response callback that refused the reply
                answer = exc
            settle(future, answer)

    def _failed(self, exchange: Exchange, exc: BaseException, again: bool) -> None:
        assert exchange.batch is not None
        if again and exchange.sends < 2 and any(not entry[2].done() for entry in exchange.batch):
            self._dispatch(exchange)  # once more, on a fresh connection (its deadline kept)
        else:
            _fail(exchange.batch, exc)

    def keep(self, task: asyncio.Task[None]) -> None:
        """A task answering queued callers (a script's reload: `Soon`), counted and closed as the rest."""
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
            settle(future, reply)

    async def _exchange(self, conn: Any, batch: list[Queued]) -> list[Any]:
        await conn.send_packed_command(resp.pack([args for args, _, _ in batch]), check_health=False)
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
        waiting, self._opening = self._opening, []
        _fail([entry for exchange in waiting for entry in exchange.batch or ()], asyncio.CancelledError())
        if self._wire is not None:
            self._wire.fail(asyncio.CancelledError(), again=False)
        if self._opener is not None:
            self._opener.cancel()
            await asyncio.gather(self._opener, return_exceptions=True)
        sending = list(self._sending)
        for task in sending:
            task.cancel()
        await asyncio.gather(*sending, return_exceptions=True)
        await self._own.disconnect()


class BatchedScript(AsyncScript):  # type: ignore[misc,unused-ignore]
    """A script registered with a `BatchingRedis`: redis-py's `AsyncScript`, called on its
    client without the pipeline check redis-py makes on every call (an `isinstance` against a
    `typing` protocol: ~4 µs a call here, seven calls per mint + revoke). `EVALSHA`; on
    `NOSCRIPT` loaded and run once more, as redis-py's. Called with `client=` (a pipeline):
    redis-py's own call."""

    sha: str

    async def run(self, count: int, keys_and_args: Sequence[Any], what: str) -> Any:
        """Loaded, then run (a queued call's `NOSCRIPT`: `Soon`), under `guard(what)`."""
        target = self.registered_client
        with guard(what):
            self.sha = await target.script_load(self.script)
            return await target.execute_command("EVALSHA", self.sha, count, *keys_and_args)

    async def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        if client is not None:
            return await super().__call__(keys, args, client)
        keys = keys or ()
        args = args or ()
        target = self.registered_client
        try:
            return await target.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            self.sha = await target.script_load(self.script)
            return await target.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)


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


def _fail(batch: list[Queued], exc: BaseException) -> None:
    """Every caller of `batch` fails with `exc` (a cancelled exchange: every caller cancelled;
    a `soon` caller's failure is `StateUnavailable`, as `guard` makes it)."""
    for _, options, future in batch:
        if isinstance(exc, Exception):
            soon = options.get(_SOON)
            settle(future, exc if soon is None else unavailable(soon.what, exc))
        elif not future.done():
            future.cancel()


def settle(future: asyncio.Future[Any], reply: Any) -> None:
    if future.done():  # its caller was cancelled: the reply is dropped
        return
    if isinstance(reply, BaseException):
        future.set_exception(reply)
    else:
        future.set_result(reply)


def _line_target(pool: Any) -> LineTarget | None:
    """Where the line connects: the pool's own settings, when the line can speak as its
    connections do (replies not decoded); else None (redis-py's connection)."""
    kwargs = dict(pool.connection_kwargs)
    if kwargs.get("decode_responses"):
        return None
    try:
        return LineTarget.of(pool.connection_class.__name__, kwargs)
    except ValueError:
        return None


def _handshake(target: LineTarget, protocol: int) -> list[bytes]:
    """What a fresh line sends first, as redis-py's connection of `protocol` does: RESP3's `HELLO 3`
    (with the ACL user and password), else `AUTH`; then `SELECT` of a database other than 0."""
    if protocol != 3:
        return target.handshake()
    auth = [] if target.password is None else ["AUTH", target.username or "default", target.password]
    return [linetarget.pack(["HELLO", 3, *auth]), *([linetarget.pack(["SELECT", target.db])] if target.db else [])]
