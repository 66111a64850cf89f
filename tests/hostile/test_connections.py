"""Connection abuse (SPEC §19): idle, slowloris, keep-alive, the cap, a stalled reader.

The gateway here runs with short bounds: a request head must be complete 3 s after the
connection opened (or after its first byte), an idle keep-alive connection closes after 5 s, at
most 16 connections are open, and a worker that accepts no byte for 1 s is disconnected. On
main none of these bounds existed: every connection below stayed open for as long as the worker
liked, and a stalled reader kept its account's one request slot.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator

import pytest

from tests.hostile.conftest import HAIKU, dataplane_healthy, mint_v2, post_raw, start_hostile_gateway
from tests.support.attempts import A_HEADERS, settled
from tests.support.harness import Gateway, Stub
from tests.support.waits import wait_until

HEAD_S, KEEPALIVE_S, CAP, STALL_S = 3, 5, 16, 1


@pytest.fixture(scope="module")
def cgw(tmp_path_factory: pytest.TempPathFactory, stub: Stub) -> Iterator[Gateway]:
    gateway = start_hostile_gateway(
        tmp_path_factory.mktemp("connections"),
        stub,
        {
            "GATEWAY_HEADER_TIMEOUT_SECONDS": str(HEAD_S),
            "GATEWAY_KEEPALIVE_SECONDS": str(KEEPALIVE_S),
            "GATEWAY_MAX_CONNECTIONS": str(CAP),
            "GATEWAY_CLIENT_STALL_SECONDS": str(STALL_S),
        },
    )
    yield gateway
    gateway.stop()


def connect(gw: Gateway, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", gw.dataplane_port))
    return sock


def closed(sock: socket.socket, poke: bytes = b"") -> bool:
    """Has the gateway closed this connection? (`poke` is sent first: a slowloris' next byte)"""
    try:
        if poke:
            sock.send(poke)
        sock.setblocking(False)
        try:
            return sock.recv(65536) == b""
        except BlockingIOError:
            return False
        finally:
            sock.setblocking(True)
    except (ConnectionResetError, BrokenPipeError):
        return True


def counter(gw: Gateway, name: str) -> float:
    """A counter on control's `/metrics` (the data plane's SPEC §19 counters reach it by RPC)."""
    text = gw.api("GET", "/metrics")[2]
    found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def test_an_idle_connection_is_closed_after_the_head_timeout(cgw: Gateway) -> None:
    before = counter(cgw, "leasehold_header_timeouts_total")
    sock = connect(cgw)
    opened = time.monotonic()
    wait_until(lambda: closed(sock), HEAD_S + 8, "the idle connection closed", interval_s=0.1)
    assert time.monotonic() - opened >= HEAD_S - 0.5
    sock.close()
    assert dataplane_healthy(cgw)
    wait_until(
        lambda: counter(cgw, "leasehold_header_timeouts_total") >= before + 1,
        10,
        "the head timeout counted on /metrics",
    )


def test_a_slowloris_is_closed_though_it_keeps_sending(cgw: Gateway) -> None:
    sock = connect(cgw)
    opened = time.monotonic()
    sock.send(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n")
    wait_until(lambda: closed(sock, b"x"), HEAD_S + 8, "the slowloris closed", interval_s=0.3)
    assert time.monotonic() - opened >= HEAD_S - 0.5
    sock.close()
    assert dataplane_healthy(cgw)


def _get_healthz(sock: socket.socket) -> bytes:
    sock.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
        piece = sock.recv(65536)
        assert piece, answer
        answer += piece
    return answer


def test_an_idle_keep_alive_connection_is_closed(cgw: Gateway) -> None:
    sock = connect(cgw)
    assert _get_healthz(sock).startswith(b"HTTP/1.1 200")
    answered = time.monotonic()
    wait_until(lambda: closed(sock), KEEPALIVE_S + 8, "the keep-alive connection closed", interval_s=0.1)
    assert time.monotonic() - answered >= KEEPALIVE_S - 0.5
    sock.close()


def test_beyond_the_cap_a_connection_is_refused_and_open_ones_go_on(cgw: Gateway) -> None:
    wait_until(lambda: dataplane_healthy(cgw), 10, "no connection left from other tests")
    before = counter(cgw, "leasehold_connections_refused_total")
    held = [connect(cgw) for _ in range(CAP)]
    extra = connect(cgw)
    answer = b""
    while True:
        try:
            piece = extra.recv(65536)
        except ConnectionResetError:
            break
        if not piece:
            break
        answer += piece
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), answer
    assert b"retry-after: 1" in head and b"connection: close" in head
    assert json.loads(body)["error"]["code"] == "connection-limit"
    assert _get_healthz(held[0]).startswith(b"HTTP/1.1 200")  # open ones are unaffected
    for sock in [*held, extra]:
        sock.close()
    assert wait_until(lambda: dataplane_healthy(cgw), 10, "a new connection accepted once below the cap")
    wait_until(
        lambda: counter(cgw, "leasehold_connections_refused_total") >= before + 1,
        10,
        "the refused connection counted on /metrics",
    )


def _big_stream(events: int, size: int) -> str:
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": HAIKU,
            "content": [],
            "usage": {"input_tokens": 5, "output_tokens": 1},
        },
    }
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x" * size}}
    one = f"event: content_block_delta\ndata: {json.dumps(delta)}\n\n"
    return f"event: message_start\ndata: {json.dumps(start)}\n\n" + one * events


def test_a_stalled_reader_is_cut_and_its_slot_released(cgw: Gateway, clean_stub: Stub) -> None:
    """16 MiB streamed over >= 10 s (so no kernel buffer can absorb it all before the cut) to a
    worker that reads nothing: its write stalls, after 1 s the attempt
    ends client-aborted, the upstream request is cancelled and the account's only request slot
    (request_capacity 1) serves the next request."""
    minted = mint_v2(cgw, HAIKU, "d-stall")
    clean_stub.script({"body": _big_stream(1024, 16 * 1024), "stall_between_events_s": 0.01})
    sock = connect(cgw, rcvbuf=4096)
    body = json.dumps({"model": HAIKU, "max_tokens": 8, "stream": True, "messages": []}).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in {**A_HEADERS, "x-api-key": minted["token"]}.items())
    sock.send(f"POST /v1/messages HTTP/1.1\r\nHost: x\r\n{head}content-length: {len(body)}\r\n\r\n".encode() + body)
    row = settled(cgw, minted["key_id"], timeout_s=20)[0]
    assert (row["status"], row["condition"], row["refusal_reason"]) == ("client-aborted", None, None)
    assert wait_until(
        lambda: clean_stub.requests()[0]["outcome"] == "client-gone", 30, "the upstream request cancelled"
    )
    status, _, _ = post_raw(
        cgw,
        "/v1/messages",
        json.dumps({"model": HAIKU, "max_tokens": 8, "messages": []}).encode(),
        {**A_HEADERS, "x-api-key": minted["token"]},
    )
    assert status == 200  # the slot was released (on main: 429 request-capacity-exhausted)
    sock.close()
    assert dataplane_healthy(cgw)
