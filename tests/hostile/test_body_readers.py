"""Large bodies are read in a reader process (dataplane/readers.py), exactly as strictly (SPEC §19).

msgspec holds the GIL for a whole parse, so a body of `OFF_LOOP_BYTES` or more is read in a
reader process. These run every body of the strict reader's tables both ways (in place and in a
reader, small and padded past the threshold) and expect the same peek or the same refusal; and
they break readers on purpose (one that dies, one that hangs, one that answers garbage) to see
the body answered `internal-error` and the next one read by a fresh reader. Each test runs real
processes; none asserts a duration.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from dataplane import bodies, readers
from dataplane.bodies import OFF_LOOP_BYTES, BodyPeek, BodyRefused, peek_body, peek_off_process, strict_peek
from dataplane.readers import ReaderLost, Readers
from dataplane.usage_ask import asks_usage, with_usage, with_usage_off_loop
from shared.codes import Refusal
from tests.hostile.test_strict_bodies import READ, REFUSED
from tests.support.waits import until

T = TypeVar("T")
PAD = b" " * OFF_LOOP_BYTES  # trailing whitespace: the same JSON, past the threshold
THIS = "tests.hostile.test_body_readers"


def _in_place(body: bytes) -> BodyPeek | tuple[Refusal, str]:
    try:
        return strict_peek(body)
    except BodyRefused as refused:
        return (refused.code, refused.message)


async def _off(read: Callable[[bytes], Awaitable[BodyPeek]], body: bytes) -> BodyPeek | tuple[Refusal, str]:
    try:
        return await read(body)
    except BodyRefused as refused:
        return (refused.code, refused.message)


TABLE = (
    [c.body for c in REFUSED]
    + [c.body for c in READ]
    + [
        b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}',
        b'{"model":"m","stream":true,"stream_options":null}',
        b'{"model":"m","stream_options":[]}',
    ]
)


def test_every_body_reads_the_same_in_a_reader_process() -> None:
    async def run() -> list[Any]:
        try:
            seen = []
            for body in TABLE:
                for sent in (body, body + PAD):
                    expected = _in_place(sent)
                    assert await _off(peek_off_process, sent) == expected, sent[:80]
                    assert await _off(peek_body, sent) == expected, sent[:80]
                    seen.append(expected)
            return seen
        finally:
            await bodies.close_readers()

    seen = asyncio.run(run())
    assert sum(not isinstance(s, BodyPeek) for s in seen) == 2 * (len(REFUSED) + 1)  # refusals too
    assert bodies._readers.started >= 1 and bodies._readers.pids() == []


def test_a_near_limit_body_of_the_costliest_shape_is_read() -> None:
    body = b'{"model":"claude-opus-4-1","a":[' + b"0," * (4 << 20) + b'0],"model":"claude-haiku-4-5"}'
    ok = body.replace(b',"model":"claude-haiku-4-5"', b"")

    async def run() -> tuple[Any, Any]:
        try:
            return await _off(peek_body, ok), await _off(peek_body, body)
        finally:
            await bodies.close_readers()

    read, refused = asyncio.run(run())
    assert read == BodyPeek("claude-opus-4-1", False, False, False)
    assert refused == (Refusal.INVALID_REQUEST_BODY, "the request body has more than one top-level 'model'")


# ---- broken readers: answered, never hung; the next body gets a fresh reader -----------------


def crashy_reader(fd: int) -> None:
    """A reader that dies on `crash`, hangs on `hang`, answers garbage to `garbage`, and
    answers anything else with its environment (JSON)."""

    def answer(kind: int, body: bytes) -> bytes:
        if body == b"crash":
            os._exit(3)
        if body == b"hang":
            time.sleep(3600)
        if body == b"garbage":
            return b"\xff" * 10
        return json.dumps(dict(os.environ)).encode()

    readers.serve(fd, answer)


def _run(pool: Readers, work: Callable[[Readers], Awaitable[T]]) -> T:
    async def run() -> T:
        try:
            return await work(pool)
        finally:
            await pool.closed()

    return asyncio.run(run())


async def _lost(pool: Readers, payload: bytes) -> str:
    with pytest.raises(ReaderLost) as caught:
        await pool.ask(payload)
    return str(caught.value)


def test_a_reader_that_dies_mid_read_is_lost_and_the_next_body_is_read() -> None:
    async def work(pool: Readers) -> None:
        assert "lost" in await _lost(pool, b"crash")
        assert json.loads(await pool.ask(b"ok")) is not None
        assert (pool.started, pool.lost) == (2, 1)

    _run(Readers(f"{THIS}:crashy_reader"), work)


def test_a_reader_that_hangs_is_killed_at_its_bound() -> None:
    async def work(pool: Readers) -> None:
        assert "TimeoutError" in await _lost(pool, b"hang")
        assert pool.pids() == []
        await until(lambda: all(p.poll() is not None for p in pool._exiting), 30, "killed, not left reading")
        pool.answer_s = 120.0  # the next reader's start-up on a loaded machine is not bounded here
        assert json.loads(await pool.ask(b"ok")) is not None
        assert (pool.started, pool.lost) == (2, 1)

    _run(Readers(f"{THIS}:crashy_reader", answer_s=1.0), work)


def test_a_reader_killed_while_idle_is_replaced_unseen() -> None:
    async def work(pool: Readers) -> list[int]:
        await pool.ask(b"ok")
        (pid,) = pool.pids()
        os.kill(pid, 9)
        await until(lambda: pool.pids() == [], 30, "the reader is dead")
        await pool.ask(b"ok")  # a fresh reader: the body is not answered an error
        assert pool.started == 2 and pool.lost == 0
        return [pid]

    _run(Readers(f"{THIS}:crashy_reader"), work)


def test_a_large_body_whose_reader_is_lost_is_refused_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the data plane answers (500 `internal-error`, the wire's shape): never waved through."""
    monkeypatch.setattr(bodies, "_readers", Readers(f"{THIS}:crashy_reader"))
    for payload in (b"crash", b"garbage"):

        async def work(pool: Readers, payload: bytes = payload) -> Any:
            return await _off(peek_off_process, payload)

        code, message = _run(bodies._readers, work)
        assert code == Refusal.INTERNAL_ERROR and "could not read the request body" in message


def test_a_reader_gets_no_environment_and_no_credential() -> None:
    os.environ["GATEWAY_TEST_READER_CREDENTIAL"] = "sk-ant-api03-reader-must-not-see-this"
    try:
        seen = _run(Readers(f"{THIS}:crashy_reader"), lambda pool: pool.ask(b"env"))
    finally:
        del os.environ["GATEWAY_TEST_READER_CREDENTIAL"]
    assert set(json.loads(seen)) <= {"LC_CTYPE"}  # what Python's locale coercion sets (PEP 538)


def test_an_idle_reader_exits_and_a_closed_pool_leaves_none() -> None:
    async def work(pool: Readers) -> None:
        await pool.ask(b"ok")
        (pid,) = pool.pids()
        await until(lambda: pool.pids() == [] and not _alive(pid), 30, "the idle reader exits")
        await pool.ask(b"ok")
        (pid,) = pool.pids()
        await pool.closed()
        assert not _alive(pid)

    _run(Readers(f"{THIS}:crashy_reader", idle_s=0.2), work)


def test_readers_are_bounded() -> None:
    async def work(pool: Readers) -> None:
        answers = await asyncio.gather(*(pool.ask(b"ok") for _ in range(6)))
        assert len(answers) == 6 and pool.started <= 2

    _run(Readers(f"{THIS}:crashy_reader", most=2), work)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ---- a chat stream's usage asked for on a large body, in a reader process too ------------------

USAGE_BODIES = [
    b'{"model":"gpt-5-mini","stream":true,"x":"%s","stream_options":{"include_usage":false}}',
    b'{"model":"gpt-5-mini","stream":true,"stream_options":null,"x":"%s"}',
    b'{"stream_options" : {"other":1, "include_usage":null} ,"model":"m","stream":true,"x":["%s"]}',
    b'{"model":"m","stream":true,"x":{"stream_options":"%s"},"stream_options":{"a":"\\u00e9"}}',
    b'{"model":"m","stream":true,"x":[0,"%s",0],"stream_options":{}}',
]


@pytest.mark.parametrize("template", USAGE_BODIES)
def test_usage_is_asked_for_alike_in_a_reader_process(template: bytes) -> None:
    body = template % (b"a" * OFF_LOOP_BYTES)
    peek = strict_peek(body)
    assert peek.stream_options and asks_usage("/v1/chat/completions", peek)

    async def run() -> bytes | None:
        try:
            return await with_usage_off_loop(body, peek)
        finally:
            await bodies.close_readers()

    expected = with_usage(body, peek)
    assert asyncio.run(run()) == expected
    assert bodies._readers.started >= 1  # it did go to a reader
    if expected is not None:
        assert strict_peek(expected).include_usage
