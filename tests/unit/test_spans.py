"""SPEC §21's span of an attempt row, by table (shared/spans.py: pure)."""

from __future__ import annotations

import msgspec
import pytest

from shared.spans import DecisionNote, SpanEvent, account_of, error_type_of, ids_of, ns_of, sampled, span_of
from shared.wire import AttemptRow, Usage

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ROW = AttemptRow(
    attempt_id="att_01J0",
    key_id="k1",
    account_id="legacy-anthropic",
    mint_decision_id=None,
    dispatch_id=None,
    repo_slug="acme/app",
    principal_id="w-1",
    wire="anthropic",
    path="/v1/messages",
    requested_model="claude-sonnet-4-6",
    served_model="claude-sonnet-4-6-20260101",
    stream=False,
    started_at="2026-12-01T10:00:00.000Z",
    finished_at="2026-12-01T10:00:01.250Z",
    status="completed",
    http_status=200,
    condition=None,
    refusal_reason=None,
    usage=Usage(input_tokens=12, output_tokens=3, cache_read_tokens=7, cache_creation_tokens=5),
    cost_usd=0.0012,
    cost_reason="priced",
    overhead_ms=0.4,
)
ANTHROPIC = account_of("anthropic", "https://api.anthropic.com")


def row(**changes) -> AttemptRow:
    return msgspec.structs.replace(ROW, **changes)


def test_a_completed_row_is_a_client_span_in_the_genai_conventions() -> None:
    plan = span_of(ROW, ANTHROPIC)
    assert plan.name == "chat claude-sonnet-4-6" and plan.error_type is None and plan.parent is None
    assert (plan.trace_id, plan.span_id) == ids_of("att_01J0")
    assert plan.start_ns == 1796119200000 * 1_000_000 and plan.end_ns - plan.start_ns == 1_250_000_000
    assert plan.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.stream": False,
        "gen_ai.request.model": "claude-sonnet-4-6",
        "gen_ai.response.model": "claude-sonnet-4-6-20260101",
        "http.response.status_code": 200,
        "gen_ai.provider.name": "anthropic",
        "server.address": "api.anthropic.com",
        "server.port": 443,
        "gen_ai.usage.input_tokens": 24,
        "gen_ai.usage.output_tokens": 3,
        "gen_ai.usage.cache_read.input_tokens": 7,
        "gen_ai.usage.cache_creation.input_tokens": 5,
        "leasehold.attempt_id": "att_01J0",
        "leasehold.key_id": "k1",
        "leasehold.account_id": "legacy-anthropic",
        "leasehold.repo": "acme/app",
        "leasehold.principal": "w-1",
        "leasehold.status": "completed",
        "leasehold.transport": "http",
        "leasehold.cost_usd": 0.0012,
        "leasehold.overhead_ms": 0.4,
        "leasehold.hop": 0,
    }


def test_openai_usage_counts_the_cached_prompt_as_input() -> None:
    """The ledger's OpenAI row: prompt_tokens 12 of which 4 cached → input 8, cache_read 4."""
    usage = Usage(input_tokens=8, output_tokens=3, cache_read_tokens=4)
    plan = span_of(
        row(wire="openai", path="/v1/chat/completions", requested_model="gpt-5", usage=usage),
        account_of("openai", "http://127.0.0.1:9000"),
    )
    a = plan.attributes
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.cache_read.input_tokens"]) == (12, 4)
    assert (a["gen_ai.provider.name"], a["server.address"], a["server.port"]) == ("openai", "127.0.0.1", 9000)


ERRORS = [
    ("completed", dict(status="completed"), None),
    ("upstream 429", dict(status="upstream-error", http_status=429, condition="rate-limited"), "rate-limited"),
    ("upstream 400", dict(status="upstream-error", http_status=400), "upstream-error"),
    (
        "gateway refusal",
        dict(status="refused", http_status=400, refusal_reason="model-not-permitted"),
        "model-not-permitted",
    ),
    ("cut stream", dict(status="transport-error", condition="transport-error"), "transport-error"),
    ("client went away", dict(status="client-aborted", http_status=200), "client-aborted"),
    ("unfinished", dict(status=None), "unfinished"),
]


@pytest.mark.parametrize("name,changes,error", ERRORS, ids=[e[0] for e in ERRORS])
def test_error_type(name: str, changes: dict, error: str | None) -> None:
    assert error_type_of(row(**changes)) == error
    plan = span_of(row(**changes))
    assert plan.error_type == error and plan.attributes.get("error.type") == error


def test_a_traceparent_makes_the_span_its_child() -> None:
    plan = span_of(row(traceparent=TP, tracestate="congo=t61"))
    assert plan.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736" and plan.span_id == ids_of("att_01J0")[1]
    assert plan.parent is not None and (plan.parent.span_id, plan.parent.flags, plan.parent.tracestate) == (
        "00f067aa0ba902b7",
        1,
        "congo=t61",
    )
    assert span_of(row(traceparent="garbage")).parent is None  # never trusted unparsed


NAMES = [
    ("messages", "/v1/messages", "m", "chat m"),
    ("responses", "/v1/responses", "gpt-5", "chat gpt-5"),
    ("embeddings", "/v1/embeddings", "e", "embeddings e"),
    ("count_tokens", "/v1/messages/count_tokens", "m", "count_tokens m"),
    ("models, no model", "/v1/models", None, "list_models"),
    ("a model bounded in the name", "/v1/messages", "x" * 500, "chat " + "x" * 128),
]


@pytest.mark.parametrize("name,path,model,span_name", NAMES, ids=[n[0] for n in NAMES])
def test_span_names(name: str, path: str, model: str | None, span_name: str) -> None:
    assert span_of(row(path=path, requested_model=model)).name == span_name


def test_lineage_hop_and_events() -> None:
    event = SpanEvent(name="leasehold.mint", at_ns=5, attributes={"leasehold.outcome": "selected"})
    v2 = row(mint_decision_id="md_1", dispatch_id="d-1", hop=1)
    assert span_of(v2).attributes["leasehold.hop"] == 1  # the row's, copied from its lease (SPEC §14)
    plan = span_of(v2, note=DecisionNote(events=(event,)))
    assert plan.attributes["leasehold.hop"] == 1 and plan.events == (event,)
    assert plan.attributes["leasehold.dispatch_id"] == "d-1" and plan.attributes["leasehold.mint_decision_id"] == "md_1"


def test_time_to_first_chunk_is_the_rows_first_byte_in_seconds() -> None:
    assert span_of(row(stream=True, first_byte_ms=250.5)).attributes["gen_ai.response.time_to_first_chunk"] == 0.2505
    assert "gen_ai.response.time_to_first_chunk" not in span_of(row(first_byte_ms=None)).attributes


def test_times_and_ids() -> None:
    assert ns_of("2026-12-01T10:00:00.001Z") % 1_000_000_000 == 1_000_000
    assert ns_of(None) is None and ns_of("yesterday") is None
    plan = span_of(row(finished_at=None))
    assert plan.end_ns == plan.start_ns  # never an end before the start
    assert ids_of("att_a") != ids_of("att_b") and all(int(i, 16) for i in ids_of("att_a"))


def test_accounts() -> None:
    zai = account_of("zai-harness", "https://api.z.ai/api/anthropic")
    assert (zai.provider, zai.address, zai.port) == ("z.ai", "api.z.ai", 443)
    assert account_of("openai", "not a url").address is None
    assert "server.address" not in span_of(ROW, account_of("openai", "not a url")).attributes


def test_no_usage_no_token_attributes() -> None:
    assert not any(k.startswith("gen_ai.usage") for k in span_of(row(usage=None)).attributes)


SAMPLING = [
    ("default, no caller", "parentbased_always_on", 1.0, None, True),
    ("default, sampled caller", "parentbased_always_on", 1.0, TP, True),
    ("default, caller did not sample", "parentbased_always_on", 1.0, TP[:-2] + "00", False),
    ("always_on ignores the caller", "always_on", 1.0, TP[:-2] + "00", True),
    ("always_off", "always_off", 1.0, TP, False),
    ("parentbased_always_off follows a sampled caller", "parentbased_always_off", 1.0, TP, True),
    ("parentbased_always_off, no caller", "parentbased_always_off", 1.0, None, False),
    ("ratio 0", "traceidratio", 0.0, None, False),
    ("ratio 1", "traceidratio", 1.0, None, True),
]


@pytest.mark.parametrize("name,sampler,ratio,traceparent,kept", SAMPLING, ids=[s[0] for s in SAMPLING])
def test_sampled(name: str, sampler: str, ratio: float, traceparent: str | None, kept: bool) -> None:
    assert sampled(span_of(row(traceparent=traceparent)), sampler, ratio) is kept


def test_a_ratio_keeps_about_its_share_and_a_whole_trace() -> None:
    plans = [span_of(row(attempt_id=f"att_{i}")) for i in range(4000)]
    kept = sum(sampled(p, "traceidratio", 0.25) for p in plans)
    assert 800 < kept < 1200
    same_trace = [span_of(row(attempt_id=f"att_{i}", traceparent=TP)) for i in range(5)]
    assert len({sampled(p, "traceidratio", 0.5) for p in same_trace}) == 1  # one answer per trace
