"""What control answers to odd requests, on the wire, is what it answered on aiohttp.

Each case was sent as raw bytes to control built from the commit before `shared.http1` (on
aiohttp) and to this one: the status line, the headers that matter (Content-Type, Allow,
WWW-Authenticate, Connection, Content-Length) and the body are those recorded there. Two answers
differ on purpose: what the parser refuses is a 400 in the same shape (HTTP/1.0 status line,
`text/plain; charset=utf-8`, then a close) whose text names the fault without echoing the
request's bytes back; and an unauthenticated `Expect: 100-continue` gets its 401 with no
`100 Continue` before it (SPEC §13: no body is asked for before auth).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.support.harness import Gateway

READ, MINT = "r" * 40, "m" * 40
UNAUTH = b'{"error":{"code":"unauthenticated","message":"a valid bearer token is required"}}'
NOT_FOUND, NOT_ALLOWED = b"404: Not Found", b"405: Method Not Allowed"
TEXT, JSON = "text/plain; charset=utf-8", "application/json"
HEALTH = b'{"status":"ok","dataplane_connected":false,"dataplane_pid":null,"ledger_ok":true}'
CHALLENGE = {"www-authenticate": 'Bearer realm="leasehold"', "connection": "close"}


def req(
    method: str, path: str, token: str | None = None, body: bytes = b"", extra: str = "", version: str = "1.1"
) -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: 127.0.0.1"]
    lines += [f"Authorization: Bearer {token}"] if token else []
    lines += [f"Content-Length: {len(body)}"] if body else []
    lines += [line for line in extra.split("|") if line]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Case(NamedTuple):
    name: str
    raw: bytes  # "ADMIN" stands for the control token
    status_line: str
    headers: dict[str, str]
    body: bytes | None  # None: a parser's 400, whose text is checked for shape only


A = "ADMIN"
BIG = b"{" + b" " * (2 * 1024 * 1024) + b"}"
CHUNKED = f"POST /control/v2/mint HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {A}\r\nTransfer-Encoding: chunked\r\n"
CASES = [
    Case("unknown public path", req("GET", "/nope"), "HTTP/1.1 404 Not Found", {"content-type": TEXT}, NOT_FOUND),
    Case(
        "unknown /control path, no token",
        req("GET", "/control/nope"),
        "HTTP/1.1 401 Unauthorized",
        {"content-type": JSON, **CHALLENGE},
        UNAUTH,
    ),
    Case(
        "unknown /control path",
        req("GET", "/control/nope", A),
        "HTTP/1.1 404 Not Found",
        {"content-type": TEXT},
        NOT_FOUND,
    ),
    Case("healthz", req("GET", "/healthz"), "HTTP/1.1 200 OK", {"content-type": JSON}, HEALTH),
    Case("healthz, HTTP/1.0", req("GET", "/healthz", version="1.0"), "HTTP/1.0 200 OK", {"content-type": JSON}, HEALTH),
    Case("healthz, percent-encoded", req("GET", "/heal%74hz"), "HTTP/1.1 200 OK", {}, HEALTH),
    Case("healthz, absolute-form", req("GET", "http://127.0.0.1/healthz"), "HTTP/1.1 200 OK", {}, HEALTH),
    Case("healthz, odd query", req("GET", "/healthz?x=%ZZ&y"), "HTTP/1.1 200 OK", {}, HEALTH),
    Case("healthz/", req("GET", "/healthz/"), "HTTP/1.1 404 Not Found", {}, NOT_FOUND),
    Case("//healthz", req("GET", "//healthz"), "HTTP/1.1 404 Not Found", {}, NOT_FOUND),
    Case(
        "POST healthz",
        req("POST", "/healthz"),
        "HTTP/1.1 405 Method Not Allowed",
        {"allow": "GET,HEAD", "content-type": TEXT},
        NOT_ALLOWED,
    ),
    Case(
        "OPTIONS healthz",
        req("OPTIONS", "/healthz"),
        "HTTP/1.1 405 Method Not Allowed",
        {"allow": "GET,HEAD"},
        NOT_ALLOWED,
    ),
    Case(
        "DELETE events, no token", req("DELETE", "/control/v2/events"), "HTTP/1.1 401 Unauthorized", CHALLENGE, UNAUTH
    ),
    Case(
        "DELETE events",
        req("DELETE", "/control/v2/events", A),
        "HTTP/1.1 405 Method Not Allowed",
        {"allow": "GET,HEAD"},
        NOT_ALLOWED,
    ),
    Case(
        "GET mint", req("GET", "/control/v2/mint", A), "HTTP/1.1 405 Method Not Allowed", {"allow": "POST"}, NOT_ALLOWED
    ),
    Case(
        "DELETE policy level",
        req("DELETE", "/control/v2/policy/level", A),
        "HTTP/1.1 405 Method Not Allowed",
        {"allow": "GET,HEAD,PUT"},
        NOT_ALLOWED,
    ),
    Case("mint, no token", req("POST", "/control/v2/mint", body=b"{}"), "HTTP/1.1 401 Unauthorized", CHALLENGE, UNAUTH),
    Case(
        "mint, a wrong token",
        req("POST", "/control/v2/mint", "x" * 40, body=b"{}"),
        "HTTP/1.1 401 Unauthorized",
        CHALLENGE,
        UNAUTH,
    ),
    Case(
        "mint, the read token",
        req("POST", "/control/v2/mint", READ, body=b"{}"),
        "HTTP/1.1 403 Forbidden",
        {"connection": "close", "content-type": JSON},
        b'{"error":{"code":"forbidden-scope","message":"this route needs scope mint; the token grants read"}}',
    ),
    Case(
        "mint, bad JSON",
        req("POST", "/control/v2/mint", A, body=b"{nope", extra="Content-Type: application/json"),
        "HTTP/1.1 422 Unprocessable Entity",
        {"content-type": JSON},
        b'{"error":{"code":"invalid-request","message":"the body is not valid JSON"}}',
    ),
    Case(
        "mint, text/plain",
        req("POST", "/control/v2/mint", A, body=b"{}", extra="Content-Type: text/plain"),
        "HTTP/1.1 415 Unsupported Media Type",
        {"content-type": JSON},
        b'{"error":{"code":"invalid-request","message":"the body must be application/json"}}',
    ),
    Case(
        "mint, no Content-Type",
        req("POST", "/control/v2/mint", A, body=b"{}"),
        "HTTP/1.1 415 Unsupported Media Type",
        {},
        b'{"error":{"code":"invalid-request","message":"the body must be application/json"}}',
    ),
    Case(
        "mint, JSON with a charset",
        req("POST", "/control/v2/mint", A, body=b"{}", extra="Content-Type: application/json; charset=utf-8"),
        "HTTP/1.1 422 Unprocessable Entity",
        {},
        b'{"error":{"code":"invalid-request","message":"invalid body: Object missing required field `dispatch_id`"}}',
    ),
    Case(
        "mint, a 2 MiB body",
        req("POST", "/control/v2/mint", A, body=BIG, extra="Content-Type: application/json"),
        "HTTP/1.1 413 Request Entity Too Large",
        {"content-type": TEXT},
        b"Maximum request body size 1048576 exceeded.",
    ),
    Case(
        "mint, a 2 MiB body, no token",
        req("POST", "/control/v2/mint", body=BIG),
        "HTTP/1.1 401 Unauthorized",
        CHALLENGE,
        UNAUTH,
    ),
    Case(
        "mint, chunked",
        (CHUNKED + "Content-Type: application/json\r\n\r\n3\r\n{no\r\n0\r\n\r\n").encode(),
        "HTTP/1.1 422 Unprocessable Entity",
        {},
        b'{"error":{"code":"invalid-request","message":"the body is not valid JSON"}}',
    ),
    Case(
        "mint, a bad chunk",
        (CHUNKED + "\r\nzz\r\n{}\r\n0\r\n\r\n").encode(),
        "HTTP/1.0 400 Bad Request",
        {"content-type": TEXT},
        None,
    ),
    Case(
        "Content-Length and Transfer-Encoding",
        (CHUNKED + "Content-Length: 2\r\n\r\n2\r\n{}\r\n0\r\n\r\n").encode(),
        "HTTP/1.0 400 Bad Request",
        {"content-type": TEXT},
        None,
    ),
    Case(
        "two Content-Lengths",
        req("POST", "/control/v2/mint", A, extra="Content-Length: 2|Content-Length: 3") + b"{} ",
        "HTTP/1.0 400 Bad Request",
        {},
        None,
    ),
    Case(
        "Expect: 100-continue, no token",
        req("POST", "/control/v2/mint", extra="Content-Length: 2|Expect: 100-continue|Content-Type: application/json"),
        "HTTP/1.1 401 Unauthorized",
        CHALLENGE,
        UNAUTH,
    ),
    Case("not HTTP", b"GARBAGE\r\n\r\n", "HTTP/1.0 400 Bad Request", {"content-type": TEXT}, None),
    Case("HTTP/9.9", b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n", "HTTP/1.0 400 Bad Request", {}, None),
    Case("a request line over 8190 bytes", req("GET", "/healthz?" + "a" * 9000), "HTTP/1.0 400 Bad Request", {}, None),
    Case(
        "a header over 8190 bytes",
        req("GET", "/healthz", extra="X-Long: " + "a" * 9000),
        "HTTP/1.0 400 Bad Request",
        {},
        None,
    ),
    Case(
        "200 headers",
        req("GET", "/healthz", extra="|".join(f"X-H{i}: v" for i in range(200))),
        "HTTP/1.0 400 Bad Request",
        {},
        None,
    ),
    Case("a space before a colon", b"GET /healthz HTTP/1.1\r\nHost : x\r\n\r\n", "HTTP/1.0 400 Bad Request", {}, None),
    Case("bare LFs", b"GET /healthz HTTP/1.1\nHost: x\n\n", "HTTP/1.0 400 Bad Request", {}, None),
    Case(
        "a missing dashboard asset",
        req("GET", "/dashboard/nope.js"),
        "HTTP/1.1 404 Not Found",
        {"content-type": TEXT},
        NOT_FOUND,
    ),
    Case(
        "revoke a malformed key id",
        req("DELETE", "/control/v1/keys/a%20b", A),
        "HTTP/1.1 422 Unprocessable Entity",
        {},
        b'{"error":{"code":"invalid-request","message":"key_id must be a ULID"}}',
    ),
    Case(
        "renew, no body",
        req("POST", "/control/v2/keys/k_x/renew", A),
        "HTTP/1.1 422 Unprocessable Entity",
        {},
        b'{"error":{"code":"invalid-request","message":"key_id must be a ULID"}}',
    ),
    Case(
        "a query integer out of shape",
        req("GET", "/control/v2/routes/recent?limit=abc", A),
        "HTTP/1.1 422 Unprocessable Entity",
        {},
        b'{"error":{"code":"invalid-request","message":"limit must be an integer in 1..200","param":"limit","min":1,"max":200}}',
    ),
    Case("metrics, no token", req("GET", "/metrics"), "HTTP/1.1 401 Unauthorized", CHALLENGE, UNAUTH),
    Case(
        "HTTP/1.0 keep-alive",
        req("GET", "/healthz", version="1.0", extra="Connection: keep-alive"),
        "HTTP/1.0 200 OK",
        {"connection": "keep-alive"},
        HEALTH,
    ),
]


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = Gateway(
        Path(tmp_path_factory.mktemp("answers")), None, {"GATEWAY_READ_TOKEN": READ, "GATEWAY_MINT_TOKEN": MINT}
    )
    gw.start_control()
    yield gw
    gw.stop()


def answer_to(port: int, raw: bytes) -> tuple[str, dict[str, str], bytes, bytes]:
    """The first response (status line, lower-cased headers, body) and what followed it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            assert chunk, rest
            rest += chunk
        return lines[0], headers, rest[:length], rest[length:]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_control_answers_odd_requests_as_it_did_on_aiohttp(control: Gateway, case: Case) -> None:
    status_line, headers, body, after = answer_to(
        control.control_port, case.raw.replace(b"ADMIN", control.control_token.encode())
    )
    assert status_line == case.status_line and b"100 Continue" not in after
    assert {k: headers.get(k) for k in case.headers} == case.headers
    assert headers["content-length"] == str(len(body)) and "date" in headers and "server" in headers
    if case.body is not None:
        assert body == case.body
    else:  # the parser's refusal: its reason, never the request's bytes echoed back
        assert headers["content-type"] == TEXT and body and b"healthz" not in body and b"aaaa" not in body


def test_head_answers_gets_head_without_a_body(control: Gateway) -> None:
    for path, content_type in (("/healthz", JSON), ("/dashboard", "text/html; charset=utf-8")):
        with socket.create_connection(("127.0.0.1", control.control_port), timeout=10) as sock:
            sock.sendall(req("HEAD", path) + req("GET", "/healthz", extra="Connection: close"))
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and f"Content-Type: {content_type}".encode() in head
        assert rest.startswith(b"HTTP/1.1 200 OK")  # the HEAD's answer carried no body
        assert rest.endswith(HEALTH)


def _refused_on_metrics(control: Gateway) -> dict[str, float]:
    _, _, body, _ = answer_to(control.control_port, req("GET", "/metrics", control.control_token))
    counts = {}
    for line in body.decode().splitlines():
        if line.startswith("leasehold_control_http_refused_total{"):
            name, _, value = line.rpartition(" ")
            counts[name.split('reason="')[1].split('"')[0]] = float(value)
    return counts


def test_each_refusal_is_counted_on_metrics_and_the_server_goes_on(control: Gateway) -> None:
    before = _refused_on_metrics(control)
    assert before and set(before) >= {"bad-request", "line-too-long", "head-timeout"}  # every reason, from 0
    both = b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
    long_line = req("GET", "/healthz?" + "a" * 9000)
    for raw in (both, long_line, long_line):
        status_line, _, _, _ = answer_to(control.control_port, raw)
        assert status_line.startswith("HTTP/1.0 400")
    after = _refused_on_metrics(control)
    assert after["bad-request"] == before["bad-request"] + 1
    assert after["line-too-long"] == before["line-too-long"] + 2
    assert answer_to(control.control_port, req("GET", "/healthz"))[0] == "HTTP/1.1 200 OK"
