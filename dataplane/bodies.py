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

Duplicates are found in the one parse: each watched member is a type msgspec hands to a hook
(`_once`), which sees every occurrence, escaped spellings of the key included. `stream_options`
is a Struct (object or null, else refused), so a second one is found another way: only a body
whose bytes may hold it twice (`"stream_options"` twice, or `\\u00XX` escapes of ASCII letters,
which no encoder emits) is parsed a second time, by Python's `json` with a hook that sees every
object's members in order.

`decode_body` inflates a `content-encoding` of gzip or zlib deflate incrementally (at most
`STEP_OUT` bytes per step) in one of `INFLATERS` worker threads, off the event loop, and never
past the body limit (413 `body-too-large`, the decoding stopped there). Any other coding is 415.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import threading
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
    model: str | None  # the top-level `model` (None: the body names none)
    stream: bool  # `"stream": true`
    include_usage: bool  # `stream_options.include_usage` is true
    stream_options: bool  # a top-level `stream_options` member is present


class _Member:
    """A watched member's value, as the decoder read it; `_seen` counts it (see `_once`)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _Model(_Member):
    __slots__ = ()


class _Stream(_Member):
    __slots__ = ()


class _Usage(_Member):
    __slots__ = ()


class _Options(msgspec.Struct):
    include_usage: _Usage | msgspec.UnsetType = msgspec.UNSET


class _Peek(msgspec.Struct):
    model: _Model | msgspec.UnsetType = msgspec.UNSET
    stream: _Stream | msgspec.UnsetType = msgspec.UNSET
    stream_options: _Options | None | msgspec.UnsetType = msgspec.UNSET


_seen = threading.local()  # the watched members one decode has met (a decode runs in one thread)


def _once(kind: Any, value: Any) -> Any:
    """msgspec's hook for each watched member it meets: a second one is a repeated member."""
    seen: set[Any] = _seen.kinds
    if kind in seen:
        raise _invalid(f"the request body has more than one {_NAMES[kind]}")
    seen.add(kind)
    return kind(value)


_NAMES = {_Model: "top-level 'model'", _Stream: "top-level 'stream'", _Usage: "stream_options.include_usage"}
_decode = msgspec.json.Decoder(_Peek, dec_hook=_once).decode


def _invalid(message: str) -> BodyRefused:
    return BodyRefused(Refusal.INVALID_REQUEST_BODY, message)


def _check_utf8(body: bytes) -> None:
    if body.isascii():
        return
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    try:
        for start in range(0, len(body), UTF8_PIECE):
            decoder.decode(body[start : start + UTF8_PIECE])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise _invalid("the request body is not valid UTF-8") from None


def _repeats_options(body: bytes) -> bool:
    """Is `stream_options` a top-level member twice? (msgspec keeps the last Struct silently;
    the cheap test: the key's bytes occur twice, or it may be written with escapes)"""
    return body.count(b'"stream_options"') > 1 or any(e in body for e in _ESCAPED_ASCII)


class _Members(dict[str, Any]):
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
    top = json.loads(body, object_pairs_hook=_members, parse_int=lambda _: 0, parse_float=lambda _: 0.0)
    if "stream_options" in top.repeated:
        raise _invalid("the request body has more than one top-level 'stream_options'")


def strict_peek(body: bytes) -> BodyPeek:
    """What the upstream will read from `body`, or BodyRefused(invalid-request-body)."""
    _check_utf8(body)
    _seen.kinds = set()
    try:
        peek = _decode(body)
    except msgspec.ValidationError as exc:
        raise _invalid(
            f"the request body is not a JSON object with an object or null stream_options ({str(exc)[:96]})"
        ) from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _invalid(f"the request body is not strict JSON ({str(exc)[:96]})") from None
    options = peek.stream_options
    if options is not msgspec.UNSET and _repeats_options(body):
        _check_repeats(body)
    model = None
    if peek.model is not msgspec.UNSET:
        model = peek.model.value
        if not isinstance(model, str):
            raise _invalid("the request body's model is not a string")
    stream = peek.stream is not msgspec.UNSET and peek.stream.value is True
    include = (
        isinstance(options, _Options)
        and options.include_usage is not msgspec.UNSET
        and options.include_usage.value is True
    )
    return BodyPeek(model, stream, include, options is not msgspec.UNSET)


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
    raise BodyRefused(
        Refusal.UNSUPPORTED_CONTENT_ENCODING,
        f"content-encoding {coding[:64]!r} is not decoded by the gateway (identity, gzip or deflate)",
    )


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
                pending = bytes(data[pos : pos + STEP_IN])
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
