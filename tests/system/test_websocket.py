"""The Responses API over WebSocket (SPEC §20), through real daemons and the stub's socket side.

Each test drives a socket as Codex does (aiohttp's client, `openai-beta` on the handshake) and
reads what the worker got, what reached the stub, and the rows control holds.
"""

from __future__ import annotations

import json

import aiohttp
import pytest

from tests.support.attempts import O_MODEL, assert_swapped, rows_for, settled
from tests.support.harness import Gateway, Stub
from tests.support.harness import http as call
from tests.support.sockets import WS_HEADERS, closed_with, connect, create, turn, until_terminal
from tests.support.waits import until

UPGRADE = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}


def ws_entries(stub: Stub) -> list[dict]:
    return [e for e in stub.requests() if e["method"] == "WS"]


async def test_turns_chain_over_one_socket_one_row_each(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gateway.dataplane_url, minted["token"])
        warm = await turn(ws, create(generate=False))  # Codex's warmup: an attempt
        assert [e["type"] for e in warm] == ["response.created", "response.completed"]
        events = await turn(ws, create())
        assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
        sequence = [e["sequence_number"] for e in events]
        assert sequence == sorted(sequence) == list(range(len(events)))  # in order, none lost
        previous = events[-1]["response"]["id"]
        for _ in range(2):  # turns chain previous_response_id
            events = await turn(ws, create(previous_response_id=previous))
            assert events[-1]["type"] == "response.completed", events[-1]
            previous = events[-1]["response"]["id"]
        await ws.close()
    rows = settled(gateway, minted["key_id"], 4)
    assert {(r["transport"], r["stream"], r["status"], r["http_status"]) for r in rows} == {
        ("websocket", True, "completed", 200)
    }
    assert [r["usage"]["output_tokens"] for r in rows] == [0, 3, 3, 3]
    assert all(r["requested_model"] == r["served_model"] == O_MODEL for r in rows)
    # SPEC §14: each response.create sent upstream → its first event; a first mint's lease: hop 0
    assert all(r["first_byte_ms"] >= 0 and r["hop"] == 0 for r in rows), rows
    entries = ws_entries(clean_stub)
    assert [e["generate"] for e in entries] == [False, True, True, True]
    assert entries[2]["previous_response_id"] is not None
    assert_swapped(entries[0], minted["token"], "authorization", clean_stub.openai_key)
    for name, value in WS_HEADERS.items():  # handshake headers pass
        assert entries[0]["headers"][name] == value


async def test_http_rows_say_http(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    status, _, _ = call(
        "POST",
        gateway.dataplane_url + "/v1/responses",
        {"model": O_MODEL, "input": "hi"},
        {"authorization": f"Bearer {minted['token']}"},
    )
    assert status == 200
    assert settled(gateway, minted["key_id"], 1)[0]["transport"] == "http"


def test_unknown_key_is_401_before_the_upgrade(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    gateway.revoke(minted["key_id"])
    for token in ("lhgw_01J00000000000000000000000.BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB", minted["token"]):
        status, headers, body = call(
            "GET", gateway.dataplane_url + "/v1/responses", None, {"authorization": f"Bearer {token}", **UPGRADE}
        )
        assert status == 401 and headers["x-should-retry"] == "false"
        assert body["error"]["code"] == "unknown-key" and body["error"]["type"] == "authentication_error"
    assert clean_stub.requests() == [] and rows_for(gateway, minted["key_id"]) == []


def test_other_upgrades_are_426_after_authentication(gateway: Gateway, clean_stub: Stub) -> None:
    anthropic_lease, openai_lease = gateway.mint(), gateway.mint("openai")
    for token, path in ((anthropic_lease["token"], "/v1/responses"), (openai_lease["token"], "/v1/chat/completions")):
        status, headers, body = call(
            "GET", gateway.dataplane_url + path, None, {"authorization": f"Bearer {token}", **UPGRADE}
        )
        assert status == 426 and body["error"]["code"] == "websocket-not-supported", body
        assert headers["x-request-id"]
    assert clean_stub.requests() == []


@pytest.mark.parametrize("refused, answered", [(404, 426), (405, 426), (426, 426), (429, 429), (503, 503)])
def test_an_upstream_handshake_refusal(gateway: Gateway, clean_stub: Stub, refused: int, answered: int) -> None:
    minted = gateway.mint("openai")
    clean_stub.script({"ws_handshake_status": refused, "headers": {"retry-after": "2"}})
    status, headers, body = call(
        "GET", gateway.dataplane_url + "/v1/responses", None, {"authorization": f"Bearer {minted['token']}", **UPGRADE}
    )
    assert status == answered
    if answered == 426:
        assert body["error"]["code"] == "websocket-not-supported"
    else:  # passed through as HTTP: status, headers, the upstream's own body
        assert headers["retry-after"] == "2" and body["error"]["type"] != "leasehold"
    row = settled(gateway, minted["key_id"], 1)[0]
    assert (row["status"], row["http_status"], row["transport"]) == ("upstream-error", refused, "websocket")
    assert row["condition"] == {429: "rate-limited", 503: "upstream-unavailable"}.get(refused)


async def test_refusals_on_the_socket_keep_it_open(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gateway.dataplane_url, minted["token"])
        for message, code in (
            (create(model="claude-sonnet-4-6"), "model-not-permitted"),
            ('{"type": "response.create", "model": "gpt-5", "model": "x"}', "invalid-request-body"),
            ('{"type": "response.create", "model": NaN}', "invalid-request-body"),
            ("[1, 2]", "invalid-request-body"),
        ):
            events = await turn(ws, message)
            assert events == [
                {
                    "type": "error",
                    "status": 400,
                    "error": {"type": "invalid_request_error", "code": code, "message": events[0]["error"]["message"]},
                }
            ]
        assert (await turn(ws, create()))[-1]["type"] == "response.completed"  # still open, still served
        await ws.close()
    rows = settled(gateway, minted["key_id"], 5)
    assert [(r["status"], r["refusal_reason"], r["condition"]) for r in rows[:4]] == [
        ("refused", "model-not-permitted", None)
    ] + [("refused", "invalid-request-body", None)] * 3
    assert [r["first_byte_ms"] is None for r in rows] == [True] * 4 + [False]
    assert len(ws_entries(clean_stub)) == 1  # nothing refused went upstream


@pytest.mark.parametrize(
    "step, status, condition",
    [
        ({"ws_error": {"code": "rate_limit_exceeded"}}, 429, "rate-limited"),
        ({"ws_error": {"code": "insufficient_quota"}}, 429, "rate-limited"),
        ({"ws_error": {"code": "invalid_api_key"}}, 401, "credential-rejected"),
        ({"ws_error": {"code": "rate_limit_exceeded", "status": 503}}, 503, "upstream-unavailable"),
        ({"ws_error": {"code": "context_length_exceeded", "status": 400}}, 400, None),
        ({"ws_error": {"code": "something_new"}, "ws_error_after_events": 2}, None, None),
        ({"ws_failed_code": "server_error"}, 500, "upstream-unavailable"),
    ],
    ids=["rate-limit", "quota", "key", "status-wins", "request-fault", "unknown", "failed"],
)
async def test_socket_errors_are_evidence_as_their_http_status(
    gateway: Gateway, clean_stub: Stub, step: dict, status: int | None, condition: str | None
) -> None:
    minted = gateway.mint("openai")
    clean_stub.script(step)
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gateway.dataplane_url, minted["token"])
        events = await turn(ws, create())
        assert events[-1]["type"] in ("error", "response.failed")
        # §7: the row was at control before the worker saw the event
        row = rows_for(gateway, minted["key_id"])
        assert [(r["status"], r["http_status"], r["condition"]) for r in row] == [("upstream-error", status, condition)]
        assert (await turn(ws, create()))[-1]["type"] == "response.completed"
        await ws.close()
    settled(gateway, minted["key_id"], 2)


async def test_an_upstream_cut_mid_response_is_a_transport_error_and_1011(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    clean_stub.script({"ws_cut_after_events": 3})
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gateway.dataplane_url, minted["token"])
        await ws.send_str(create())
        assert await closed_with(ws) == 1011
    row = settled(gateway, minted["key_id"], 1)[0]
    assert (row["status"], row["condition"], row["transport"]) == ("transport-error", "transport-error", "websocket")


async def test_the_worker_closing_mid_response_is_client_aborted(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    clean_stub.script({"hold_after_events": 2, "hold": "abort-1"})
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gateway.dataplane_url, minted["token"])
        await ws.send_str(create())
        await ws.receive(timeout=10)
        await until(lambda: gateway.active()["count"] >= 1, 10, "the attempt in flight")
        await ws.close(code=4001)
    clean_stub.release("abort-1")
    row = settled(gateway, minted["key_id"], 1)[0]
    assert (row["status"], row["condition"]) == ("client-aborted", None)


async def test_pings_and_close_codes_pass_through(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    clean_stub.script({"ws_close_after_events": 11, "ws_close_code": 4000})  # after response.completed
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gateway.dataplane_url, minted["token"])
        await ws.ping(b"p-1")
        msg = await ws.receive(timeout=10)
        assert (msg.type, msg.data) == (aiohttp.WSMsgType.PONG, b"p-1")  # the stub's pong
        await ws.send_str(create())
        events = await until_terminal(ws)
        assert events[-1]["type"] == "response.completed"
        assert await closed_with(ws) == 4000
    assert settled(gateway, minted["key_id"], 1)[0]["status"] == "completed"


async def test_permessage_deflate_is_negotiated_per_side(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    async with aiohttp.ClientSession() as session:
        for compress in (0, 15):
            ws = await connect(session, gateway.dataplane_url, minted["token"], compress=compress)
            assert ws.compress == compress
            assert (await turn(ws, create()))[-1]["type"] == "response.completed"
            await ws.close()
    # offered upstream only where the worker offered it: a worker without it costs no inflate
    assert [
        "permessage-deflate" in e["headers"].get("sec-websocket-extensions", "") for e in ws_entries(clean_stub)
    ] == [False, True]


async def test_after_a_revoke_the_response_in_flight_finishes_then_1008(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    clean_stub.script({"hold_after_events": 2, "hold": "revoke-1"})
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gateway.dataplane_url, minted["token"])
        await ws.send_str(create())
        await ws.receive(timeout=10)
        gateway.revoke(minted["key_id"])
        await ws.send_str(create())  # a new create while revoked: refused
        refused = await until_terminal(ws)
        assert refused[-1]["error"]["code"] == "unknown-key"
        clean_stub.release("revoke-1")
        finished = await until_terminal(ws)
        assert finished[-1]["type"] == "response.completed"  # the one in flight finished
        assert await closed_with(ws) == 1008
    rows = settled(gateway, minted["key_id"], 2)
    assert sorted(r["status"] for r in rows) == ["completed", "refused"]
    assert len(ws_entries(clean_stub)) == 1


async def test_an_idle_socket_closes_1008_at_once_after_a_revoke(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gateway.dataplane_url, minted["token"])
        assert (await turn(ws, create()))[-1]["type"] == "response.completed"
        gateway.revoke(minted["key_id"])
        assert await closed_with(ws, timeout_s=5) == 1008


def sockets_open(gw: Gateway, account: str = "legacy-openai") -> int:
    view = gw.api("GET", "/control/v2/accounts")[2]
    return next(a["sockets_open"] for a in view["accounts"] if a["id"] == account)


async def test_views_show_socket_attempts_and_open_sockets(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    before = sockets_open(gateway)
    clean_stub.script({"hold_after_events": 2, "hold": "views-1"})
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gateway.dataplane_url, minted["token"])
        other = await connect(session, gateway.dataplane_url, minted["token"])
        await until(lambda: sockets_open(gateway) == before + 2, 10, "two sockets open in the view")
        await ws.send_str(create())
        active = await until(
            lambda: [r for r in gateway.active()["routes"] if r["key_id"] == minted["key_id"]],
            10,
            "the socket attempt in flight",
        )
        assert (active[0]["transport"], active[0]["stream"], active[0]["path"]) == ("websocket", True, "/v1/responses")
        clean_stub.release("views-1")
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
        await ws.close()
        await other.close()
    await until(lambda: sockets_open(gateway) == before, 10, "the sockets closed in the view")
    settled(gateway, minted["key_id"], 1)


async def test_no_secret_reaches_a_log_a_row_or_a_view(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    token = minted["token"]
    clean_stub.script({"ws_handshake_status": 429}, {}, {"ws_cut_after_events": 2})
    async with aiohttp.ClientSession() as session:
        assert handshake_status(gateway, token) == 429
        ws = await connect(session, gateway.dataplane_url, token)
        assert (await turn(ws, create()))[-1]["type"] == "response.completed"
        await ws.send_str(create())
        assert await closed_with(ws) == 1011
    settled(gateway, minted["key_id"], 3)
    texts = [
        gateway.logs(),
        json.dumps(gateway.ledger()),
        json.dumps(gateway.active()),
        json.dumps(gateway.recent()),
        json.dumps(gateway.api("GET", "/control/v2/accounts")[2]),
    ]
    for secret in (clean_stub.openai_key, token, token.split(".", 1)[1]):
        assert not any(secret in text for text in texts)
    assert minted["key_id"] in texts[1]  # the search is not vacuous


def handshake_status(gw: Gateway, token: str) -> int:
    return call("GET", gw.dataplane_url + "/v1/responses", None, {"authorization": f"Bearer {token}", **UPGRADE})[0]


async def test_socket_attempts_carry_the_handshakes_trace_context(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with aiohttp.ClientSession() as session:
        ws = await connect(
            session,
            gateway.dataplane_url,
            minted["token"],
            headers={"Authorization": f"Bearer {minted['token']}", "traceparent": parent},
        )
        for _ in range(2):
            assert (await turn(ws, create()))[-1]["type"] == "response.completed"
        await ws.close()
    assert [r["traceparent"] for r in settled(gateway, minted["key_id"], 2)] == [parent, parent]
    assert ws_entries(clean_stub)[0]["headers"]["traceparent"] == parent  # passed upstream too
