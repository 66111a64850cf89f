"""leaseholdctl's client over real loopback I/O: what it sends, and an unreachable control daemon."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from controlplane.cli.client import Client, TokenChoice
from controlplane.cli.exits import CtlError, Exit
from tests.support.harness import free_port
from tests.unit.test_ctl_client import SECRET


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": json.loads(body)})
        payload = json.dumps({"ok": True}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Recorder.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_client_sends_bearer_and_json_and_ignores_proxy_variables(recorder: str, monkeypatch) -> None:
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    client = Client(recorder, TokenChoice(SECRET, "GATEWAY_CONTROL_TOKEN"))
    reply = client.call("POST", "/control/v2/mint", {"a": 1}, query={"x": "1", "skip": None})
    assert (reply.status, reply.body) == (201, {"ok": True})
    assert _Recorder.seen == [{"path": "/control/v2/mint?x=1", "auth": f"Bearer {SECRET}", "body": {"a": 1}}]


def test_unreachable_is_one_line_naming_url_and_variable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(CtlError) as caught:
        Client(url, TokenChoice(SECRET, "--token-file")).call("GET", "/control/v2/accounts")
    assert caught.value.code == Exit.UNREACHABLE
    message = caught.value.message
    assert url in message and "GATEWAY_CONTROL_URL" in message and "leasehold-control running" in message
    assert SECRET not in message
