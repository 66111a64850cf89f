"""`shared/fleet/resp.pack`: the batch's RESP bytes, table-tested against redis-py's own
`pack_command` (what the commands cost to encode changed, never what is sent)."""

from __future__ import annotations

import pytest
import redis
from redis.asyncio.connection import Connection

from shared.fleet.resp import pack

CASES = [
    [("GET", "k")],
    [("SMEMBERS", "{f}:live:d:11:acme/app")],
    [("EVALSHA", "2f85bb3a7ce35c98c081d20e6cec82c93cc828d1", 3, "a", "b", "c", b"\x00\xffbytes", 86_400_000)],
    [("SET", "k", b"v", "PX", 60_000), ("HLEN", "h"), ("HEXISTS", "h", "f")],
    [("SET", "k", "ünïcode ✓")],
    [("EVALSHA", "sha", 0, -1, 0, 1.5, 1e-7, float("inf"))],
    [("MGET", "a", "b"), ("LRANGE", "l", 0, -1), ("GET", "")],
    [("SET", "k", bytearray(b"ba")), ("SET", "k", memoryview(b"mv"))],
    [("SET", "k", "x" * 1023), ("SET", "k", b"y" * 1024), ("SET", "k", "z" * 70_000)],  # a header past the table
    [("MGET", *(f"k{i}" for i in range(1100)))],  # a count past the table
    [],
]


@pytest.mark.parametrize("commands", CASES)
def test_pack_writes_what_redis_py_writes(commands: list[tuple[object, ...]]) -> None:
    conn = Connection()
    expected = b"".join(b"".join(bytes(part) for part in conn.pack_command(*args)) for args in commands)
    assert pack(commands) == expected


@pytest.mark.parametrize("bad", [True, None, object(), [1], {"a": 1}])
def test_pack_refuses_what_redis_py_refuses(bad: object) -> None:
    with pytest.raises(redis.DataError):
        Connection().pack_command("SET", "k", bad)
    with pytest.raises(redis.DataError):
        pack([("GET", "k"), ("SET", "k", bad)])
