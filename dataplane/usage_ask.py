"""Usage the ledger needs is always asked for (SPEC §19).

An OpenAI chat completions stream requested without `stream_options.include_usage: true` (the
`openai` SDK's default) would leave a row without usage: $0 in silence. The gateway asks for it:
`with_usage` sets the member upstream, every other member's bytes unchanged, and `UsageStrip`
removes from what the worker receives the usage-only chunk (`"choices": []` and a `usage`
object) it did not ask for. Every other byte of the stream passes as it came.

The one member is written by splicing: with no `stream_options`, `{"stream_options":
{"include_usage":true},` replaces the body's opening brace; with one, only its value is
rewritten (found by a scan of the top level that skips strings).
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from dataplane.bodies import OFF_LOOP_BYTES, BodyPeek, ask_reader

CHAT_PATH = "/v1/chat/completions"
_ASKED = b'"stream_options":{"include_usage":true},'
# A top-level scan's tokens: a whole string (escapes included), or one structural character.
# The string's loop is unrolled (runs of plain bytes at once): `"(?:[^"\\]|\\.)*"` took ~0.8 s
# per MiB of one string, holding the GIL (bench/README.md, Stop 30).
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\],:]', re.S)
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_EMPTY_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
# A partial event held back longer than this passes unfiltered (it is not a usage chunk).
HOLD_CAP = 1024 * 1024


def asks_usage(path: str, peek: BodyPeek) -> bool:
    """Must the gateway ask for usage on this request's behalf?"""
    return path == CHAT_PATH and peek.stream and not peek.include_usage


ASK_USAGE = 1  # a reader process's request kind (`dataplane.bodyreader`)


async def with_usage_off_loop(body: bytes, peek: BodyPeek) -> bytes | None:
    """`with_usage`, in a reader process when it must scan a large body for `stream_options`
    (the scan holds the GIL: ~35 ms per MiB of one long string, more for many tokens); a reader
    lost on the way is BodyRefused(internal-error)."""
    if not peek.stream_options or len(body) < OFF_LOOP_BYTES:
        return with_usage(body, peek)
    asked = await ask_reader(body, ASK_USAGE, 2 * len(body) + 1024)
    return bytes(asked) if asked else None


def _value_span(body: bytes, member: bytes) -> tuple[int, int] | None:
    """Where the value of the top-level `member` (a JSON string token, quotes included) lies."""
    depth = 0
    start = -1
    expect_key = False
    key = b""
    for token in _TOKEN.finditer(body):
        text = token.group()
        if text in (b"{", b"["):
            depth += 1
            expect_key = depth == 1 and text == b"{"
        elif text in (b"}", b"]"):
            if depth == 1 and start >= 0:
                return start, token.start()
            depth -= 1
        elif depth != 1:
            continue
        elif text == b",":
            if start >= 0:
                return start, token.start()
            expect_key = True
        elif text == b":":
            if key == member:
                start = token.end()
        elif expect_key:
            key = json.loads(text).encode()
            key = b'"' + key + b'"'
            expect_key = False
    return None


def with_usage(body: bytes, peek: BodyPeek) -> bytes | None:
    """`body` with `stream_options.include_usage` true; None if it cannot be set (a
    `stream_options` that is neither an object nor null: the upstream refuses the body).

    Spliced, never re-encoded: every byte but the one member's stays as the worker sent it
    (a number such as `1e999` or `1E2`, an escape such as `\\u00e9`, the whitespace)."""
    if not peek.stream_options:
        opening = body.index(b"{")
        return body[:opening] + b"{" + _ASKED + body[opening + 1 :]
    span = _value_span(body, b'"stream_options"')
    if span is None:
        return None
    start, end = _stripped(body, *span)
    value = body[start:end]
    if value == b"null":
        written = b'{"include_usage":true}'
    elif value.startswith(b"{") and value.endswith(b"}"):
        written = _usage_set(value)
    else:
        return None
    return body[:start] + written + body[end:]


def _stripped(body: bytes, start: int, end: int) -> tuple[int, int]:
    """The span without the whitespace around the value (that whitespace stays)."""
    value = body[start:end]
    return start + len(value) - len(value.lstrip()), end - (len(value) - len(value.rstrip()))


def _usage_set(options: bytes) -> bytes:
    """A `stream_options` object with `include_usage` true: its value replaced where the member
    is (the strict parse refused it twice), else the member added last."""
    span = _value_span(options, b'"include_usage"')
    if span is not None:
        start, end = _stripped(options, *span)
        return options[:start] + b"true" + options[end:]
    inner = options[1:-1]
    if not inner.strip():
        return b"{" + inner + b'"include_usage":true}'
    return options[:-1] + b',"include_usage":true}'


class _Chunk(msgspec.Struct):
    choices: Any = None
    usage: Any = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


def _usage_only(event: bytes) -> bool:
    """A `data:` event whose chunk has no choices and a usage object."""
    if not _EMPTY_CHOICES.search(event):
        return False
    for line in event.splitlines():
        if line.startswith(b"data:"):
            try:
                chunk = _decode_chunk(line[5:].strip())
            except (msgspec.DecodeError, msgspec.ValidationError):
                return False
            return chunk.choices == [] and isinstance(chunk.usage, dict)
    return False


class UsageStrip:
    """Drops the usage-only chunk from a plain SSE stream; holds back only a partial event."""

    __slots__ = ("held", "dropped")

    def __init__(self) -> None:
        self.held = b""
        self.dropped = 0

    def feed(self, chunk: bytes) -> bytes:
        data = self.held + chunk if self.held else chunk
        last = None
        for match in _EVENT_END.finditer(data):
            last = match
        if last is None:
            if len(data) > HOLD_CAP:
                self.held = b""
                return data
            self.held = data
            return b""
        whole, self.held = data[: last.end()], data[last.end() :]
        if not _EMPTY_CHOICES.search(whole):
            return whole
        kept: list[bytes] = []
        start = 0
        for end in _EVENT_END.finditer(whole):
            event = whole[start : end.end()]
            if _usage_only(event):
                self.dropped += 1
            else:
                kept.append(event)
            start = end.end()
        return b"".join(kept)

    def flush(self) -> bytes:
        held, self.held = self.held, b""
        return held
