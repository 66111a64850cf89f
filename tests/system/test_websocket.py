"""The Responses API over WebSocket (SPEC §20), through real daemons and the stub's socket side."""

from __future__ import annotations

import aiohttp

from tests.support.attempts import O_MODEL, assert_swapped, settled, stub_entry
from tests.support.harness import Gateway, Stub
from tests.support.sockets import closed_with, connect, create, turn


async def test_turn_over_socket_one_row(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gateway.dataplane_url, minted["token"])
        events = await turn(ws, create())
        assert events[-1]["type"] == "response.completed"
        assert events[0]["type"] == "response.created"
        await ws.close()
    row = settled(gateway, minted["key_id"], 1)[0]
    assert (row["transport"], row["stream"], row["status"], row["http_status"]) == (
        "websocket", True, "completed", 200)
    assert row["requested_model"] == row["served_model"] == O_MODEL and row["usage"]["output_tokens"] == 3
    entry = stub_entry(clean_stub, lambda e: e["method"] == "WS")
    assert_swapped(entry, minted["token"], "authorization", clean_stub.openai_key)
    assert entry["headers"]["openai-beta"] == "responses_websockets=2026-02-06"
