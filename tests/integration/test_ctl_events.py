"""`leaseholdctl events` against a scripted SSE server on loopback: JSON lines, resume, refusals.

The control daemon's own feed is tested in `tests/system/test_ctl_feed.py`; this pins the
client's half (parsing, `Last-Event-ID` on reconnect, one-line refusals).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from controlplane.cli.exits import Exit
from controlplane.ctl import main

TOKEN = "feed_token_0123456789abcdefghijklmnopqrstuvwxyz"
EVENTS = [
    (str(i), "route.started" if i % 2 else "route.finished", {"attempt_id": f"at_{(i + 1) // 2}"}) for i in range(1, 5)
]


class FeedServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), FeedHandler)
        self.last_event_ids: list[str | None] = []
        self.status = 200
        self.done = threading.Event()


class FeedHandler(BaseHTTPRequestHandler):
    server: FeedServer

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._json(
                401, {"error": {"code": "unauthenticated", "message": "a valid bearer token is required"}}
            )
        if self.server.status != 200:
            return self._json(self.server.status, "404: Not Found")
        last = self.headers.get("Last-Event-ID")
        self.server.last_event_ids.append(last)
        start = 0 if last is None else next(i for i, e in enumerate(EVENTS) if e[0] == last) + 1
        first_connection = len(self.server.last_event_ids) == 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b": heartbeat\r\n\r\n")
        for event_id, kind, data in EVENTS[start : start + 2 if first_connection else None]:
            self.wfile.write(f"id: {event_id}\r\nevent: {kind}\r\ndata: {json.dumps(data)}\r\n\r\n".encode())
            self.wfile.flush()
        if not first_connection:
            self.server.done.wait(10)  # stay open, like a live feed, until the test ends
        # first connection: return, which drops the feed mid-stream

    def _json(self, status: int, body: Any) -> None:
        raw = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def feed(monkeypatch) -> Iterator[FeedServer]:
    server = FeedServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("GATEWAY_CONTROL_URL", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("LEASEHOLD_TOKEN", TOKEN)
    yield server
    server.done.set()
    server.shutdown()
    server.server_close()


def test_events_print_json_lines_and_resume_after_a_drop(feed: FeedServer, capsys) -> None:
    assert main(["events", "--max-events", "4"]) == Exit.OK
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert lines == [{"id": i, "event": kind, "data": data} for i, kind, data in EVENTS]
    assert feed.last_event_ids == [None, "2"]
    assert "reconnecting" in captured.err and "resuming after id 2" in captured.err


def test_events_resume_from_a_given_id(feed: FeedServer, capsys) -> None:
    assert main(["events", "--last-event-id", "1", "--max-events", "1", "--no-reconnect"]) == Exit.OK
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == ["2"]
    assert feed.last_event_ids == ["1"]


def test_events_without_reconnect_stop_when_the_feed_drops(feed: FeedServer, capsys) -> None:
    assert main(["events", "--no-reconnect"]) == Exit.FAILED
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2 and "the event feed ended" in captured.err


@pytest.mark.parametrize(
    ("status", "token", "code", "words"),
    [
        (200, "wrong", Exit.AUTH, "401"),
        (404, TOKEN, Exit.FAILED, "does not serve /control/v2/events"),
    ],
    ids=["wrong token", "feed not served"],
)
def test_events_refusals_are_one_line(
    feed: FeedServer, monkeypatch, capsys, status: int, token: str, code: Exit, words: str
) -> None:
    feed.status = status
    monkeypatch.setenv("LEASEHOLD_TOKEN", token)
    assert main(["events"]) == code
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and token not in err
