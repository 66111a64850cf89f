"""`BatchingRedis` against a real redis-server (issue 27): the commands awaited at one moment go
as one pipeline, each caller still gets its own reply or its own error, a cancelled caller sends
nothing, a hung server fails every caller within the reply bound, and what is not batched (a
blocking read) neither joins a batch nor delays one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from shared.capacity import StateUnavailable
from shared.fleet.batching import BatchingRedis
from shared.fleet.redis_client import connect, guard
from tests.support.fleet import Fleet
from tests.support.redis_server import RedisServer
from tests.support.waits import until

SCRIPT = "return {redis.call('GET', KEYS[1]), #ARGV}"


async def nested(client: BatchingRedis, key: str) -> list[object]:
    """Two levels of gather, as a mint's reads are (its facts, each candidate's)."""
    inner = asyncio.gather(client.get(key), client.hlen(key + ":h"))
    return [await client.smembers(key + ":s"), *await inner]


async def test_concurrent_commands_go_as_one_pipeline_each_with_its_reply(fleet: Fleet) -> None:
    client = BatchingRedis(fleet.client)
    key = fleet.keys.prefix + "b"
    admin = fleet.admin()
    admin.set(key, "v")
    admin.sadd(key + ":s", "x", "y")
    admin.hset(key + ":h", mapping={"a": "1", "b": "2"})
    script = client.register_script(SCRIPT)
    await script(keys=[key], args=["1", "2"])  # loaded once, as a daemon's first use
    batches = client.batches
    got = await asyncio.gather(
        client.get(key),
        nested(client, key),
        script(keys=[key], args=["1"]),
        client.set(key + ":new", "n", px=60_000),
        client.hexists(key + ":h", "a"),
    )
    assert got == [b"v", [{b"x", b"y"}, b"v", 2], [b"v", 1], True, True]
    assert client.batches == batches + 1
    assert admin.get(key + ":new") == b"n"
    alone = client.batches
    assert await client.get(key) == b"v" and client.batches == alone  # one command: no pipeline


async def test_an_error_reply_is_its_callers_alone_and_a_flushed_script_loads_itself(fleet: Fleet) -> None:
    client = BatchingRedis(fleet.client)
    key = fleet.keys.prefix + "e"
    fleet.admin().set(key, "v")
    script = client.register_script(SCRIPT)
    await script(keys=[key])
    fleet.admin().script_flush()  # a restarted server forgot it
    wrong, ok, scripted = await asyncio.gather(
        client.hlen(key), client.get(key), script(keys=[key]), return_exceptions=True
    )
    assert isinstance(wrong, redis.ResponseError) and "WRONGTYPE" in str(wrong)
    assert ok == b"v" and scripted == [b"v", 0]


async def test_a_caller_cancelled_before_the_batch_goes_sends_nothing(fleet: Fleet) -> None:
    client = BatchingRedis(fleet.client)
    key = fleet.keys.prefix + "c"
    cancelled = asyncio.ensure_future(client.set(key + ":cancelled", "1"))
    kept = asyncio.ensure_future(client.set(key + ":kept", "1"))
    await asyncio.sleep(0)  # both queued, the batch not yet gone
    cancelled.cancel()
    assert await kept is True
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert fleet.admin().get(key + ":kept") == b"1" and fleet.admin().get(key + ":cancelled") is None


async def test_a_batch_over_the_cap_goes_as_several(fleet: Fleet) -> None:
    client = BatchingRedis(fleet.client, max_batch=3)
    key = fleet.keys.prefix + "m"
    fleet.admin().set(key, "v")
    batches = client.batches
    assert await asyncio.gather(*(client.get(key) for _ in range(7))) == [b"v"] * 7
    assert client.batches == batches + 2  # 3 + 3 pipelined, the last one alone


async def test_a_blocking_read_is_not_batched_and_delays_no_batch(fleet: Fleet) -> None:
    plain = connect(fleet.server.url, timeout_s=10)  # a reply bound past the block
    client = BatchingRedis(plain)
    key = fleet.keys.prefix + "x"
    fleet.admin().set(key, "v")
    try:
        blocking = asyncio.ensure_future(client.xread({key + ":stream": "$"}, block=8_000))
        # Batched with it, the gets would be answered after it (one connection answers in order)
        assert await asyncio.gather(client.get(key), client.get(key)) == [b"v", b"v"]
        assert not blocking.done()
        blocking.cancel()  # redis-py may consume a cancel (redis_client.raise_if_cancelled): drained either way
        await asyncio.gather(blocking, return_exceptions=True)
    finally:
        await client.aclose()
        await plain.aclose()


async def guarded(client: BatchingRedis, key: str) -> object:
    with guard("batched get"):
        return await client.get(key)


async def test_a_hung_server_fails_every_caller_within_the_reply_bound(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    plain = connect(server.url, timeout_s=0.5)
    client = BatchingRedis(plain)
    try:
        assert await asyncio.gather(guarded(client, "k"), guarded(client, "k")) == [None, None]
        server.pause()
        started = time.monotonic()
        failed = await asyncio.gather(*(guarded(client, "k") for _ in range(3)), return_exceptions=True)
        assert all(isinstance(f, StateUnavailable) for f in failed), failed
        assert time.monotonic() - started < 5  # the bound (0.5 s), never a hang
        server.resume()
        assert await asyncio.gather(guarded(client, "k"), guarded(client, "k")) == [None, None]
    finally:
        server.resume()
        await client.aclose()
        await plain.aclose()
        server.stop()


async def test_a_connection_that_died_with_a_restarted_server_is_replaced_at_once(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    plain = connect(server.url)
    client = BatchingRedis(plain)
    try:
        assert await asyncio.gather(client.set("k", "1"), client.get("k")) == [True, b"1"]
        server.restart()  # the pooled connection is dead now
        assert await asyncio.gather(client.set("k", "2"), client.get("k")) == [True, b"2"]
    finally:
        await client.aclose()
        await plain.aclose()
        server.stop()


async def test_closing_cancels_the_callers_still_waiting(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    plain = connect(server.url, timeout_s=5)
    client = BatchingRedis(plain)
    try:
        assert await client.get("k") is None  # connected
        server.pause()
        waiting = asyncio.gather(client.get("k"), client.get("k"), return_exceptions=True)
        await until(lambda: client.in_flight == 1, 5, "the exchange out, its replies awaited")
        await client.aclose()
        got = await asyncio.wait_for(waiting, 2)  # never left hanging
        assert all(isinstance(g, asyncio.CancelledError) for g in got), got
    finally:
        server.resume()
        await plain.aclose()
        server.stop()


async def test_every_batched_command_answers_what_the_plain_client_answers(fleet: Fleet) -> None:
    """The exchange's replies are parsed in one pass (`shared/fleet/resp.py`), not by redis-py's
    reader: each command of `BATCHED` answers, type for type, what the plain client answers
    (its response callback applied), a reply larger than one read included."""
    client = BatchingRedis(fleet.client)
    key = fleet.keys.prefix + "same"
    admin = fleet.admin()
    big = bytes(range(256)) * 1_000  # 256 kB: several reads
    admin.set(key, big)
    admin.sadd(key + ":s", "x", "y")
    admin.sadd(key + ":empty-later", "z")
    admin.srem(key + ":empty-later", "z")
    admin.hset(key + ":h", mapping={"a": "1"})
    admin.rpush(key + ":l", "1", "2", "3")
    script = client.register_script("return {KEYS[1], tonumber(ARGV[1]), false, {1, 'two'}}")
    await script(keys=[key], args=["7"])  # loaded once

    def calls(c: object) -> list[object]:
        r: Any = c
        return [
            r.get(key),
            r.get(key + ":none"),
            r.set(key + ":new", "n", px=60_000),
            r.set(key + ":new", "m", nx=True),
            r.smembers(key + ":s"),
            r.smembers(key + ":empty-later"),
            r.hlen(key + ":h"),
            r.hexists(key + ":h", "a"),
            r.hexists(key + ":h", "b"),
            r.mget([key + ":new", key + ":none"]),
            r.lrange(key + ":l", 0, -1),
            r.evalsha(script.sha, 1, key, "7"),
            r.delete(key + ":gone", key + ":new"),
            r.hgetall(key + ":h"),
            r.hgetall(key + ":none"),
            r.hmget(key + ":h", ["a", "b"]),
        ]

    batches = client.batches
    ours = await asyncio.gather(*calls(client))
    assert client.batches == batches + 1
    admin.set(key + ":new", "n", px=60_000)  # as before the batch
    theirs = [await call for call in calls(fleet.client)]
    assert [type(v) for v in ours] == [type(v) for v in theirs]
    assert ours == theirs
    assert ours[0] == big


async def test_an_exchange_whose_connection_breaks_before_its_replies_is_sent_once_more(tmp_path: Path) -> None:
    """The line (`shared/fleet/batchwire.py`): a connection lost with an exchange on it (its
    replies not read) sends that exchange again, once, on a fresh connection."""
    server = RedisServer(tmp_path / "redis").start()
    plain = connect(server.url, timeout_s=5)
    client = BatchingRedis(plain)
    try:
        assert await client.set("k", "1") is True  # connected
        first = client._wire
        assert first is not None
        server.pause()
        waiting = asyncio.gather(client.set("k", "2"), client.get("k"))
        await until(lambda: client.in_flight == 1, 5, "the exchange out, its replies awaited")
        assert first.transport is not None
        first.transport.abort()  # the connection breaks before the replies
        await until(lambda: first.closed, 5, "the broken connection noticed")
        server.resume()
        assert await asyncio.wait_for(waiting, 5) == [True, b"2"]
        assert client._wire is not first
    finally:
        server.resume()
        await client.aclose()
        await plain.aclose()
        server.stop()


async def test_a_decoding_client_keeps_redis_pys_connection(fleet: Fleet) -> None:
    """A pool that decodes replies (not the daemon's) is not spoken to by the line: its exchanges
    go over redis-py's own connection and reader, batched as well."""
    plain = redis.asyncio.Redis.from_url(fleet.server.url, decode_responses=True)
    client = BatchingRedis(plain)
    key = fleet.keys.prefix + "decoded"
    fleet.admin().set(key, "v")
    try:
        batches = client.batches
        assert await asyncio.gather(client.get(key), client.hlen(key + ":h")) == ["v", 0]
        assert client.batches == batches + 1 and client._wire is None
    finally:
        await client.aclose()
        await plain.aclose()


@pytest.mark.parametrize("how", ["unix socket, RESP3, db 3", "TCP, RESP2, db 2"])
async def test_line_handshake(tmp_path: Path, how: str) -> None:
    """The line connects as the pool's connections do: over a Unix socket or TCP, in the RESP
    version redis-py speaks for that URL (`HELLO 3`, or none), into the URL's database."""
    socket_path = tmp_path / "r.sock"
    server = RedisServer(tmp_path / "redis", extra_args=["--unixsocket", str(socket_path), "--unixsocketperm", "700"])
    server.start()
    db = 3 if how.startswith("unix") else 2
    url = f"unix://{socket_path}?db={db}" if how.startswith("unix") else f"{server.url[:-2]}/{db}?protocol=2"
    plain = connect(url)
    client = BatchingRedis(plain)
    try:
        key = "line:" + how
        assert await asyncio.gather(client.set(key, "v"), client.get(key), client.hgetall(key + ":none")) == [
            True,
            b"v",
            {},
        ]
        assert client._wire is not None  # spoken over the line, not redis-py's connection
        admin = redis.Redis(port=server.port, db=db)
        assert admin.get(key) == b"v" and redis.Redis(port=server.port, db=0).get(key) is None
        admin.close()
    finally:
        await client.aclose()
        await plain.aclose()
        server.stop()
