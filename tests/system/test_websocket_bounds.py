"""SPEC §19's connection bounds per socket (SPEC §20): a worker that stops reading its socket is
cut after `GATEWAY_CLIENT_STALL_SECONDS` (its response ends `client-aborted`, its request slot
is released), and every open socket counts against `GATEWAY_MAX_CONNECTIONS`.

The gateway here runs with a stall bound of 1 s and a cap of 16 connections; its OpenAI account
has one request slot, so a slot a cut socket kept would refuse the next request.
"""

from __future__ import annotations

import base64
import os
import socket
import struct
from collections.abc import Iterator

import aiohttp
import pytest

from tests.support.attempts import O_MODEL, settled
from tests.support.harness import Gateway, Stub, http
from tests.support.sockets import connect, create, turn
from tests.support.waits import until, wait_until

STALL_S, CAP = 1, 16
ACCOUNTS = """
[[account]]
id = "openai-one"
provider_binding = "openai"
base_url = "{url}"
auth_style = "bearer"
credential_env = "GATEWAY_ONE_KEY"
models = ["gpt-*"]
request_capacity = 1
"""


@pytest.fixture(scope="module")
def bgw(tmp_path_factory: pytest.TempPathFactory, stub: Stub) -> Iterator[Gateway]:
    workdir = tmp_path_factory.mktemp("ws-bounds")
    accounts = workdir / "accounts.toml"
    accounts.write_text(ACCOUNTS.format(url=stub.url))
    gateway = Gateway(
        workdir,
        stub,
        {
            "GATEWAY_ACCOUNTS_FILE": str(accounts),
            "GATEWAY_ONE_KEY": stub.openai_key or "",
            "GATEWAY_CLIENT_STALL_SECONDS": str(STALL_S),
            "GATEWAY_MAX_CONNECTIONS": str(CAP),
        },
    ).start()
    status, _, body = gateway.api(
        "PUT",
        "/control/v2/policy/level",
        {
            "name": "platform",
            "expected_revision": 0,
            "reason": "one account",
            "document": {"account_order": ["openai-one"]},
        },
    )
    assert status == 200, body
    yield gateway
    gateway.stop()


def mint(gw: Gateway) -> dict:
    status, _, body = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": "d-" + os.urandom(4).hex(),
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "w-1",
            "model": O_MODEL,
        },
    )
    assert status == 201 and body["account_id"] == "openai-one", body
    return body


def raw_socket(gw: Gateway, token: str) -> socket.socket:
    """A WebSocket opened by hand on a tiny receive buffer, without permessage-deflate (so every
    byte the upstream sends is a byte to this buffer), that will read nothing after the upgrade."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", gw.dataplane_port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: Bearer {token}\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        piece = sock.recv(1)
        assert piece, head
        head += piece
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def text_frame(text: str) -> bytes:
    """One masked client text frame (RFC 6455 §5.2)."""
    data, mask = text.encode(), os.urandom(4)
    size = len(data)
    length = bytes([0x80 | size]) if size < 126 else bytes([0x80 | 126]) + struct.pack("!H", size)
    return b"\x81" + length + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def test_a_socket_that_stops_reading_is_cut_and_its_slot_released(bgw: Gateway, clean_stub: Stub) -> None:
    """16 MiB over >= 10 s (no kernel buffer absorbs it before the cut) to a worker that reads
    nothing: after 1 s its response ends client-aborted and the account's one slot serves again."""
    minted = mint(bgw)
    clean_stub.script({"deltas": 1024, "ws_pad": 16 * 1024, "stall_between_events_s": 0.01})
    sock = raw_socket(bgw, minted["token"])
    try:
        sock.sendall(text_frame(create()))
        row = settled(bgw, minted["key_id"], timeout_s=30)[0]
        assert (row["status"], row["condition"], row["transport"]) == ("client-aborted", None, "websocket")
        assert row["usage"] is None and 0 < row["bytes_out"] < 16 * 1024 * 1024
    finally:
        sock.close()
    status, _, body = http(
        "POST",
        bgw.dataplane_url + "/v1/responses",
        {"model": O_MODEL, "input": "hi"},
        {"authorization": f"Bearer {minted['token']}"},
    )
    assert status == 200, body  # the slot was released: not 429 request-capacity-exhausted
    wait_until(
        lambda: (
            [
                a["sockets_open"]
                for a in bgw.api("GET", "/control/v2/accounts")[2]["accounts"]
                if a["id"] == "openai-one"
            ]
            == [0]
        ),
        10,
        "the cut socket no longer open",
    )


async def test_sockets_count_against_the_connection_cap(bgw: Gateway, clean_stub: Stub) -> None:
    """16 open sockets fill the cap: a 17th connection is answered 503 `connection-limit`, the
    sockets go on; once one closes, a new connection is accepted."""
    minted = mint(bgw)
    wait_until(lambda: http("GET", bgw.dataplane_url + "/healthz")[0] == 200, 10, "no connection left over")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as session:
        sockets = [await connect(session, bgw.dataplane_url, minted["token"]) for _ in range(CAP)]
        status, headers, body = http("GET", bgw.dataplane_url + "/healthz")
        assert status == 503 and body["error"]["code"] == "connection-limit", (status, body)
        assert headers["retry-after"] == "1"
        assert (await turn(sockets[-1], create()))[-1]["type"] == "response.completed"  # open ones go on
        await sockets.pop().close()
        await until(
            lambda: http("GET", bgw.dataplane_url + "/healthz")[0] == 200, 10, "a connection accepted below the cap"
        )
        for ws in sockets:
            await ws.close()
    assert settled(bgw, minted["key_id"], 1)[0]["status"] == "completed"
