"""SPEC §21 with real daemons and a real OTLP/HTTP receiver: one CLIENT span per attempt row,
in the GenAI conventions, parented under the request's `traceparent`; a collector that is down,
failing or slow never slows or loses a row, and every span it costs is counted."""

from __future__ import annotations

import http.client as http_client
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shared.spans import ids_of, ns_of
from tests.support.harness import REPO, Gateway, Stub, base_env, credential_like, free_port, http
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.waits import wait_until

PARENT_TRACE, PARENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
ANTHROPIC_BODY = {"model": "claude-sonnet-4-6", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
OPENAI_BODY = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}


def traced(workdir: Path, stub: Stub, endpoint: str, **otel: str) -> Gateway:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50", **otel}
    return Gateway(workdir, stub, env).start()


@pytest.fixture(scope="module")
def receiver():
    r = OtlpReceiver().start()
    yield r
    r.close()


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory):
    s = Stub(tmp_path_factory.mktemp("stub"), credential_like("sk-ant-"), credential_like("sk-"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def collector_key() -> str:
    return credential_like("hc_")


@pytest.fixture(scope="module")
def gw(tmp_path_factory, stub: Stub, receiver: OtlpReceiver, collector_key: str):
    g = traced(
        tmp_path_factory.mktemp("gw"),
        stub,
        receiver.endpoint,
        OTEL_EXPORTER_OTLP_HEADERS=f"x-collector-key={collector_key}",
        OTEL_RESOURCE_ATTRIBUTES="deployment.environment=test",
    )
    yield g
    g.stop()


def call(gw: Gateway, wire: str, token: str, body: dict[str, Any], **headers: str) -> tuple[int, dict[str, Any]]:
    """One request; returns its status and its ledger row."""
    before = len(gw.ledger())
    path = "/v1/messages" if wire == "anthropic" else "/v1/chat/completions"
    status, _, _ = http("POST", gw.dataplane_url + path, body, {"Authorization": f"Bearer {token}", **headers})
    return status, gw.wait_rows(before + 1)[-1]


def assert_row_times(span, row: dict[str, Any]) -> None:
    assert span.start_ns == ns_of(row["started_at"]) and span.end_ns == ns_of(row["finished_at"])


def test_anthropic_json_span_is_the_callers_child(
    gw: Gateway, stub: Stub, receiver: OtlpReceiver, collector_key: str
) -> None:
    token = gw.mint("anthropic")["token"]
    status, row = call(gw, "anthropic", token, ANTHROPIC_BODY, traceparent=TRACEPARENT, tracestate=TRACESTATE)
    assert status == 200 and row["traceparent"] == TRACEPARENT and row["tracestate"] == TRACESTATE
    sent = stub.requests()[-1]["headers"]
    assert sent.get("traceparent") == TRACEPARENT and sent.get("tracestate") == TRACESTATE  # unchanged upstream
    span = receiver.wait_span(row["attempt_id"])
    assert (span.kind, span.name, span.trace_id, span.parent_span_id) == (
        "CLIENT",
        "chat claude-sonnet-4-6",
        PARENT_TRACE,
        PARENT_SPAN,
    )
    assert span.span_id == ids_of(row["attempt_id"])[1] and span.trace_state == TRACESTATE
    assert_row_times(span, row)
    a = span.attributes
    assert {
        k: a.get(k)
        for k in (
            "gen_ai.operation.name",
            "gen_ai.provider.name",
            "gen_ai.request.model",
            "gen_ai.response.model",
            "gen_ai.request.stream",
            "http.response.status_code",
            "server.address",
        )
    } == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-sonnet-4-6",
        "gen_ai.response.model": row["served_model"],
        "gen_ai.request.stream": False,
        "http.response.status_code": 200,
        "server.address": "127.0.0.1",
    }
    usage = row["usage"]  # the conventions count the cached prompt in input_tokens; the ledger does not
    assert (
        a["gen_ai.usage.input_tokens"]
        == usage["input_tokens"] + usage["cache_read_tokens"] + usage["cache_creation_tokens"]
    )
    assert (
        a["gen_ai.usage.output_tokens"],
        a["gen_ai.usage.cache_read.input_tokens"],
        a["gen_ai.usage.cache_creation.input_tokens"],
    ) == (usage["output_tokens"], usage["cache_read_tokens"], usage["cache_creation_tokens"])
    assert {k: a[k] for k in a if k.startswith("leasehold.") and k != "leasehold.overhead_ms"} == {
        "leasehold.attempt_id": row["attempt_id"],
        "leasehold.key_id": row["key_id"],
        "leasehold.account_id": "legacy-anthropic",
        "leasehold.repo": "acme/app",
        "leasehold.principal": "w-1",
        "leasehold.status": "completed",
        "leasehold.transport": "http",
        "leasehold.hop": 0,
        "leasehold.cost_usd": row["cost_usd"],
    }
    assert "error.type" not in a and span.status == 0
    assert span.resource["service.name"] == "leasehold" and span.resource["deployment.environment"] == "test"
    assert span.resource.get("host.name")
    assert receiver.headers[-1].get("x-collector-key") == collector_key  # OTEL_EXPORTER_OTLP_HEADERS honoured


def test_openai_json_span_starts_a_trace_without_traceparent(gw: Gateway, receiver: OtlpReceiver) -> None:
    token = gw.mint("openai")["token"]
    status, row = call(gw, "openai", token, OPENAI_BODY)
    assert status == 200 and row["traceparent"] is None
    span = receiver.wait_span(row["attempt_id"])
    assert (span.trace_id, span.span_id) == ids_of(row["attempt_id"]) and span.parent_span_id == ""
    assert span.name == "chat gpt-5" and span.attributes["gen_ai.provider.name"] == "openai"
    usage = row["usage"]  # OpenAI: the ledger's input is prompt_tokens - cached_tokens; the span's is prompt_tokens
    assert usage["cache_read_tokens"] > 0
    assert span.attributes["gen_ai.usage.input_tokens"] == usage["input_tokens"] + usage["cache_read_tokens"]
    assert_row_times(span, row)


def test_mint_decision_is_an_event_on_the_first_attempt(gw: Gateway, receiver: OtlpReceiver) -> None:
    """Runs before the refusals below open legacy-anthropic's circuit (a v2 mint would be held)."""
    status, _, minted = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": "d-trace",
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "w",
            "model": "claude-sonnet-4-6",
        },
    )
    assert status == 201, minted
    _, first = call(gw, "anthropic", minted["token"], ANTHROPIC_BODY, traceparent=TRACEPARENT)
    _, second = call(gw, "anthropic", minted["token"], ANTHROPIC_BODY, traceparent=TRACEPARENT)
    one, two = receiver.wait_span(first["attempt_id"]), receiver.wait_span(second["attempt_id"])
    assert [e.name for e in one.events] == ["leasehold.mint"] and two.events == []
    event = one.events[0].attributes
    assert (
        event["leasehold.mint_decision_id"]
        == minted["mint_decision_id"]
        == one.attributes["leasehold.mint_decision_id"]
    )
    assert event["leasehold.outcome"] == "selected" and one.attributes["leasehold.hop"] == 0
    assert one.attributes["leasehold.dispatch_id"] == "d-trace"


def test_exec_gives_its_worker_a_trace_the_attempts_join(gw: Gateway, receiver: OtlpReceiver) -> None:
    """`leaseholdctl exec`: the worker gets TRACEPARENT (and no GATEWAY_*); a worker that sends it
    as its `traceparent` header gets its attempt's span under exec's trace."""
    worker = (
        "import json, os, urllib.request as u; assert not [k for k in os.environ if k.startswith('GATEWAY_')]; "
        "r = u.Request(os.environ['ANTHROPIC_BASE_URL'] + '/v1/messages', data=json.dumps("
        + repr(ANTHROPIC_BODY)
        + ").encode(), headers={'x-api-key': os.environ['ANTHROPIC_API_KEY'], 'content-type': 'application/json', "
        "'traceparent': os.environ['TRACEPARENT']}); u.urlopen(r).read(); print(os.environ['TRACEPARENT'])"
    )
    before = len(gw.ledger())
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "controlplane.ctl",
            "exec",
            "--repo",
            "acme/app",
            "--principal",
            "w-9",
            "--model",
            "claude-sonnet-4-6",
            "--",
            sys.executable,
            "-c",
            worker,
        ],
        env={**base_env(), "GATEWAY_CONTROL_URL": gw.control_url, "GATEWAY_CONTROL_TOKEN": gw.control_token},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    traceparent = done.stdout.strip().splitlines()[-1]
    row = gw.wait_rows(before + 1)[before]
    assert row["traceparent"] == traceparent
    span = receiver.wait_span(row["attempt_id"])
    assert span.trace_id == traceparent.split("-")[1] and span.parent_span_id == traceparent.split("-")[2]


def test_leaseholdctl_trace_prints_the_span_the_collector_received(gw: Gateway, receiver: OtlpReceiver) -> None:
    token = gw.mint("anthropic")["token"]
    _, row = call(gw, "anthropic", token, ANTHROPIC_BODY, traceparent=TRACEPARENT)
    span = receiver.wait_span(row["attempt_id"])
    env = {**base_env(), "GATEWAY_CONTROL_URL": gw.control_url, "GATEWAY_CONTROL_TOKEN": gw.control_token}
    done = subprocess.run(
        [sys.executable, "-m", "controlplane.ctl", "trace", row["attempt_id"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"trace {PARENT_TRACE}" and PARENT_SPAN in lines[1]
    assert lines[2].strip().startswith(f"└─ {span.name}   CLIENT") and span.span_id in lines[2]
    for key in ("gen_ai.usage.input_tokens", "leasehold.attempt_id", "server.address"):
        assert f"{key} = {span.attributes[key]!r}" in done.stdout
    print(done.stdout)  # the README's rendering comes from this
    missing = subprocess.run(
        [sys.executable, "-m", "controlplane.ctl", "trace", "att_nope"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert missing.returncode != 0 and "not among the recent routes" in missing.stderr


@pytest.mark.parametrize("wire", ["anthropic", "openai"])
def test_stream_span(gw: Gateway, receiver: OtlpReceiver, wire: str) -> None:
    token = gw.mint(wire)["token"]
    body = {**(ANTHROPIC_BODY if wire == "anthropic" else OPENAI_BODY), "stream": True}
    status, row = call(gw, wire, token, body, traceparent=TRACEPARENT)
    assert status == 200 and row["status"] == "completed" and row["stream"] is True
    span = receiver.wait_span(row["attempt_id"])
    assert span.attributes["gen_ai.request.stream"] is True and span.parent_span_id == PARENT_SPAN
    assert_row_times(span, row)
    assert row["first_byte_ms"] >= 0  # SPEC §14; the conventions' time to first chunk is in seconds
    assert span.attributes["gen_ai.response.time_to_first_chunk"] == pytest.approx(row["first_byte_ms"] / 1000)


@pytest.mark.parametrize(
    ("wire", "step", "http_status", "error_type"),
    [
        ("anthropic", {"status": 429}, 429, "rate-limited"),
        ("anthropic", {"status": 401}, 401, "credential-rejected"),
        ("openai", {"status": 503}, 503, "upstream-unavailable"),
        ("openai", {"status": 400}, 400, "upstream-error"),
    ],
    ids=["429", "401", "503", "400"],
)
def test_refused_attempt_is_an_error_span(
    gw: Gateway, receiver: OtlpReceiver, wire: str, step: dict[str, Any], http_status: int, error_type: str
) -> None:
    import json

    token = gw.mint(wire)["token"]
    body = ANTHROPIC_BODY if wire == "anthropic" else OPENAI_BODY
    status, row = call(gw, wire, token, body, traceparent=TRACEPARENT, **{"x-stub-step": json.dumps(step)})
    assert status == http_status
    span = receiver.wait_span(row["attempt_id"])
    assert span.attributes["error.type"] == error_type and span.status == 2  # STATUS_CODE_ERROR
    assert span.attributes["http.response.status_code"] == http_status and span.parent_span_id == PARENT_SPAN


def test_gateway_refusal_is_an_error_span(gw: Gateway, receiver: OtlpReceiver) -> None:
    """The data plane's own refusal (a model the account does not serve: 400, no upstream call)."""
    minted = gw.mint("anthropic")
    status, row = call(gw, "anthropic", minted["token"], {**ANTHROPIC_BODY, "model": "gpt-5"}, traceparent=TRACEPARENT)
    if row["refusal_reason"] is None:
        pytest.skip("the legacy account serves every model here")
    span = receiver.wait_span(row["attempt_id"])
    assert span.attributes["error.type"] == row["refusal_reason"] and span.attributes["leasehold.status"] == "refused"
    assert row["first_byte_ms"] is None and "gen_ai.response.time_to_first_chunk" not in span.attributes


def test_cut_stream_is_an_error_span(gw: Gateway, receiver: OtlpReceiver) -> None:
    import json

    token = gw.mint("anthropic")["token"]
    before = len(gw.ledger())
    try:
        http(
            "POST",
            gw.dataplane_url + "/v1/messages",
            {**ANTHROPIC_BODY, "stream": True},
            {"x-api-key": token, "x-stub-step": json.dumps({"cut_after_events": 2})},
        )
    except (OSError, http_client.HTTPException):
        pass  # the cut reaches the worker as a broken read
    row = gw.wait_rows(before + 1)[before]
    span = receiver.wait_span(row["attempt_id"])
    assert row["status"] == "transport-error" and span.attributes["error.type"] == (row["condition"] or row["status"])
    assert span.attributes["leasehold.status"] == "transport-error" and span.status == 2


def test_invalid_traceparent_is_ignored_and_still_forwarded(gw: Gateway, stub: Stub, receiver: OtlpReceiver) -> None:
    token = gw.mint("anthropic")["token"]
    bogus = "00-" + "0" * 32 + "-00f067aa0ba902b7-01"
    status, row = call(gw, "anthropic", token, ANTHROPIC_BODY, traceparent=bogus, tracestate="a=1")
    assert status == 200 and row["traceparent"] is None and row["tracestate"] is None
    assert stub.requests()[-1]["headers"].get("traceparent") == bogus
    span = receiver.wait_span(row["attempt_id"])
    assert span.parent_span_id == "" and span.trace_id == ids_of(row["attempt_id"])[0]


def test_nothing_dropped_with_a_healthy_collector(gw: Gateway) -> None:
    assert dropped(gw) == 0


def dropped(gw: Gateway) -> float:
    text = gw.api("GET", "/metrics")[2]
    match = re.search(r"^leasehold_trace_spans_dropped_total (\S+)$", text, re.M)
    assert match, "leasehold_trace_spans_dropped_total missing from /metrics"
    return float(match.group(1))


# ---- a collector that fails: rows never slowed nor lost, spans counted ------------------------


def burst(gw: Gateway, n: int) -> float:
    """n requests one after another; returns the slowest one's seconds. Every row is on disk."""
    token = gw.mint("anthropic")["token"]
    before, slowest = len(gw.ledger()), 0.0
    for _ in range(n):
        t0 = time.monotonic()
        assert http("POST", gw.dataplane_url + "/v1/messages", ANTHROPIC_BODY, {"x-api-key": token})[0] == 200
        slowest = max(slowest, time.monotonic() - t0)
    assert len(gw.wait_rows(before + n)) == before + n
    return slowest


FAILURES = {
    "down": ({}, "down"),
    "answering 500": ({"OTEL_EXPORTER_OTLP_TIMEOUT": "300"}, "error"),
    "slow past the timeout": ({"OTEL_EXPORTER_OTLP_TIMEOUT": "300"}, "slow"),
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_failing_collector_never_slows_or_loses_a_row(tmp_path: Path, stub: Stub, failure: str) -> None:
    otel, mode = FAILURES[failure]
    receiver = OtlpReceiver()
    if mode != "down":
        receiver.start()
        receiver.mode, receiver.delay_s = mode, 3.0
    endpoint = receiver.endpoint if mode != "down" else f"http://127.0.0.1:{free_port()}"
    gw = traced(tmp_path, stub, endpoint, OTEL_BSP_MAX_QUEUE_SIZE="4", OTEL_BSP_MAX_EXPORT_BATCH_SIZE="2", **otel)
    try:
        n = 12
        slowest = burst(gw, n)
        assert slowest < 2.0, f"a request took {slowest:.2f}s with the collector {failure}"
        wait_until(lambda: dropped(gw) == n, 30, f"all {n} spans counted as dropped")
        if mode != "down":
            assert receiver.requests > 0  # it was tried, and failed
        assert receiver.spans == [] or mode == "slow"  # a slow collector may take a batch late
    finally:
        gw.stop()
        receiver.close()
    assert "trace_export_failing" in gw.logs()


def test_export_off_without_an_endpoint(tmp_path: Path, stub: Stub) -> None:
    """Unset, nothing is exported, the SDK is not even imported, and the counter says 0."""
    gw = Gateway(tmp_path, stub).start()
    try:
        assert burst(gw, 1) < 5
        assert dropped(gw) == 0
        assert "traces_exporting" not in gw.logs()
    finally:
        gw.stop()
