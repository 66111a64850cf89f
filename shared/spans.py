"""SPEC §21's span of an attempt row, as data: pure, no SDK, no clock.

Control hands each recorded row to `span_of` and gives the result to the OpenTelemetry SDK
(controlplane/traces.py); `leaseholdctl trace` renders the same plan from the ledger's row, so
what it prints is what the collector received. Everything here is read from the row and from
what control already knows (the account's server, the mint decision's facts): nothing new is
asked of the data plane, and nothing in a plan can hold a credential, a token, a digest, a
prompt or a completion — the row carries none of them (SPEC §13, §14).

Ids are derived from the attempt id (sha256), so a span's id can be computed from its row:
the span id always; the trace id too when the request carried no `traceparent`.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from urllib.parse import urlsplit

import msgspec

from shared.codes import AttemptStatus
from shared.tracecontext import parse_traceparent
from shared.wire import AttemptRow

# SPEC §21's `gen_ai.operation.name` of each served path; a path not listed (none is served
# today) is named by its last segment.
OPERATION_OF_PATH = {
    "/v1/messages": "chat",
    "/v1/chat/completions": "chat",
    "/v1/responses": "chat",
    "/v1/embeddings": "embeddings",
    "/v1/messages/count_tokens": "count_tokens",
    "/v1/models": "list_models",
}
# `gen_ai.provider.name`: the conventions' well-known values where one exists.
PROVIDER_OF_BINDING = {"anthropic": "anthropic", "openai": "openai", "zai-harness": "z.ai"}
Attr = str | int | float | bool | tuple[str, ...]
MODEL_IN_NAME = 128  # the worker names the model: bounded in the span name (the SDK bounds attributes)


class SpanEvent(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    at_ns: int
    attributes: dict[str, Attr] = {}


class Parent(msgspec.Struct, frozen=True, kw_only=True):
    """The caller's span (the request's `traceparent`), remote to this process."""

    trace_id: str
    span_id: str
    flags: int
    tracestate: str | None = None


class SpanPlan(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    trace_id: str  # 32 hex digits: the parent's, else derived from the attempt id
    span_id: str  # 16 hex digits, derived from the attempt id
    parent: Parent | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Attr]
    error_type: str | None = None
    events: tuple[SpanEvent, ...] = ()


class Account(msgspec.Struct, frozen=True, kw_only=True):
    """What the span says of the row's account (`account_of`: from control's registry)."""

    provider: str  # `gen_ai.provider.name`
    address: str | None = None  # `server.address` / `server.port`: the account's base URL
    port: int | None = None


def account_of(provider_binding: str, base_url: str) -> Account:
    parts = urlsplit(base_url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = None
    return Account(
        provider=PROVIDER_OF_BINDING.get(provider_binding, provider_binding),
        address=parts.hostname,
        port=port if parts.hostname else None,
    )


class DecisionNote(msgspec.Struct, frozen=True, kw_only=True):
    """What control's mint desk decided for the row's lease: its hop, and the events the first
    attempt under the decision carries (then announced, so later attempts carry none)."""

    hop: int = 0
    events: tuple[SpanEvent, ...] = ()


def ns_of(stamp: str | None) -> int | None:
    """An ISO 8601 `…Z` stamp (milliseconds) → Unix nanoseconds; None when absent or malformed."""
    if not stamp:
        return None
    try:
        return round(datetime.fromisoformat(stamp).timestamp() * 1000) * 1_000_000
    except ValueError:
        return None


def ids_of(attempt_id: str) -> tuple[str, str]:
    """`(trace_id, span_id)` derived from an attempt id; neither is all zeros."""
    digest = hashlib.sha256(attempt_id.encode()).hexdigest()
    return (
        digest[16:48] if digest[16:48].strip("0") else "1".zfill(32),
        digest[:16] if digest[:16].strip("0") else "1".zfill(16),
    )


def error_type_of(row: AttemptRow) -> str | None:
    """SPEC §21: the refusal, else the condition, else the status of a row that did not
    complete; None for a completed one."""
    if row.status == AttemptStatus.COMPLETED:
        return None
    return row.refusal_reason or row.condition or row.status or "unfinished"


def usage_attributes(row: AttemptRow) -> dict[str, Attr]:
    """The conventions' token counts: input includes the cache's reads and writes (the ledger
    counts only the uncached part as `input_tokens`, SPEC §14)."""
    usage = row.usage
    if usage is None:
        return {}
    return {
        "gen_ai.usage.input_tokens": usage.input_tokens + usage.cache_read_tokens + usage.cache_creation_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": usage.cache_read_tokens,
        "gen_ai.usage.cache_creation.input_tokens": usage.cache_creation_tokens,
    }


def _server(account: Account | None) -> dict[str, Attr]:
    if account is None:
        return {}
    attrs: dict[str, Attr] = {"gen_ai.provider.name": account.provider}
    if account.address is not None and account.port is not None:
        attrs["server.address"] = account.address
        attrs["server.port"] = account.port
    return attrs


def _leasehold(row: AttemptRow) -> dict[str, Attr]:
    attrs: dict[str, Attr] = {
        "leasehold.attempt_id": row.attempt_id,
        "leasehold.key_id": row.key_id,
        "leasehold.account_id": row.account_id,
        "leasehold.repo": row.repo_slug,
        "leasehold.principal": row.principal_id,
        "leasehold.status": row.status or "unfinished",
        "leasehold.transport": row.transport,
        "leasehold.hop": row.hop,  # the lease's, copied onto the row by the data plane (SPEC §8, §14)
    }
    optional = {
        "leasehold.dispatch_id": row.dispatch_id,
        "leasehold.mint_decision_id": row.mint_decision_id,
        "leasehold.cost_usd": row.cost_usd,
        "leasehold.refusal_reason": row.refusal_reason,
        "leasehold.condition": row.condition,
        "leasehold.worker_role": row.worker_role,
        "leasehold.overhead_ms": row.overhead_ms,
    }
    attrs.update({k: v for k, v in optional.items() if v is not None})
    return attrs


def sampled(plan: SpanPlan, sampler: str = "parentbased_always_on", ratio: float = 1.0) -> bool:
    """`OTEL_TRACES_SAMPLER`'s decision for a span, as the SDK's built-in samplers make it: a
    `parentbased_*` sampler follows the caller's sampled flag when there is a caller, else (and
    for the others always) its root rule; `traceidratio` keeps a trace whose id's lower 64 bits
    fall under `ratio` × 2⁶⁴, so every span of a trace gets the same answer."""
    if sampler.startswith("parentbased_") and plan.parent is not None:
        return bool(plan.parent.flags & 1)
    rule = sampler.removeprefix("parentbased_")
    if rule == "always_on":
        return True
    if rule == "always_off":
        return False
    return int(plan.trace_id[16:], 16) < round(ratio * (1 << 64))


def span_of(row: AttemptRow, account: Account | None = None, note: DecisionNote | None = None) -> SpanPlan:
    """The one span of a terminal row (SPEC §21)."""
    operation = OPERATION_OF_PATH.get(row.path, row.path.rstrip("/").rsplit("/", 1)[-1] or "request")
    attrs: dict[str, Attr] = {"gen_ai.operation.name": operation, "gen_ai.request.stream": row.stream}
    if row.requested_model is not None:
        attrs["gen_ai.request.model"] = row.requested_model
    if row.served_model is not None:
        attrs["gen_ai.response.model"] = row.served_model
    if row.first_byte_ms is not None:
        attrs["gen_ai.response.time_to_first_chunk"] = row.first_byte_ms / 1000
    if row.http_status is not None:
        attrs["http.response.status_code"] = row.http_status
    attrs.update(_server(account))
    attrs.update(usage_attributes(row))
    attrs.update(_leasehold(row))
    error = error_type_of(row)
    if error is not None:
        attrs["error.type"] = error
    trace_id, span_id = ids_of(row.attempt_id)
    caller = parse_traceparent(row.traceparent)
    parent = None
    if caller is not None:
        parent = Parent(trace_id=caller.trace_id, span_id=caller.span_id, flags=caller.flags, tracestate=row.tracestate)
        trace_id = caller.trace_id
    start = ns_of(row.started_at) or 0
    end = max(start, ns_of(row.finished_at) or start)
    name = operation if row.requested_model is None else f"{operation} {row.requested_model[:MODEL_IN_NAME]}"
    return SpanPlan(
        name=name,
        trace_id=trace_id,
        span_id=span_id,
        parent=parent,
        start_ns=start,
        end_ns=end,
        attributes=attrs,
        error_type=error,
        events=() if note is None else note.events,
    )
