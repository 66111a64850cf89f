"""What a Responses WebSocket (SPEC §20) reports beside its rows, with real daemons, the stub's
socket side sending a provider's rate-limit headers on every answer, and a real OTLP receiver:
- each attempt on the socket is one CLIENT span at the receiver with §21's attributes,
  parented under the handshake's `traceparent` (issue 24's "WebSocket once it lands");
- the upstream handshake's answer is read for the provider's rate limits (§22): the 101's go on
  the socket's first attempt (the answer they came with is that attempt's handshake; later
  turns get no HTTP answer, so their rows carry none), a refused handshake's on its own row.
"""

from __future__ import annotations

import aiohttp
import pytest

from shared.spans import ids_of, ns_of
from tests.support.attempts import O_MODEL, settled
from tests.support.harness import Gateway, Stub, credential_like, http
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.sockets import connect, create, turn

PARENT_TRACE, PARENT_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
TRACEPARENT = f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"
UPGRADE = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}


@pytest.fixture(scope="module")
def receiver():
    r = OtlpReceiver().start()
    yield r
    r.close()


@pytest.fixture(scope="module")
def limited_stub(tmp_path_factory: pytest.TempPathFactory):
    s = Stub(
        tmp_path_factory.mktemp("stub"),
        credential_like("sk-ant-"),
        credential_like("sk-proj-"),
        rate_limit_headers=True,
    )
    yield s
    s.stop()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, limited_stub: Stub, receiver: OtlpReceiver):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    g = Gateway(tmp_path_factory.mktemp("gw"), limited_stub, env).start()
    yield g
    g.stop()


async def test_each_socket_attempt_is_a_span_under_the_handshakes_traceparent(
    gw: Gateway, limited_stub: Stub, receiver: OtlpReceiver
) -> None:
    minted = gw.mint("openai")
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gw.dataplane_url, minted["token"], headers={"traceparent": TRACEPARENT})
        first = await turn(ws, create())
        second = await turn(ws, create(previous_response_id=first[-1]["response"]["id"]))
        assert first[-1]["type"] == second[-1]["type"] == "response.completed"
        await ws.close()
    rows = settled(gw, minted["key_id"], 2)
    for row in rows:
        assert row["transport"] == "websocket" and row["traceparent"] == TRACEPARENT
        span = receiver.wait_span(row["attempt_id"])
        a = span.attributes
        assert (span.kind, span.trace_id, span.parent_span_id, span.span_id) == (
            "CLIENT",
            PARENT_TRACE,
            PARENT_SPAN,
            ids_of(row["attempt_id"])[1],
        )
        assert span.name == f"{a['gen_ai.operation.name']} {O_MODEL}"
        assert span.start_ns == ns_of(row["started_at"]) and span.end_ns == ns_of(row["finished_at"])
        assert {
            k: a.get(k)
            for k in (
                "gen_ai.provider.name",
                "gen_ai.request.model",
                "gen_ai.response.model",
                "gen_ai.request.stream",
                "gen_ai.usage.output_tokens",
                "leasehold.transport",
                "leasehold.status",
                "leasehold.key_id",
                "leasehold.account_id",
                "http.response.status_code",
            )
        } == {
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": O_MODEL,
            "gen_ai.response.model": row["served_model"],
            "gen_ai.request.stream": True,
            "gen_ai.usage.output_tokens": row["usage"]["output_tokens"],
            "leasehold.transport": "websocket",
            "leasehold.status": "completed",
            "leasehold.key_id": minted["key_id"],
            "leasehold.account_id": "legacy-openai",
            "http.response.status_code": 200,
        }
        assert "error.type" not in a and span.status == 0


async def test_the_handshakes_rate_limits_go_on_the_sockets_first_attempt(gw: Gateway, limited_stub: Stub) -> None:
    minted = gw.mint("openai")
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, gw.dataplane_url, minted["token"])
        for _ in range(2):
            assert (await turn(ws, create()))[-1]["type"] == "response.completed"
        await ws.close()
    first, second = settled(gw, minted["key_id"], 2)
    limits = first["rate_limits"]
    assert set(limits) == {"observed_at", "requests", "tokens"}
    assert limits["requests"]["limit"] == 4000 and 3000 <= limits["requests"]["remaining"] <= 4000
    assert limits["tokens"]["limit"] == 2_000_000 and limits["tokens"]["reset_at"] > limits["observed_at"]
    assert second.get("rate_limits") is None  # no HTTP answer of its own


def test_a_refused_handshakes_rate_limits_are_on_its_row(
    gw: Gateway, limited_stub: Stub, receiver: OtlpReceiver
) -> None:
    minted = gw.mint("openai")
    limited_stub.script(
        {
            "ws_handshake_status": 429,
            "headers": {
                "retry-after": "2",
                "x-ratelimit-limit-requests": "500",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "2s",
            },
        }
    )
    status, headers, _ = http(
        "GET",
        gw.dataplane_url + "/v1/responses",
        None,
        {"authorization": f"Bearer {minted['token']}", "traceparent": TRACEPARENT, **UPGRADE},
    )
    assert status == 429 and headers["x-ratelimit-remaining-requests"] == "0"  # passed through unchanged
    (row,) = settled(gw, minted["key_id"], 1)
    assert (row["status"], row["http_status"], row["transport"]) == ("upstream-error", 429, "websocket")
    assert row["rate_limits"]["requests"]["limit"] == 500 and row["rate_limits"]["requests"]["remaining"] == 0
    span = receiver.wait_span(row["attempt_id"])  # a refused socket is a span with its error, too
    assert span.attributes["error.type"] and span.attributes["leasehold.transport"] == "websocket"
    assert (span.trace_id, span.parent_span_id) == (PARENT_TRACE, PARENT_SPAN)
