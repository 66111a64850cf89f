"""Redis commands queued at the call, answered by a future (issue 27 §4): a fleet backend's method
on the mint's and the revoke's path (a slot's reserve and release, the live claim, the staged
decision, the key's end, the reads) hands its caller an awaitable without a coroutine, so the
caller's `asyncio.gather` starts no task for it (a task per concurrent backend call was ~15 µs of
CPU each here, 13 per mint + revoke), and its command is in the exchange before the call returns.

Rule: `soon(client, what, then, *command)` and `soon_script(script, what, then, keys, args)`
queue on a `BatchingRedis` that writes on its line (`BatchingRedis.queue`), and the reply is
answered from the connection's `data_received` (`Soon.answer`): through `then`, or, an error reply
or the exchange's failure, as `guard(what)` makes it (`StateUnavailable`); a script's `NOSCRIPT`
loads it and runs it once more, as `BatchedScript` does. On any other client they are a coroutine
doing the same under `guard`. Neither raises at the call: a refusal before anything is queued is
the awaitable's (`failed`), so a gather sees it beside the others (every claim waited for before
any undo: `MintDesk._claim`). What is sent, and when the exchange leaves, is as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from redis.exceptions import NoScriptError

from shared.fleet.batching import BatchedScript, BatchingRedis, settle
from shared.fleet.redis_client import guard, unavailable

T = TypeVar("T")


class Soon:
    """How a command queued by `soon` is answered, from the connection's `data_received` (no
    task woken between): its reply through `then`; an error reply, or the exchange's failure, as
    `guard` makes it (`StateUnavailable` naming `what`); `NOSCRIPT` of a registered script: the
    script loaded and run once more (a task, as redis-py's script does it)."""

    __slots__ = ("what", "then", "script")

    def __init__(self, what: str, then: Callable[[Any], Any], script: BatchedScript | None = None) -> None:
        self.what = what
        self.then = then
        self.script = script

    def answer(self, client: BatchingRedis, args: tuple[Any, ...], future: asyncio.Future[Any], reply: Any) -> None:
        if isinstance(reply, BaseException):
            if isinstance(reply, NoScriptError) and self.script is not None:
                client.keep(asyncio.ensure_future(self._again(args, future)))
                return
            settle(future, unavailable(self.what, reply))
            return
        try:
            answer = self.then(reply)
        except Exception as exc:  # `then` refused the reply (`StateLost`, a reply of another shape)
            answer = exc
        settle(future, answer)

    async def _again(self, args: tuple[Any, ...], future: asyncio.Future[Any]) -> None:
        """The script loaded, and run once more (`BatchedScript`'s own `NOSCRIPT` path)."""
        assert self.script is not None
        try:
            answer = self.then(await self.script.run(args[2], args[3:], self.what))
        except Exception as exc:
            answer = exc
        except BaseException:
            future.cancel()
            raise
        settle(future, answer)


def soon(client: Any, what: str, then: Callable[[Any], T], *args: Any) -> Awaitable[T]:
    """`client.execute_command(*args)` under `guard(what)`, its reply through `then` — queued now
    when `client` is a `BatchingRedis` on its line (a future: no coroutine, and no task when the
    caller gathers it; issue 27 §4), else a coroutine doing just that. Never raises here: any
    failure is the awaitable's. `then` takes the reply as it came (a plain client's response
    callback may have applied)."""
    if isinstance(client, BatchingRedis) and client.queues:
        return client.queue(args, Soon(what, then))
    return _awaited(client, what, then, args)


def soon_script(
    script: Any, what: str, then: Callable[[Any], T], keys: Sequence[Any], args: Sequence[Any]
) -> Awaitable[T]:
    """`soon` for a registered script (`EVALSHA`; `NOSCRIPT`: loaded and run once more)."""
    if isinstance(script, BatchedScript) and script.registered_client.queues:
        client: BatchingRedis = script.registered_client
        queued: asyncio.Future[T] = client.queue(
            ("EVALSHA", script.sha, len(keys), *keys, *args), Soon(what, then, script)
        )
        return queued
    return _awaited_script(script, what, then, keys, args)


async def _awaited(client: Any, what: str, then: Callable[[Any], T], args: tuple[Any, ...]) -> T:
    with guard(what):
        reply = await client.execute_command(*args)
    return then(reply)


async def _awaited_script(
    script: Any, what: str, then: Callable[[Any], T], keys: Sequence[Any], args: Sequence[Any]
) -> T:
    with guard(what):
        reply = await script(keys=keys, args=args)
    return then(reply)


def failed(exc: BaseException) -> asyncio.Future[Any]:
    """An awaitable that fails with `exc` (a `soon` method's refusal before anything is queued:
    never raised at the call, so a caller's gather sees it beside the others)."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_exception(exc)
    return future
