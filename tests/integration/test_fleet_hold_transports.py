"""A failing data-plane fleet loop holds a ceilinged account on every transport alike (SPEC §16,
§19, §20): the HTTP request, the socket's handshake and each `response.create` on an open socket
are refused 503 `fleet-state-unavailable` by one rule (`dataplane/fleethold.fleet_held`), and
all are served again once the loop runs steadily. Before the socket gates shared it they looked
only at a lapsed place, and a create on a failing host reached the upstream.

The data plane runs in this process (`tests/support/inprocess.py`, for its `FleetAdmission`,
whose standing pass is made to raise as a bug would) against the stub and a real redis-server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from dataplane import fleetloops
from dataplane.admission import FleetAdmission
from shared.fleet.hosts import HostRegistry
from shared.fleet.redis_client import connect as redis_connect
from shared.supervisor import Supervisor
from tests.support.fleet import Fleet
from tests.support.harness import Stub
from tests.support.inprocess import openai_plane
from tests.support.sockets import connect, create, turn
from tests.support.waits import until

HOST = "h1"
ACCOUNT = "capped-openai"
TTL_S = 60  # this host's place never lapses during the test: only the loop holds


@pytest.fixture
async def admission(fleet: Fleet) -> AsyncIterator[FleetAdmission]:
    hosts = HostRegistry(fleet.client, fleet.keys, TTL_S)
    assert (await hosts.claim(HOST, "inst-1")).granted  # this host's control: a fresh heartbeat
    made = FleetAdmission(redis_connect(fleet.server.url), fleet.keys.fleet_id, HOST, ttl_s=TTL_S)
    made.supervisor = Supervisor(pause_s=0.05, failing_after=3, steady_s=1.0)
    made.check_interval_s = 0.05
    yield made
    await made.close()


def ws_creates(stub: Stub) -> int:
    return len([e for e in stub.requests() if e["method"] == "WS"])


async def test_a_failing_fleet_loop_holds_http_the_handshake_and_each_create_alike(
    clean_stub: Stub, tmp_path: Path, admission: FleetAdmission
) -> None:
    healthy = admission.check_standing

    async def buggy() -> bool:
        raise RuntimeError("a bug, not an outage")

    tasks = fleetloops.spawn(admission)
    try:
        async with openai_plane(clean_stub, tmp_path, ACCOUNT, lease_capacity=5, fleet=admission) as plane:
            base = plane.url.removesuffix("/v1/responses")
            auth = {"Authorization": f"Bearer {plane.token}"}
            async with aiohttp.ClientSession() as session:
                ws = await connect(session, base, plane.token)  # opened while the loops run steadily
                assert (await turn(ws, create()))[-1]["type"] == "response.completed"

                admission.check_standing = buggy  # type: ignore[method-assign]
                await until(lambda: admission.supervisor.failing() == ["standing"], 15, "the loop to read failing")
                async with session.post(plane.url, json={"model": "gpt-5", "input": "hi"}, headers=auth) as http:
                    body = await http.json()
                    assert (http.status, body["error"]["code"]) == (503, "fleet-state-unavailable")
                    assert "standing" in body["error"]["message"] and http.headers["retry-after"] == "1"
                refused = await turn(ws, create())  # on the open socket: refused, the socket stays
                assert refused[-1]["type"] == "error", refused
                assert (refused[-1]["error"]["code"], refused[-1]["status"]) == ("fleet-state-unavailable", 503)
                assert "standing" in refused[-1]["error"]["message"]
                with pytest.raises(aiohttp.WSServerHandshakeError) as handshake:
                    await connect(session, base, plane.token)
                assert handshake.value.status == 503
                assert ws_creates(clean_stub) == 1 and not [e for e in clean_stub.requests() if e["method"] == "POST"]

                admission.check_standing = healthy  # type: ignore[method-assign]
                await until(lambda: admission.hold() is None, 15, "the loop to run steadily again")
                assert (await turn(ws, create()))[-1]["type"] == "response.completed"
                again = await connect(session, base, plane.token)
                assert (await turn(again, create()))[-1]["type"] == "response.completed"
                await again.close()
                await ws.close()
            await until(lambda: len(plane.link.outbox) == 6, 10, "every attempt's row")
            rows = list(plane.link.outbox.values())
            assert sorted((r.transport, r.status, r.refusal_reason or "") for r in rows) == [
                ("http", "refused", "fleet-state-unavailable"),
                ("websocket", "completed", ""),
                ("websocket", "completed", ""),
                ("websocket", "completed", ""),
                ("websocket", "refused", "fleet-state-unavailable"),
                ("websocket", "refused", "fleet-state-unavailable"),
            ]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
