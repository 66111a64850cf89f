"""Several responses on one socket (SPEC §20): each upstream event is matched to its
`response.create` by what it names, and every response that went upstream ends in one row.

The stub answers creates concurrently (`ws_parallel`) and interleaves them with named holds, so
the order of events is fixed by the test, not by timing.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import aiohttp
import pytest

from tests.support.attempts import O_MODEL, rows_for, settled
from tests.support.harness import Gateway, Stub
from tests.support.sockets import connect, create, until_terminal
from tests.support.waits import until

OTHER = "gpt-4o-mini"


async def read(ws: aiohttp.ClientWebSocketResponse, n: int, log: list[str]) -> list[dict[str, Any]]:
    """The next `n` events (their raw text kept in `log`)."""
    got = []
    for _ in range(n):
        msg = await ws.receive(timeout=10)
        assert msg.type == aiohttp.WSMsgType.TEXT, (msg.type, msg.data, got)
        log.append(msg.data)
        got.append(json.loads(msg.data))
    return got


async def to_end(ws: aiohttp.ClientWebSocketResponse, log: list[str]) -> list[dict[str, Any]]:
    """Events until a terminal one (raw text kept in `log`)."""
    got: list[dict[str, Any]] = []
    while not got or got[-1]["type"] not in ("response.completed", "response.failed", "error"):
        got += await read(ws, 1, log)
    return got


async def steer(
    session: aiohttp.ClientSession, gw: Gateway, stub: Stub, token: str, log: list[str]
) -> tuple[aiohttp.ClientWebSocketResponse, list[dict[str, Any]]]:
    """Steering, as Codex does it: a create for `O_MODEL`, and while its response streams (two
    events in) a create for `OTHER`, which makes the stub drop the first without a terminal."""
    stub.script({"ws_drop_on_next": True, "holds": {"2": f"steer-{uuid.uuid4().hex[:8]}"}}, {"deltas": 4})
    ws = await connect(session, gw.dataplane_url, token)
    await ws.send_str(create(O_MODEL))
    first = await read(ws, 2, log)
    await ws.send_str(create(OTHER))
    return ws, first


def by_model(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    assert len({r["requested_model"] for r in rows}) == len(rows), rows
    return {r["requested_model"]: r for r in rows}


def bytes_of(log: list[str], response_id: str, item_id: str) -> int:
    """What the events of one response weigh, as the gateway counts `bytes_out` (text length)."""

    def mine(event: dict[str, Any]) -> bool:
        return (
            (event.get("response") or {}).get("id") == response_id
            or event.get("item_id") == item_id
            or (event.get("item") or {}).get("id") == item_id
        )

    return sum(len(text) for text in log if mine(json.loads(text)))


async def test_interleaved_responses_each_get_their_own_row(gateway: Gateway, clean_stub: Stub) -> None:
    tag = uuid.uuid4().hex[:8]
    clean_stub.script(
        {"ws_parallel": True, "deltas": 2, "holds": {"1": f"a1-{tag}", "4": f"a2-{tag}"}},
        {"ws_parallel": True, "deltas": 5, "holds": {"2": f"b1-{tag}"}},
    )
    minted = gateway.mint("openai")
    log: list[str] = []
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gateway.dataplane_url, minted["token"])
        await ws.send_str(create(OTHER, metadata={"turn": "a"}))
        (a_created,) = await read(ws, 1, log)  # a: created, then held
        await ws.send_str(create(O_MODEL, metadata={"turn": "b"}))
        b_head = await read(ws, 2, log)  # b: created, in_progress
        clean_stub.release(f"a1-{tag}")
        a_mid = await read(ws, 3, log)  # a speaks while b is open
        clean_stub.release(f"b1-{tag}")
        b_rest = await to_end(ws, log)  # b ends first
        clean_stub.release(f"a2-{tag}")
        a_rest = await to_end(ws, log)
        await ws.close()
    assert a_created["response"]["model"] == OTHER and b_head[0]["response"]["model"] == O_MODEL
    assert [e["type"] for e in a_mid] == [
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert b_rest[-1]["type"] == a_rest[-1]["type"] == "response.completed"
    rows = by_model(settled(gateway, minted["key_id"], 2))
    assert [rows[m]["usage"]["output_tokens"] for m in (OTHER, O_MODEL)] == [2, 5]
    assert [rows[m]["served_model"] for m in (OTHER, O_MODEL)] == [OTHER, O_MODEL]
    assert {(r["status"], r["http_status"], r["transport"]) for r in rows.values()} == {("completed", 200, "websocket")}
    a_item = a_mid[1]["item"]["id"]
    b_item = next(e["item"]["id"] for e in b_rest if e["type"] == "response.output_item.added")
    assert rows[OTHER]["bytes_out"] == bytes_of(log, a_created["response"]["id"], a_item)
    assert rows[O_MODEL]["bytes_out"] == bytes_of(log, b_head[0]["response"]["id"], b_item)


async def test_an_error_for_a_second_create_ends_that_create(gateway: Gateway, clean_stub: Stub) -> None:
    """The upstream refuses the second create (an `error` naming nothing) while the first streams:
    the error ends the second; the first keeps streaming and ends with its own usage."""
    tag = uuid.uuid4().hex[:8]
    clean_stub.script({"ws_parallel": True, "deltas": 4, "holds": {"2": f"c1-{tag}"}}, {"ws_parallel": True})
    minted = gateway.mint("openai")
    log: list[str] = []
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gateway.dataplane_url, minted["token"])
        await ws.send_str(create(O_MODEL))
        await read(ws, 2, log)
        await ws.send_str(create(OTHER, previous_response_id="resp_unknown"))
        (error,) = await read(ws, 1, log)
        assert error["type"] == "error" and error["error"]["code"] == "previous_response_not_found"
        clean_stub.release(f"c1-{tag}")
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
        await ws.close()
    rows = by_model(settled(gateway, minted["key_id"], 2))
    assert (rows[OTHER]["status"], rows[OTHER]["http_status"], rows[OTHER]["usage"]) == ("upstream-error", 400, None)
    assert (rows[O_MODEL]["status"], rows[O_MODEL]["usage"]["output_tokens"]) == ("completed", 4)


async def test_a_response_dropped_for_its_successor_still_ends_in_one_row(gateway: Gateway, clean_stub: Stub) -> None:
    """Steering: a create sent while a response streams makes the upstream drop that response
    without a terminal event. The successor's row has its usage; the dropped one ends with a 200
    row without usage, so it counts as unpriced (SPEC §19), and both slots are released."""
    minted = gateway.mint("openai")
    log: list[str] = []
    async with aiohttp.ClientSession() as session:
        ws, first = await steer(session, gateway, clean_stub, minted["token"], log)
        events = await until_terminal(ws)
        assert events[-1]["type"] == "response.completed" and events[-1]["response"]["model"] == OTHER
        rows = by_model(settled(gateway, minted["key_id"], 2))  # while the socket is open
        await until(
            lambda: not [r for r in gateway.active()["routes"] if r["key_id"] == minted["key_id"]],
            10,
            "no attempt in flight",
        )
        await ws.close()
    assert first[0]["response"]["model"] == O_MODEL
    assert (rows[OTHER]["status"], rows[OTHER]["usage"]["output_tokens"]) == ("completed", 4)
    dropped = rows[O_MODEL]
    assert (dropped["status"], dropped["http_status"], dropped["usage"]) == ("completed", 200, None)
    assert dropped["cost_usd"] is None and dropped["cost_reason"] == "unpriced"
    assert dropped["bytes_out"] == sum(len(t) for t in log)
    outcomes = [e["outcome"] for e in clean_stub.requests() if e["method"] == "WS"]
    assert outcomes == ["dropped", "completed"]


async def test_a_dropped_response_is_unpriced_in_its_budget(make_gateway, clean_stub: Stub) -> None:
    """SPEC §19: a 2xx row without usage is unpriced, never $0 in silence: in a budgeted scope
    the budget counts it in `unpriced_attempts` (its spend is the priced successor's alone)."""
    gw = make_gateway().start()
    status, _, body = gw.api(
        "PUT",
        "/control/v2/policy/level",
        {
            "name": "repo:acme/app",
            "expected_revision": gw.api("GET", "/control/v2/policy")[2]["revision"],
            "document": {"budgets": [{"window": "day", "usd": 100.0}]},
            "reason": "budget",
        },
    )
    assert status == 200, body
    minted = gw.mint("openai")
    log: list[str] = []
    async with aiohttp.ClientSession() as session:
        ws, _ = await steer(session, gw, clean_stub, minted["token"], log)
        assert (await to_end(ws, log))[-1]["type"] == "response.completed"
        await ws.close()
    rows = by_model(settled(gw, minted["key_id"], 2))
    assert rows[O_MODEL]["cost_reason"] == "unpriced" and rows[OTHER]["cost_usd"] > 0
    budget = next(b for b in gw.api("GET", "/control/v2/budgets")[2]["budgets"] if b["level"] == "repo:acme/app")
    assert budget["unpriced_attempts"] == 1 and budget["spent_usd"] == pytest.approx(rows[OTHER]["cost_usd"]), budget


async def test_a_create_continuing_a_response_in_flight_ends_it_when_answered(
    gateway: Gateway, clean_stub: Stub
) -> None:
    """A create whose `previous_response_id` names the response still in flight continues it:
    once the upstream answers the successor (`response.created`), the continued response has
    its row, before the successor ends."""
    tag = uuid.uuid4().hex[:8]
    clean_stub.script(
        {"ws_drop_on_next": True, "holds": {"2": f"k1-{tag}"}}, {"deltas": 2, "holds": {"1": f"k2-{tag}"}}
    )
    minted = gateway.mint("openai")
    log: list[str] = []
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gateway.dataplane_url, minted["token"])
        await ws.send_str(create(O_MODEL))
        first = await read(ws, 2, log)
        await ws.send_str(create(OTHER, previous_response_id=first[0]["response"]["id"]))
        (created,) = await read(ws, 1, log)
        assert created["type"] == "response.created", created
        (continued,) = await until(
            lambda: rows_for(gateway, minted["key_id"]), 10, "the continued response's row, the successor still open"
        )
        assert (continued["requested_model"], continued["status"], continued["usage"]) == (O_MODEL, "completed", None)
        clean_stub.release(f"k2-{tag}")
        assert (await to_end(ws, log))[-1]["type"] == "response.completed"
        await ws.close()
    rows = by_model(settled(gateway, minted["key_id"], 2))
    assert rows[OTHER]["usage"]["output_tokens"] == 2 and rows[O_MODEL]["cost_reason"] == "unpriced"
