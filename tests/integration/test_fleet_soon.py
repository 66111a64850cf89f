"""`shared/fleet/soon.py` against a real redis-server (issue 27 §4): a fleet backend's command
queued at the call, answered by a future. It is in the exchange before the call returns (a
gather of such calls starts no task), its reply goes through its `then`, and every failure is
what `guard` makes of it — an error reply, a hung server, a refusal before anything is queued
— on a batching client and on a plain one alike; a flushed script loads itself; and a release
`OwedCapacity` cannot land is owed, never lost, as before."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Coroutine, Generator
from pathlib import Path
from typing import Any

import pytest

from controlplane.fleet.owed import OwedCapacity, OwedWrites
from shared.capacity import StateUnavailable
from shared.fleet.batching import BatchingRedis
from shared.fleet.capacity import Incarnation, RedisCapacity
from shared.fleet.keys import Ceiling, FleetKeys
from shared.fleet.redis_client import connect
from shared.fleet.soon import soon, soon_script
from tests.support.fleet import Fleet
from tests.support.redis_server import RedisServer

SCRIPT = "return #ARGV"


def tasks_started(loop: asyncio.AbstractEventLoop) -> Counter[str]:
    """Every task the loop starts from now on, by its coroutine's name."""
    started: Counter[str] = Counter()

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any] | Generator[Any, None, Any], **kw: Any
    ) -> asyncio.Task[Any]:
        started[getattr(coro, "__qualname__", "?")] += 1
        return asyncio.Task(coro, loop=loop, **kw)

    loop.set_task_factory(factory)  # type: ignore[arg-type]
    return started


@pytest.fixture
async def batching(fleet: Fleet) -> Any:
    client = BatchingRedis(fleet.client)
    yield client
    await client.aclose()


async def test_queued_at_the_call_answered_through_then_with_no_task(fleet: Fleet, batching: BatchingRedis) -> None:
    key = fleet.keys.prefix + "q"
    fleet.admin().hset(key, mapping={"a": "1", "b": "2"})
    script = batching.register_script(SCRIPT)
    await script(args=["x"])  # loaded
    loop = asyncio.get_running_loop()
    started = tasks_started(loop)
    try:
        count = soon(batching, "count", lambda n: n * 10, "HLEN", key)
        ran = soon_script(script, "script", str, [], ["a", "b", "c"])
        assert len(batching._queue) == 2  # both in the coming exchange before any await
        batches = batching.batches
        assert await asyncio.gather(count, ran) == [20, "3"]
    finally:
        loop.set_task_factory(None)
    assert not started, started  # no task per call
    assert batching.batches == batches + 1  # one exchange


async def test_an_error_reply_and_a_refusing_then_are_their_callers_alone(
    fleet: Fleet, batching: BatchingRedis
) -> None:
    key = fleet.keys.prefix + "e"
    fleet.admin().set(key, "v")

    def refuse(_reply: object) -> object:
        raise StateUnavailable("not this shape")

    wrong, refused, ok = await asyncio.gather(
        soon(batching, "a count", int, "HLEN", key),
        soon(batching, "a get", refuse, "GET", key),
        soon(batching, "a get", bytes.decode, "GET", key),
        return_exceptions=True,
    )
    assert isinstance(wrong, StateUnavailable) and str(wrong).startswith("a count: ResponseError WRONGTYPE")
    assert isinstance(refused, StateUnavailable) and str(refused) == "not this shape"
    assert ok == "v"


async def test_a_flushed_script_loads_itself_and_runs_once_more(fleet: Fleet, batching: BatchingRedis) -> None:
    script = batching.register_script(SCRIPT)
    assert await soon_script(script, "script", int, [], ["a"]) == 1  # loaded on NOSCRIPT
    fleet.admin().script_flush()  # a restarted server forgot it
    assert await asyncio.gather(soon_script(script, "script", int, [], ["a", "b"]), batching.get("k")) == [2, None]


async def test_a_plain_client_gets_the_same_answers_and_failures(fleet: Fleet) -> None:
    key = fleet.keys.prefix + "p"
    fleet.admin().set(key, "v")
    script = fleet.client.register_script(SCRIPT)
    got = await asyncio.gather(
        soon(fleet.client, "a count", int, "HLEN", key),
        soon(fleet.client, "a get", bytes.decode, "GET", key),
        soon_script(script, "script", int, [], ["a", "b"]),
        return_exceptions=True,
    )
    assert isinstance(got[0], StateUnavailable) and str(got[0]).startswith("a count: ResponseError WRONGTYPE")
    assert got[1:] == ["v", 2]


async def test_a_hung_server_fails_every_queued_caller_unavailable_within_the_bound(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    plain = connect(server.url, timeout_s=0.5)
    client = BatchingRedis(plain)
    try:
        assert await soon(client, "a get", repr, "GET", "k") == "None"
        server.pause()
        started = time.monotonic()
        failed = await asyncio.gather(
            *(soon(client, "a get", repr, "GET", "k") for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(f, StateUnavailable) and str(f).startswith("a get: TimeoutError") for f in failed), failed
        assert time.monotonic() - started < 5  # the bound (0.5 s), never a hang
        server.resume()
        assert await soon(client, "a get", repr, "GET", "k") == "None"
    finally:
        server.resume()
        await client.aclose()
        await plain.aclose()
        server.stop()


async def test_a_refused_reserve_fails_its_awaitable_not_the_call(fleet: Fleet, batching: BatchingRedis) -> None:
    """A claim that refuses before anything is queued fails in the mint's gather beside the
    others (so every other claim is waited for, and undone), never at the call."""
    owed = OwedWrites(lambda _key: False)
    capacity = OwedCapacity(batching, fleet.keys, "h1", Incarnation(), owed)
    capacity.admitting = False
    refused = capacity.reserve("acct", "k1", 1)
    with pytest.raises(StateUnavailable, match="re-register"):
        await refused
    negative = RedisCapacity(batching, fleet.keys, Ceiling.LEASE, "h1").reserve("acct", "k1", -1)
    with pytest.raises(ValueError, match="count"):
        await negative


async def test_a_release_redis_cannot_take_is_owed_then_delivered(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    plain = connect(server.url, timeout_s=0.5)
    client = BatchingRedis(plain)
    keys = FleetKeys("t")
    owed = OwedWrites(lambda _key: False)
    capacity = OwedCapacity(client, keys, "h1", Incarnation(), owed)
    try:
        assert await asyncio.gather(capacity.reserve("acct", "k1", 2), capacity.reserve("acct", "k2", 2)) == [
            True,
            True,
        ]
        server.pause()
        assert await capacity.release("k1") is False  # owed, not lost
        assert len(owed) == 1
        assert await capacity.release("k2") is False  # queued behind it at once, never tried
        assert len(owed) == 2
        server.resume()
        assert await owed.deliver() == 2
        assert await capacity.count("acct") == 0
        assert await capacity.release("k1") is False  # released already: held nothing
        assert await capacity.reserve("acct", "k3", 2) is True
        assert await capacity.release("k3") is True
    finally:
        server.resume()
        await client.aclose()
        await plain.aclose()
        server.stop()
