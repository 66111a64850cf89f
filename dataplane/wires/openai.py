"""The OpenAI wire (chat completions, Responses, embeddings, models): error shape, stream
terminals, usage extraction, rate-limit headers; its `WIRE` (with the facts of
`shared/wires.OPENAI`) is a row of `table.WIRES`."""

from __future__ import annotations

import msgspec

from dataplane.ratelimits import RateLimitHeaders
from dataplane.wires.spec import WireSpec
from dataplane.wires.sse import SseScanner
from shared import wires
from shared.wire import Usage

# Requests and tokens, the reset a Go duration from the answer's arrival.
RATE_LIMITS = RateLimitHeaders(
    names=tuple(
        (kind, f"x-ratelimit-limit-{kind}", f"x-ratelimit-remaining-{kind}", f"x-ratelimit-reset-{kind}")
        for kind in ("requests", "tokens")
    ),
    absolute_reset=False,
)

_ERROR_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    415: "invalid_request_error",
    426: "invalid_request_error",
    429: "rate_limit_error",
}


class _Details(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    prompt_tokens_details: _Details | None = None
    input_tokens_details: _Details | None = None


class _Choice(msgspec.Struct):
    finish_reason: str | None = None


class _Body(msgspec.Struct):
    """A chat completion, a chat chunk, an embeddings answer or a Response object."""

    model: str | None = None
    usage: _Usage | None = None
    choices: list[_Choice] = []
    error: dict | None = None


class _ResponsesEvent(msgspec.Struct):
    response: _Body | None = None


_decode_body = msgspec.json.Decoder(_Body).decode
_decode_event = msgspec.json.Decoder(_ResponsesEvent).decode
_encode = msgspec.json.Encoder().encode
_RESPONSES_TERMINAL = (b"response.completed", b"response.incomplete", b"response.failed")


def _usage(u: _Usage) -> Usage:
    """Input excludes cached tokens, which are counted (and priced) as cache reads."""
    prompt = u.prompt_tokens if u.prompt_tokens is not None else (u.input_tokens or 0)
    output = u.completion_tokens if u.completion_tokens is not None else (u.output_tokens or 0)
    details = u.prompt_tokens_details or u.input_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    return Usage(input_tokens=max(0, prompt - cached), output_tokens=output, cache_read_tokens=cached)


class ChatScanner(SseScanner):
    """`data: [DONE]` completes; a clean close after a `finish_reason` completes as well."""

    def on_event(self, name: bytes, data: bytes) -> None:
        if data == b"[DONE]":
            self.seen.terminal = True
            return
        try:
            chunk = _decode_body(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        if chunk.error is not None:
            self.seen.upstream_error = True
        if chunk.model:
            self.seen.model = chunk.model
        if chunk.usage is not None:
            self.seen.usage = _usage(chunk.usage)
        if any(choice.finish_reason for choice in chunk.choices):
            self.seen.finish_seen = True


class ResponsesScanner(SseScanner):
    """`response.completed`, `response.incomplete` or `response.failed` completes."""

    wanted = frozenset({b"error", b"response.created", *_RESPONSES_TERMINAL})

    def on_event(self, name: bytes, data: bytes) -> None:
        if name == b"error":
            self.seen.upstream_error = True
            return
        if name in _RESPONSES_TERMINAL:
            self.seen.terminal = True
        elif name != b"response.created":
            return
        try:
            event = _decode_event(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        if event.response is not None:
            self.seen.model = event.response.model or self.seen.model
            if event.response.usage is not None:
                self.seen.usage = _usage(event.response.usage)


def scanner_for(path: str) -> SseScanner:
    return ResponsesScanner() if path == "/v1/responses" else ChatScanner()


def usage_from_body(body: bytes) -> tuple[str | None, Usage | None]:
    try:
        parsed = _decode_body(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None, None
    return parsed.model, None if parsed.usage is None else _usage(parsed.usage)


def error_body(status: int, code: str, message: str, request_id: str) -> bytes:
    kind = _ERROR_TYPE.get(status, "server_error")
    return _encode({"error": {"message": message, "type": kind, "param": None, "code": code}})


def cut_event(path: str, message: str) -> bytes:
    if path == "/v1/responses":
        payload = _encode({"type": "error", "code": "server_error", "message": message})
        return b"event: error\ndata: " + payload + b"\n\n"
    payload = _encode({"error": {"message": message, "type": "server_error", "param": None, "code": "transport-error"}})
    return b"data: " + payload + b"\n\n"


WIRE = WireSpec(
    facts=wires.OPENAI,
    error_body=error_body,
    cut_event=cut_event,
    scanner=scanner_for,
    usage_from_body=usage_from_body,
    rate_limits=RATE_LIMITS,
)
