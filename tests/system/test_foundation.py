"""One request through every room: SDK → data plane → stub → ledger → routes view."""

from __future__ import annotations

import socket
import time

import anthropic
import pytest

from tests.support.harness import Gateway, Stub, http
from tests.support.stub_upstream import (
    STUB_CACHE_CREATION_INPUT_TOKENS,
    STUB_CACHE_READ_INPUT_TOKENS,
    STUB_INPUT_TOKENS,
    stub_text,
)
from tests.support.waits import wait_until

MODEL = "claude-sonnet-4-6"
USAGE = {
    "input_tokens": STUB_INPUT_TOKENS,
    "output_tokens": 3,
    "cache_read_tokens": STUB_CACHE_READ_INPUT_TOKENS,
    "cache_creation_tokens": STUB_CACHE_CREATION_INPUT_TOKENS,
}


def client(gw: Gateway, token: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.dataplane_url, api_key=token, max_retries=0)


def rows_for(gw: Gateway, key_id: str) -> list[dict]:
    return [r for r in gw.ledger() if r["key_id"] == key_id]


def test_sdk_non_streaming_and_streaming_each_leave_one_row(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    sdk = client(gateway, minted["token"])
    message = sdk.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert message.content[0].text == stub_text()
    with sdk.messages.stream(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}]) as stream:
        assert stream.get_final_text() == stub_text()

    rows = wait_until(
        lambda: len(rows_for(gateway, minted["key_id"])) == 2 and rows_for(gateway, minted["key_id"]),
        10,
        "two ledger rows",
    )
    assert [r["stream"] for r in rows] == [False, True]
    for row in rows:
        assert row["status"] == "completed" and row["http_status"] == 200
        assert row["usage"] == USAGE
        assert row["served_model"] == MODEL and row["account_id"] == "legacy-anthropic"
        assert row["cost_reason"] == "priced" and row["cost_usd"] > 0
    recent = [r for r in gateway.recent()["routes"] if r["key_id"] == minted["key_id"]]
    assert sorted(r["attempt_id"] for r in recent) == sorted(r["attempt_id"] for r in rows)
    assert all(r["usage"] == USAGE for r in recent)
    assert gateway.active()["count"] == 0

    seen = clean_stub.requests()
    assert [r["headers"].get("x-api-key") for r in seen] == [clean_stub.anthropic_key] * 2
    assert all("authorization" not in r["headers"] for r in seen)


@pytest.mark.parametrize("kind", ["unknown", "revoked", "malformed"])
def test_refused_key_gets_401_in_anthropic_shape_and_never_reaches_upstream(
    gateway: Gateway, clean_stub: Stub, kind: str
) -> None:
    if kind == "unknown":
        token = "lhgw_01J00000000000000000000000.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    elif kind == "malformed":
        token = "not-a-token"
    else:
        minted = gateway.mint()
        assert gateway.revoke(minted["key_id"]) is True
        assert gateway.revoke(minted["key_id"]) is False  # idempotent
        token = minted["token"]
    status, headers, body = http(
        "POST",
        gateway.dataplane_url + "/v1/messages",
        {"model": MODEL, "max_tokens": 5, "messages": []},
        {"x-api-key": token, "anthropic-version": "2023-06-01"},
    )
    assert status == 401
    assert headers["x-should-retry"] == "false"
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert body["error"]["code"] == "unknown-key"
    assert headers["request-id"] == body["request_id"]
    assert clean_stub.requests() == []
    assert token not in gateway.logs()


def test_control_refuses_without_bearer_before_reading_the_body(gateway: Gateway) -> None:
    """Headers announce 10 MB; none of it is sent, yet the 401 arrives."""
    with socket.create_connection(("127.0.0.1", gateway.control_port), timeout=5) as sock:
        sock.sendall(
            b"POST /control/v1/keys HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10000000\r\n\r\n"
        )
        answer = sock.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 401"), answer
    assert '"unauthenticated"' in answer or "unauthenticated" in answer
    status, _, _ = gateway.api("GET", "/control/v2/routes/recent", token="wrong-token-value")
    assert status == 401


def test_control_loss_fails_closed_and_restart_restores_service(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway().start()
    minted = gw.mint()
    sdk = client(gw, minted["token"])
    sdk.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "a"}])

    gw.control.kill()

    def refused() -> bool:
        status, headers, body = http(
            "POST",
            gw.dataplane_url + "/v1/messages",
            {"model": MODEL, "max_tokens": 5, "messages": []},
            {"x-api-key": minted["token"]},
        )
        return status == 503 and body["error"]["code"] == "control-unavailable" and headers.get("retry-after") == "1"

    wait_until(refused, 10, "503 control-unavailable")

    gw.start_control()
    gw.wait_synchronised()
    message = sdk.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "b"}])
    assert message.content[0].text == stub_text()
    rows = gw.wait_rows(2)
    assert len({r["attempt_id"] for r in rows}) == len(rows) == 2


def test_upstream_error_row_is_recorded_before_the_worker_sees_it(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    sdk = client(gateway, minted["token"])
    with pytest.raises(anthropic.RateLimitError) as caught:
        sdk.messages.create(
            model=MODEL,
            max_tokens=5,
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"x-stub-step": '{"status": 429, "headers": {"retry-after": "7"}}'},
        )
    assert caught.value.response.headers["retry-after"] == "7"
    # No wait: the row was acknowledged by control before the 429 was returned.
    rows = [r for r in gateway.recent()["routes"] if r["key_id"] == minted["key_id"]]
    assert len(rows) == 1
    assert rows[0]["status"] == "upstream-error" and rows[0]["condition"] == "rate-limited"


def test_cut_stream_reaches_the_client_as_broken(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    sdk = client(gateway, minted["token"])
    started = time.monotonic()
    with pytest.raises(anthropic.APIStatusError):  # the SDK raises the gateway's error event
        with sdk.messages.stream(
            model=MODEL,
            max_tokens=5,
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"x-stub-step": '{"cut_after_events": 4}'},
        ) as stream:
            stream.get_final_text()
    assert time.monotonic() - started < 30
    rows = wait_until(lambda: rows_for(gateway, minted["key_id"]), 10, "row of the cut stream")
    assert rows[0]["status"] == "transport-error" and rows[0]["condition"] == "transport-error"
    assert rows[0]["usage"]["input_tokens"] == STUB_INPUT_TOKENS
