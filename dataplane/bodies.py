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

`peek_body` reads a body of at least `OFF_LOOP_BYTES` in a reader process (`dataplane.readers`):
msgspec, the UTF-8 check and the repeat checks hold the GIL, so a thread would stall the event
loop as long as the loop itself (~19 ms per MiB of a worst-shaped body). Below it, the worst
case is ~2.5 ms and the body is read in place, with no coroutine between. A reader lost mid-read
is answered 500 `internal-error` (the body was not read: never waved through).
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

from dataplane.readers import ReaderLost, Readers
from shared.codes import Refusal

# Each inflation step produces at most this much and reads at most `STEP_IN` of input.
STEP_OUT = 256 * 1024
STEP_IN = 64 * 1024
FIRST_IN = 64  # a member's first read (see `_inflate`)
# How many request bodies inflate at once (worker threads; the others queue).
INFLATERS = 1
# A body at least this large is read in a reader process: below it, the worst-shaped body
# (`[0,0,...]`, ~19 ms per MiB on a loaded core) is read in ~2.5 ms (bench/README.md, Stop 30).
OFF_LOOP_BYTES = 128 * 1024
# UTF-8 is validated in pieces of this size (no str of the whole body is made).
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
    value: Any


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
    member = _new(kind)  # no `__init__` frame: built and filled in C
    member.value = value
    return member


_new = object.__new__


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
    if not body.isascii():
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
    if options is not _UNSET and _repeats_options(body):
        _check_repeats(body)
    member = peek.model
    model = None
    if member is not _UNSET:
        model = member.value
        if not isinstance(model, str):
            raise _invalid("the request body's model is not a string")
    stream = peek.stream
    if options is _UNSET:  # the usual body: no stream_options (a tuple built in C, no frame)
        return _tuple_new(BodyPeek, (model, stream is not _UNSET and stream.value is True, False, False))
    include = (
        isinstance(options, _Options) and options.include_usage is not _UNSET and options.include_usage.value is True
    )
    return _tuple_new(BodyPeek, (model, stream is not _UNSET and stream.value is True, include, True))


_UNSET = msgspec.UNSET
_tuple_new = tuple.__new__  # `BodyPeek(...)` runs a Python `__new__`: this builds it in C


def strict_model(body: bytes) -> str | None:
    """The model a strict RFC 8259 parser reads from `body` (exactly one JSON object), None if
    it names none; BodyRefused(invalid-request-body) for anything else (SPEC §19)."""
    return strict_peek(body).model


async def peek_body(body: bytes) -> BodyPeek:
    """`strict_peek`, in a reader process for a body of `OFF_LOOP_BYTES` or more (its parse
    holds no GIL of this process, so the loop keeps its latency whatever the body's shape)."""
    if len(body) < OFF_LOOP_BYTES:
        return strict_peek(body)
    return await peek_off_process(body)


async def peek_off_process(body: bytes) -> BodyPeek:
    """`strict_peek` in a reader process (`dataplane.readers`), whatever the body's size; a
    reader lost on the way is BodyRefused(internal-error): the body was not read."""
    answer = _answer_of(await ask_reader(body))
    if answer.refusal is not None:
        raise BodyRefused(answer.refusal, answer.message)
    return BodyPeek(answer.model, answer.stream, answer.include_usage, answer.stream_options)


class _Answer(msgspec.Struct, array_like=True):
    """A reader process's answer: the peek, or the refusal (`Refusal` member) and its message."""

    refusal: Refusal | None
    message: str
    model: str | None = None
    stream: bool = False
    include_usage: bool = False
    stream_options: bool = False


_encode_answer = msgspec.msgpack.Encoder().encode
_decode_answer = msgspec.msgpack.Decoder(_Answer).decode


def _answer_of(data: bytearray) -> _Answer:
    try:
        return _decode_answer(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise BodyRefused(Refusal.INTERNAL_ERROR, "the gateway could not read the request body") from None


def answer(body: bytes) -> bytes:
    """What a reader process answers for `body` (`strict_peek`, encoded)."""
    try:
        peek = strict_peek(body)
    except BodyRefused as refused:
        return _encode_answer(_Answer(refused.code, refused.message))
    return _encode_answer(_Answer(None, "", *peek))


_readers = Readers("dataplane.bodyreader:serve_reader")


async def ask_reader(body: bytes, kind: int = 0, most: int = 1 << 16) -> bytearray:
    """A reader process's answer to a request of `kind` about `body` (`dataplane.bodyreader`
    names the kinds; 0 is `answer`); a reader lost on the way is BodyRefused(internal-error)."""
    try:
        return await _readers.ask(body, kind, most)
    except ReaderLost as lost:
        raise BodyRefused(Refusal.INTERNAL_ERROR, f"the gateway could not read the request body: {lost}") from None


async def close_readers() -> None:
    """Stop the reader processes (the data plane's shutdown); a later large body starts one."""
    await _readers.closed()


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
    the limit stops a bomb at `limit` bytes. A gzip body may hold several members (RFC 1952):
    each member's first reads are small and double (`FIRST_IN` up to `STEP_IN`), and the input
    is never copied past them, so a body of many tiny members costs time linear in its size."""
    wbits = 16 + zlib.MAX_WBITS if coding in _GZIP else zlib.MAX_WBITS
    out: list[bytes] = []
    size = 0
    data = memoryview(body)
    pos = 0
    while True:
        inflate = zlib.decompressobj(wbits)
        step = FIRST_IN
        pending: bytes | memoryview = b""
        while True:
            if not pending and pos < len(data):
                pending = data[pos : pos + step]
                pos += len(pending)
                step = min(step * 2, STEP_IN)
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
        pos -= len(inflate.unused_data)  # where the next member begins (the tail repeats it)
        if pos >= len(data):
            return b"".join(out)
        if wbits == zlib.MAX_WBITS:
            raise _invalid("the request body has data after its deflate stream")
