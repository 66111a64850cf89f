"""W3C Trace Context parsing by table (SPEC §21): what the data plane copies into a row."""

from __future__ import annotations

import pytest

from shared.tracecontext import (
    TraceParent,
    new_traceparent,
    parse_traceparent,
    trace_headers,
    valid_tracestate,
    worker_traceparent,
)

GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

TRACEPARENTS = [
    ("the spec's example", GOOD, TraceParent("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", 1)),
    ("not sampled", GOOD[:-2] + "00", TraceParent("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", 0)),
    (
        "a later version may add fields",
        "01" + GOOD[2:] + "-what-ever",
        TraceParent("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", 1),
    ),
    ("version 00 with a fifth field", GOOD + "-x", None),
    ("version ff", "ff" + GOOD[2:], None),
    ("upper-case hex", GOOD.upper(), None),
    ("all-zero trace id", "00-" + "0" * 32 + "-b7ad6b7169203331-01", None),
    ("all-zero parent id", "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01", None),
    ("short trace id", "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01", None),
    ("not hex", "00-0af7651916cd43dd8448eb211c80319z-b7ad6b7169203331-01", None),
    ("empty", "", None),
    ("absent", None, None),
    ("oversized", GOOD + "-" + "a" * 300, None),
    ("a newline smuggled in", GOOD + "\nx-api-key: k", None),
]


@pytest.mark.parametrize("name,value,parsed", TRACEPARENTS, ids=[c[0] for c in TRACEPARENTS])
def test_parse_traceparent(name: str, value: str | None, parsed: TraceParent | None) -> None:
    assert parse_traceparent(value) == parsed


TRACESTATES = [
    ("one member", "congo=t61rcWkgMzE", True),
    ("two members, a multi-tenant key", "rojo=00f067aa0ba902b7,tenant@vendor=x", True),
    ("empty members skipped", "a=1,,b=2", True),
    ("duplicate key", "a=1,a=2", False),
    ("no equals", "congo", False),
    ("upper-case key", "Congo=1", False),
    ("comma in value is a separator, equals is not allowed", "a=b=c", False),
    ("33 members", ",".join(f"k{i}=v" for i in range(33)), False),
    ("too long", "a=" + "v" * 600, False),
    ("only blanks", " , ", False),
    ("absent", None, False),
]


@pytest.mark.parametrize("name,value,ok", TRACESTATES, ids=[c[0] for c in TRACESTATES])
def test_valid_tracestate(name: str, value: str | None, ok: bool) -> None:
    assert valid_tracestate(value) is ok


def test_trace_headers_copies_only_what_parses() -> None:
    assert trace_headers({"traceparent": GOOD, "tracestate": "a=1"}) == (GOOD, "a=1")
    assert trace_headers({"traceparent": GOOD, "tracestate": "A=1"}) == (GOOD, None)
    assert trace_headers({"traceparent": "bogus", "tracestate": "a=1"}) == (None, None)
    assert trace_headers({"tracestate": "a=1"}) == (None, None)


def test_new_and_worker_traceparents() -> None:
    fresh = new_traceparent()
    assert parse_traceparent(fresh) is not None and fresh.endswith("-01")
    assert worker_traceparent({"TRACEPARENT": GOOD}) == GOOD
    assert worker_traceparent({"TRACEPARENT": "bad"}) != "bad"
