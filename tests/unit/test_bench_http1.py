"""The load generator's HTTP/1.1 framing, by table: bytes in, status / body count / done out."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from bench.http1 import ProtocolError, ResponseParser, build_request


class Case(NamedTuple):
    name: str
    pieces: tuple[bytes, ...]
    status: int
    body: bytes
    done: bool


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"7\r\nevent: \r\n5\r\nhello\r\n0\r\n\r\n"
)
CASES = [
    Case("content-length in one piece", (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",), 200, b"hello", True),
    Case(
        "content-length split everywhere",
        (b"HTTP/1.1 20", b"1 Created\r\nconTent-LENGTH:  5\r", b"\n\r\nhe", b"llo"),
        201,
        b"hello",
        True,
    ),
    Case("content-length still short", (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel",), 200, b"hel", False),
    Case("empty body", (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",), 200, b"", True),
    Case("no content", (b"HTTP/1.1 204 No Content\r\n\r\n",), 204, b"", True),
    Case("error answer", (b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 2\r\n\r\n{}",), 401, b"{}", True),
    Case("chunked in one piece", (CHUNKED,), 200, b"event: hello", True),
    Case("chunked byte by byte", tuple(CHUNKED[i : i + 1] for i in range(len(CHUNKED))), 200, b"event: hello", True),
    Case("chunked without terminator", (CHUNKED[:-5],), 200, b"event: hello", False),
    Case(
        "chunk extension and trailer",
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nX-T: 1\r\n\r\n",),
        200,
        b"abc",
        True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_parser_frames_responses(case: Case) -> None:
    parser = ResponseParser(keep_body=True)
    done = False
    for piece in case.pieces:
        done = parser.feed(piece)
    assert (parser.status, bytes(parser.body), parser.body_bytes, done) == (
        case.status,
        case.body,
        len(case.body),
        case.done,
    )


BAD = [
    ("not http", b"SSH-2.0-OpenSSH\r\n\r\n"),
    ("bad chunk size", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
    ("chunk without crlf", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\naXY"),
    ("body beyond content-length", b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab"),
]


@pytest.mark.parametrize("data", [b for _, b in BAD], ids=[n for n, _ in BAD])
def test_parser_refuses_broken_framing(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        ResponseParser().feed(data)


def test_close_delimited_body_ends_at_eof_and_a_cut_stream_does_not() -> None:
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 200 OK\r\n\r\nabc") is False
    assert parser.eof() is True and parser.body_bytes == 3
    cut = ResponseParser()
    cut.feed(CHUNKED[:-5])
    assert cut.eof() is False


def test_request_bytes_carry_host_headers_and_length() -> None:
    raw = build_request("POST", "/v1/messages", "127.0.0.1:9", {"x-api-key": "k"}, b"{}")
    assert raw == (b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:9\r\nx-api-key: k\r\nContent-Length: 2\r\n\r\n{}")
    assert b"Content-Length" not in build_request("GET", "/", "h")
