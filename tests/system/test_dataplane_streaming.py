"""Streams: delivered as they arrive, complete only on their wire's terminal event, and a
stream that ends any other way reaches the worker broken (error event, then no terminator)."""

from __future__ import annotations

import http.client
import json
import time
from datetime import datetime, timedelta

import anthropic
import httpx2  # the HTTP client the installed anthropic and openai SDKs are built on
import openai
import pytest

from tests.support.attempts import (
    A_BODY,
    A_HEADERS,
    A_MODEL,
    MESSAGES,
    O_MODEL,
    anthropic_sdk,
    one_row,
    openai_sdk,
    settled,
    step,
    stub_entry,
)
from tests.support.harness import Gateway, Stub
from tests.support.stub_upstream import (
    STUB_CACHE_CREATION_INPUT_TOKENS,
    STUB_CACHE_READ_INPUT_TOKENS,
    STUB_INPUT_TOKENS,
    stub_text,
)

# What message_start reports before any output: the billing of a stream cut after it.
A_STARTED_USAGE = {
    "input_tokens": STUB_INPUT_TOKENS,
    "output_tokens": 1,
    "cache_read_tokens": STUB_CACHE_READ_INPUT_TOKENS,
    "cache_creation_tokens": STUB_CACHE_CREATION_INPUT_TOKENS,
}
BODIES = {
    "anthropic": ("/v1/messages", {**A_BODY, "stream": True}),
    "chat": ("/v1/chat/completions", {"model": O_MODEL, "messages": MESSAGES, "stream": True}),
    "responses": ("/v1/responses", {"model": O_MODEL, "input": "hi", "stream": True}),
}
MS = timedelta(milliseconds=1)
ERROR_EVENT = {
    "anthropic": b'event: error\ndata: {"type":"error","error":{"type":"api_error"',
    "chat": b'data: {"error":{"message":',
    "responses": b'event: error\ndata: {"type":"error","code":"server_error"',
}


def raw_stream(gw: Gateway, token: str, kind: str, extra: dict[str, str]) -> tuple[int, bytes, bool]:
    """POST a stream with a plain HTTP/1.1 client: (status, body bytes, ended cleanly)."""
    path, body = BODIES[kind]
    conn = http.client.HTTPConnection("127.0.0.1", gw.dataplane_port, timeout=15)
    try:
        conn.request(
            "POST",
            path,
            json.dumps(body),
            {**A_HEADERS, "authorization": f"Bearer {token}", "accept": "application/json", **extra},
        )
        response = conn.getresponse()
        try:
            return response.status, response.read(), True
        except http.client.IncompleteRead as exc:
            return response.status, exc.partial, False
    finally:
        conn.close()


def test_chunks_reach_the_client_as_the_upstream_sends_them(gateway: Gateway, clean_stub: Stub) -> None:
    """20 events 250 ms apart: the first arrives long before the stub even sends the last. The
    stream lasts about 5 s so that a loaded 2-core machine, where a process may wait for a core
    for half a second, cannot make a relayed-as-sent stream look buffered."""
    minted = gateway.mint()
    sdk = anthropic_sdk(gateway, minted["token"])
    arrivals: list[float] = []
    with sdk.messages.stream(
        model=A_MODEL, max_tokens=64, messages=MESSAGES, extra_headers=step(deltas=14, stall_between_events_s=0.25)
    ) as stream:
        for _event in stream:
            arrivals.append(time.time())
    entry = stub_entry(clean_stub)
    assert entry["events_sent"] == 20 and entry["outcome"] == "completed"
    assert len(arrivals) >= 20
    assert entry["last_sent_at"] - entry["first_sent_at"] >= 4.5
    assert arrivals[0] < entry["last_sent_at"] - 3.0, "the first event waited for later ones"
    assert arrivals[0] - entry["first_sent_at"] < 1.5
    spread = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert sum(1 for gap in spread if gap > 0.1) >= 12, spread  # one at a time, not in bursts
    row = one_row(gateway, minted["key_id"])
    assert (row["status"], row["hop"], row["transport"]) == ("completed", 0, "http")
    # SPEC §14: sent upstream → the answer's head; the stub's ≥ 4.5 s of events comes after it
    took_ms = (datetime.fromisoformat(row["finished_at"]) - datetime.fromisoformat(row["started_at"])) / MS
    assert isinstance(row["first_byte_ms"], float) and 0 <= row["first_byte_ms"] < took_ms - 3000


@pytest.mark.parametrize("kind", ["anthropic", "chat", "responses"])
@pytest.mark.parametrize("fault", ["cut_after_events", "eof_after_events"])
def test_stream_without_terminal_event_reaches_the_worker_broken(
    gateway: Gateway, clean_stub: Stub, kind: str, fault: str
) -> None:
    """An abrupt cut and a clean-but-short upstream stream both end broken at the worker."""
    minted = gateway.mint("anthropic" if kind == "anthropic" else "openai")
    status, body, clean = raw_stream(gateway, minted["token"], kind, step(**{fault: 3}))
    assert status == 200 and not clean, body
    assert body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1].startswith(ERROR_EVENT[kind]), body
    row = one_row(gateway, minted["key_id"])
    assert (row["status"], row["condition"], row["http_status"]) == ("transport-error", "transport-error", 200)
    assert row["refusal_reason"] is None and row["stream"] is True
    if kind == "anthropic":
        assert row["usage"] == A_STARTED_USAGE and row["served_model"] == A_MODEL  # billed as delivered
    else:
        assert row["usage"] is None


def test_sdks_raise_on_a_cut_stream_and_never_return_the_truncated_text(gateway: Gateway, clean_stub: Stub) -> None:
    a = gateway.mint()
    with pytest.raises(anthropic.APIStatusError) as caught:  # the SDK raises the gateway's error event
        with anthropic_sdk(gateway, a["token"]).messages.stream(
            model=A_MODEL, max_tokens=16, messages=MESSAGES, extra_headers=step(eof_after_events=5)
        ) as s:
            s.get_final_text()
    assert "t0" not in str(caught.value)
    o = gateway.mint("openai")
    sdk = openai_sdk(gateway, o["token"])
    with pytest.raises(openai.APIError):
        list(
            sdk.chat.completions.create(
                model=O_MODEL, messages=MESSAGES, stream=True, extra_headers=step(eof_after_events=3)
            )
        )
    with pytest.raises(openai.APIConnectionError) as cut:  # yields the error event, then meets the cut
        with sdk.responses.stream(model=O_MODEL, input="hi", extra_headers=step(eof_after_events=6)) as s:
            s.get_final_response()
    assert isinstance(cut.value.__cause__, httpx2.RemoteProtocolError)
    assert one_row(gateway, a["key_id"])["status"] == "transport-error"
    assert [r["status"] for r in settled(gateway, o["key_id"], 2)] == ["transport-error"] * 2


def test_chat_stream_without_done_completes_after_a_finish_reason(gateway: Gateway, clean_stub: Stub) -> None:
    """Some compatible providers omit `[DONE]`: a clean close after finish_reason is complete."""
    minted = gateway.mint("openai")
    status, body, clean = raw_stream(gateway, minted["token"], "chat", step(eof_after_events=5))
    assert status == 200 and clean and b'"finish_reason":"stop"' in body and b"[DONE]" not in body
    assert one_row(gateway, minted["key_id"])["status"] == "completed"


def test_malformed_event_is_forwarded_and_does_not_cut(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    status, body, clean = raw_stream(gateway, minted["token"], "anthropic", step(malformed_event_at=4))
    assert status == 200 and clean
    assert b"data: {malformed\n\n" in body and body.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    row = one_row(gateway, minted["key_id"])
    assert row["status"] == "completed" and row["usage"]["output_tokens"] == 3


def test_gzip_stream_is_relayed_compressed_and_a_cut_still_breaks_it(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    with anthropic_sdk(gateway, minted["token"]).messages.stream(
        model=A_MODEL, max_tokens=16, messages=MESSAGES, extra_headers=step(gzip=True)
    ) as stream:
        assert stream.get_final_text() == stub_text()
        assert stream.response.headers["content-encoding"] == "gzip"
    status, _, clean = raw_stream(
        gateway, minted["token"], "anthropic", {"accept-encoding": "gzip", **step(gzip=True, cut_after_events=4)}
    )
    assert status == 200 and not clean
    rows = settled(gateway, minted["key_id"], 2)
    assert [r["status"] for r in rows] == ["completed", "transport-error"]
    assert rows[0]["usage"]["output_tokens"] == 3 and rows[1]["usage"] == A_STARTED_USAGE


@pytest.mark.parametrize("kind", ["chat", "responses"])
def test_openai_stream_usage_and_served_model(gateway: Gateway, clean_stub: Stub, kind: str) -> None:
    minted = gateway.mint("openai")
    path, body = BODIES[kind]
    if kind == "chat":
        body = {**body, "stream_options": {"include_usage": True}}
    conn = http.client.HTTPConnection("127.0.0.1", gateway.dataplane_port, timeout=10)
    conn.request(
        "POST",
        path,
        json.dumps(body),
        {"authorization": f"Bearer {minted['token']}", "content-type": "application/json"},
    )
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    assert response.status == 200 and (b"[DONE]" in payload or b"response.completed" in payload)
    row = one_row(gateway, minted["key_id"])
    assert row["served_model"] == O_MODEL and row["usage"]["output_tokens"] == 3
    assert row["usage"]["cache_read_tokens"] == 4 and row["cost_reason"] == "priced"


def test_non_streaming_answer_cut_mid_body_reaches_the_worker_short(gateway: Gateway, clean_stub: Stub) -> None:
    """A JSON answer cut after its headers: the worker gets a short body, never a complete one."""
    minted = gateway.mint()
    with pytest.raises(anthropic.APIConnectionError) as cut:
        anthropic_sdk(gateway, minted["token"]).messages.create(
            model=A_MODEL, max_tokens=16, messages=MESSAGES, extra_headers=step(cut_after_events=1)
        )
    assert isinstance(cut.value.__cause__, httpx2.RemoteProtocolError)
    conn = http.client.HTTPConnection("127.0.0.1", gateway.dataplane_port, timeout=10)
    conn.request(
        "POST",
        "/v1/messages",
        json.dumps(A_BODY),
        {**A_HEADERS, "x-api-key": minted["token"], **step(cut_after_events=1)},
    )
    response = conn.getresponse()
    with pytest.raises(http.client.IncompleteRead):
        response.read()
    conn.close()
    rows = settled(gateway, minted["key_id"], 2)
    assert all(
        (r["status"], r["http_status"], r["stream"], r["usage"]) == ("transport-error", 200, False, None) for r in rows
    )
