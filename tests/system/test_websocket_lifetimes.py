"""How long a proxied socket lives (SPEC §20): gates at the handshake and per create, capacity,
budgets, a dispatch hop (1012), SIGTERM (1001), the upstream idle bound (1011)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp

from tests.support.attempts import settled
from tests.support.harness import Gateway, Stub, credential_like
from tests.support.harness import http as call
from tests.support.sockets import closed_with, connect, create, turn, until_terminal
from tests.support.waits import until, wait_until
from tests.system.test_budget_enforcement import put

UPGRADE = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}
B = "openai-team-b"


def handshake(gw: Gateway, token: str) -> tuple[int, dict, dict]:
    return call("GET", gw.dataplane_url + "/v1/responses", None, {"authorization": f"Bearer {token}", **UPGRADE})


def mint_v2(gw: Gateway, model: str = "gpt-5", **fields) -> dict:
    status, _, minted = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": "d-ws",
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "w-1",
            "model": model,
            **fields,
        },
    )
    assert status == 201, minted
    return minted


def account(tmp_path: Path, stub: Stub, name: str, extra: str = "", models: str = '"gpt-*"') -> Path:
    path = tmp_path / "accounts.toml"
    path.write_text(
        f'[[account]]\nid = "{name}"\nprovider_binding = "openai"\nbase_url = "{stub.url}"\n'
        f'auth_style = "bearer"\ncredential_env = "GATEWAY_B_KEY"\nmodels = [{models}]\n{extra}'
    )
    return path


async def test_request_capacity_at_the_handshake_and_per_create(make_gateway, clean_stub: Stub, tmp_path: Path) -> None:
    path = account(tmp_path, clean_stub, "capped-openai", "request_capacity = 1\n", '"capped-*"')
    gw = make_gateway({"GATEWAY_ACCOUNTS_FILE": str(path), "GATEWAY_B_KEY": clean_stub.openai_key}).start()
    minted = mint_v2(gw, "capped-model-1")
    clean_stub.script({"hold_after_events": 2, "hold": "cap-1"})
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gw.dataplane_url, minted["token"])
        await ws.send_str(create("capped-model-1"))
        await ws.receive(timeout=10)  # in flight: it holds the one slot
        status, headers, body = handshake(gw, minted["token"])  # a second socket: 429 before the upgrade
        assert (status, headers["retry-after"], body["error"]["code"]) == (429, "1", "request-capacity-exhausted")
        await ws.send_str(create("capped-model-1"))  # multiplexed: refused on the socket
        clean_stub.release("cap-1")
        got = await until_terminal(ws)
        assert got[-1]["error"]["code"] == "request-capacity-exhausted" and got[-1]["status"] == 429
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"
        assert (await turn(ws, create("capped-model-1")))[-1]["type"] == "response.completed"  # slot back
        await ws.close()
    rows = settled(gw, minted["key_id"], 4)
    assert sorted((r["status"], r["refusal_reason"]) for r in rows) == [
        ("completed", None),
        ("completed", None),
        ("refused", "request-capacity-exhausted"),
        ("refused", "request-capacity-exhausted"),
    ]
    assert {r["transport"] for r in rows} == {"websocket"}


async def test_an_exhausted_budget_closes_1008_and_refuses_the_handshake(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway().start()
    put(gw, "repo:acme/app", {"budgets": [{"window": "day", "usd": 0.000001}]})
    minted = gw.mint("openai")
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gw.dataplane_url, minted["token"])
        assert (await turn(ws, create()))[-1]["type"] == "response.completed"  # never cut by the gate
        assert await closed_with(ws, timeout_s=15) == 1008  # spent: rights lost
    status, headers, body = handshake(gw, minted["token"])
    assert (status, body["error"]["code"], headers["x-should-retry"]) == (429, "budget-exhausted", "false")
    rows = settled(gw, minted["key_id"], 2)
    assert [(r["status"], r["refusal_reason"]) for r in rows] == [("completed", None), ("refused", "budget-exhausted")]


async def test_a_dispatch_hop_closes_1012_and_the_reconnect_reaches_the_sibling(
    make_gateway, clean_stub: Stub, tmp_path: Path
) -> None:
    second = Stub(tmp_path / "stub-b", anthropic_key=None, openai_key=credential_like("sk-proj-"))
    try:
        path = account(tmp_path, second, B)
        gw = make_gateway({"GATEWAY_ACCOUNTS_FILE": str(path), "GATEWAY_B_KEY": second.openai_key}).start()
        minted = mint_v2(gw, fallback_driver="gateway")
        assert minted["account_id"] == "legacy-openai"
        clean_stub.script({"ws_error": {"code": "rate_limit_exceeded"}})
        async with aiohttp.ClientSession() as session:
            ws = await connect(session, gw.dataplane_url, minted["token"])
            assert (await turn(ws, create()))[-1]["error"]["code"] == "rate_limit_exceeded"
            assert await closed_with(ws) == 1012
            seen: list[tuple[int, str]] = []

            def bound() -> bool:  # meanwhile a handshake is refused 503 fallback-pending (§17)
                status, _, body = handshake(gw, minted["token"])
                seen.append((status, body["error"]["code"] if status == 503 else ""))
                return status != 503

            await until(bound, 15, "the hop bound")
            assert {s for s in seen if s[0] == 503} <= {(503, "fallback-pending")}, seen
            ws = await connect(session, gw.dataplane_url, minted["token"])
            assert (await turn(ws, create()))[-1]["type"] == "response.completed"
            await ws.close()
        rows = settled(gw, minted["key_id"], 2)
        assert [(r["account_id"], r["status"], r["condition"]) for r in rows if r["status"] != "refused"] == [
            ("legacy-openai", "upstream-error", "rate-limited"),
            (B, "completed", None),
        ]
        assert len([e for e in second.requests() if e["method"] == "WS"]) == 1
    finally:
        second.stop()


async def test_sigterm_drains_sockets_then_closes_1001(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway({"GATEWAY_DRAIN_SECONDS": "10"}).start()
    minted = gw.mint("openai")
    clean_stub.script({"hold_after_events": 2, "hold": "drain-1"})
    async with aiohttp.ClientSession() as session:
        idle = await connect(session, gw.dataplane_url, minted["token"])
        busy = await connect(session, gw.dataplane_url, minted["token"])
        await busy.send_str(create())
        await busy.receive(timeout=10)
        gw.dataplane.popen.send_signal(signal.SIGTERM)
        assert await closed_with(idle) == 1001  # nothing in flight: at once
        await busy.send_str(create())  # no new response while draining
        assert (await until_terminal(busy))[-1]["error"]["code"] == "gateway-shutdown"
        clean_stub.release("drain-1")
        assert (await until_terminal(busy))[-1]["type"] == "response.completed"
        assert await closed_with(busy) == 1001
    assert wait_until(lambda: gw.dataplane.popen.poll() is not None, 15, "the data plane exited") is not None
    rows = settled(gw, minted["key_id"], 2)
    assert sorted((r["status"], r["refusal_reason"]) for r in rows) == [
        ("completed", None),
        ("refused", "gateway-shutdown"),
    ]


async def test_the_upstream_idle_bound_runs_only_while_a_response_is_in_flight(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway({"GATEWAY_UPSTREAM_IDLE_TIMEOUT": "1"}).start()
    minted = gw.mint("openai")
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gw.dataplane_url, minted["token"])
        await asyncio.sleep(1.5)  # idle with nothing in flight: held, not a fault (the bound under test)
        assert (await turn(ws, create()))[-1]["type"] == "response.completed"
        clean_stub.script({"hold_after_events": 2, "hold": "idle-1"})
        await ws.send_str(create())
        assert await closed_with(ws) == 1011
    clean_stub.release("idle-1")
    rows = settled(gw, minted["key_id"], 2)
    assert [(r["status"], r["condition"]) for r in rows] == [
        ("completed", None),
        ("transport-error", "transport-error"),
    ]


def test_an_upstream_that_cannot_be_reached_is_a_transport_error_before_the_upgrade(make_gateway) -> None:
    import socket as _socket

    closed = _socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    try:
        gw = make_gateway(
            {
                "GATEWAY_OPENAI_BASE_URL": f"http://127.0.0.1:{closed.getsockname()[1]}",
                "GATEWAY_OPENAI_API_KEY": credential_like("sk-proj-"),
            },
            upstream=None,
        ).start()
        minted = gw.mint("openai")
        status, headers, body = handshake(gw, minted["token"])
        assert (status, body["error"]["code"]) == (502, "upstream-unreachable") and headers["x-request-id"]
        row = settled(gw, minted["key_id"], 1)[0]
        assert (row["status"], row["condition"], row["transport"]) == (
            "transport-error",
            "transport-error",
            "websocket",
        )
    finally:
        closed.close()
