"""Pure wire rules by table: completeness and verdicts, usage extraction, error shapes."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import pytest

from dataplane.endings import VERDICTS, Ending, is_complete, verdict
from dataplane.wires import anthropic, openai
from dataplane.wires.table import guess_wire
from shared.codes import AttemptStatus, Condition, Refusal, Wire
from shared.evidence import condition_for_terminal
from shared.wire import Usage

REPO = Path(__file__).resolve().parents[2]


# ---- endings --------------------------------------------------------------------------------


class Case(NamedTuple):
    name: str
    given: Any
    expect: Any


VERDICT_CASES = [
    Case("clean end of a complete answer", (Ending.EOF, True), (AttemptStatus.COMPLETED, None, False)),
    Case("clean end without the terminal event", (Ending.EOF, False), (AttemptStatus.TRANSPORT_ERROR, None, True)),
    Case("upstream read failure", (Ending.UPSTREAM_FAILED, False), (AttemptStatus.TRANSPORT_ERROR, None, True)),
    Case("idle timeout", (Ending.IDLE_TIMEOUT, False), (AttemptStatus.TRANSPORT_ERROR, None, True)),
    Case("worker went away", (Ending.CLIENT_GONE, False), (AttemptStatus.CLIENT_ABORTED, None, False)),
    Case("drain window over", (Ending.SHUTDOWN, False), (AttemptStatus.REFUSED, Refusal.GATEWAY_SHUTDOWN, True)),
]


@pytest.mark.parametrize("case", VERDICT_CASES, ids=lambda c: c.name)
def test_verdict(case: Case) -> None:
    got = verdict(*case.given)
    assert (got.status, got.refusal, got.cut) == case.expect


def test_verdict_table_is_total_and_only_a_clean_complete_end_completes() -> None:
    assert set(VERDICTS) == {(e, c) for e in Ending for c in (True, False)}
    for (ending, complete), v in VERDICTS.items():
        assert (v.status == AttemptStatus.COMPLETED) == (ending == Ending.EOF and complete)
        # a verdict that is evidence is exactly a transport error of the upstream
        condition = condition_for_terminal(v.status, 200, v.refusal)
        assert condition == (Condition.TRANSPORT_ERROR if v.status == AttemptStatus.TRANSPORT_ERROR else None)


COMPLETE_CASES = [
    Case("json body", ("/v1/messages", False, True, False, False), True),
    Case("sse with terminal", ("/v1/messages", True, True, True, False), True),
    Case("sse without terminal", ("/v1/messages", True, True, False, False), False),
    Case("chat finish_reason without [DONE]", ("/v1/chat/completions", True, True, False, True), True),
    Case("responses never completes on finish", ("/v1/responses", True, True, False, True), False),
    Case("unreadable encoding judged by close", ("/v1/responses", True, False, False, False), True),
]


@pytest.mark.parametrize("case", COMPLETE_CASES, ids=lambda c: c.name)
def test_is_complete(case: Case) -> None:
    assert is_complete(*case.given) is case.expect


def test_endings_is_a_pure_core() -> None:
    tree = ast.parse((REPO / "dataplane" / "endings.py").read_text())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not imported & {"asyncio", "aiohttp", "os", "socket", "time", "structlog", "secrets"}


# ---- usage ----------------------------------------------------------------------------------


def sse(name: str | None, data: dict) -> bytes:
    head = b"" if name is None else b"event: " + name.encode() + b"\n"
    return head + b"data: " + json.dumps(data).encode() + b"\n\n"


def test_anthropic_stream_usage_merges_start_and_delta() -> None:
    s = anthropic.Scanner()
    s.feed(
        sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "model": "claude-x",
                    "usage": {
                        "input_tokens": 10,
                        "output_tokens": 1,
                        "cache_read_input_tokens": 3,
                        "cache_creation_input_tokens": 2,
                    },
                },
            },
        )
    )
    assert s.seen.usage == Usage(input_tokens=10, output_tokens=1, cache_read_tokens=3, cache_creation_tokens=2)
    s.feed(sse("message_delta", {"type": "message_delta", "usage": {"output_tokens": 42}}))
    assert s.seen.usage == Usage(input_tokens=10, output_tokens=42, cache_read_tokens=3, cache_creation_tokens=2)
    assert s.seen.model == "claude-x" and not s.seen.terminal
    s.feed(sse("message_stop", {"type": "message_stop"}))
    assert s.seen.terminal


def test_anthropic_in_stream_error_is_noted() -> None:
    s = anthropic.Scanner()
    s.feed(sse("error", {"type": "error", "error": {"type": "overloaded_error", "message": "x"}}))
    assert s.seen.upstream_error and not s.seen.terminal


def test_chat_stream_usage_from_the_final_chunk_and_done() -> None:
    s = openai.ChatScanner()
    s.feed(
        sse(None, {"model": "gpt-5", "choices": [{"delta": {"content": "a"}, "finish_reason": None}], "usage": None})
    )
    assert s.seen.usage is None and not s.seen.finish_seen
    s.feed(sse(None, {"model": "gpt-5", "choices": [{"delta": {}, "finish_reason": "stop"}]}))
    s.feed(
        sse(
            None,
            {
                "model": "gpt-5",
                "choices": [],
                "usage": {"prompt_tokens": 20, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 8}},
            },
        )
    )
    assert s.seen.usage == Usage(input_tokens=12, output_tokens=5, cache_read_tokens=8)
    assert s.seen.finish_seen and not s.seen.terminal
    s.feed(b"data: [DONE]\n\n")
    assert s.seen.terminal


def test_chat_in_stream_error_is_noted() -> None:
    s = openai.ChatScanner()
    s.feed(sse(None, {"error": {"message": "boom", "type": "server_error"}}))
    assert s.seen.upstream_error


@pytest.mark.parametrize("terminal", ["response.completed", "response.incomplete", "response.failed"])
def test_responses_terminal_events_carry_usage(terminal: str) -> None:
    s = openai.ResponsesScanner()
    s.feed(sse("response.created", {"type": "response.created", "response": {"model": "gpt-5", "usage": None}}))
    s.feed(sse("response.output_text.delta", {"type": "response.output_text.delta", "delta": "x"}))
    assert s.seen.model == "gpt-5" and s.seen.usage is None and not s.seen.terminal
    s.feed(
        sse(
            terminal,
            {
                "type": terminal,
                "response": {
                    "model": "gpt-5-2026",
                    "usage": {"input_tokens": 30, "output_tokens": 7, "input_tokens_details": {"cached_tokens": 10}},
                },
            },
        )
    )
    assert s.seen.terminal and s.seen.model == "gpt-5-2026"
    assert s.seen.usage == Usage(input_tokens=20, output_tokens=7, cache_read_tokens=10)


BODY_CASES = [
    Case(
        "anthropic message",
        (
            anthropic.usage_from_body,
            {"model": "claude-x", "usage": {"input_tokens": 5, "output_tokens": 6, "cache_read_input_tokens": 1}},
        ),
        ("claude-x", Usage(input_tokens=5, output_tokens=6, cache_read_tokens=1)),
    ),
    Case("anthropic count_tokens has no usage", (anthropic.usage_from_body, {"input_tokens": 5}), (None, None)),
    Case(
        "chat completion",
        (openai.usage_from_body, {"model": "gpt-5", "usage": {"prompt_tokens": 9, "completion_tokens": 2}}),
        ("gpt-5", Usage(input_tokens=9, output_tokens=2)),
    ),
    Case(
        "response object",
        (
            openai.usage_from_body,
            {
                "model": "gpt-5",
                "usage": {"input_tokens": 9, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 4}},
            },
        ),
        ("gpt-5", Usage(input_tokens=5, output_tokens=2, cache_read_tokens=4)),
    ),
    Case(
        "embeddings",
        (openai.usage_from_body, {"model": "emb", "usage": {"prompt_tokens": 3, "total_tokens": 3}}),
        ("emb", Usage(input_tokens=3)),
    ),
    Case("not json", (openai.usage_from_body, None), (None, None)),
]


@pytest.mark.parametrize("case", BODY_CASES, ids=lambda c: c.name)
def test_usage_from_body(case: Case) -> None:
    extract, body = case.given
    raw = b"<html>" if body is None else json.dumps(body).encode()
    assert extract(raw) == case.expect


# ---- gateway-authored shapes ----------------------------------------------------------------


def test_anthropic_error_body_shape() -> None:
    body = msgspec.json.decode(anthropic.error_body(429, "request-capacity-exhausted", "full", "att_1"))
    assert body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "full", "code": "request-capacity-exhausted"},
        "request_id": "att_1",
    }


def test_openai_error_body_shape() -> None:
    body = msgspec.json.decode(openai.error_body(503, "pool-timeout", "busy", "att_1"))
    assert body == {"error": {"message": "busy", "type": "server_error", "param": None, "code": "pool-timeout"}}


@pytest.mark.parametrize("kind", ["anthropic", "chat", "responses"])
def test_cut_events_are_one_well_formed_sse_event(kind: str) -> None:
    event = (
        anthropic.cut_event("/v1/messages", "m")
        if kind == "anthropic"
        else openai.cut_event("/v1/responses" if kind == "responses" else "/v1/chat/completions", "m")
    )
    assert event.endswith(b"\n\n") and event.count(b"\n\n") == 1
    data = json.loads(event.split(b"data: ", 1)[1])
    if kind == "anthropic":
        assert event.startswith(b"event: error\n") and data["error"]["type"] == "api_error"
    elif kind == "responses":
        assert event.startswith(b"event: error\n") and data["type"] == "error" and data["code"]
    else:
        assert event.startswith(b"data: ") and data["error"]["message"] == "m"
    scanner = (
        anthropic.Scanner()
        if kind == "anthropic"
        else openai.scanner_for("/v1/responses" if kind == "responses" else "/v1/chat/completions")
    )
    scanner.feed(event)
    assert scanner.seen.upstream_error  # a client reading it sees an error, never a completion


@pytest.mark.parametrize(
    "path,headers,wire",
    [
        ("/v1/messages", {}, Wire.ANTHROPIC),
        ("/v1/messages/count_tokens", {}, Wire.ANTHROPIC),
        ("/v1/chat/completions", {}, Wire.OPENAI),
        ("/v1/models", {"anthropic-version": "2023-06-01"}, Wire.ANTHROPIC),
        ("/v1/models", {"x-api-key": "k"}, Wire.ANTHROPIC),
        ("/v1/models", {"authorization": "Bearer k"}, Wire.OPENAI),
    ],
)
def test_guess_wire_before_a_lease(path: str, headers: dict, wire: Wire) -> None:
    from multidict import CIMultiDict, CIMultiDictProxy

    assert guess_wire(path, CIMultiDictProxy(CIMultiDict(headers))).name == wire
