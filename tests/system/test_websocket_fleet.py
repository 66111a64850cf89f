"""Open WebSockets counted fleet-wide (SPEC §20, §16): two pairs on one real redis-server. Each
host publishes its data plane's open sockets per account with its heartbeat (MAC'd, SPEC §19),
and either host's accounts view says `sockets_open` for the whole fleet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.support.fleetpairs import FleetPairs, account, accounts_toml
from tests.support.harness import Stub
from tests.support.redis_server import RedisServer
from tests.support.sockets import closed_with, connect, create, turn, until_terminal
from tests.support.waits import until


@pytest.fixture
def fleet(tmp_path: Path, stub: Stub, redis_server: RedisServer) -> Iterator[FleetPairs]:
    pairs = FleetPairs(tmp_path / "fleet", stub, redis_server, 2, accounts=accounts_toml(stub, lease_capacity=None))
    try:
        yield pairs.start()
    finally:
        pairs.stop()


async def test_sockets_open_is_fleet_wide(fleet: FleetPairs, clean_stub: Stub) -> None:
    a, b = fleet[0], fleet[1]
    on_a, on_b = a.mint("openai"), b.mint("openai")
    account_id = on_a["account_id"]
    assert on_b["account_id"] == account_id

    async def seen(count: int) -> None:
        for gw in (a, b):
            await until(
                lambda gw=gw: account(gw, account_id)["sockets_open"] == count,
                20,
                f"{count} sockets open seen by {gw.env['GATEWAY_HOST_ID']}",
            )

    async with aiohttp.ClientSession() as session:
        sockets = [await connect(session, a.dataplane_url, on_a["token"]) for _ in range(2)]
        sockets.append(await connect(session, b.dataplane_url, on_b["token"]))
        for ws in sockets:  # each socket served, then held idle
            assert (await turn(ws, create()))[-1]["type"] == "response.completed"
        await seen(3)
        await sockets.pop(0).close()  # one closes on host a
        await seen(2)
        await sockets.pop().close()  # the one on host b
        await seen(1)
        for ws in sockets:
            await ws.close()
    await seen(0)


async def test_a_disable_on_one_host_closes_the_sockets_on_the_other(fleet: FleetPairs, clean_stub: Stub) -> None:
    """SPEC §16, §20: a disable committed on host a reaches host b's data plane (the fleet event
    relay, or the chain poll when the event was lost): b's idle socket closes 1008, a new create
    on its busy socket is refused and never reaches the upstream, the one in flight finishes,
    then that socket closes 1008 too."""
    a, b = fleet[0], fleet[1]
    on_b = b.mint("openai")
    clean_stub.script({"hold_after_events": 2, "hold": "fleet-disable-1"})
    async with aiohttp.ClientSession() as session:
        idle = await connect(session, b.dataplane_url, on_b["token"])
        busy = await connect(session, b.dataplane_url, on_b["token"])
        await busy.send_str(create())
        await busy.receive(timeout=10)  # in flight, held by the stub
        status, _, body = a.api(
            "PATCH", f"/control/v2/accounts/{on_b['account_id']}/state", {"state": "disabled", "reason": "fleet test"}
        )
        assert status == 200, body
        assert await closed_with(idle, timeout_s=20) == 1008  # b heard it
        await busy.send_str(create())
        refused = await until_terminal(busy)
        assert (refused[-1]["type"], refused[-1]["error"]["code"]) == ("error", "administrative-disabled")
        clean_stub.release("fleet-disable-1")
        assert (await until_terminal(busy))[-1]["type"] == "response.completed"
        assert await closed_with(busy) == 1008
    assert len([e for e in clean_stub.requests() if e["method"] == "WS"]) == 1
