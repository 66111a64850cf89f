"""The data plane's HTTP server (aiohttp's low-level server, no router): what the router did,
it still does — `Expect: 100-continue`, 417 for an unknown expectation, any path reaches the
proxy, the body limit — on a plain socket, byte for byte."""

from __future__ import annotations

import http.client
import json
import socket

from tests.support.attempts import A_BODY, read_until, settled
from tests.support.harness import Gateway, Stub


def _head(gw: Gateway, token: str, payload: bytes, extra: list[str], path: str = "/v1/messages") -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: 127.0.0.1",
        "Content-Type: application/json",
        "anthropic-version: 2023-06-01",
        f"x-api-key: {token}",
        f"Content-Length: {len(payload)}",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_expect_100_continue_is_answered_before_the_body(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    payload = json.dumps(A_BODY).encode()
    with socket.create_connection(("127.0.0.1", gateway.dataplane_port), timeout=10) as sock:
        sock.sendall(_head(gateway, minted["token"], payload, ["Expect: 100-continue"]))
        interim = read_until(sock, b"\r\n\r\n")
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), interim
        sock.sendall(payload)
        answer = read_until(sock, b"\r\n\r\n")
        assert answer.split(b"\r\n", 1)[0] == b"HTTP/1.1 200 OK", answer
    rows = settled(gateway, minted["key_id"])
    assert rows[0]["status"] == "completed" and rows[0]["http_status"] == 200


def test_an_unknown_expectation_is_refused_417(gateway: Gateway) -> None:
    minted = gateway.mint()
    payload = json.dumps(A_BODY).encode()
    with socket.create_connection(("127.0.0.1", gateway.dataplane_port), timeout=10) as sock:
        sock.sendall(_head(gateway, minted["token"], payload, ["Expect: something-else"]) + payload)
        head, body = _answer(sock)
    assert head.split(b"\r\n", 1)[0] == b"HTTP/1.1 417 Expectation Failed", head
    assert b"\r\nrequest-id: req_" in head.lower()  # the Anthropic wire (an x-api-key was sent)
    error = json.loads(body)
    assert error["type"] == "error" and error["error"]["code"] == "invalid-request", error
    assert "something-else" in error["error"]["message"]


def _answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """One answer with a Content-Length: (head, body)."""
    data = read_until(sock, b"\r\n\r\n")
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


def test_a_header_line_past_the_limit_is_refused_in_the_wire_shape(gateway: Gateway, clean_stub: Stub) -> None:
    """SPEC §15 accepts header lines up to 16 KiB; past the parser's 32 KiB limit the answer is
    still a gateway-authored error in the wire's shape (not aiohttp's plain text), the
    connection is closed, nothing reaches the upstream, and nothing of the header is echoed."""
    minted = gateway.mint()
    payload = json.dumps(A_BODY).encode()
    huge = "x-huge: " + "lhgw_" + "q" * (40 * 1024)
    with socket.create_connection(("127.0.0.1", gateway.dataplane_port), timeout=10) as sock:
        sock.sendall(_head(gateway, minted["token"], payload, [huge]) + payload)
        answer = b""
        while chunk := sock.recv(65536):  # the gateway closes after answering
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n", 1)[0].split(b" ", 1)[1] == b"400 Bad Request", answer[:300]  # HTTP/1.0: unparsed
    assert b"content-type: application/json" in head.lower()
    assert b"x-request-id: req_" in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "invalid-request" and "32768" in error["message"], error
    assert b"qqqq" not in answer and minted["token"].encode() not in answer
    assert clean_stub.requests() == []


def test_any_path_reaches_the_proxy(gateway: Gateway) -> None:
    """No route table: an odd path is the proxy's to refuse (in the wire's shape), not a 404."""
    minted = gateway.mint()
    payload = json.dumps(A_BODY).encode()
    with socket.create_connection(("127.0.0.1", gateway.dataplane_port), timeout=10) as sock:
        sock.sendall(_head(gateway, minted["token"], payload, [], path="/v1/not/a/path") + payload)
        answer = read_until(sock, b"}")
        assert answer.split(b"\r\n", 1)[0].startswith(b"HTTP/1.1 404"), answer
        assert b"path-not-served" in answer


def test_a_chunked_body_past_aiohttp_default_limit_is_relayed(gateway: Gateway, clean_stub: Stub) -> None:
    """The body ceiling is GATEWAY_MAX_BODY_BYTES (32 MiB by default), not aiohttp's 1 MiB."""
    minted = gateway.mint()
    body = {**A_BODY, "messages": [{"role": "user", "content": "x" * (3 * 1024 * 1024 // 2)}]}
    payload = json.dumps(body).encode()
    conn = http.client.HTTPConnection("127.0.0.1", gateway.dataplane_port, timeout=20)
    conn.request(
        "POST",
        "/v1/messages",
        iter([payload[i : i + 65536] for i in range(0, len(payload), 65536)]),
        {"Content-Type": "application/json", "anthropic-version": "2023-06-01", "x-api-key": minted["token"]},
        encode_chunked=True,
    )
    response = conn.getresponse()
    response.read()
    conn.close()
    assert response.status == 200
    rows = settled(gateway, minted["key_id"])
    assert rows[0]["status"] == "completed"
