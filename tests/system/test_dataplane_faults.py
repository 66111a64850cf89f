"""Faults (issue 3 items 6 and 7): each ends in the right answer, exactly one terminal row, and
nothing left in flight — client aborts, resets, stalls, timeouts, malformed answers, limits."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator

import anthropic
import pytest

from tests.support.attempts import (
    A_BODY,
    A_HEADERS,
    A_MODEL,
    MESSAGES,
    anthropic_sdk,
    one_row,
    read_until,
    send_raw,
    settled,
    step,
    stub_entry,
)
from tests.support.harness import Gateway, Stub, free_port
from tests.support.harness import http as call
from tests.support.stub_upstream import (
    STUB_CACHE_CREATION_INPUT_TOKENS,
    STUB_CACHE_READ_INPUT_TOKENS,
    STUB_INPUT_TOKENS,
    stub_text,
)
from tests.support.waits import wait_until

A_STARTED_USAGE = {
    "input_tokens": STUB_INPUT_TOKENS,
    "output_tokens": 1,
    "cache_read_tokens": STUB_CACHE_READ_INPUT_TOKENS,
    "cache_creation_tokens": STUB_CACHE_CREATION_INPUT_TOKENS,
}
MAX_BODY = 4096


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory, stub: Stub) -> Iterator[Gateway]:
    """Small timeouts and body ceiling; the zai-harness account points at a closed port."""
    gw = Gateway(
        tmp_path_factory.mktemp("tight"),
        stub,
        {
            "GATEWAY_UPSTREAM_IDLE_TIMEOUT": "0.5",
            "GATEWAY_UPSTREAM_HEADERS_TIMEOUT": "1",
            "GATEWAY_MAX_BODY_BYTES": str(MAX_BODY),
            "GATEWAY_ZAI_BASE_URL": f"http://127.0.0.1:{free_port()}",
        },
    ).start()
    yield gw
    gw.stop()


def wire_error(body: dict, code: str) -> None:
    assert body["type"] == "error" and body["error"]["code"] == code, body


# ---- client aborts (item 6) -----------------------------------------------------------------


def test_client_gone_before_the_first_upstream_byte(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    sock = send_raw(
        gateway, {**A_BODY, "stream": True}, {"x-api-key": minted["token"], **step(stall_before_headers_s=20)}
    )
    stub_entry(clean_stub, lambda e: e["outcome"] is None, what="the request at the stub")
    sock.close()
    entry = stub_entry(clean_stub, lambda e: e["outcome"] == "client-gone", what="the upstream request cancelled")
    assert entry["events_sent"] == 0
    row = one_row(gateway, minted["key_id"])
    assert (row["status"], row["condition"], row["http_status"], row["usage"]) == ("client-aborted", None, None, None)
    assert row["refusal_reason"] is None


def test_client_gone_mid_stream_is_billed_for_what_was_delivered(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    sock = send_raw(
        gateway,
        {**A_BODY, "stream": True},
        {"x-api-key": minted["token"], **step(deltas=40, stall_between_events_s=0.1)},
    )
    read_until(sock, b"content_block_delta")
    sock.close()
    entry = stub_entry(clean_stub, lambda e: e["outcome"] == "client-gone", what="the upstream stream cancelled")
    assert entry["events_sent"] < 46
    row = one_row(gateway, minted["key_id"])
    assert (row["status"], row["condition"], row["http_status"]) == ("client-aborted", None, 200)
    assert row["usage"] == A_STARTED_USAGE and row["served_model"] == A_MODEL


def test_worker_timeout_on_a_non_streaming_call_is_a_client_abort(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    sdk = anthropic_sdk(gateway, minted["token"], timeout=0.5)
    with pytest.raises(anthropic.APITimeoutError):
        sdk.messages.create(model=A_MODEL, max_tokens=5, messages=MESSAGES, extra_headers=step(delay_s=20))
    stub_entry(clean_stub, lambda e: e["outcome"] == "client-gone", what="the upstream request cancelled")
    row = one_row(gateway, minted["key_id"])
    assert (row["status"], row["condition"], row["stream"]) == ("client-aborted", None, False)


# ---- upstream faults (item 6) ---------------------------------------------------------------


def test_reset_before_headers_is_502_in_the_wire_shape(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    status, headers, body = call(
        "POST",
        gateway.dataplane_url + "/v1/messages",
        A_BODY,
        {**A_HEADERS, "x-api-key": minted["token"], **step(reset=True)},
    )
    assert status == 502
    wire_error(body, "upstream-unreachable")
    row = one_row(gateway, minted["key_id"])
    assert headers["request-id"] == row["attempt_id"] and "x-leasehold-overhead-ms" in headers
    assert (row["status"], row["condition"], row["http_status"]) == ("transport-error", "transport-error", 502)
    assert row["first_byte_ms"] is None  # SPEC §14: no response byte came


def test_reset_mid_stream_cuts_the_stream(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    sock = send_raw(gateway, {**A_BODY, "stream": True}, {"x-api-key": minted["token"], **step(reset_after_events=4)})
    got = read_until(sock, b"event: error\n")
    rest = b""
    while chunk := sock.recv(65536):
        rest += chunk
    sock.close()
    assert b"0\r\n\r\n" not in got + rest  # never the chunked terminator
    row = one_row(gateway, minted["key_id"])
    assert (row["status"], row["condition"], row["http_status"]) == ("transport-error", "transport-error", 200)
    assert row["usage"] == A_STARTED_USAGE


def test_a_sized_answer_cut_before_its_body_sends_the_worker_nothing_to_mistake(
    gateway: Gateway, clean_stub: Stub
) -> None:
    """A length-delimited answer's headers leave with its first body byte (one write for a JSON
    answer). When the upstream closes before any body byte, the worker gets no status line at
    all — a closed connection, which every client retries — never headers promising a body."""
    minted = gateway.mint()
    raw = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    sock = send_raw(gateway, A_BODY, {"x-api-key": minted["token"], **step(raw_response=raw)})
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    sock.close()
    assert got == b""
    row = one_row(gateway, minted["key_id"])
    assert (row["status"], row["condition"]) == ("transport-error", "transport-error")
    assert row["usage"] is None


@pytest.mark.parametrize(
    "raw",
    [
        "HTTP/1.1 999 Nope\r\ncontent-length: 0\r\n\r\n",
        "HTTP/1.1 20x Nope\r\ncontent-length: 0\r\n\r\n",
        "HTTX/9 200 OK\r\n\r\n",
    ],
)
def test_malformed_status_line_is_502_in_the_wire_shape(gateway: Gateway, clean_stub: Stub, raw: str) -> None:
    minted = gateway.mint("openai")
    status, headers, body = call(
        "POST",
        gateway.dataplane_url + "/v1/chat/completions",
        {"model": "gpt-5", "messages": MESSAGES},
        {"authorization": f"Bearer {minted['token']}", **step(raw_response=raw)},
    )
    assert status == 502
    assert set(body) == {"error"} and body["error"]["code"] in ("upstream-protocol-error", "upstream-unreachable")
    row = one_row(gateway, minted["key_id"])
    assert headers["x-request-id"] == row["attempt_id"]
    assert (row["status"], row["condition"], row["http_status"]) == ("transport-error", "transport-error", 502)


def test_999_status_is_named_a_protocol_error(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    status, _, body = call(
        "POST",
        gateway.dataplane_url + "/v1/messages",
        A_BODY,
        {
            **A_HEADERS,
            "x-api-key": minted["token"],
            **step(raw_response="HTTP/1.1 999 Nope\r\ncontent-length: 0\r\n\r\n"),
        },
    )
    assert status == 502
    wire_error(body, "upstream-protocol-error")
    one_row(gateway, minted["key_id"])


def test_stall_past_the_idle_timeout_cuts_the_stream(tight: Gateway, clean_stub: Stub) -> None:
    minted = tight.mint()
    started = time.monotonic()
    sock = send_raw(
        tight, {**A_BODY, "stream": True}, {"x-api-key": minted["token"], **step(stall_after_events=4, stall_s=20)}
    )
    got = read_until(sock, b"event: error\n")
    while chunk := sock.recv(65536):
        got += chunk
    sock.close()
    assert time.monotonic() - started < 5
    assert b"content_block_delta" in got and b"message_stop" not in got and b"0\r\n\r\n" not in got
    stub_entry(clean_stub, lambda e: e["outcome"] == "client-gone", what="the stalled upstream cancelled")
    row = one_row(tight, minted["key_id"])
    assert (row["status"], row["condition"], row["http_status"]) == ("transport-error", "transport-error", 200)
    assert row["usage"] == A_STARTED_USAGE


def test_idle_gaps_below_the_idle_timeout_never_end_a_stream(tight: Gateway, clean_stub: Stub) -> None:
    """No total timeout: 12 gaps of 0.3 s (3.6 s in all) under a 0.5 s idle and 1 s headers timeout."""
    minted = tight.mint()
    with anthropic_sdk(tight, minted["token"]).messages.stream(
        model=A_MODEL, max_tokens=16, messages=MESSAGES, extra_headers=step(deltas=6, stall_between_events_s=0.3)
    ) as stream:
        assert stream.get_final_text() == stub_text(6)
    assert one_row(tight, minted["key_id"])["status"] == "completed"


def test_headers_timeout_is_504_in_the_wire_shape(tight: Gateway, clean_stub: Stub) -> None:
    minted = tight.mint()
    started = time.monotonic()
    status, headers, body = call(
        "POST",
        tight.dataplane_url + "/v1/messages",
        A_BODY,
        {**A_HEADERS, "x-api-key": minted["token"], **step(stall_before_headers_s=20)},
    )
    assert status == 504 and time.monotonic() - started < 5
    wire_error(body, "upstream-timeout")
    stub_entry(clean_stub, lambda e: e["outcome"] == "client-gone", what="the upstream request cancelled")
    row = one_row(tight, minted["key_id"])
    assert headers["request-id"] == row["attempt_id"]
    assert (row["status"], row["condition"], row["http_status"]) == ("transport-error", "transport-error", 504)


def test_unreachable_upstream_is_502(tight: Gateway, clean_stub: Stub) -> None:
    minted = tight.mint("zai-harness")
    status, _, body = call(
        "POST",
        tight.dataplane_url + "/v1/messages",
        {**A_BODY, "model": "glm-4.6"},
        {**A_HEADERS, "x-api-key": minted["token"]},
    )
    assert status == 502
    wire_error(body, "upstream-unreachable")
    row = one_row(tight, minted["key_id"])
    assert (row["status"], row["condition"], row["http_status"]) == ("transport-error", "transport-error", 502)


# ---- limits (item 7) ------------------------------------------------------------------------


def test_body_above_the_ceiling_is_413_without_an_upstream_call(tight: Gateway, clean_stub: Stub) -> None:
    minted = tight.mint()
    big = {**A_BODY, "messages": [{"role": "user", "content": "x" * MAX_BODY}]}
    status, headers, body = call(
        "POST", tight.dataplane_url + "/v1/messages", big, {**A_HEADERS, "x-api-key": minted["token"]}
    )
    assert status == 413
    wire_error(body, "body-too-large")
    assert headers["request-id"] == body["request_id"]

    # The same without a Content-Length: a chunked upload is counted as it arrives.
    conn = http.client.HTTPConnection("127.0.0.1", tight.dataplane_port, timeout=10)
    conn.request(
        "POST",
        "/v1/messages",
        iter([json.dumps(big).encode()[i : i + 1000] for i in range(0, MAX_BODY + 1000, 1000)]),
        {**A_HEADERS, "x-api-key": minted["token"]},
        encode_chunked=True,
    )
    response = conn.getresponse()
    answer = json.loads(response.read())
    conn.close()
    assert response.status == 413 and answer["error"]["code"] == "body-too-large"

    rows = settled(tight, minted["key_id"], 2)
    assert all((r["status"], r["refusal_reason"], r["condition"]) == ("refused", "body-too-large", None) for r in rows)
    assert clean_stub.requests() == []


def test_pool_timeout_is_503_and_one_account_never_starves_another(make_gateway, clean_stub: Stub) -> None:
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(0)  # one queued connection fills it: later connects hang (a connect timeout)
    filler = socket.create_connection(blackhole.getsockname(), timeout=5)
    try:
        gw = make_gateway(
            {
                "GATEWAY_UPSTREAM_POOL_SIZE": "1",
                "GATEWAY_UPSTREAM_POOL_TIMEOUT": "0.3",
                "GATEWAY_UPSTREAM_CONNECT_TIMEOUT": "0.3",
                "GATEWAY_OPENAI_BASE_URL": f"http://127.0.0.1:{blackhole.getsockname()[1]}",
            }
        ).start()
        _pool_and_connect_timeouts(gw, clean_stub)
    finally:
        filler.close()
        blackhole.close()


def _pool_and_connect_timeouts(gw: Gateway, stub: Stub) -> None:
    holder, waiter, other = gw.mint(), gw.mint(), gw.mint("zai-harness")
    sock = send_raw(
        gw, {**A_BODY, "stream": True}, {"x-api-key": holder["token"], **step(stall_after_events=3, stall_s=30)}
    )
    read_until(sock, b"event: ping")  # the only slot of legacy-anthropic's pool is taken

    status, headers, body = call(
        "POST", gw.dataplane_url + "/v1/messages", A_BODY, {**A_HEADERS, "x-api-key": waiter["token"]}
    )
    assert status == 503 and headers["retry-after"] == "1"
    wire_error(body, "pool-timeout")
    row = one_row(gw, waiter["key_id"])
    assert (row["status"], row["refusal_reason"], row["condition"]) == ("refused", "pool-timeout", None)

    status, _, body = call(
        "POST",
        gw.dataplane_url + "/v1/messages",
        {**A_BODY, "model": "glm-4.6"},
        {**A_HEADERS, "x-api-key": other["token"]},
    )
    assert status == 200, body  # another account's pool is untouched
    sock.close()
    one_row(gw, holder["key_id"])
    status, _, _ = call("POST", gw.dataplane_url + "/v1/messages", A_BODY, {**A_HEADERS, "x-api-key": waiter["token"]})
    assert status == 200  # the slot came back with the aborted stream
    settled(gw, waiter["key_id"], 2)

    openai_lease = gw.mint("openai")
    started = time.monotonic()
    status, _, body = call(
        "POST",
        gw.dataplane_url + "/v1/chat/completions",
        {"model": "gpt-5", "messages": MESSAGES},
        {"authorization": f"Bearer {openai_lease['token']}"},
    )
    assert status == 504 and body["error"]["code"] == "upstream-timeout"
    assert time.monotonic() - started < 5
    row = one_row(gw, openai_lease["key_id"])
    assert (row["status"], row["condition"]) == ("transport-error", "transport-error")
    wait_until(lambda: gw.active()["count"] == 0, 10, "no route in flight")
