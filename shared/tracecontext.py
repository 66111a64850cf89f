"""W3C Trace Context (`traceparent`, `tracestate`): strict parsing, and a new trace for a worker.

The data plane copies a request's two headers into its attempt row only when they parse here
(SPEC §21); anything else is ignored — never refused, never repaired — and the headers go
upstream untouched either way. Control parents the attempt's span under a `traceparent` that
parsed. `leaseholdctl exec` hands its worker a `TRACEPARENT` from `worker_traceparent`.

Grammar (https://www.w3.org/TR/trace-context/): `traceparent` is
`version "-" trace-id "-" parent-id "-" trace-flags`, lower-case hex, 2-32-16-2 digits, the
all-zero ids and version `ff` invalid; a version above 00 may carry more fields after a `-`.
`tracestate` is at most 32 comma-separated `key=value` members, each bounded.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import NamedTuple

# The spec lets a receiver truncate a long tracestate; a header over this is dropped whole.
TRACESTATE_MAX_CHARS = 512
TRACESTATE_MAX_MEMBERS = 32
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_KEY = re.compile(r"^(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})$")
_VALUE = re.compile(r"^[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]$")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


class TraceParent(NamedTuple):
    trace_id: str  # 32 lower-case hex digits
    span_id: str  # 16 lower-case hex digits: the caller's span, the attempt's parent
    flags: int  # bit 0: sampled


def parse_traceparent(value: str | None) -> TraceParent | None:
    """The parsed header, or None for anything the W3C grammar does not allow."""
    if value is None or len(value) > 256:
        return None
    match = _TRACEPARENT.match(value.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    if version == "00" and rest is not None:  # version 00 has exactly four fields
        return None
    return TraceParent(trace_id, span_id, int(flags, 16))


def valid_tracestate(value: str | None) -> bool:
    """True for a bounded `tracestate` of well-formed, distinct-key members."""
    if value is None or len(value) > TRACESTATE_MAX_CHARS:
        return False
    members = [m.strip() for m in value.split(",")]
    members = [m for m in members if m]  # empty list members are allowed and ignored
    if not members or len(members) > TRACESTATE_MAX_MEMBERS:
        return False
    keys = set()
    for member in members:
        key, sep, val = member.partition("=")
        if not sep or not _KEY.match(key) or not _VALUE.match(val) or key in keys:
            return False
        keys.add(key)
    return True


def trace_headers(headers: Mapping[str, str]) -> tuple[str | None, str | None]:
    """`(traceparent, tracestate)` to copy into the row: each only if valid, and a tracestate
    only beside a valid traceparent (the spec: without one it means nothing)."""
    parent = headers.get("traceparent")
    if parse_traceparent(parent) is None:
        return None, None
    state = headers.get("tracestate")
    return parent.strip(), state.strip() if valid_tracestate(state) else None  # type: ignore[union-attr]


def new_traceparent() -> str:
    """A fresh sampled trace: random trace and span ids."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def worker_traceparent(env: Mapping[str, str]) -> str:
    """The `TRACEPARENT` a worker gets: the caller's own when it holds a valid one (the worker
    joins the trace it was started in), else a new trace."""
    inherited = env.get("TRACEPARENT")
    return inherited.strip() if parse_traceparent(inherited) is not None else new_traceparent()  # type: ignore[union-attr]
