"""`shared.http1`'s bounds over real sockets, raw bytes in: the request line, each header,
the header count and total, the body against `client_max_size`, what llhttp's strict mode
refuses (both Content-Length and Transfer-Encoding, a bad chunk, a bare LF), and the deadlines
for a head (slowloris) and a stalled body. Each refusal is a 400 (408, 413) in aiohttp's shape,
is counted by reason, closes that connection, and leaves the server serving the next one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared.http1.errors import Refused
from shared.http1.limits import Limits
from tests.support.http1 import Answer, closed_by_peer, exchange
from tests.support.http1_app import READS, build, get, post

SHORT = Limits(head_timeout_s=0.3, body_timeout_s=0.3)


async def still_serves(port: int) -> None:
    answer = await exchange(port, get("/hello?n=1"))
    assert answer.status == 200 and answer.body == b'{"hello":"1"}'


async def refused_then_closed(port: int, raw: bytes, status: int = 400) -> Answer:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        answer = await Answer.read(reader)
        assert answer.status == status, answer.raw
        assert answer.headers["content-type"] == "text/plain; charset=utf-8"
        assert await closed_by_peer(reader)
        return answer
    finally:
        writer.close()


CASES = [
    ("request line over 8190 bytes", get("/hello?" + "a" * 8190), Refused.LINE_TOO_LONG),
    ("header value over 8190 bytes", get("/hello", "X-Long: " + "a" * 8191 + "\r\n"), Refused.FIELD_TOO_LONG),
    ("header name over 8190 bytes", get("/hello", "X" * 8191 + ": v\r\n"), Refused.FIELD_TOO_LONG),
    ("129 headers", get("/hello", "".join(f"X-H{i}: v\r\n" for i in range(128))), Refused.TOO_MANY_HEADERS),
    ("head over 64 KiB", get("/hello", "".join(f"X-{i}: {'v' * 8000}\r\n" for i in range(9))), Refused.HEAD_TOO_LARGE),
    (
        "Content-Length and Transfer-Encoding",
        b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
        Refused.BAD_REQUEST,
    ),
    (
        "two Content-Lengths",
        b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nab",
        Refused.BAD_REQUEST,
    ),
    (
        "a bad chunk size",
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
        Refused.BAD_REQUEST,
    ),
    ("a bare LF", b"GET /hello HTTP/1.1\nHost: t\n\n", Refused.BAD_REQUEST),
    ("not HTTP", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n", Refused.BAD_REQUEST),
    ("an unknown version", b"GET /hello HTTP/9.9\r\nHost: t\r\n\r\n", Refused.BAD_REQUEST),
    ("a space before the colon", b"GET /hello HTTP/1.1\r\nHost : t\r\n\r\n", Refused.BAD_REQUEST),
]


@pytest.mark.parametrize(("raw", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_what_the_bounds_and_the_parser_refuse(app_server: Any, raw: bytes, reason: Refused) -> None:
    app = build()
    server = await app_server(app)
    answer = await refused_then_closed(server.port, raw)
    assert answer.status_line.startswith("HTTP/1.0 400 ")
    assert server.refused == {reason: 1}
    assert app[READS] == []  # no handler read a body
    await still_serves(server.port)


async def test_a_body_over_client_max_size_is_a_413_before_it_is_read(app_server: Any) -> None:
    app = build(max_size=1024)
    server = await app_server(app)
    answer = await exchange(server.port, post("/echo", b"x" * 1025, "Expect: 100-continue\r\n"))
    assert answer.status_line == "HTTP/1.1 413 Request Entity Too Large"  # no 100 Continue before it
    assert answer.body == b"Maximum request body size 1024 exceeded."
    assert answer.headers["content-type"] == "text/plain; charset=utf-8"
    assert server.refused == {Refused.BODY_TOO_LARGE: 1} and app[READS] == []
    at_limit = await exchange(server.port, post("/echo", b"y" * 1024))
    assert at_limit.status == 200 and at_limit.body == b"y" * 1024


async def test_a_chunked_body_is_decoded_and_bounded_as_it_arrives(app_server: Any) -> None:
    app = build(max_size=1024)
    server = await app_server(app)
    head = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer = await exchange(server.port, head + b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    assert answer.status == 200 and answer.body == b"abcde"
    over = await exchange(server.port, head + b"400\r\n" + b"z" * 1024 + b"\r\n1\r\nz\r\n0\r\n\r\n")
    assert over.status == 413 and app[READS] == [5]


async def test_a_head_that_never_ends_is_answered_408_and_closed(app_server: Any) -> None:
    """Slowloris: a byte at a time keeps no connection past the head's deadline."""
    server = await app_server(build(), limits=SHORT)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /hello HTTP/1.1\r\nHost: t\r\n")
    for byte in b"X-Slow: 1":
        writer.write(bytes([byte]))
        await writer.drain()
    answer = await Answer.read(reader, timeout_s=5)
    assert answer.status == 408 and await closed_by_peer(reader)
    assert server.refused == {Refused.HEAD_TIMEOUT: 1}
    writer.close()
    await still_serves(server.port)


async def test_a_stalled_body_is_answered_408_and_closed(app_server: Any) -> None:
    server = await app_server(build(), limits=SHORT)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
    answer = await Answer.read(reader, timeout_s=5)
    assert answer.status == 408 and await closed_by_peer(reader)
    assert server.refused == {Refused.BODY_TIMEOUT: 1}
    writer.close()
    await still_serves(server.port)


async def test_a_client_closing_mid_body_leaves_the_server_serving(app_server: Any) -> None:
    app = build()
    server = await app_server(app)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nonly ten b")
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    await until_no_connections(server)
    assert app[READS] == []
    await still_serves(server.port)


async def until_no_connections(server: Any) -> None:
    from tests.support.waits import until

    await until(lambda: not server.connections, 5, "the server to drop the connection")


async def test_a_handler_that_raises_is_a_500_and_the_server_goes_on(app_server: Any) -> None:
    server = await app_server(build())
    answer = await refused_then_closed(server.port, get("/boom"), status=500)
    assert answer.body == b"500 Internal Server Error\n\nServer got itself in trouble"
    assert server.refused == {Refused.HANDLER_FAILED: 1}
    await still_serves(server.port)


async def test_random_bytes_never_stop_the_server(app_server: Any) -> None:
    """Each connection's loop survives what it is sent; the server serves on (seeded, printed)."""
    import random

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    server = await app_server(build(), limits=SHORT)
    for _ in range(60):
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
        if rng.random() < 0.5:  # a plausible start, then junk
            junk = b"POST /echo HTTP/1.1\r\n" + junk
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(junk)
        writer.write_eof()
        try:
            await asyncio.wait_for(reader.read(), 5)
        except ConnectionResetError:
            pass
        writer.close()
    await still_serves(server.port)
    assert sum(server.refused.values()) > 0, f"seed={seed}"
