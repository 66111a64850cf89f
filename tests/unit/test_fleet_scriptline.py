"""The script line's RESP2 wire (issue 27), strictly parsed and bounded: a reply is complete or
not yet (None), and anything that is not a bounded RESP2 reply is a `ProtocolError`; the target
is read from the pooled client's own settings, so both connect alike."""

from __future__ import annotations

import pytest

from shared.fleet.redis_client import connect
from shared.fleet.scriptline import MAX_BULK, MAX_LINE, ErrorReply, LineTarget, ProtocolError, pack, parse


@pytest.mark.parametrize(
    "args, packed",
    [
        (["PING"], b"*1\r\n$4\r\nPING\r\n"),
        (
            ["EVALSHA", "ab", 1, "k", b"\x00\r\n", ""],
            b"*6\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n1\r\n$1\r\nk\r\n$3\r\n\x00\r\n\r\n$0\r\n\r\n",
        ),
        (["SELECT", 12], b"*2\r\n$6\r\nSELECT\r\n$2\r\n12\r\n"),
    ],
)
def test_a_command_is_an_array_of_bulk_strings(args, packed) -> None:
    assert pack(args) == packed


@pytest.mark.parametrize(
    "data, reply, end",
    [
        (b":1\r\n", 1, 4),
        (b":-1\r\n", -1, 5),
        (b":0\r\n:1\r\n", 0, 4),  # the first of two replies
        (b"+OK\r\n", b"OK", 5),
        (b"-NOSCRIPT No matching script\r\n", ErrorReply("NOSCRIPT No matching script"), 30),
        (b"$3\r\nabc\r\n", b"abc", 9),
        (b"$0\r\n\r\n", b"", 6),
        (b"$-1\r\n", None, 5),
        (b"*-1\r\n", None, 5),
        (b"*0\r\n", [], 4),
        (b"*3\r\n:1\r\n$1\r\nx\r\n*1\r\n:2\r\n", [1, b"x", [2]], 23),
    ],
)
def test_a_complete_reply_and_where_the_next_starts(data, reply, end) -> None:
    assert parse(data) == (reply, end)


@pytest.mark.parametrize("data", [b"", b":1", b":1\r", b"$3\r\nab", b"$3\r\nabc\r", b"*2\r\n:1\r\n", b"*1\r\n$2\r\n"])
def test_an_incomplete_reply_waits_for_more(data) -> None:
    assert parse(data) is None


@pytest.mark.parametrize(
    "data",
    [
        b"?1\r\n",  # an unknown type
        b":\r\n",
        b":1x\r\n",
        b":--1\r\n",
        b":" + b"9" * 20 + b"\r\n",  # not an integer, or too long
        b"$-2\r\n",
        b"$" + str(MAX_BULK + 1).encode() + b"\r\n",  # a length out of bounds
        b"$3\r\nabcd\r\n",  # a bulk not ended where its length says
        b"*-2\r\n",
        b"*99999999\r\n",
        b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",  # nested too deep
        b"+" + b"x" * (MAX_LINE + 2),  # a line that never ends
    ],
)
def test_anything_else_is_a_protocol_error(data) -> None:
    with pytest.raises(ProtocolError):
        parse(data)


@pytest.mark.parametrize(
    "url, target, handshake",
    [
        ("redis://127.0.0.1:6390", LineTarget(host="127.0.0.1", port=6390), []),
        (
            "redis://:pw@127.0.0.1:6390/3",
            LineTarget(host="127.0.0.1", port=6390, password="pw", db=3),
            [pack(["AUTH", "pw"]), pack(["SELECT", 3])],
        ),
        (
            "rediss://gw:p%40ss@redis.example:6380/0?ssl_ca_certs=/ca&ssl_certfile=/c&ssl_keyfile=/k",
            LineTarget(
                host="redis.example",
                port=6380,
                tls=True,
                ca_certs="/ca",
                certfile="/c",
                keyfile="/k",
                username="gw",
                password="p@ss",
            ),
            [pack(["AUTH", "gw", "p@ss"])],
        ),
        ("unix:///run/redis.sock?db=2", LineTarget(path="/run/redis.sock", db=2), [pack(["SELECT", 2])]),
    ],
)
def test_the_line_connects_as_the_pooled_client_does(url, target, handshake) -> None:
    pool = connect(url, timeout_s=0.5, connect_timeout_s=0.25).connection_pool
    got = LineTarget.of(pool.connection_class.__name__, dict(pool.connection_kwargs))
    expected = LineTarget(
        **{**{f: getattr(target, f) for f in target.__struct_fields__}, "timeout_s": 0.5, "connect_timeout_s": 0.25}
    )
    assert got == expected
    assert got.handshake() == handshake


def test_another_connection_kind_is_refused() -> None:
    with pytest.raises(ValueError):
        LineTarget.of("ClusterConnection", {})
