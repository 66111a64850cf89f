"""The Anthropic Messages wire: error shape, stream terminal, usage extraction, rate-limit
headers; its `WIRE` (with the facts of `shared/wires.ANTHROPIC`) is a row of `table.WIRES`."""

from __future__ import annotations

import msgspec

from dataplane.ratelimits import RateLimitHeaders
from dataplane.wires.spec import WireSpec
from dataplane.wires.sse import SseScanner
from shared import wires
from shared.wire import Usage

# Every kind, the reset an RFC 3339 time.
RATE_LIMITS = RateLimitHeaders(
    names=tuple(
        (
            kind,
            f"anthropic-ratelimit-{name}-limit",
            f"anthropic-ratelimit-{name}-remaining",
            f"anthropic-ratelimit-{name}-reset",
        )
        for kind, name in (
            ("requests", "requests"),
            ("tokens", "tokens"),
            ("input_tokens", "input-tokens"),
            ("output_tokens", "output-tokens"),
        )
    ),
    absolute_reset=True,
)

_ERROR_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    426: "invalid_request_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class _Message(msgspec.Struct):
    model: str | None = None
    usage: _Usage | None = None


class _Start(msgspec.Struct):
    message: _Message | None = None


class _Delta(msgspec.Struct):
    usage: _Usage | None = None


_decode_message = msgspec.json.Decoder(_Message).decode
_decode_start = msgspec.json.Decoder(_Start).decode
_decode_delta = msgspec.json.Decoder(_Delta).decode
_encode = msgspec.json.Encoder().encode


def _usage(u: _Usage, base: Usage | None = None) -> Usage:
    base = base or Usage()
    return Usage(
        input_tokens=u.input_tokens if u.input_tokens is not None else base.input_tokens,
        output_tokens=u.output_tokens if u.output_tokens is not None else base.output_tokens,
        cache_read_tokens=(
            u.cache_read_input_tokens if u.cache_read_input_tokens is not None else base.cache_read_tokens
        ),
        cache_creation_tokens=(
            u.cache_creation_input_tokens if u.cache_creation_input_tokens is not None else base.cache_creation_tokens
        ),
    )


class Scanner(SseScanner):
    """`message_stop` completes a stream; usage from `message_start` then `message_delta`."""

    wanted = frozenset({b"message_start", b"message_delta", b"message_stop", b"error"})

    def on_event(self, name: bytes, data: bytes) -> None:
        seen = self.seen
        try:
            if name == b"message_start":
                start = _decode_start(data)
                if start.message is not None:
                    seen.model = start.message.model
                    if start.message.usage is not None:
                        seen.usage = _usage(start.message.usage)
            elif name == b"message_delta":
                delta = _decode_delta(data)
                if delta.usage is not None:
                    seen.usage = _usage(delta.usage, seen.usage)
            elif name == b"message_stop":
                seen.terminal = True
            elif name == b"error":
                seen.upstream_error = True
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass  # a malformed event is forwarded as it came; it does not cut the stream


def scanner_for(path: str) -> SseScanner:
    return Scanner()  # one stream shape on every path


def usage_from_body(body: bytes) -> tuple[str | None, Usage | None]:
    try:
        message = _decode_message(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None, None
    return message.model, None if message.usage is None else _usage(message.usage)


def error_body(status: int, code: str, message: str, request_id: str) -> bytes:
    kind = _ERROR_TYPE.get(status, "api_error")
    return _encode(
        {"type": "error", "error": {"type": kind, "message": message, "code": code}, "request_id": request_id}
    )


def cut_event(path: str, message: str) -> bytes:
    """The error event that ends a cut stream (the same on every path)."""
    payload = _encode({"type": "error", "error": {"type": "api_error", "message": message}})
    return b"event: error\ndata: " + payload + b"\n\n"


WIRE = WireSpec(
    facts=wires.ANTHROPIC,
    error_body=error_body,
    cut_event=cut_event,
    scanner=scanner_for,
    usage_from_body=usage_from_body,
    rate_limits=RATE_LIMITS,
)
