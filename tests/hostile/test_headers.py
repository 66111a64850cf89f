"""Header abuse (SPEC §15, §19): each is answered in a wire's error shape (a request aiohttp
cannot parse is answered before the wire is known), the upstream sees nothing, and the data
plane stays healthy."""

from __future__ import annotations

import json
import socket

import pytest

from tests.hostile.conftest import HAIKU, dataplane_healthy, mint_v2
from tests.support.harness import Gateway, Stub

BODY = json.dumps({"model": "claude-opus-4-1", "max_tokens": 8, "messages": []}).encode()


def exchange(gw: Gateway, raw: bytes) -> bytes:
    sock = socket.create_connection(("127.0.0.1", gw.dataplane_port), timeout=15)
    try:
        sock.sendall(raw)
        answer = b""
        while True:
            try:
                piece = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not piece:
                break
            answer += piece
            if b"\r\n\r\n" in answer:
                head, _, body = answer.partition(b"\r\n\r\n")
                length = [
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ]
                if length and len(body) >= length[0]:
                    break
        return answer
    finally:
        sock.close()


def request(token: str, extra: bytes, body: bytes = BODY, length: bool = True) -> bytes:
    head = (
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nanthropic-version: 2023-06-01\r\n"
        b"content-type: application/json\r\nx-api-key: " + token.encode() + b"\r\n" + extra
    )
    if length:
        head += b"content-length: " + str(len(body)).encode() + b"\r\n"
    return head + b"\r\n" + body


CASES = {
    "a header line over 32 KiB": (b"x-pad: " + b"a" * (40 * 1024) + b"\r\n", True, (400, 431)),
    "200 headers": (b"".join(b"x-h%d: v\r\n" % i for i in range(200)), True, (400, 431)),
    "content-length and chunked (smuggling)": (b"transfer-encoding: chunked\r\n", True, (400,)),
    "two content-lengths that differ": (b"content-length: 3\r\n", True, (400,)),
    "a NUL in a header value": (b"x-evil: a\x00b\r\n", True, (400,)),
    "a bare LF in a header": (b"x-evil: a\nx-more: b\r\n", True, (400,)),
    "an obsolete folded header": (b"x-evil: a\r\n  folded\r\n", True, (400,)),
    "two content-encoding lines": (b"content-encoding: identity\r\ncontent-encoding: gzip\r\n", True, (415,)),
    "content-encoding: br": (b"content-encoding: br\r\n", True, (415,)),
    "an unknown expectation": (b"expect: 200-ok\r\n", True, (417,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_header_abuse(hgw: Gateway, clean_stub: Stub, name: str) -> None:
    extra, length, statuses = CASES[name]
    minted = mint_v2(hgw, HAIKU, f"d-header-{list(CASES).index(name)}")
    answer = exchange(hgw, request(minted["token"], extra, length=length))
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.") else None
    assert status in statuses, answer[:300]
    error = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]  # a wire's shape: either one
    assert error["type"] in ("invalid_request_error", "request_too_large", "api_error") and error["message"]
    assert clean_stub.requests() == []
    assert dataplane_healthy(hgw)
