"""Request bodies read strictly, or refused (SPEC §19).

The model the gateway checks (scope §12, prices §18) must be the model the upstream will read.
A lenient peek that gives up on a body it cannot read ("names no model") lets a worker walk
around its lease, so a body on a path that names a model is read by a strict RFC 8259 parser or
refused 400 `invalid-request-body`:
- exactly one JSON object, UTF-8 without a BOM, no `NaN`/`Infinity`, no trailing data, no
  unpaired surrogate escapes (msgspec refuses all of these, also in members it skips);
- no top-level `model`, `stream` or `stream_options` member twice, nor `include_usage` twice
  in `stream_options` (msgspec, like most parsers, keeps the last one silently; another parser
  may keep the first), and `model` a string.

Duplicates are found without a second parse in the common case: a key spelled `"model"` twice
must occur twice as those seven bytes, unless it is written with `\\u00XX` escapes of ASCII
letters (which no encoder emits). Only a body that fails this cheap test is parsed a second
time, by Python's `json` with a hook that sees every object's members in order.

`decode_body` inflates a `content-encoding` of gzip or zlib deflate incrementally (at most
`STEP_OUT` bytes per step) in one of `INFLATERS` worker threads, off the event loop, and never
past the body limit (413 `body-too-large`, the decoding stopped there). Any other coding is 415.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import msgspec

from shared.codes import Refusal

# Each inflation step produces at most this much and reads at most `STEP_IN` of input.
STEP_OUT = 256 * 1024
STEP_IN = 64 * 1024
# How many request bodies inflate at once (worker threads; the others queue).
INFLATERS = 1
# A body at least this large is checked off the event loop (in a worker thread).
OFF_LOOP_BYTES = 1024 * 1024
# UTF-8 is validated in pieces of this size (a thread lets the loop run between pieces).
UTF8_PIECE = 1024 * 1024
# The members whose duplicates matter: what the gateway and the upstream both read.
WATCHED = ("model", "stream", "stream_options")
_ESCAPED_ASCII = (b"\\u005", b"\\u006", b"\\u007")
_GZIP = frozenset({"gzip", "x-gzip"})
_inflaters = ThreadPoolExecutor(max_workers=INFLATERS, thread_name_prefix="inflate")


class BodyRefused(Exception):
    """A body the gateway cannot read strictly; `code` says how it is answered."""

    def __init__(self, code: Refusal, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class BodyPeek(NamedTuple):
    model: str | None          # the top-level `model` (None: the body names none)
    stream: bool               # `"stream": true`
    include_usage: bool        # `stream_options.include_usage` is true
    stream_options: bool       # a top-level `stream_options` member is present


class _Options(msgspec.Struct):
    include_usage: Any = None


class _Peek(msgspec.Struct):
    model: Any = msgspec.UNSET
    stream: Any = None
    stream_options: Any = msgspec.UNSET


_decode = msgspec.json.Decoder(_Peek).decode


def _invalid(message: str) -> BodyRefused:
    return BodyRefused(Refusal.INVALID_REQUEST_BODY, message)


def _check_utf8(body: bytes) -> None:
    if body.isascii():
        return
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    try:
        for start in range(0, len(body), UTF8_PIECE):
            decoder.decode(body[start:start + UTF8_PIECE])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise _invalid("the request body is not valid UTF-8") from None


def _may_repeat(body: bytes) -> bool:
    """False when no watched member can occur twice (the cheap test, see the module doc)."""
    if any(escaped in body for escaped in _ESCAPED_ASCII):
        return True
    return (body.count(b'"model"') > 1 or body.count(b'"stream') > 1
            or body.count(b'"include_usage"') > 1)


class _Members(dict):  # type: ignore[type-arg]
    """An object as Python's json read it, with the keys it held more than once."""

    repeated: frozenset[str] = frozenset()


def _members(pairs: list[tuple[str, Any]]) -> _Members:
    obj = _Members(pairs)
    if len(obj) != len(pairs):
        keys = [key for key, _ in pairs]
        obj.repeated = frozenset(key for key in obj if keys.count(key) > 1)
    return obj


def _check_repeats(body: bytes) -> None:
    """The slow path: Python's json, with a hook that sees each object's members in order."""
    top = json.loads(body, object_pairs_hook=_members, parse_int=lambda _: 0,
                     parse_float=lambda _: 0.0)
    repeated = top.repeated & set(WATCHED)
    if repeated:
        raise _invalid(f"the request body has more than one top-level {sorted(repeated)[0]!r}")
    options = top.get("stream_options")
    if isinstance(options, _Members) and "include_usage" in options.repeated:
        raise _invalid("the request body has more than one stream_options.include_usage")


def strict_peek(body: bytes) -> BodyPeek:
    """What the upstream will read from `body`, or BodyRefused(invalid-request-body)."""
    _check_utf8(body)
    try:
        peek = _decode(body)
    except msgspec.ValidationError:
        raise _invalid("the request body is not a JSON object") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _invalid(f"the request body is not strict JSON ({str(exc)[:96]})") from None
    if _may_repeat(body):
        _check_repeats(body)
    model = peek.model
    if model is msgspec.UNSET:
        model = None
    elif not isinstance(model, str):
        raise _invalid("the request body's model is not a string")
    options = peek.stream_options
    include = isinstance(options, dict) and options.get("include_usage") is True
    return BodyPeek(model, peek.stream is True, include, options is not msgspec.UNSET)


def strict_model(body: bytes) -> str | None:
    """The model a strict RFC 8259 parser reads from `body` (exactly one JSON object), None if
    it names none; BodyRefused(invalid-request-body) for anything else (SPEC §19)."""
    return strict_peek(body).model


async def peek_body(body: bytes) -> BodyPeek:
    """`strict_peek`, off the event loop for a large body."""
    if len(body) < OFF_LOOP_BYTES:
        return strict_peek(body)
    return await asyncio.to_thread(strict_peek, body)


def coding_of(values: list[str]) -> str:
    """The one content-coding a request names ("" for identity); 415 for any other, or a list."""
    coding = ",".join(values).strip().lower()
    if coding in ("", "identity") or coding in _GZIP or coding == "deflate":
        return "" if coding == "identity" else coding
    raise BodyRefused(Refusal.UNSUPPORTED_CONTENT_ENCODING,
                      f"content-encoding {coding[:64]!r} is not decoded by the gateway "
                      f"(identity, gzip or deflate)")


async def decode_body(body: bytes, coding: str, limit: int) -> bytes:
    """`body` decoded from `coding` (as `coding_of` returns it), at most `limit` bytes.

    Off the event loop: zlib releases the GIL while it inflates, so the loop (`/healthz`, other
    workers' streams) keeps its latency while bombs arrive; at most `INFLATERS` bodies inflate
    at once, the others wait their turn without holding anything but their (bounded) body.
    """
    if not coding:
        return body
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_inflaters, _inflate, body, coding, limit)


def _inflate(body: bytes, coding: str, limit: int) -> bytes:
    """Inflate step by step: each step reads at most `STEP_IN` and writes at most `STEP_OUT`, so
    the limit stops a bomb at `limit` bytes. A gzip body may hold several members (RFC 1952)."""
    wbits = 16 + zlib.MAX_WBITS if coding in _GZIP else zlib.MAX_WBITS
    out: list[bytes] = []
    size = 0
    data = memoryview(body)
    while True:
        inflate = zlib.decompressobj(wbits)
        pos = 0
        pending = b""
        while True:
            if not pending and pos < len(data):
                pending = bytes(data[pos:pos + STEP_IN])
                pos += len(pending)
            try:
                piece = inflate.decompress(pending, STEP_OUT)
            except zlib.error:
                raise _invalid(f"the request body is not valid {coding}") from None
            pending = inflate.unconsumed_tail
            size += len(piece)
            if size > limit:
                raise BodyRefused(Refusal.BODY_TOO_LARGE, f"the decoded body exceeds {limit} bytes")
            out.append(piece)
            if inflate.eof or (not pending and pos >= len(data) and len(piece) < STEP_OUT):
                break
        if not inflate.eof:
            raise _invalid(f"the request body is a truncated {coding} stream")
        rest = inflate.unused_data + bytes(data[pos:])
        if not rest:
            return b"".join(out)
        if wbits == zlib.MAX_WBITS:
            raise _invalid("the request body has data after its deflate stream")
        data = memoryview(rest)
