"""A disable ends a socket's rights (SPEC §20, §9), through real daemons and the stub's socket side.

After `PATCH /control/v2/accounts/{id}/state {"state":"disabled"}` returns, control has told
its data plane: a new `response.create` on the account's open sockets is refused on the socket
(`administrative-disabled`) and never reaches the upstream, the response in flight finishes,
and then both sockets close 1008; a new handshake is refused before the upgrade. A drain is no
loss of rights, HTTP requests on the account's live leases are not refused (SPEC stops its
mints and renewals only), and a data plane that reconnects hears the disable in its snapshot.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.support.attempts import O_MODEL, settled
from tests.support.harness import Gateway, Stub
from tests.support.harness import http as call
from tests.support.sockets import closed_with, connect, create, turn, until_terminal

ACCOUNT = "legacy-openai"
UPGRADE = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}


def set_state(gw: Gateway, state: str, account: str = ACCOUNT) -> None:
    status, _, body = gw.api("PATCH", f"/control/v2/accounts/{account}/state", {"state": state, "reason": "test"})
    assert status == 200, body


def handshake(gw: Gateway, token: str) -> tuple[int, dict[str, str], Any]:
    return call("GET", gw.dataplane_url + "/v1/responses", None, {"authorization": f"Bearer {token}", **UPGRADE})


def over_http(gw: Gateway, token: str) -> int:
    body = {"model": O_MODEL, "input": "hi"}
    return call("POST", gw.dataplane_url + "/v1/responses", body, {"authorization": f"Bearer {token}"})[0]


def ws_creates(stub: Stub) -> int:
    return len([e for e in stub.requests() if e["method"] == "WS"])


async def test_a_disable_refuses_new_creates_lets_the_one_in_flight_finish_then_1008(
    make_gateway, clean_stub: Stub
) -> None:
    gw = make_gateway().start()
    minted = gw.mint("openai")
    assert minted["account_id"] == ACCOUNT
    clean_stub.script({"hold_after_events": 2, "hold": "disable-1"})
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gw.dataplane_url, minted["token"])
        await ws.send_str(create())
        await ws.receive(timeout=10)  # in flight, held by the stub
        set_state(gw, "disabled")  # answers once the data plane has it
        await ws.send_str(create())  # a new create on the disabled account: refused on the socket
        refused = await until_terminal(ws)
        assert refused[-1]["type"] == "error", refused
        assert (refused[-1]["error"]["code"], refused[-1]["status"]) == ("administrative-disabled", 409)
        assert ws_creates(clean_stub) == 1  # it never reached the upstream
        clean_stub.release("disable-1")
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"  # the one in flight finished
        assert await closed_with(ws) == 1008
    status, headers, body = handshake(gw, minted["token"])  # a new socket: refused before the upgrade
    assert (status, body["error"]["code"], headers["x-should-retry"]) == (409, "administrative-disabled", "false")
    assert over_http(gw, minted["token"]) == 200  # HTTP on the live lease is served (SPEC stops mints)
    assert ws_creates(clean_stub) == 1
    rows = settled(gw, minted["key_id"], 4)
    assert sorted((r["transport"], r["status"], r["refusal_reason"] or "") for r in rows) == [
        ("http", "completed", ""),
        ("websocket", "completed", ""),
        ("websocket", "refused", "administrative-disabled"),
        ("websocket", "refused", "administrative-disabled"),
    ]


async def test_an_idle_socket_closes_1008_a_drain_does_not_and_a_reconnected_data_plane_knows(
    make_gateway, clean_stub: Stub
) -> None:
    gw = make_gateway().start()
    minted = gw.mint("openai")
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gw.dataplane_url, minted["token"])
        assert (await turn(ws, create()))[-1]["type"] == "response.completed"
        set_state(gw, "draining")  # stops new mints only: no loss of the lease's rights
        assert (await turn(ws, create()))[-1]["type"] == "response.completed"
        set_state(gw, "disabled")
        assert await closed_with(ws, timeout_s=10) == 1008  # nothing in flight: at once (the sweep)
        gw.dataplane.stop()  # a data plane that (re)connects hears the disable in its snapshot
        gw.start_dataplane()
        gw.wait_synchronised()
        assert handshake(gw, minted["token"])[0] == 409
        set_state(gw, "enabled")  # enabled again: sockets are served again
        ws = await connect(session, gw.dataplane_url, minted["token"])
        assert (await turn(ws, create()))[-1]["type"] == "response.completed"
        await ws.close()
    assert ws_creates(clean_stub) == 3
