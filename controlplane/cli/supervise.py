"""What `leaseholdctl exec` does beside a dispatch key's worker (SPEC §17), each in a thread.

- `Extender` moves the key's expiry forward every third of its TTL while the worker runs, so a
  run may outlive one TTL; if this process dies, nothing extends it and the key expires within
  one TTL.
- `HopWatcher` follows the event feed and prints each `dispatch.hop` of the key as it happens.
"""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any

from controlplane.cli.client import Client
from controlplane.cli.exits import CtlError
from controlplane.cli.output import warn
from controlplane.cli.views import EVENTS_PATH, SseParser
from shared.codes import Scope

# The shortest extension period: an operator's 60 s TTL is extended every 20 s.
MIN_EXTEND_EVERY_S = 5.0
FEED_READ_TIMEOUT_S = 60.0


def extend_every_s(ttl_s: int) -> float:
    return max(MIN_EXTEND_EVERY_S, ttl_s / 3)


def hop_line(event: dict[str, Any], sockets: bool = False) -> str:
    """One hop, as `-v` prints it; `sockets` (an OpenAI-wire worker) adds what happened to its
    Responses WebSockets: the data plane closed them 1012 after the hop (SPEC §20)."""
    data = event.get("data") or {}
    line = (
        f"hop {data.get('hop')}: {data.get('from_account')} -> {data.get('to_account')} "
        f"({data.get('condition')}; decision {data.get('mint_decision_id')})"
    )
    if sockets:
        line += (
            f"; its Responses WebSockets on {data.get('from_account')} closed (1012) and "
            f"reconnect to {data.get('to_account')}"
        )
    return line


class Extender(threading.Thread):
    def __init__(self, client: Client, key_id: str, ttl_s: int) -> None:
        super().__init__(name="leasehold-extend", daemon=True)
        self.client, self.key_id, self.ttl_s = client, key_id, ttl_s
        self.stopped = threading.Event()
        self.extended = 0
        self.expires_at: str | None = None

    def run(self) -> None:
        path = f"/control/v2/keys/{self.key_id}/extend"
        while not self.stopped.wait(extend_every_s(self.ttl_s)):
            try:
                reply = self.client.call("POST", path, {"ttl_seconds": self.ttl_s})
                self.expires_at = self.client.expect(reply, Scope.MINT, path)["expires_at"]
                self.extended += 1
            except CtlError as exc:  # say so, and keep trying: the key is still good until it expires
                warn(f"could not extend lease {self.key_id}: {exc.message}")

    def stop(self) -> None:
        self.stopped.set()


class HopWatcher(threading.Thread):
    def __init__(self, client: Client, key_id: str, sockets: bool = False) -> None:
        super().__init__(name="leasehold-hops", daemon=True)
        self.client, self.key_id, self.sockets = client, key_id, sockets
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                with self.client.stream(
                    EVENTS_PATH, Scope.READ, {"Accept": "text/event-stream"}, FEED_READ_TIMEOUT_S
                ) as response:
                    parser = SseParser()
                    for raw in response:
                        event = parser.feed(raw.decode("utf-8", "replace"))
                        if (
                            event
                            and event["event"] == "dispatch.hop"
                            and (event.get("data") or {}).get("key_id") == self.key_id
                        ):
                            warn(hop_line(event, self.sockets))
                        if self.stopped.is_set():
                            return
            except (CtlError, OSError, http.client.HTTPException, json.JSONDecodeError):
                pass
            self.stopped.wait(1.0)

    def stop(self) -> None:
        self.stopped.set()
