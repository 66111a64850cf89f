"""A bug inside the data plane (not a fault of the worker or the upstream) still ends well: the
worker gets a 500 `internal-error` in the wire's shape before any byte went out, or a cut
stream after, the attempt ends in exactly one row `refused`/`internal-error`, its request slot
is returned, and the failure is logged by type — never with the key or the credential (checked on
what the code hands the logger, before the redactor: there is nothing to redact).

The bug is injected (a method of the relay that raises), because no input should reach one; the
rest is the real data plane in this process (`tests/support/inprocess.py`) against the stub
(stream events paced so they arrive as separate chunks), each terminal row read from its outbox.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from dataplane import relay as relay_module
from tests.support.attempts import A_BODY, A_HEADERS, step
from tests.support.harness import Stub
from tests.support.inprocess import Plane, anthropic_plane

ACCOUNT = "bug-anthropic"


@pytest.fixture
async def plane(clean_stub: Stub, tmp_path: Path) -> AsyncIterator[Plane]:
    async with anthropic_plane(clean_stub, tmp_path, ACCOUNT, request_capacity=1) as running:
        yield running


def _assert_logged_safely(logs: list[dict], plane: Plane, stub: Stub) -> None:
    failed = [entry for entry in logs if entry["event"] == "request_failed"]
    assert len(failed) == 1 and failed[0]["error"] == "RuntimeError", logs
    text = repr(logs)
    assert plane.token not in text and plane.token.split(".")[1] not in text
    assert stub.anthropic_key not in text


async def test_a_bug_before_the_answer_is_a_500_internal_error_in_the_wire_shape(
    plane: Plane, stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_args: object, **_kwargs: object) -> web.StreamResponse:
        raise RuntimeError("a bug in the relay")

    monkeypatch.setattr(plane.proxy.relay, "exchange", broken)
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            async with session.post(plane.url, json=A_BODY, headers={**A_HEADERS, "x-api-key": plane.token}) as answer:
                body = await answer.json()
                assert answer.status == 500
                assert answer.headers["request-id"].startswith("att_")
    assert body["type"] == "error" and body["error"]["code"] == "internal-error", body
    (row,) = plane.link.outbox.values()
    assert (row.status, row.http_status, row.refusal_reason) == ("refused", 500, "internal-error")
    assert row.condition is None  # gateway-authored: never evidence against the account
    assert plane.proxy.capacity.count(ACCOUNT) == 0 and not plane.proxy.in_flight
    _assert_logged_safely(logs, plane, stub)


async def test_a_bug_mid_stream_cuts_the_stream_and_ends_in_one_row(
    plane: Plane, stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = relay_module.Observer.feed
    chunks = 0

    def feed_then_break(self: relay_module.Observer, chunk: bytes) -> None:
        nonlocal chunks
        chunks += 1
        if chunks == 2:
            raise RuntimeError("a bug in the usage scan")
        original(self, chunk)

    monkeypatch.setattr(relay_module.Observer, "feed", feed_then_break)
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            paced = step(stall_between_events_s=0.02)  # events arrive as separate chunks
            async with session.post(
                plane.url, json={**A_BODY, "stream": True}, headers={**A_HEADERS, "x-api-key": plane.token, **paced}
            ) as answer:
                assert answer.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    await answer.read()  # closed without the chunked terminator: never complete
    (row,) = plane.link.outbox.values()
    assert (row.status, row.refusal_reason) == ("refused", "internal-error")
    assert plane.proxy.capacity.count(ACCOUNT) == 0 and not plane.proxy.in_flight
    _assert_logged_safely(logs, plane, stub)
