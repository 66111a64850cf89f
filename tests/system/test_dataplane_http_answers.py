"""What the data plane answers to odd requests, on the wire, is what it answered on aiohttp.

Each case was sent as raw bytes to the data plane built from the commit before its server moved
onto `shared.http1` (aiohttp's `web.Server`, 9139513) and to this one: every answer's status
line, its headers (names lower-cased; Date, request ids and the overhead figure normalised) and
its body (request ids and the lease count normalised) are those recorded there, as is whether
the connection closed after. `Server` is checked present, never its value (it named aiohttp).

What differs on purpose, and why: what the parser refuses (a bad request line, a bad chunk,
both Content-Length and Transfer-Encoding, bare LFs, a line past `MAX_HEADER_BYTES`) is still a
400 in the wire's error shape (SPEC §15: `invalid-request`, the default wire's request id
header) on an HTTP/1.0 status line, then a close; its message names llhttp's reason instead of
aiohttp's exception class (`PARSER_400` checks the shape and the fixed part of the text).
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from typing import NamedTuple

import pytest

from tests.support.attempts import A_BODY
from tests.support.harness import Gateway, Stub

KEY = "VKEY"  # stands for a minted virtual key
_RID = re.compile(rb"(?:req|msg|att)_[0-9A-Za-z]+")
_LEASES = re.compile(rb'"leases":\d+')
PARSER_400 = "<parser-400>"  # a parser's refusal: checked for the wire's shape (see the docstring)
BODY = json.dumps(A_BODY).encode()


def req(
    method: str, path: str, *, key: bool = False, body: bytes = b"", extra: str = "", version: str = "1.1"
) -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: 127.0.0.1"]
    lines += [f"x-api-key: {KEY}", "anthropic-version: 2023-06-01", "Content-Type: application/json"] if key else []
    lines += [f"Content-Length: {len(body)}"] if body else []
    lines += [line for line in extra.split("|") if line]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Answer(NamedTuple):
    status_line: str
    headers: dict[str, str]
    body: str


def _normal(value: bytes) -> str:
    return _LEASES.sub(b'"leases":N', _RID.sub(b"<id>", value)).decode("utf-8", "replace")


def read_answers(port: int, raw: bytes, count: int, closes: bool) -> tuple[list[Answer], bool]:
    """`count` answers (all of them up to the close when `closes`), and whether it closed; an
    answer to a HEAD request (by the request line it answers) is read without a body."""
    methods = [m.split(b" ", 1)[0] for m in re.findall(rb"(?:^|\r?\n\r?\n)([A-Z]+ )", raw)]
    answers: list[Answer] = []
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(raw)
        data, closed = b"", False

        def more() -> bool:
            nonlocal data, closed
            chunk = sock.recv(65536)
            if not chunk:
                closed = True
                return False
            data += chunk
            return True

        while len(answers) < count or (closes and not closed):
            while b"\r\n\r\n" not in data:
                if not more():
                    return answers, closed
            head, _, data = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if lines[0].startswith("HTTP/1.1 100 "):
                answers.append(Answer(lines[0], {}, ""))
                continue
            head_only = len(answers) < len(methods) and methods[len(answers)] == b"HEAD"
            body = b""
            if head_only:
                pass
            elif "content-length" in headers:
                length = int(headers["content-length"])
                while len(data) < length and more():
                    pass
                body, data = data[:length], data[length:]
            elif headers.get("transfer-encoding") == "chunked":
                while True:
                    while b"\r\n" not in data and more():
                        pass
                    size_line, _, data = data.partition(b"\r\n")
                    size = int(size_line, 16)
                    while len(data) < size + 2 and more():
                        pass
                    body, data = body + data[:size], data[size + 2 :]
                    if size == 0:
                        break
            for name in ("date", "server"):
                if name in headers:
                    headers[name] = "<present>"
            for name in ("request-id", "x-request-id"):
                if name in headers:
                    headers[name] = "<id>"
            if "x-leasehold-overhead-ms" in headers:
                headers["x-leasehold-overhead-ms"] = "<ms>"
            answers.append(Answer(lines[0], headers, _normal(body)))
        return answers, closed


@pytest.fixture(scope="module")
def key(gateway: Gateway) -> Iterator[str]:
    yield gateway.mint()["token"]


def _cases() -> list[tuple[str, bytes]]:
    chunked = (
        "POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: VKEY\r\nanthropic-version: 2023-06-01\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
    )
    half = len(BODY) // 2
    chunks = f"{half:x}\r\n".encode() + BODY[:half] + f"\r\n{len(BODY) - half:x}\r\n".encode() + BODY[half:]
    return [
        ("healthz", req("GET", "/healthz")),
        ("healthz, HEAD", req("HEAD", "/healthz")),
        ("healthz, HTTP/1.0", req("GET", "/healthz", version="1.0")),
        ("healthz, HTTP/1.0 keep-alive", req("GET", "/healthz", version="1.0", extra="Connection: keep-alive")),
        ("healthz, absolute-form", req("GET", "http://127.0.0.1/healthz")),
        ("healthz, Connection: close", req("GET", "/healthz", extra="Connection: close")),
        ("POST healthz", req("POST", "/healthz")),
        ("pipelined", req("GET", "/healthz") + req("HEAD", "/healthz") + req("GET", "/nope")),
        ("no key", req("POST", "/v1/messages", body=BODY)),
        ("no key, OpenAI path", req("POST", "/v1/chat/completions", body=b"{}")),
        ("an unknown key", req("POST", "/v1/messages", body=BODY, extra="x-api-key: lhgw_nope")),
        ("an unknown path, no key", req("GET", "/nope")),
        ("a path not served", req("POST", "/v1/nope", key=True, body=b"{}")),
        ("a body over the limit, declared", req("POST", "/v1/messages", key=True, extra="Content-Length: 99999999")),
        ("bad JSON", req("POST", "/v1/messages", key=True, body=b"{nope")),
        ("Expect: something-else", req("POST", "/v1/messages", key=True, body=BODY, extra="Expect: something-else")),
        ("Expect: 100-continue, no key", req("POST", "/v1/messages", extra="Content-Length: 2|Expect: 100-continue")),
        ("chunked body", (chunked + "\r\n").encode() + chunks + b"\r\n0\r\n\r\n"),
        ("a bad chunk", (chunked + "\r\nzz\r\n{}\r\n0\r\n\r\n").encode()),
        ("Content-Length and Transfer-Encoding", (chunked + "Content-Length: 2\r\n\r\n2\r\n{}\r\n0\r\n\r\n").encode()),
        ("two Content-Lengths", req("GET", "/healthz", extra="Content-Length: 2|Content-Length: 3") + b"{} "),
        ("not HTTP", b"GARBAGE\r\n\r\n"),
        ("HTTP/9.9", b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n"),
        ("bare LFs", b"GET /healthz HTTP/1.1\nHost: x\n\n"),
        ("a header over 32 KiB", req("GET", "/healthz", extra="X-Long: " + "a" * 40000)),
        ("a request line over 32 KiB", req("GET", "/healthz?" + "a" * 40000)),
        ("a 20 KiB header is served", req("GET", "/healthz", extra="X-Long: " + "a" * 20000)),
    ]


A = Answer
PRESENT = {"date": "<present>", "server": "<present>"}
HEALTH = '{"status":"ok","control":"synchronised","leases":N}'
HEALTH_HEADERS = {"cache-control": "no-store", "content-type": "application/json", "content-length": "51", **PRESENT}


def health(status_line: str = "HTTP/1.1 200 OK", body: str = HEALTH, **more: str) -> Answer:
    return A(status_line, {**HEALTH_HEADERS, **more}, body)


def refused(status_line: str, request_id: str, body: str, *, retry: bool = True, length: str = "") -> Answer:
    """A gateway-authored refusal: the request id header of its wire, the overhead figure,
    `x-should-retry: false` unless `retry`."""
    headers = {request_id: "<id>", "x-leasehold-overhead-ms": "<ms>"}
    headers |= {} if retry else {"x-should-retry": "false"}
    content_length = length or str(len(body.replace("<id>", "req_" + "0" * 26)))
    return A(
        status_line, {**headers, "content-type": "application/json", "content-length": content_length, **PRESENT}, body
    )


def unknown_key(request_id: str) -> Answer:
    if request_id == "request-id":
        body = (
            '{"type":"error","error":{"type":"authentication_error","message":"unknown, expired or revoked'
            ' virtual key","code":"unknown-key"},"request_id":"<id>"}'
        )
    else:
        body = (
            '{"error":{"message":"unknown, expired or revoked virtual key","type":"authentication_error",'
            '"param":null,"code":"unknown-key"}}'
        )
    return refused("HTTP/1.1 401 Unauthorized", request_id, body, retry=False)


PARSER = refused("HTTP/1.0 400 Bad Request", "x-request-id", PARSER_400, length="<n>")
MESSAGE = (
    '{"id":"<id>","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[{"type":"text",'
    '"text":"t0 t1 t2 "}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,'
    '"cache_creation_input_tokens":5,"cache_read_input_tokens":7,"output_tokens":3}}'
)
UPSTREAM_HEADERS = {"request-id": "<id>", "content-type": "application/json", "x-leasehold-overhead-ms": "<ms>"}


def anthropic_error(kind: str, message: str, code: str) -> str:
    return f'{{"type":"error","error":{{"type":"{kind}","message":"{message}","code":"{code}"}},"request_id":"<id>"}}'


# name: (the connection closes after, the answers); recorded on 9139513 (aiohttp's server)
EXPECTED: dict[str, tuple[bool, list[Answer]]] = {
    "healthz": (False, [health()]),
    "healthz, HEAD": (False, [health(body="")]),
    "healthz, HTTP/1.0": (True, [health("HTTP/1.0 200 OK")]),
    "healthz, HTTP/1.0 keep-alive": (False, [health("HTTP/1.0 200 OK", connection="keep-alive")]),
    "healthz, absolute-form": (False, [health()]),
    "healthz, Connection: close": (True, [health(connection="close")]),
    "POST healthz": (
        False,
        [
            A(
                "HTTP/1.1 405 Method Not Allowed",
                {"allow": "GET, HEAD", "content-type": "application/json", "content-length": "31", **PRESENT},
                '{"status":"method-not-allowed"}',
            )
        ],
    ),
    "pipelined": (False, [health(), health(body=""), unknown_key("x-request-id")]),
    "no key": (False, [unknown_key("request-id")]),
    "no key, OpenAI path": (False, [unknown_key("x-request-id")]),
    "an unknown key": (False, [unknown_key("request-id")]),
    "an unknown path, no key": (False, [unknown_key("x-request-id")]),
    "a path not served": (
        False,
        [
            refused(
                "HTTP/1.1 404 Not Found",
                "request-id",
                anthropic_error("not_found_error", "/v1/nope is not served on the anthropic wire", "path-not-served"),
            )
        ],
    ),
    "a body over the limit, declared": (
        True,
        [
            refused(
                "HTTP/1.1 413 Request Entity Too Large",
                "request-id",
                anthropic_error("request_too_large", "the body exceeds 33554432 bytes", "body-too-large"),
            )
        ],
    ),
    "bad JSON": (
        False,
        [
            refused(
                "HTTP/1.1 400 Bad Request",
                "request-id",
                anthropic_error(
                    "invalid_request_error",
                    "the request body is not strict JSON (JSON is malformed: object keys must be strings (byte 1))",
                    "invalid-request-body",
                ),
                retry=False,
            )
        ],
    ),
    "Expect: something-else": (
        False,
        [
            refused(
                "HTTP/1.1 417 Expectation Failed",
                "request-id",
                anthropic_error("api_error", "unknown expectation: Expect: something-else", "invalid-request"),
            )
        ],
    ),
    "Expect: 100-continue, no key": (False, [A("HTTP/1.1 100 Continue", {}, ""), unknown_key("request-id")]),
    "chunked body": (False, [A("HTTP/1.1 200 OK", {**UPSTREAM_HEADERS, "content-length": "292", **PRESENT}, MESSAGE)]),
    "a bad chunk": (True, [PARSER]),
    "Content-Length and Transfer-Encoding": (True, [PARSER]),
    "two Content-Lengths": (True, [PARSER]),
    "not HTTP": (True, [PARSER]),
    "HTTP/9.9": (True, [PARSER]),
    "bare LFs": (True, [PARSER]),
    "a header over 32 KiB": (True, [PARSER]),
    "a request line over 32 KiB": (True, [PARSER]),
    "a 20 KiB header is served": (False, [health()]),
}


@pytest.mark.parametrize("name, raw", _cases(), ids=[c[0] for c in _cases()])
def test_the_data_plane_answers_odd_requests_as_it_did_on_aiohttp(
    gateway: Gateway, clean_stub: Stub, key: str, name: str, raw: bytes
) -> None:
    closes, expected = EXPECTED[name]
    answers, closed = read_answers(
        gateway.dataplane_port, raw.replace(KEY.encode(), key.encode()), len(expected), closes
    )
    assert closed == closes
    assert len(answers) == len(expected), answers
    for got, want in zip(answers, expected, strict=True):
        if want.body == PARSER_400:  # the parser's refusal: the wire's shape, llhttp's reason
            assert {**got.headers, "content-length": "<n>"} == want.headers
            assert int(got.headers["content-length"]) == len(got.body.encode())
            error = json.loads(got.body)["error"]
            assert error["code"] == "invalid-request" and error["type"] == "invalid_request_error", error
            message = error["message"]
            assert message.startswith("the request could not be read as HTTP/1.1 (") and message.endswith(
                "; header lines are limited to 32768 bytes)"
            ), message
            assert "aaaa" not in message and "healthz" not in message and "zz" not in message  # never echoed
            assert got.status_line == want.status_line
        else:
            assert got == want
