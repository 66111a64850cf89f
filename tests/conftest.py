"""Shared fixtures: one stub upstream per session, gateways per module or per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet import Fleet
from tests.support.harness import Gateway, Stub, credential_like, stop_all
from tests.support.redis_server import RedisServer


@pytest.fixture(scope="session")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stub]:
    upstream = Stub(
        tmp_path_factory.mktemp("stub"),
        anthropic_key=credential_like("sk-ant-api03-"),
        openai_key=credential_like("sk-proj-"),
    )
    yield upstream
    upstream.stop()


@pytest.fixture
def clean_stub(stub: Stub) -> Stub:
    stub.reset()
    return stub


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, stub: Stub) -> Iterator[Gateway]:
    gw = Gateway(tmp_path_factory.mktemp("gateway"), stub).start()
    yield gw
    gw.stop()


@pytest.fixture
def make_gateway(tmp_path: Path, stub: Stub) -> Iterator:
    """Build (not start) gateways owned by one test; every one is stopped afterwards."""
    made: list[Gateway] = []

    def make(extra_env: dict[str, str] | None = None, upstream: Stub | None = stub, name: str = "gw") -> Gateway:
        gw = Gateway(tmp_path / f"{name}{len(made)}", upstream, extra_env)
        made.append(gw)
        return gw

    yield make
    stop_all(made)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server for the session (loopback, nothing persisted); each test's keys
    live in their own fleet namespace (`fleet`). Missing binary: the test fails, never skips."""
    try:
        server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


@pytest.fixture
async def fleet(redis_server: RedisServer) -> AsyncIterator[Fleet]:
    made = Fleet(redis_server)
    yield made
    await made.close()


@pytest.fixture
async def app_client() -> AsyncIterator:
    """`await app_client(app)`: the app served by `shared.http1` on 127.0.0.1 and a client for
    it (the fixture aiohttp's `aiohttp_client` was for control's apps); all closed afterwards."""
    from tests.support.http1 import AppClient, serve

    made: list[AppClient] = []

    async def make(app: Any) -> AppClient:
        client = AppClient(await serve(app))
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


@pytest.fixture
async def app_server() -> AsyncIterator:
    """`await app_server(app, limits=...)`: the app served by `shared.http1` on 127.0.0.1;
    closed afterwards unless the test closed it."""
    from tests.support.http1 import serve

    made: list[Any] = []

    async def make(app: Any, **kwargs: Any) -> Any:
        server = await serve(app, **kwargs)
        made.append(server)
        return server

    yield make
    for server in made:
        if not server.closing:
            await server.close()
