"""The data plane's script line (issue 27) against a real redis-server: concurrent calls share
one connection and each gets its own reply, in order; a script Redis lost is sent again as
`EVAL`; a hung server is `StateUnavailable` within the reply bound, a restarted one is
reconnected to at once, a stopped one is `StateUnavailable`; a cancelled caller's reply never
answers the next call; an error reply is `StateUnavailable` and the line stays usable."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from shared.capacity import StateUnavailable
from shared.fleet.redis_client import connect
from shared.fleet.scriptline import ScriptLine
from tests.support.redis_server import RedisServer

TIMEOUT_S = 0.5
# One reply bound, plus a loaded 2-core machine's scheduling slack.
HUNG_BOUND_S = TIMEOUT_S + 1.5
ECHO = "return tonumber(ARGV[1])"
# Busy for ARGV[2] loop turns, then answers ARGV[1]: a reply that is still out when cancelled.
SLOW = "for i = 1, tonumber(ARGV[2]) do end return tonumber(ARGV[1])"
FAILS = "return redis.error_reply('ERR boom')"


@pytest.fixture
async def line(tmp_path: Path) -> AsyncIterator[tuple[RedisServer, ScriptLine, object]]:
    server = RedisServer(tmp_path / "redis").start()
    client = connect(server.url, timeout_s=TIMEOUT_S)
    line = ScriptLine.of(client)
    try:
        yield server, line, client
    finally:
        line.close()
        await client.aclose()
        server.stop()


async def test_concurrent_calls_share_the_line_and_each_gets_its_own_reply(line) -> None:
    _server, hot, client = line
    echo = client.register_script(ECHO)
    replies = await asyncio.gather(*(hot.run(echo, [], [n]) for n in range(200)))
    assert replies == list(range(200))
    clients = await client.client_list()
    assert len(clients) == 2  # the pool's one connection (CLIENT LIST) and the line's


async def test_a_script_redis_lost_is_sent_again_as_eval(line) -> None:
    server, hot, client = line
    echo = client.register_script(ECHO)
    assert await hot.run(echo, [], [1]) == 1  # EVALSHA after EVAL: the first time Redis never saw it
    await client.script_flush()
    assert await hot.run(echo, [], [2]) == 2
    assert await hot.run(echo, [], [3]) == 3


async def test_an_error_reply_is_unavailable_and_the_line_stays_usable(line) -> None:
    _server, hot, client = line
    with pytest.raises(StateUnavailable, match="boom"):
        await hot.run(client.register_script(FAILS), [], [])
    assert await hot.run(client.register_script(ECHO), [], [7]) == 7


async def test_a_hung_server_is_unavailable_within_the_bound_and_the_line_recovers(line) -> None:
    server, hot, client = line
    echo = client.register_script(ECHO)
    assert await hot.run(echo, [], [1]) == 1
    server.pause()
    try:
        started = time.monotonic()
        results = await asyncio.gather(*(hot.run(echo, [], [n]) for n in range(3)), return_exceptions=True)
        assert all(isinstance(r, StateUnavailable) and "TimeoutError" in str(r) for r in results), results
        assert time.monotonic() - started < HUNG_BOUND_S
    finally:
        server.resume()
    assert await hot.run(echo, [], [4]) == 4  # on a fresh connection: no late reply answers it


async def test_a_restarted_server_is_reconnected_to_without_a_refusal(line) -> None:
    server, hot, client = line
    echo = client.register_script(ECHO)
    assert await hot.run(echo, [], [1]) == 1
    server.restart()
    assert await hot.run(echo, [], [2]) == 2  # the dead connection's call sent once more


async def test_a_stopped_server_is_unavailable(line) -> None:
    server, hot, client = line
    echo = client.register_script(ECHO)
    assert await hot.run(echo, [], [1]) == 1
    server.stop()
    with pytest.raises(StateUnavailable):
        await hot.run(echo, [], [2])


async def test_a_cancelled_callers_reply_never_answers_the_next_call(line) -> None:
    _server, hot, client = line
    slow, echo = client.register_script(SLOW), client.register_script(ECHO)
    assert await hot.run(slow, [], [0, 1]) == 0 and await hot.run(echo, [], [0]) == 0  # loaded
    for n in range(1, 6):
        out = asyncio.ensure_future(hot.run(slow, [], [-n, 300_000]))
        await asyncio.sleep(0)  # sent: its reply is on the way
        out.cancel()
        assert await hot.run(echo, [], [n]) == n


async def test_a_closed_line_refuses(line) -> None:
    _server, hot, client = line
    hot.close()
    with pytest.raises(StateUnavailable):
        await hot.run(client.register_script(ECHO), [], [1])


class _SlowFirstOpen(ScriptLine):
    """A line whose first open times out (a loaded host's first request)."""

    opens = 0

    async def _establish(self, wire) -> None:  # type: ignore[no-untyped-def]
        self.opens += 1
        if self.opens == 1:
            raise TimeoutError()
        await super()._establish(wire)


async def test_an_open_that_timed_out_is_tried_once_more(line) -> None:
    _server, hot, client = line
    slow = _SlowFirstOpen(hot.target)
    try:
        assert await slow.run(client.register_script(ECHO), [], [5]) == 5 and slow.opens == 2
    finally:
        slow.close()


async def test_an_open_that_never_completes_is_unavailable(line) -> None:
    _server, hot, client = line
    never = ScriptLine(msgspec.structs.replace(hot.target, connect_timeout_s=1e-9))
    with pytest.raises(StateUnavailable, match="connect TimeoutError"):
        await never.run(client.register_script(ECHO), [], [1])
    never.close()
