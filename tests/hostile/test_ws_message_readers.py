"""A large client WebSocket message is read in a reader process, exactly as strictly (SPEC §19, §20).

`events.read_message` (a message of `OFF_LOOP_BYTES` or more, see `websocket/session.py`) must
read what `events.client_message` and `matching.create_echo` read in place, and refuse what they
refuse with the same code and message. These run every message of a table both ways (small, and
padded past the threshold) in real reader processes, and break a reader on purpose to see the
message refused `internal-error`, never waved through.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from dataplane import bodies
from dataplane.bodies import OFF_LOOP_BYTES, BodyRefused
from dataplane.readers import Readers
from dataplane.websocket import events
from dataplane.websocket.matching import create_echo
from shared.codes import Refusal
from tests.hostile.test_body_readers import THIS as READERS_TESTS
from tests.hostile.test_strict_bodies import READ, REFUSED

PAD = b" " * OFF_LOOP_BYTES  # trailing whitespace: the same JSON, past the threshold
MOST = 64 << 20

MESSAGES = (
    [
        b'{"type":"response.create","model":"gpt-5","input":"hi"}',
        b'{"type":"response.create","model":"gpt-5","generate":false}',
        b'{"type":"response.create","model":"gpt-5","generate":null,"previous_response_id":"resp_1",'
        b'"metadata":{"turn":"7","n":[1,2.5,null]},"event_id":"evt_1"}',
        b'{"type":"response.create","metadata":{},"previous_response_id":"","event_id":3}',
        b'{"type":"response.cancel","response_id":"resp_1"}',
        b'{"type":7,"model":"gpt-5"}',
        b"{}",
        b'{"type":"response.create","model":"gpt-5","model":"x"}',
        b'{"type":"response.create","model":NaN}',
        b'{"type":"response.create","model":3}',
        b"[1, 2]",
        b'{"type":"response.create"} {}',
        b'\xef\xbb\xbf{"type":"response.create"}',
        b'{"type":"response.create","input":"\xff"}',
    ]
    + [c.body for c in REFUSED]
    + [c.body for c in READ]
)


def _in_place(data: bytes) -> tuple[Any, ...]:
    try:
        read = events.client_message(data, MOST)
    except BodyRefused as refused:
        return (refused.code, refused.message)
    echo = create_echo(data) if read.type == events.CREATE else None
    return (read.type, read.model, read.generate, echo)


async def _off(data: bytes, most: int = MOST) -> tuple[Any, ...]:
    try:
        read = await events.read_message(data, most)
    except BodyRefused as refused:
        return (refused.code, refused.message)
    return tuple(read)


def test_every_message_reads_the_same_in_a_reader_process() -> None:
    async def run() -> list[tuple[Any, ...]]:
        try:
            seen = []
            for message in MESSAGES:
                for sent in (message, message + PAD):
                    expected = _in_place(sent)
                    assert await _off(sent) == expected, sent[:80]
                    seen.append(expected)
            return seen
        finally:
            await bodies.close_readers()

    seen = asyncio.run(run())
    refused = [s for s in seen if isinstance(s[0], Refusal)]
    assert len(refused) >= 2 * (len(REFUSED) + 7)  # refusals too, both sizes
    assert {s[0] for s in refused} == {Refusal.INVALID_REQUEST_BODY}
    creates = [s for s in seen if s[0] == events.CREATE]
    assert any(s[3] is not None and s[3].metadata for s in creates)  # an echo crossed the socket
    assert ("response.create", "gpt-5", False, create_echo(b"{}")) in seen  # a warmup
    assert bodies._readers.started >= 1 and bodies._readers.pids() == []


def test_a_near_limit_message_of_the_costliest_shape_is_read_and_its_limit_held() -> None:
    head = b'{"type":"response.create","model":"gpt-5","x":['
    ok = head + b"0," * (4 << 20) + b"0]}"
    doubled = ok[:-1] + b',"model":"gpt-4o"}'

    async def run() -> list[tuple[Any, ...]]:
        try:
            return [await _off(ok), await _off(doubled), await _off(ok, len(ok) - 1)]
        finally:
            await bodies.close_readers()

    read, refused, too_large = asyncio.run(run())
    assert read == ("response.create", "gpt-5", True, create_echo(b"{}"))
    assert refused == (Refusal.INVALID_REQUEST_BODY, "the request body has more than one top-level 'model'")
    assert too_large == (Refusal.BODY_TOO_LARGE, f"the message exceeds {len(ok) - 1} bytes")


def test_a_huge_metadata_is_dropped_from_the_echo_not_the_message() -> None:
    """Its answer would be as costly to decode on the loop as the message: matched without it."""
    metadata = {f"k{i}": [0.5] * 64 for i in range(2000)}
    message = json.dumps({"type": "response.create", "model": "gpt-5", "metadata": metadata}).encode()
    small = b'{"type":"response.create","model":"gpt-5","metadata":{"a":"b"},"event_id":"e"}' + PAD

    async def run() -> list[tuple[Any, ...]]:
        try:
            return [await _off(message), await _off(small)]
        finally:
            await bodies.close_readers()

    huge, kept = asyncio.run(run())
    assert huge[:3] == ("response.create", "gpt-5", True) and huge[3].metadata is None
    assert create_echo(message).metadata == metadata  # in place it is read: the drop is the reader's
    assert kept[3].metadata == {"a": "b"} and kept[3].event_id == "e"


def test_a_message_whose_reader_is_lost_is_refused_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused on the socket (500 `internal-error`, as an HTTP body's lost reader): never sent."""
    monkeypatch.setattr(bodies, "_readers", Readers(f"{READERS_TESTS}:crashy_reader"))

    async def run() -> list[tuple[Any, ...]]:
        try:
            return [await _off(b"crash"), await _off(b"garbage")]
        finally:
            await bodies._readers.closed()

    for code, message in asyncio.run(run()):
        assert code == Refusal.INTERNAL_ERROR and "could not read" in message
