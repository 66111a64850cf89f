"""Checks the data plane tests share: one terminal row per attempt, nothing left in flight.

Every wait is on a condition with a deadline (`wait_until`), never a bare sleep.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import anthropic
import openai

from tests.support.harness import Gateway, Stub
from tests.support.waits import wait_until

A_MODEL = "claude-sonnet-4-6"
O_MODEL = "gpt-5"
MESSAGES = [{"role": "user", "content": "hi"}]
A_BODY = {"model": A_MODEL, "max_tokens": 16, "messages": MESSAGES}
A_HEADERS = {"anthropic-version": "2023-06-01", "content-type": "application/json"}


def step(**fields: Any) -> dict[str, str]:
    """The `x-stub-step` header scripting one answer of the stub."""
    return {"x-stub-step": json.dumps(fields)}


def anthropic_sdk(gw: Gateway, token: str, **kwargs: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.dataplane_url, api_key=token, max_retries=0, **kwargs)


def openai_sdk(gw: Gateway, token: str, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.dataplane_url + "/v1", api_key=token, max_retries=0, **kwargs)


def rows_for(gw: Gateway, key_id: str) -> list[dict[str, Any]]:
    return [r for r in gw.ledger() if r["key_id"] == key_id]


def active_for(gw: Gateway, key_id: str) -> list[dict[str, Any]]:
    return [r for r in gw.active()["routes"] if r["key_id"] == key_id]


def settled(gw: Gateway, key_id: str, count: int = 1, timeout_s: float = 10) -> list[dict[str, Any]]:
    """Wait until the key has `count` terminal rows and nothing in flight; return the rows.

    Asserts there is exactly `count` rows (no attempt ended twice) and that control's active
    routes no longer hold any of the key's attempts.
    """

    def done() -> list[dict[str, Any]] | None:
        rows = rows_for(gw, key_id)
        return rows if len(rows) >= count and not active_for(gw, key_id) else None

    rows = wait_until(done, timeout_s, f"{count} terminal row(s) for {key_id} and none active")
    assert len(rows) == count, rows
    assert len({r["attempt_id"] for r in rows}) == count, rows
    return rows


def one_row(gw: Gateway, key_id: str, timeout_s: float = 10) -> dict[str, Any]:
    return settled(gw, key_id, 1, timeout_s)[0]


def stub_entry(
    stub: Stub, predicate: Any = None, timeout_s: float = 10, what: str = "the stub's record"
) -> dict[str, Any]:
    """The newest stub request record matching `predicate` (waits until one does)."""

    def find() -> dict[str, Any] | None:
        for entry in reversed(stub.requests()):
            if predicate is None or predicate(entry):
                return entry
        return None

    return wait_until(find, timeout_s, what)


def assert_swapped(entry: dict[str, Any], token: str, header: str, credential: str) -> None:
    """The stub saw the account credential in `header` and no trace of the virtual key."""
    headers = entry["headers"]
    expected = credential if header == "x-api-key" else f"Bearer {credential}"
    assert headers.get(header) == expected, headers
    other = "authorization" if header == "x-api-key" else "x-api-key"
    assert other not in headers, headers
    assert not any(token in v or "lhgw_" in v for v in headers.values()), headers


def send_raw(gw: Gateway, body: dict, headers: dict[str, str], path: str = "/v1/messages") -> socket.socket:
    """Send one request on a plain socket (the test decides when the worker goes away)."""
    payload = json.dumps(body).encode()
    head = [
        f"POST {path} HTTP/1.1",
        "Host: 127.0.0.1",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    sock = socket.create_connection(("127.0.0.1", gw.dataplane_port), timeout=10)
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    got = b""
    deadline = time.monotonic() + 10
    while marker not in got:
        assert time.monotonic() < deadline, got
        chunk = sock.recv(65536)
        assert chunk, got
        got += chunk
    return got
