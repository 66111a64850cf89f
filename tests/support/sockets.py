"""Helpers for the WebSocket tests (SPEC §20): open a socket through the data plane, drive turns."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.support.attempts import O_MODEL

WS_HEADERS = {"openai-beta": "responses_websockets=2026-02-06", "originator": "codex_exec", "session-id": "sess-1"}


def create(model: str = O_MODEL, **fields: Any) -> str:
    return json.dumps({"type": "response.create", "model": model, "input": "hi", **fields})


async def connect(
    session: aiohttp.ClientSession, url: str, token: str, **kwargs: Any
) -> aiohttp.ClientWebSocketResponse:
    headers = {"Authorization": f"Bearer {token}", **WS_HEADERS, **kwargs.pop("headers", {})}
    return await session.ws_connect(url + "/v1/responses", autoping=False, autoclose=False, headers=headers, **kwargs)


async def turn(ws: aiohttp.ClientWebSocketResponse, message: str, timeout_s: float = 10) -> list[dict[str, Any]]:
    """Send one message; the events until a terminal one (or an `error`)."""
    await ws.send_str(message)
    return await until_terminal(ws, timeout_s)


async def until_terminal(ws: aiohttp.ClientWebSocketResponse, timeout_s: float = 10) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while True:
        msg = await ws.receive(timeout=timeout_s)
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise AssertionError(f"socket ended: {msg.type} {msg.data!r} after {got!r}")
        event = json.loads(msg.data)
        got.append(event)
        if event.get("type") in ("response.completed", "response.incomplete", "response.failed", "error"):
            return got


async def closed_with(ws: aiohttp.ClientWebSocketResponse, timeout_s: float = 10) -> int | None:
    """Read until the socket closes; its close code."""
    while True:
        msg = await ws.receive(timeout=timeout_s)
        if msg.type == aiohttp.WSMsgType.CLOSE:
            await ws.close()
            return msg.data
        if msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
            return ws.close_code
