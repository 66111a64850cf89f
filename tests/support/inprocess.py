"""The real data plane in the test's own process, on loopback, against the stub.

Proxy, lease replica, upstream pools and control link are the daemon's own; the replica is
loaded as control's snapshot would load it (one lease on one account), and the control link is
never connected, so each terminal row waits in `link.outbox` where a test reads it. For what a
test needs to reach inside the data plane (its capacity table, an injected fault); everything
else runs the daemons as processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from dataplane.leases import LeaseReplica
from dataplane.main import build_server
from dataplane.proxy import Proxy
from dataplane.rpc_client import ControlLink
from dataplane.upstreams import UpstreamPools
from shared.clock import now_ms
from shared.settings import load_settings
from shared.tokens import new_token
from shared.wire import AccountRoute, Lease
from tests.support.harness import Stub, free_port

CREDENTIAL_ENV = "GATEWAY_INPROCESS_KEY"


class Plane:
    def __init__(self, url: str, token: str, link: ControlLink, proxy: Proxy) -> None:
        self.url = url  # the data plane's /v1/messages (Anthropic) or /v1/responses (OpenAI)
        self.token = token  # a virtual key naming the one lease
        self.link = link
        self.proxy = proxy


@asynccontextmanager
async def anthropic_plane(
    stub: Stub,
    tmp_path: Path,
    account_id: str,
    request_capacity: int | None = None,
    *,
    fleet: Any = None,
    env: dict[str, str] | None = None,
) -> AsyncIterator[Plane]:
    """One Anthropic-wire account on the stub, one live lease on it; stopped on exit. `fleet`:
    the data plane's `FleetAdmission`; `env`: more `GATEWAY_*` settings."""
    route = AccountRoute(
        id=account_id,
        provider_binding="anthropic",
        wire="anthropic",
        base_url=stub.url,
        auth_style="x-api-key",
        credential_env=CREDENTIAL_ENV,
        request_capacity=request_capacity,
    )
    async with _plane(stub.anthropic_key or "", tmp_path, route, "/v1/messages", fleet, env) as plane:
        yield plane


@asynccontextmanager
async def openai_plane(
    stub: Stub, tmp_path: Path, account_id: str, *, lease_capacity: int | None = None, fleet: Any = None
) -> AsyncIterator[Plane]:
    """One OpenAI-wire account on the stub (its `url` is `/v1/responses`, for HTTP and the
    socket), one live lease on it, and `fleet` as the data plane's `FleetAdmission`."""
    route = AccountRoute(
        id=account_id,
        provider_binding="openai",
        wire="openai",
        base_url=stub.url,
        auth_style="bearer",
        credential_env=CREDENTIAL_ENV,
        lease_capacity=lease_capacity,
    )
    async with _plane(stub.openai_key or "", tmp_path, route, "/v1/responses", fleet) as plane:
        yield plane


@asynccontextmanager
async def _plane(
    credential: str,
    tmp_path: Path,
    route: AccountRoute,
    path: str,
    fleet: Any = None,
    env: dict[str, str] | None = None,
) -> AsyncIterator[Plane]:
    port = free_port()
    settings = load_settings(
        {"GATEWAY_DATAPLANE_LISTEN": f"127.0.0.1:{port}", "GATEWAY_RUNTIME_DIR": str(tmp_path), **(env or {})},
        role="dataplane",
    )
    replica = LeaseReplica(env={CREDENTIAL_ENV: credential})
    token, key_id, digest = new_token()
    replica.load(
        [Lease(key_id=key_id, digest=digest, account_id=route.id, expires_at_ms=now_ms() + 600_000)], [route], True
    )
    link = ControlLink(str(tmp_path / "no-control.sock"), replica)
    pools = UpstreamPools(settings)
    proxy = Proxy(settings, replica, link, pools, fleet)
    server = build_server(settings, proxy)  # the daemon's own server
    await server.start("127.0.0.1", port)
    try:
        yield Plane(f"http://127.0.0.1:{port}{path}", token, link, proxy)
    finally:
        await server.close()
        await pools.close()
