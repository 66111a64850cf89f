"""Large client messages on a socket (SPEC §19, §20), through real daemons and the stub's socket side.

A text message of `OFF_LOOP_BYTES` or more is read in a reader process (`events.read_message`),
as strictly as a small one: a valid `response.create` goes upstream byte for byte, one with a
second `model` is refused on the socket and never sent, and the socket's messages keep their
order (a later small message waits for the large one's read).
"""

from __future__ import annotations

import json

import aiohttp

from dataplane.bodies import OFF_LOOP_BYTES
from tests.hostile.test_large_bodies import _children
from tests.support.attempts import O_MODEL, settled
from tests.support.harness import Gateway, Stub
from tests.support.sockets import connect, create, turn, until_terminal

WAIT_S = 60  # a first reader process starts on a loaded machine
TEXT = "The reader reads this. " * (OFF_LOOP_BYTES // 8)  # ~3 x the threshold


def _large(**fields: object) -> str:
    """A compact (as the stub re-encodes it) `response.create` past the threshold."""
    message = {"type": "response.create", "model": O_MODEL, "input": TEXT, **fields}
    return json.dumps(message, separators=(",", ":"))


def _ws_entries(stub: Stub) -> list[dict]:
    return [e for e in stub.requests() if e["method"] == "WS"]


async def test_a_large_create_is_read_off_the_loop_and_relayed_intact(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    message = _large(metadata={"turn": "1"})
    assert len(message.encode()) >= 2 * OFF_LOOP_BYTES
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gateway.dataplane_url, minted["token"])
        events = await turn(ws, message, timeout_s=WAIT_S)
        assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed", events[-1]
        assert _children(gateway.dataplane.popen.pid)  # type: ignore[union-attr]  # its reader (idle 60 s)
        await ws.close()
    row = settled(gateway, minted["key_id"], 1, timeout_s=WAIT_S)[0]
    assert (row["status"], row["transport"], row["requested_model"]) == ("completed", "websocket", O_MODEL)
    (entry,) = _ws_entries(clean_stub)
    assert (entry["model"], entry["body_len"]) == (O_MODEL, len(message.encode()))  # byte for byte


async def test_a_large_create_with_a_second_model_is_refused_in_order(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    doubled = _large()[:-1] + ',"model":"gpt-4o"}'
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gateway.dataplane_url, minted["token"])
        await ws.send_str(doubled)
        await ws.send_str(create())  # sent at once: it must not overtake the large one
        refused = await until_terminal(ws, WAIT_S)
        served = await until_terminal(ws, WAIT_S)
        await ws.close()
    assert refused == [
        {
            "type": "error",
            "status": 400,
            "error": {
                "type": "invalid_request_error",
                "code": "invalid-request-body",
                "message": "the request body has more than one top-level 'model'",
            },
        }
    ]
    assert served[0]["type"] == "response.created" and served[-1]["type"] == "response.completed"
    rows = settled(gateway, minted["key_id"], 2, timeout_s=WAIT_S)
    assert [(r["status"], r["refusal_reason"]) for r in rows] == [
        ("refused", "invalid-request-body"),
        ("completed", None),
    ]
    (entry,) = _ws_entries(clean_stub)  # only the small one went upstream
    assert entry["body_len"] == len(create().encode().replace(b", ", b",").replace(b": ", b":"))
