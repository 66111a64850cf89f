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
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
             "anthropic-version: 2023-06-01", f"x-api-key: {token}", f"Content-Length: {len(payload)}",
             *extra]
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
        answer = read_until(sock, b"\r\n\r\n")
        assert answer.split(b"\r\n", 1)[0] == b"HTTP/1.1 417 Expectation Failed", answer


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
    conn.request("POST", "/v1/messages", iter([payload[i:i + 65536] for i in range(0, len(payload), 65536)]),
                 {"Content-Type": "application/json", "anthropic-version": "2023-06-01",
                  "x-api-key": minted["token"]}, encode_chunked=True)
    response = conn.getresponse()
    response.read()
    conn.close()
    assert response.status == 200
    rows = settled(gateway, minted["key_id"])
    assert rows[0]["status"] == "completed"
