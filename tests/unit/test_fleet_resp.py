"""`shared/fleet/resp.parse`: an exchange's replies, parsed in one pass, table-tested against
redis-py's own pure-Python readers fed the same bytes (what the replies cost to read changed,
never what a caller is answered), and cut at every byte (an incomplete read asks for more)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from redis._parsers import _AsyncRESP2Parser, _AsyncRESP3Parser
from redis._parsers.encoders import Encoder
from redis.exceptions import InvalidResponse, NoScriptError, ResponseError

from shared.fleet import resp

BOTH = [
    b"+OK\r\n",
    b":0\r\n",
    b":-42\r\n",
    b"$0\r\n\r\n",
    b"$5\r\nhello\r\n",
    b"$4\r\n\x00\xff\r\n\r\n",  # binary, holding a CRLF
    b"*0\r\n",
    b"-ERR unknown command\r\n",
    b"*2\r\n:1\r\n-ERR inside\r\n",
]
RESP2_ONLY = [  # its nulls (a RESP3 connection is answered `_`)
    b"$-1\r\n",
    b"*-1\r\n",
    b"*3\r\n$1\r\na\r\n:1\r\n*2\r\n$-1\r\n+x\r\n",
]
RESP3_ONLY = [
    b"_\r\n",
    b"~2\r\n$1\r\nx\r\n$1\r\ny\r\n",
    b"%2\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n*1\r\n:2\r\n",
    b",1.5\r\n",
    b"#t\r\n",
    b"#f\r\n",
    b"(3492890328409238509324850943850943825024385\r\n",
    b"=15\r\ntxt:Some string\r\n",
    b"!21\r\nSYNTAX invalid syntax\r\n",
]


async def _redis_py(parser_class: Any, data: bytes) -> Any:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()

    class Conn:
        _reader = reader
        encoder = Encoder("utf-8", "strict", False)

    parser = parser_class(65_536)
    parser.on_connect(Conn())
    return await parser.read_response()


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(theirs, BaseException):
        return type(ours) is type(theirs) and str(ours) == str(theirs)
    if isinstance(theirs, list):
        return isinstance(ours, list) and len(ours) == len(theirs) and all(map(_same, ours, theirs))
    return type(ours) is type(theirs) and ours == theirs


@pytest.mark.parametrize("data", BOTH + RESP3_ONLY)
async def test_a_reply_parses_as_redis_pys_resp3_reader_reads_it(data: bytes) -> None:
    (ours,), end = resp.parse(data, 1)
    assert end == len(data)
    assert _same(ours, await _redis_py(_AsyncRESP3Parser, data)), ours


@pytest.mark.parametrize("data", BOTH + RESP2_ONLY)
async def test_a_reply_parses_as_redis_pys_resp2_reader_reads_it(data: bytes) -> None:
    (ours,), _ = resp.parse(data, 1)
    assert _same(ours, await _redis_py(_AsyncRESP2Parser, data)), ours


def test_replies_in_a_row_and_a_noscript_error_each_their_own() -> None:
    data = b"".join(BOTH) + b"-NOSCRIPT No matching script. Please use EVAL.\r\n"
    replies, end = resp.parse(data, len(BOTH) + 1)
    assert end == len(data)
    assert isinstance(replies[-1], NoScriptError) and isinstance(replies[7], ResponseError)
    assert replies[:3] == [b"OK", 0, -42]


@pytest.mark.parametrize("data", BOTH + RESP2_ONLY + RESP3_ONLY)
def test_a_reply_cut_anywhere_is_incomplete(data: bytes) -> None:
    for cut in range(len(data)):
        with pytest.raises(resp.Incomplete):
            resp.parse(data[:cut], 1)


@pytest.mark.parametrize("data", [b">2\r\n+a\r\n+b\r\n", b"?x\r\n", b"$x\r\nab\r\n", b"*1x\r\n", b"|1\r\n+a\r\n+b\r\n"])
def test_an_unexpected_or_malformed_reply_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(InvalidResponse):
        resp.parse(data, 1)


def test_an_error_redis_py_raises_is_raised() -> None:
    with pytest.raises(redis.BusyLoadingError):
        resp.parse(b"-LOADING Redis is loading the dataset in memory\r\n", 1)


def test_nesting_past_the_bound_is_a_protocol_error() -> None:
    with pytest.raises(InvalidResponse):
        resp.parse(b"*1\r\n" * (resp.MAX_DEPTH + 2) + b":1\r\n", 1)
