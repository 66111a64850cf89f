"""`GET /metrics` against real daemons: the counters agree with the ledger (SPEC §11)."""

from __future__ import annotations

import http.client
import json
from collections import Counter, defaultdict

import anthropic
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.harness import Gateway, Stub
from tests.support.harness import http as call
from tests.support.waits import wait_until

MODEL = "claude-sonnet-4-6"
# `host_id`: the fleet's gauges (SPEC §16: a fleet's few operator-chosen host names).
ALLOWED_LABELS = {"account_id", "wire", "status", "condition", "code", "kind", "state", "reason", "le", "host_id"}
TOKEN_KINDS = ("input", "output", "cache_read", "cache_creation")


def scrape(gw: Gateway, token: str | None = None) -> tuple[str, dict[str, dict[tuple, float]]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    status, got, text = call("GET", gw.control_url + "/metrics", headers=headers)
    assert status == 200, text
    assert got["content-type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, dict[tuple, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name][tuple(sorted(sample.labels.items()))] = sample.value
    return text, samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[name].get(tuple(sorted(labels.items())), 0.0)


def abort_while_in_flight(gw: Gateway, token: str) -> None:
    """A request the worker gives up on while the upstream has not answered yet."""
    conn = http.client.HTTPConnection("127.0.0.1", gw.dataplane_port, timeout=10)
    body = json.dumps({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    conn.request(
        "POST",
        "/v1/messages",
        body,
        {"x-api-key": token, "content-type": "application/json", "x-stub-step": '{"stall_before_headers_s": 5}'},
    )
    wait_until(
        lambda: value(scrape(gw)[1], "leasehold_in_flight", account_id="legacy-anthropic") == 1,
        10,
        "the stalled request to show in flight",
    )
    conn.sock.close()
    conn.close()


def test_counters_match_the_ledger_after_mixed_traffic(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway({"GATEWAY_METRICS_PUBLIC": "1"}).start()
    anthropic_lease = gw.mint()
    openai_lease = gw.mint("openai")
    sdk = anthropic.Anthropic(base_url=gw.dataplane_url, api_key=anthropic_lease["token"], max_retries=0)
    ask = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    sdk.messages.create(**ask)  # completed
    with sdk.messages.stream(**ask) as stream:  # completed, streamed
        stream.get_final_text()
    with pytest.raises(anthropic.InternalServerError):  # failed: 500
        sdk.messages.create(**ask, extra_headers={"x-stub-step": '{"status": 500}'})
    abort_while_in_flight(gw, anthropic_lease["token"])  # client-aborted
    status, _, _ = call(
        "POST",
        gw.dataplane_url + "/v1/chat/completions",  # refused: wrong wire
        {"model": "gpt-5", "messages": []},
        {"x-api-key": anthropic_lease["token"]},
    )
    assert status == 404
    oai = openai.OpenAI(base_url=openai_lease["base_url"], api_key=openai_lease["token"], max_retries=0)
    oai.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "x"}])  # other wire

    rows = gw.wait_rows(6)
    wait_until(lambda: gw.active()["count"] == 0, 10, "no route in flight")
    assert Counter(r["status"] for r in rows) == {
        "completed": 3,
        "upstream-error": 1,
        "client-aborted": 1,
        "refused": 1,
    }
    text, samples = scrape(gw)  # public: no token

    attempts = Counter((r["account_id"], r["wire"], r["status"], r["condition"] or "none") for r in rows)
    scraped = {
        (d["account_id"], d["wire"], d["status"], d["condition"]): n
        for d, n in ((dict(k), n) for k, n in samples["leasehold_attempts_total"].items())
    }
    assert scraped == attempts

    refusals = Counter(r["refusal_reason"] for r in rows if r["refusal_reason"])
    assert {dict(k)["code"]: n for k, n in samples["leasehold_refusals_total"].items()} == refusals

    tokens: dict[tuple[str, str], int] = defaultdict(int)
    cost: dict[str, float] = defaultdict(float)
    for r in rows:
        for kind in TOKEN_KINDS:
            if r["usage"]:
                tokens[(r["account_id"], kind)] += r["usage"][f"{kind}_tokens"]
        if r["cost_usd"] is not None:
            cost[r["account_id"]] += r["cost_usd"]
    assert tokens[("legacy-anthropic", "output")] > 0 and tokens[("legacy-openai", "input")] > 0
    assert {(dict(k)["account_id"], dict(k)["kind"]): n for k, n in samples["leasehold_tokens_total"].items()} == tokens
    for account_id, usd in cost.items():
        assert value(samples, "leasehold_cost_usd_total", account_id=account_id) == pytest.approx(usd)

    for wire in ("anthropic", "openai"):
        timed = [r["overhead_ms"] for r in rows if r["wire"] == wire and r["overhead_ms"] is not None]
        assert timed, wire
        assert value(samples, "leasehold_dataplane_overhead_seconds_count", wire=wire) == len(timed)
        assert value(samples, "leasehold_dataplane_overhead_seconds_sum", wire=wire) == pytest.approx(sum(timed) / 1000)
        assert value(samples, "leasehold_dataplane_overhead_seconds_bucket", wire=wire, le="+Inf") == len(timed)

    for account_id in ("legacy-anthropic", "legacy-zai-harness", "legacy-openai"):
        assert value(samples, "leasehold_in_flight", account_id=account_id) == 0
        assert value(samples, "leasehold_circuit_state", account_id=account_id, state="closed") == 1
        assert value(samples, "leasehold_account_configured", account_id=account_id) == 1
    assert value(samples, "leasehold_leases", account_id="legacy-anthropic") == 1
    assert value(samples, "leasehold_leases", account_id="legacy-openai") == 1
    assert value(samples, "leasehold_leases", account_id="legacy-zai-harness") == 0

    # Labels are closed vocabularies and account ids: nothing that names a key, a route or a secret.
    assert {name for series in samples.values() for key in series for name, _ in key} <= ALLOWED_LABELS
    for lease in (anthropic_lease, openai_lease):
        assert lease["key_id"] not in text and lease["token"].partition(".")[2] not in text
    assert not any(r["attempt_id"] in text for r in rows)
    for secret in (clean_stub.anthropic_key, clean_stub.openai_key, gw.control_token):
        assert secret not in text


def test_metrics_need_a_read_token_unless_made_public(gateway: Gateway, make_gateway) -> None:
    status, headers, _ = call("GET", gateway.control_url + "/metrics")
    assert status == 401 and "bearer" in headers["www-authenticate"].lower()
    assert call("GET", gateway.control_url + "/metrics", headers={"Authorization": "Bearer nope"})[0] == 401
    scrape(gateway, gateway.control_token)

    public = make_gateway({"GATEWAY_METRICS_PUBLIC": "1"}).start()
    scrape(public)
    # The exemption is exactly /metrics: the read plane still wants a token.
    assert call("GET", public.control_url + "/control/v2/accounts")[0] == 401
    assert call("GET", public.control_url + "/control/v2/events")[0] == 401


def test_openmetrics_is_served_when_asked_for(gateway: Gateway) -> None:
    status, headers, text = call(
        "GET",
        gateway.control_url + "/metrics",
        headers={"Authorization": f"Bearer {gateway.control_token}", "Accept": "application/openmetrics-text"},
    )
    assert status == 200 and headers["content-type"].startswith("application/openmetrics-text")
    assert text.rstrip().endswith("# EOF")


def test_mint_decisions_are_counted_by_outcome_and_code(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway().start()
    body = {
        "dispatch_id": "d",
        "repo_slug": "acme/app",
        "principal_kind": "worker",
        "principal_id": "w",
        "model": "claude-sonnet-4-6",
    }
    assert gw.api("POST", "/control/v2/mint", body)[0] == 201
    assert gw.api("POST", "/control/v2/mint", body)[0] == 503  # the dispatch already holds a lease
    assert gw.api("POST", "/control/v2/mint", {**body, "dispatch_id": "e", "model": "llama-3"})[0] == 409
    _, samples = scrape(gw, gw.control_token)
    assert value(samples, "leasehold_mint_decisions_total", outcome="selected", code="none") == 1
    assert value(samples, "leasehold_mint_decisions_total", outcome="held", code="fallback-lease-still-held") == 1
    assert value(samples, "leasehold_mint_decisions_total", outcome="rejected", code="model-not-served") == 1
