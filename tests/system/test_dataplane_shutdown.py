"""SIGTERM (issue 3 item 8): stop accepting, let in-flight work finish for GATEWAY_DRAIN_SECONDS,
then end the rest with `gateway-shutdown` rows, hand every row to control and exit 0."""

from __future__ import annotations

import signal
import socket
import time

from tests.support.attempts import A_BODY, read_until, rows_for, send_raw, step, stub_entry
from tests.support.harness import Stub
from tests.support.stub_upstream import (
    STUB_CACHE_CREATION_INPUT_TOKENS,
    STUB_CACHE_READ_INPUT_TOKENS,
    STUB_INPUT_TOKENS,
)
from tests.support.waits import wait_until

DRAIN_S = 1.5


def read_all(sock: socket.socket) -> bytes:
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    sock.close()
    return got


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_sigterm_drains_then_cuts_with_gateway_shutdown_rows(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway({"GATEWAY_DRAIN_SECONDS": str(DRAIN_S)}).start()
    short, long_, waiting = gw.mint(), gw.mint(), gw.mint()
    stream = {**A_BODY, "stream": True}
    s_short = send_raw(gw, stream, {"x-api-key": short["token"], **step(deltas=4, stall_between_events_s=0.1)})
    s_long = send_raw(gw, stream, {"x-api-key": long_["token"], **step(stall_after_events=3, stall_s=60)})
    s_wait = send_raw(gw, A_BODY, {"x-api-key": waiting["token"], **step(delay_s=60)})
    read_until(s_long, b"event: ping")
    wait_until(lambda: len(clean_stub.requests()) == 3, 10, "three requests at the stub")

    started = time.monotonic()
    gw.dataplane.popen.send_signal(signal.SIGTERM)
    wait_until(lambda: refuses_connections(gw.dataplane_port), 5, "the listener closed")

    short_body = read_all(s_short)
    assert short_body.endswith(b"0\r\n\r\n") and b"message_stop" in short_body  # finished in the window
    long_body = read_all(s_long)
    waited = time.monotonic() - started
    assert DRAIN_S - 0.2 <= waited < DRAIN_S + 3, waited
    assert b"event: error" in long_body and b"shutting down" in long_body
    assert not long_body.endswith(b"0\r\n\r\n")  # broken, never a clean end
    wait_body = read_all(s_wait)
    assert wait_body.startswith(b"HTTP/1.1 503") and b"gateway-shutdown" in wait_body
    assert b"retry-after: 1" in wait_body.lower()

    assert gw.dataplane.popen.wait(10) == 0
    rows = {key["key_id"]: rows_for(gw, key["key_id"]) for key in (short, long_, waiting)}
    assert all(len(found) == 1 for found in rows.values()), rows
    assert rows[short["key_id"]][0]["status"] == "completed"
    cut = rows[long_["key_id"]][0]
    assert (cut["status"], cut["refusal_reason"], cut["condition"], cut["http_status"]) == (
        "refused",
        "gateway-shutdown",
        None,
        200,
    )
    assert cut["usage"] == {
        "input_tokens": STUB_INPUT_TOKENS,
        "output_tokens": 1,
        "cache_read_tokens": STUB_CACHE_READ_INPUT_TOKENS,
        "cache_creation_tokens": STUB_CACHE_CREATION_INPUT_TOKENS,
    }
    held = rows[waiting["key_id"]][0]
    assert (held["status"], held["refusal_reason"], held["http_status"]) == ("refused", "gateway-shutdown", 503)
    assert gw.active()["count"] == 0
    stub_entry(
        clean_stub,
        lambda e: e["outcome"] == "client-gone" and e["stream"],
        what="the cut stream's upstream request cancelled",
    )
