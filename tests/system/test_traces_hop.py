"""A dispatch hop (SPEC §17) in the trace (SPEC §21), with real daemons, two stub upstreams and
a real OTLP receiver: the hop is a `leasehold.dispatch_hop` span event on the attempt that
follows it (controlplane/traces.py `Traces.on_hop`), on the account it moved to; the attempt that
caused it carries the mint's event and the 429 as its error."""

from __future__ import annotations

import pytest

from tests.support.harness import Gateway, Stub, http
from tests.support.otlp_receiver import OtlpReceiver
from tests.system.test_dispatch_keys import MODEL, A, B, mint, rows_of
from tests.system.test_mint_v2_scenario import pool_gateway, second_stub  # noqa: F401 (fixture)

TRACEPARENT = "00-5bf92f3577b34da6a3ce929d0e0e4737-10f067aa0ba902b8-01"
BODY = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def receiver():
    r = OtlpReceiver().start()
    yield r
    r.close()


def ask(gw: Gateway, token: str) -> int:
    headers = {"x-api-key": token, "anthropic-version": "2023-06-01", "traceparent": TRACEPARENT}
    return http("POST", gw.dataplane_url + "/v1/messages", BODY, headers)[0]


def test_a_hop_is_an_event_on_the_attempt_that_follows_it(
    make_gateway, tmp_path, clean_stub: Stub, second_stub: Stub, receiver: OtlpReceiver
) -> None:
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    gw = pool_gateway(make_gateway, tmp_path, second_stub, otel)
    minted = mint(gw)
    clean_stub.script({"status": 429, "headers": {"retry-after": "1"}})
    assert ask(gw, minted["token"]) == 429  # A refuses: the key hops to B
    assert ask(gw, minted["token"]) == 200  # the worker's retry, on the same key, served by B
    first, second = rows_of(gw, minted["key_id"], 2)
    assert (first["account_id"], second["account_id"], second["hop"]) == (A, B, 1)
    before, after = receiver.wait_span(first["attempt_id"]), receiver.wait_span(second["attempt_id"])
    assert [e.name for e in before.events] == ["leasehold.mint"]
    assert before.attributes["error.type"] and before.attributes["http.response.status_code"] == 429
    (hop,) = [e for e in after.events if e.name == "leasehold.dispatch_hop"]
    assert hop.attributes == {
        "leasehold.from_account": A,
        "leasehold.to_account": B,
        "leasehold.condition": "rate-limited",
        "leasehold.hop": 1,
    }
    assert after.attributes["leasehold.hop"] == 1 and after.attributes["leasehold.account_id"] == B
    assert after.attributes["leasehold.mint_decision_id"] == second["mint_decision_id"]
    assert after.trace_id == before.trace_id == TRACEPARENT.split("-")[1]
    assert "error.type" not in after.attributes
