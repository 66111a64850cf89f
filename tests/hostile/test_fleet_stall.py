"""A stalled reader releases its fleet-wide request slot (SPEC §16, §19).

Two pairs on one redis-server share `capped` (request_capacity 1). A worker on host A that reads
nothing of an 8 MiB stream held the fleet's only slot for as long as its connection stayed open
(on main: host B answered 429 until then); with `GATEWAY_CLIENT_STALL_SECONDS=1` its attempt
ends `client-aborted`, the upstream request is cancelled and the slot goes back to Redis, so
host B serves the next request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostile.conftest import dataplane_healthy
from tests.hostile.test_connections import _big_stream, connect
from tests.support.attempts import A_HEADERS
from tests.support.fleet import fleet_secret_file
from tests.support.harness import Gateway, Stub, http
from tests.support.redis_server import RedisServer
from tests.support.waits import wait_until

MODEL = "capped-1"


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def _mint(gw: Gateway, dispatch: str) -> dict:
    status, _, body = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": dispatch,
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "w-1",
            "model": MODEL,
        },
    )
    assert status == 201 and body["account_id"] == "capped", body
    return body


def test_a_stalled_reader_releases_its_fleet_wide_slot(
    make_gateway, tmp_path: Path, stub: Stub, redis: RedisServer
) -> None:
    stub.reset()
    accounts = tmp_path / "accounts.toml"
    accounts.write_text(f'''
[[account]]
id = "capped"
provider_binding = "anthropic"
base_url = "{stub.url}"
auth_style = "x-api-key"
credential_env = "GATEWAY_CAPPED_KEY"
models = ["capped-*"]
request_capacity = 1
''')
    common = {
        "GATEWAY_ACCOUNTS_FILE": str(accounts),
        "GATEWAY_CAPPED_KEY": stub.anthropic_key or "",
        "GATEWAY_FLEET_REDIS_URL": redis.url,
        "GATEWAY_FLEET_ID": "stall",
        "GATEWAY_FLEET_HOST_TTL_SECONDS": "3",
        "GATEWAY_CLIENT_STALL_SECONDS": "1",
        "GATEWAY_FLEET_SECRET_FILE": str(fleet_secret_file(tmp_path)),
    }  # SPEC §19
    a = make_gateway({**common, "GATEWAY_HOST_ID": "host-a"}, name="a").start()
    b = make_gateway({**common, "GATEWAY_HOST_ID": "host-b"}, name="b").start()
    on_a, on_b = _mint(a, "d-stall-a"), _mint(b, "d-stall-b")
    stub.script({"body": _big_stream(1024, 16 * 1024), "stall_between_events_s": 0.01})
    sock = connect(a, rcvbuf=4096)
    body = json.dumps({"model": MODEL, "max_tokens": 8, "stream": True, "messages": []}).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in {**A_HEADERS, "x-api-key": on_a["token"]}.items())
    sock.send(f"POST /v1/messages HTTP/1.1\r\nHost: x\r\n{head}content-length: {len(body)}\r\n\r\n".encode() + body)
    wait_until(lambda: stub.requests() and stub.requests()[0]["events_sent"] > 0, 10, "the stream began")
    plain = {"model": MODEL, "max_tokens": 8, "messages": []}
    wait_until(
        lambda: (
            http("POST", b.dataplane_url + "/v1/messages", plain, {**A_HEADERS, "x-api-key": on_b["token"]})[0] == 200
        ),
        15,
        "host B served once A's stalled reader was cut",
    )
    a.recent()  # a read drains A's data plane: its aborted row, sent lazily, is then on disk
    rows = [r for r in a.ledger() if r["key_id"] == on_a["key_id"]]
    assert [(r["status"], r["condition"]) for r in rows] == [("client-aborted", None)]
    assert stub.requests()[0]["outcome"] == "client-gone"
    sock.close()
    assert dataplane_healthy(a) and dataplane_healthy(b)
