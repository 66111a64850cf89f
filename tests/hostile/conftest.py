"""A gateway whose leases are held to narrow models, for hostile workers to try.

Two declared accounts point at the stub: `anthropic-haiku` (models `claude-haiku-*`, request
capacity 1) and `openai-mini` (models `gpt-5-mini`); a platform policy orders them first, so a
v2 mint lands on them. A body that reaches the upstream naming another model walked around its
lease.
"""

from __future__ import annotations

import http.client as httpclient
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.harness import Gateway, Stub, http

HAIKU, OPUS = "claude-haiku-4-5", "claude-opus-4-1"
MINI, FULL = "gpt-5-mini", "gpt-5"
ACCOUNTS = """
[[account]]
id = "anthropic-haiku"
provider_binding = "anthropic"
base_url = "{url}"
auth_style = "x-api-key"
credential_env = "GATEWAY_HAIKU_KEY"
models = ["claude-haiku-*"]
request_capacity = 1

[[account]]
id = "openai-mini"
provider_binding = "openai"
base_url = "{url}"
auth_style = "bearer"
credential_env = "GATEWAY_MINI_KEY"
models = ["gpt-5-mini"]
"""


def start_hostile_gateway(workdir: Any, stub: Stub, extra: dict[str, str] | None = None) -> Gateway:
    accounts = workdir / "accounts.toml"
    accounts.write_text(ACCOUNTS.format(url=stub.url))
    gateway = Gateway(
        workdir,
        stub,
        {
            "GATEWAY_ACCOUNTS_FILE": str(accounts),
            "GATEWAY_HAIKU_KEY": stub.anthropic_key,
            "GATEWAY_MINI_KEY": stub.openai_key,
            **(extra or {}),
        },
    ).start()
    status, _, body = gateway.api(
        "PUT",
        "/control/v2/policy/level",
        {
            "name": "platform",
            "expected_revision": 0,
            "reason": "hostile input",
            "document": {"account_order": ["anthropic-haiku", "openai-mini"]},
        },
    )
    assert status == 200, body
    return gateway


@pytest.fixture(scope="package")
def hgw(tmp_path_factory: pytest.TempPathFactory, stub: Stub) -> Iterator[Gateway]:
    gateway = start_hostile_gateway(tmp_path_factory.mktemp("hostile"), stub)
    yield gateway
    gateway.stop()


def mint_v2(gw: Gateway, model: str, dispatch_id: str) -> dict[str, Any]:
    status, _, body = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": dispatch_id,
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "w-1",
            "model": model,
        },
    )
    assert status == 201, body
    return body


def post_raw(
    gw: Gateway, path: str, body: bytes, headers: dict[str, str], timeout_s: float = 15
) -> tuple[int, dict[str, str], bytes]:
    """POST exactly these bytes (http.client adds only Host and Content-Length)."""
    conn = httpclient.HTTPConnection("127.0.0.1", gw.dataplane_port, timeout=timeout_s)
    try:
        conn.request("POST", path, body, headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def dataplane_healthy(gw: Gateway) -> bool:
    gw.dataplane.require_alive("data plane")  # type: ignore[union-attr]
    status, _, body = http("GET", gw.dataplane_url + "/healthz", timeout_s=5)
    return status == 200 and body["status"] == "ok"
