"""`GET /control/v2/events` against real daemons (SPEC §11): order, resumption, gaps, bounds."""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import pytest

from controlplane.routebook import RouteView
from tests.support.harness import Gateway, Stub, credential_like
from tests.support.waits import wait_until

MODEL = "claude-sonnet-4-6"
ROUTE_FIELDS = set(RouteView.__struct_fields__)


class Feed:
    """An SSE reader on its own thread; `events` fills as they arrive."""

    def __init__(self, gw: Gateway, token: str, last_event_id: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        self.conn = http.client.HTTPConnection("127.0.0.1", gw.control_port, timeout=30)
        self.conn.request("GET", "/control/v2/events", headers=headers)
        self.response = self.conn.getresponse()
        assert self.response.status == 200, self.response.read()
        self.raw: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.ended = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        block: dict[str, Any] = {}
        try:
            while line := self.response.readline().decode():
                self.raw.append(line)
                line = line.rstrip("\r\n")
                if not line:
                    if "data" in block:
                        self.events.append(
                            {"id": block.get("id"), "event": block.get("event"), "data": json.loads(block["data"])}
                        )
                    block = {}
                elif not line.startswith(":"):
                    field, _, value = line.partition(": ")
                    block[field] = value
        except Exception:
            pass
        self.ended = True

    def wait_for(self, predicate, what: str, timeout_s: float = 10) -> list[dict[str, Any]]:
        return wait_until(lambda: predicate(list(self.events)) and list(self.events), timeout_s, what)

    def close(self) -> None:
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()
        self._thread.join(5)


@pytest.fixture(scope="module")
def feed_gateway(tmp_path_factory: pytest.TempPathFactory, stub: Stub) -> Iterator[Gateway]:
    gw = Gateway(tmp_path_factory.mktemp("events"), stub, {"GATEWAY_READ_TOKEN": credential_like("read_")})
    gw.start()
    yield gw
    gw.stop()


def read_token(gw: Gateway) -> str:
    return gw.env["GATEWAY_READ_TOKEN"]


def of_attempt(events: list[dict[str, Any]], attempt_id: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"].startswith("route.") and e["data"]["attempt_id"] == attempt_id]


def seq(event_id: str) -> int:
    return int(event_id.rpartition("-")[2])


def drive(gw: Gateway, token: str, count: int, threads: int = 4) -> None:
    """`count` plain completed requests over keep-alive connections (2 events each)."""
    body = json.dumps({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    headers = {"x-api-key": token, "anthropic-version": "2023-06-01", "content-type": "application/json"}

    def run(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", gw.dataplane_port, timeout=30)
        for _ in range(n):
            conn.request("POST", "/v1/messages", body, headers)
            answer = conn.getresponse()
            answer.read()
            assert answer.status == 200
        conn.close()

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, [count // threads + (i < count % threads) for i in range(threads)]))


def test_a_route_starts_then_finishes_in_order_as_a_sanitized_view(feed_gateway: Gateway, clean_stub: Stub) -> None:
    gw = feed_gateway
    feed = Feed(gw, read_token(gw))
    try:
        minted = gw.mint()
        sdk = anthropic.Anthropic(base_url=gw.dataplane_url, api_key=minted["token"], max_retries=0)
        with sdk.messages.stream(
            model=MODEL,
            max_tokens=16,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-stub-step": '{"stall_after_events": 2, "stall_s": 0.3}'},
        ) as s:
            s.get_final_text()
        events = feed.wait_for(lambda evs: any(e["event"] == "route.finished" for e in evs), "route.finished")
    finally:
        feed.close()
    attempt_id = events[0]["data"]["attempt_id"]
    mine = of_attempt(events, attempt_id)
    assert [e["event"] for e in mine] == ["route.started", "route.finished"]
    started, finished = mine
    assert seq(started["id"]) < seq(finished["id"]) and started["id"].split("-")[0] == finished["id"].split("-")[0]
    for event in mine:
        assert set(event["data"]) == ROUTE_FIELDS
        assert event["data"]["key_id"] == minted["key_id"]
    assert started["data"]["status"] is None and started["data"]["finished_at"] is None
    assert finished["data"]["status"] == "completed" and finished["data"]["usage"]["output_tokens"] == 3
    assert finished["data"]["cost_usd"] > 0
    raw = "".join(feed.raw)
    assert all(re.match(r"^(id|event|data): |^: |^\r?\n$", line) for line in feed.raw)
    secret_half = minted["token"].partition(".")[2]
    for secret in (minted["token"], secret_half, clean_stub.anthropic_key, gw.control_token, read_token(gw)):
        assert secret not in raw


def test_resume_with_last_event_id_replays_exactly_what_was_missed(feed_gateway: Gateway, clean_stub: Stub) -> None:
    gw = feed_gateway
    minted = gw.mint()
    first = Feed(gw, read_token(gw))
    try:
        drive(gw, minted["token"], 1, threads=1)
        seen = first.wait_for(lambda evs: any(e["event"] == "route.finished" for e in evs), "first route")
    finally:
        first.close()
    last_id = seen[-1]["id"]

    drive(gw, minted["token"], 3, threads=1)  # missed while disconnected
    missed = wait_until(
        lambda: len(rows := [r for r in gw.ledger() if r["key_id"] == minted["key_id"]]) == 4 and rows,
        10,
        "rows of the missed requests",
    )

    resumed = Feed(gw, read_token(gw), last_event_id=last_id)
    try:
        events = resumed.wait_for(lambda evs: len(evs) >= 6, "six replayed events")
    finally:
        resumed.close()
    assert [e["event"] for e in events[:6]] == ["route.started", "route.finished"] * 3
    assert [seq(e["id"]) for e in events[:6]] == list(range(seq(last_id) + 1, seq(last_id) + 7))
    assert [e["data"]["attempt_id"] for e in events[1:6:2]] == [r["attempt_id"] for r in missed[1:]]


def test_an_id_never_issued_yields_one_gap_first(feed_gateway: Gateway) -> None:
    gw = feed_gateway
    for stale in ("0000dead-5", "not-an-id", "nonsense"):
        feed = Feed(gw, read_token(gw), last_event_id=stale)
        try:
            events = feed.wait_for(lambda evs: len(evs) >= 1, "the gap event")
        finally:
            feed.close()
        assert events[0]["event"] == "gap"
        assert events[0]["data"]["reason"] == "never-issued" and events[0]["data"]["last_event_id"] == stale
        assert [e["event"] for e in events].count("gap") == 1


def test_an_evicted_id_yields_gap_then_the_buffer(feed_gateway: Gateway, clean_stub: Stub) -> None:
    gw = feed_gateway
    minted = gw.mint()
    probe = Feed(gw, read_token(gw))
    try:
        drive(gw, minted["token"], 1, threads=1)
        old_id = probe.wait_for(lambda evs: len(evs) >= 2, "a first pair")[0]["id"]
        drive(gw, minted["token"], 520)  # 1,040 events: the first one's successors are evicted
        probe.wait_for(lambda evs: len(evs) >= 1042, "every event on the live reader", timeout_s=20)
    finally:
        probe.close()
    resumed = Feed(gw, read_token(gw), last_event_id=old_id)
    try:
        events = resumed.wait_for(lambda evs: len(evs) >= 1025, "gap plus a full buffer", timeout_s=20)
    finally:
        resumed.close()
    gap, replay = events[0], events[1:1025]
    assert gap["event"] == "gap" and gap["data"]["reason"] == "evicted"
    assert gap["data"]["oldest_retained_id"] == replay[0]["id"]
    assert seq(replay[0]["id"]) > seq(old_id) + 1
    assert [seq(e["id"]) for e in replay] == list(range(seq(replay[0]["id"]), seq(replay[0]["id"]) + 1024))


def metric(gw: Gateway, name: str) -> float:
    text = gw.api("GET", "/metrics")[2]
    found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def test_a_reader_that_never_reads_is_dropped_with_bounded_queues(feed_gateway: Gateway, clean_stub: Stub) -> None:
    gw = feed_gateway
    minted = gw.mint()
    limit = metric(gw, "leasehold_event_queue_limit")
    dropped_before = metric(gw, 'leasehold_event_subscribers_closed_total{reason="queue-full"}')
    stalled = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", gw.control_port))
    stalled.sendall(
        f"GET /control/v2/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {read_token(gw)}\r\n\r\n".encode()
    )
    try:
        wait_until(lambda: metric(gw, "leasehold_event_subscribers") == 1, 10, "the stalled reader to subscribe")
        for _ in range(20):  # at most 2,400 requests; it takes about a fifth of that
            drive(gw, minted["token"], 120)
            if metric(gw, 'leasehold_event_subscribers_closed_total{reason="queue-full"}') > dropped_before:
                break
            assert metric(gw, "leasehold_event_queue_depth_max") <= limit
        assert metric(gw, 'leasehold_event_subscribers_closed_total{reason="queue-full"}') == dropped_before + 1
        assert metric(gw, "leasehold_event_subscribers") == 0
        assert metric(gw, "leasehold_event_queue_depth_max") == 0
        assert metric(gw, "leasehold_event_queue_high_water") == limit  # filled to the bound, no further
        wait_until(lambda: '"event_subscriber_dropped"' in gw.control.output(), 5, "the drop to be logged")
        line = next(x for x in gw.control.output().splitlines() if '"event_subscriber_dropped"' in x)
        assert json.loads(line)["reason"] == "queue-full"
    finally:
        stalled.close()
