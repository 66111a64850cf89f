"""The hop's header rules, URL rules and the per-account pool gate."""

from __future__ import annotations

import asyncio

import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from dataplane.upstreams import (
    PoolTimeout,
    _Gate,
    downstream_headers,
    upstream_headers,
    upstream_path_qs,
    upstream_url,
)
from shared.wire import AccountRoute


def headers(*pairs: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


INCOMING = headers(
    ("Host", "127.0.0.1:8788"),
    ("x-api-key", "lhgw_a.b"),
    ("Authorization", "Bearer lhgw_c.d"),
    ("anthropic-version", "2023-06-01"),
    ("anthropic-beta", "x-1,y-2"),
    ("x-stainless-timeout", "NOT_GIVEN"),
    ("openai-organization", "org-w"),
    ("OpenAI-Project", "proj-w"),
    ("Content-Length", "10"),
    ("Connection", "keep-alive, X-Private"),
    ("x-private", "1"),
    ("TE", "trailers"),
    ("Transfer-Encoding", "chunked"),
    ("Accept-Encoding", "zstd,gzip"),
    ("Content-Encoding", "gzip"),
    ("x-custom", "a"),
    ("x-custom", "b"),
)


@pytest.mark.parametrize(
    "style,header,value", [("x-api-key", "x-api-key", "CRED"), ("bearer", "Authorization", "Bearer CRED")]
)
def test_upstream_headers_swap_the_credential_and_keep_end_to_end_headers(style: str, header: str, value: str) -> None:
    out = upstream_headers(INCOMING, style, "CRED")
    assert out.getall(header) == [value]
    other = "Authorization" if header == "x-api-key" else "x-api-key"
    assert other not in out
    for gone in (
        "Host",
        "openai-organization",
        "openai-project",
        "content-length",
        "connection",
        "x-private",
        "te",
        "transfer-encoding",
    ):
        assert gone not in out, gone
    assert out["anthropic-beta"] == "x-1,y-2" and out["x-stainless-timeout"] == "NOT_GIVEN"
    assert out["Accept-Encoding"] == "zstd,gzip" and out["Content-Encoding"] == "gzip"
    assert out.getall("x-custom") == ["a", "b"]
    assert not any("lhgw_" in v for v in out.values())
    # every kept line in the worker's order and spelling, the credential last
    dropped = {"host", "x-api-key", "authorization", "openai-organization", "openai-project", "content-length"}
    dropped |= {"connection", "x-private", "te", "transfer-encoding", "keep-alive"}
    kept = [(n, v) for n, v in INCOMING.items() if n.lower() not in dropped]
    assert list(out.items()) == [*kept, (header, value)]


def test_downstream_headers_keep_encoding_and_rate_limits() -> None:
    out = downstream_headers(
        headers(
            ("Content-Encoding", "gzip"),
            ("Content-Length", "99"),
            ("Transfer-Encoding", "chunked"),
            ("Connection", "close"),
            ("retry-after", "3"),
            ("retry-after-ms", "2500"),
            ("x-should-retry", "true"),
            ("request-id", "req_1"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("Keep-Alive", "timeout=5"),
        )
    )
    assert dict(out) == {
        "Content-Encoding": "gzip",
        "retry-after": "3",
        "retry-after-ms": "2500",
        "x-should-retry": "true",
        "request-id": "req_1",
        "anthropic-ratelimit-requests-remaining": "0",
    }


def route(base_url: str) -> AccountRoute:
    return AccountRoute(
        id="a",
        provider_binding="openai",
        wire="openai",
        base_url=base_url,
        auth_style="bearer",
        credential_env="GATEWAY_X",
    )


@pytest.mark.parametrize(
    "base,path,expect",
    [
        ("https://api.openai.com", "/v1/responses", "https://api.openai.com/v1/responses"),
        ("https://api.openai.com/v1", "/v1/responses", "https://api.openai.com/v1/responses"),
        (
            "https://api.z.ai/api/anthropic",
            "/v1/messages?beta=true",
            "https://api.z.ai/api/anthropic/v1/messages?beta=true",
        ),
    ],
)
def test_upstream_url_keeps_the_base_prefix_and_query(base: str, path: str, expect: str) -> None:
    assert upstream_url(route(base), path) == expect


@pytest.mark.parametrize(
    "url,expect",
    [
        ("/v1/messages?beta=true", "/v1/messages?beta=true"),
        ("/v1/messages?beta=true&key=lhgw_K.S", "/v1/messages?beta=true"),
        ("/v1/messages?k=lhgw_K.S", "/v1/messages"),
        ("/v1/messages", "/v1/messages"),
    ],
)
def test_upstream_path_drops_a_query_parameter_carrying_the_key(url: str, expect: str) -> None:
    assert upstream_path_qs(URL(url, encoded=True), "lhgw_K.S") == expect


# ---- pool gate ------------------------------------------------------------------------------


async def test_gate_admits_up_to_its_size_then_hands_slots_over_in_order() -> None:
    gate = _Gate(2)
    await gate.acquire(0.1)
    await gate.acquire(0.1)
    assert gate.in_use == 2
    order: list[str] = []

    async def wait(name: str) -> None:
        await gate.acquire(5)
        order.append(name)

    first, second = asyncio.create_task(wait("first")), asyncio.create_task(wait("second"))
    await asyncio.sleep(0)
    gate.release()
    await first
    assert order == ["first"] and gate.in_use == 2
    gate.release()
    await second
    assert order == ["first", "second"] and gate.in_use == 2
    gate.release()
    gate.release()
    assert gate.in_use == 0


async def test_gate_timeout_raises_pool_timeout_and_leaks_nothing() -> None:
    gate = _Gate(1)
    await gate.acquire(0.1)
    with pytest.raises(PoolTimeout):
        await gate.acquire(0.05)
    gate.release()
    assert gate.in_use == 0 and not gate._waiters
    await gate.acquire(0.01)  # the fast path is open again
    assert gate.in_use == 1


async def test_gate_cancelled_waiter_leaks_nothing_even_when_just_handed_a_slot() -> None:
    gate = _Gate(1)
    await gate.acquire(0.1)
    waiting = asyncio.create_task(gate.acquire(5))
    await asyncio.sleep(0)
    gate.release()  # the slot is handed to the waiter...
    waiting.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert gate.in_use == 0 and not gate._waiters
    plain = asyncio.create_task(gate.acquire(5))
    await plain
    assert gate.in_use == 1
