"""`dataplane.bodies`: the strict reader, table by table, and one property (SPEC §19).

The property: the model the gateway checks is the model a strict JSON parser reads, or the body
is refused. The reference parser is Python's `json`, made strict (no BOM, no constants, no
repeated top-level member, no unpaired surrogate in any string, a string `model`).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataplane.bodies import (
    STEP_OUT,
    BodyRefused,
    coding_of,
    decode_body,
    peek_body,
    strict_model,
    strict_peek,
)
from shared.codes import Refusal

INVALID = Refusal.INVALID_REQUEST_BODY


class Refused(NamedTuple):
    body: bytes
    why: str


REFUSED = [
    Refused(b'\xef\xbb\xbf{"model":"claude-opus-4-1"}', "a UTF-8 BOM"),
    Refused(b'{"model":"claude-opus-4-1","x":NaN}', "NaN"),
    Refused(b'{"model":"claude-opus-4-1","x":Infinity}', "Infinity"),
    Refused(b'{"model":"claude-opus-4-1","x":-Infinity}', "-Infinity"),
    Refused(b'{"model":"claude-opus-4-1"} {"model":"claude-haiku-4-5"}', "trailing data"),
    Refused(b'{"model":"claude-opus-4-1"}x', "trailing garbage"),
    Refused(b'{"x":"\\ud800","model":"claude-opus-4-1"}', "an unpaired high surrogate"),
    Refused(b'{"x":"\\udc00","model":"claude-opus-4-1"}', "an unpaired low surrogate"),
    Refused(b'{"model":"claude-opus-4-1\\ud800"}', "an unpaired surrogate in model"),
    Refused(b'{"model":"claude-haiku-4-5","model":"claude-opus-4-1"}', "model twice"),
    Refused(b'{"model":"claude-haiku-4-5","mod\\u0065l":"claude-opus-4-1"}', "model twice, escaped"),
    Refused(b'{"\\u006d\\u006f\\u0064\\u0065\\u006c":"a","model":"b"}', "model twice, all escaped"),
    Refused(b'{"model":"a","stream":false,"stream":true}', "stream twice"),
    Refused(b'{"model":"a","stream_options":{},"stream_options":{}}', "stream_options twice"),
    Refused(b'{"model":"a","stream_options":{"include_usage":true,"include_usage":false}}', "include_usage twice"),
    Refused(b'{"model":null}', "a null model"),
    Refused(b'{"model":["claude-opus-4-1"]}', "a list model"),
    Refused(b'{"model":{"id":"claude-opus-4-1"}}', "an object model"),
    Refused(b'{"model":7}', "a number model"),
    Refused(b'[{"model":"claude-opus-4-1"}]', "an array"),
    Refused(b'"claude-opus-4-1"', "a string"),
    Refused(b"null", "null"),
    Refused(b"", "nothing"),
    Refused(b"   ", "whitespace"),
    Refused(b"{'model':'claude-opus-4-1'}", "single quotes"),
    Refused(b'{"model":"claude-opus-4-1",}', "a trailing comma"),
    Refused(b'{"model":"a","x":01}', "a leading zero"),
    Refused(b'{"model":"a","x":+1}', "a plus sign"),
    Refused(b'{"model":"a\x01"}', "a raw control character"),
    Refused(b'{"model":"a","x":"\xff"}', "invalid UTF-8 in a skipped member"),
    Refused(b'{"model":"a","x":"\xc0\xaf"}', "overlong UTF-8"),
    Refused(b'{"model":"a","x":"\xed\xa0\x80"}', "a UTF-8-encoded surrogate"),
    Refused(b'{"model":"\xff"}', "invalid UTF-8 in model"),
    Refused(b'{"model":"a","x":' + b"[" * 5000 + b"]" * 5000 + b"}", "nesting 5000 deep"),
    Refused(b'{"model":"a","x":\x00}', "a NUL"),
    Refused(b'\xff\xfe{\x00"\x00m\x00', "UTF-16"),
    Refused(b'{"model":"a"', "truncated"),
    Refused(b'{"model":"a","x":"\\q"}', "a bad escape"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c.why for c in REFUSED])
def test_refused(case: Refused) -> None:
    with pytest.raises(BodyRefused) as caught:
        strict_model(case.body)
    assert caught.value.code == INVALID


class Read(NamedTuple):
    body: bytes
    model: str | None
    why: str


READ = [
    Read(b'{"model":"claude-haiku-4-5"}', "claude-haiku-4-5", "plain"),
    Read(b' \r\n\t{"model":"m"} \n', "m", "whitespace around"),
    Read(b'{"mod\\u0065l":"m"}', "m", "an escaped key once"),
    Read(b'{"model":"claude-\\u006fpus"}', "claude-opus", "an escaped value"),
    Read(b'{"model":"m","x":"\\ud83d\\ude00"}', "m", "a surrogate pair"),
    Read('{"model":"m","x":"日本語 é"}'.encode(), "m", "UTF-8 text"),
    Read(b'{"model":"m","x":1e999,"y":' + b"9" * 5000 + b"}", "m", "huge numbers"),
    Read(b'{"x":{"model":"other"},"model":"m"}', "m", "a nested model"),
    Read(b'{"messages":[{"model":"a"},{"model":"b"}]}', None, "nested models, none on top"),
    Read(b'{"x":"\\"model\\":\\"opus\\""}', None, "model inside a string"),
    Read(b"{}", None, "empty object"),
    Read(b'{"model":"m","x":' + b"[" * 200 + b"]" * 200 + b"}", "m", "nesting 200 deep"),
]


@pytest.mark.parametrize("case", READ, ids=[c.why for c in READ])
def test_read(case: Read) -> None:
    assert strict_model(case.body) == case.model


def test_peek_reads_stream_and_usage_options() -> None:
    peek = strict_peek(b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}')
    assert (peek.stream, peek.include_usage, peek.stream_options) == (True, True, True)
    peek = strict_peek(b'{"model":"m","stream":"true"}')
    assert (peek.stream, peek.include_usage, peek.stream_options) == (False, False, False)


def test_a_large_body_is_read_off_the_loop() -> None:
    body = json.dumps({"model": "m", "x": "é" * 1_000_000}).encode()
    assert asyncio.run(peek_body(body)).model == "m"
    with pytest.raises(BodyRefused):
        asyncio.run(peek_body(body[:-1] + b"\xff}"))


# ---- content codings ----------------------------------------------------------------------


def _decode(body: bytes, coding: str, limit: int = 1 << 20) -> bytes:
    return asyncio.run(decode_body(body, coding_of([coding]), limit))


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "gzip, gzip", "gzip, br", "x-foo", "*"])
def test_an_unknown_coding_is_415(coding: str) -> None:
    with pytest.raises(BodyRefused) as caught:
        coding_of([coding])
    assert caught.value.code == Refusal.UNSUPPORTED_CONTENT_ENCODING


def test_two_content_encoding_lines_are_a_list() -> None:
    with pytest.raises(BodyRefused):
        coding_of(["gzip", "gzip"])


@pytest.mark.parametrize(
    "coding,encode",
    [
        ("", lambda b: b),
        ("identity", lambda b: b),
        ("GZIP", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),
    ],
)
def test_codings_decode(coding: str, encode: Any) -> None:
    body = b'{"model":"m"}'
    assert _decode(encode(body), coding) == body


def test_gzip_members_concatenate() -> None:
    assert _decode(gzip.compress(b'{"model":') + gzip.compress(b'"m"}'), "gzip") == b'{"model":"m"}'


@pytest.mark.parametrize(
    "body,coding",
    [
        (b"not gzip", "gzip"),
        (gzip.compress(b'{"model":"m"}')[:-6], "gzip"),
        (gzip.compress(b'{"model":"m"}') + b"junk", "gzip"),
        (b"", "gzip"),
        (zlib.compress(b'{"model":"m"}') + b"x", "deflate"),
        (zlib.compressobj(wbits=-15).compress(b'{"model":"m"}'), "deflate"),
    ],
)
def test_corrupt_codings_are_400(body: bytes, coding: str) -> None:
    with pytest.raises(BodyRefused) as caught:
        _decode(body, coding)
    assert caught.value.code == INVALID


def test_double_gzip_decodes_once_and_is_then_not_json() -> None:
    twice = gzip.compress(gzip.compress(b'{"model":"claude-opus-4-1"}'))
    with pytest.raises(BodyRefused) as caught:
        strict_model(_decode(twice, "gzip"))
    assert caught.value.code == INVALID


def test_a_bomb_stops_at_the_limit() -> None:
    bomb = gzip.compress(b" " * (64 << 20), 9)
    limit = 4 * STEP_OUT + 1
    with pytest.raises(BodyRefused) as caught:
        _decode(bomb, "gzip", limit)
    assert caught.value.code == Refusal.BODY_TOO_LARGE


def test_a_body_of_exactly_the_limit_decodes() -> None:
    body = b'{"model":"m","x":"' + b"a" * (3 * STEP_OUT) + b'"}'
    assert _decode(gzip.compress(body), "gzip", len(body)) == body


# ---- the property ---------------------------------------------------------------------------


class _Unread(Exception):
    pass


def reference_model(body: bytes) -> str | None:
    """A strict JSON reader: what an upstream reads, or _Unread."""
    if body.startswith(b"\xef\xbb\xbf"):
        raise _Unread
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise _Unread from None

    def constant(_: str) -> Any:
        raise _Unread

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        for _, value in items:
            if isinstance(value, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in value):
                raise _Unread
        for key, _ in items:
            if any(0xD800 <= ord(c) <= 0xDFFF for c in key):
                raise _Unread
        return {"__pairs__": items}

    try:
        top = json.loads(text, object_pairs_hook=pairs, parse_constant=constant, parse_int=lambda _: 0)
    except (ValueError, RecursionError):
        raise _Unread from None
    if not isinstance(top, dict):
        raise _Unread
    models = [value for key, value in top["__pairs__"] if key == "model"]
    if len(models) > 1:
        raise _Unread
    if not models:
        return None
    if not isinstance(models[0], str):
        raise _Unread
    return models[0]


_models = st.sampled_from(["claude-haiku-4-5", "claude-opus-4-1", "gpt-4o", ""])
_keys = st.sampled_from(["model", "mod\\u0065l", "x", "stream", "messages", "\\u006dodel"])
_scalars = st.one_of(
    _models.map(json.dumps),
    st.sampled_from(
        ["NaN", "Infinity", "1e999", "null", "true", "-0", '"\\ud800"', '"\\udc00x"', '"\\ud83d\\ude00"', "7"]
    ),
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    members = draw(st.lists(st.tuples(_keys, st.one_of(_scalars, _scalars.map(lambda s: "[" + s + "]"))), max_size=5))
    text = "{" + ",".join(f'"{k}":{v}' for k, v in members) + "}"
    prefix = draw(st.sampled_from(["", " ", "\ufeff", "[", "\n"]))
    suffix = draw(st.sampled_from(["", " ", "x", "{}", "]", "\n"]))
    raw = (prefix + text + suffix).encode("utf-8")
    cut = draw(st.integers(min_value=0, max_value=3))
    if cut == 3 and raw:  # now and then a byte flipped or dropped
        at = draw(st.integers(min_value=0, max_value=len(raw) - 1))
        raw = raw[:at] + draw(st.sampled_from([b"", b"\xff", b'"', b"\\"])) + raw[at + 1 :]
    return raw


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies())
def test_the_model_checked_is_the_model_a_strict_parser_reads(body: bytes) -> None:
    try:
        checked = strict_model(body)
    except BodyRefused as refused:
        assert refused.code == INVALID
        return
    assert checked == reference_model(body)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies(), st.sampled_from(["", "identity", "gzip", "deflate", "gzip-twice", "br"]))
def test_through_its_coding_too(body: bytes, coding: str) -> None:
    """The same invariant for the body as sent: decoded from its coding first, as the gateway does."""
    sent = {
        "gzip": gzip.compress,
        "deflate": zlib.compress,
        "gzip-twice": lambda b: gzip.compress(gzip.compress(b)),
    }.get(coding, lambda b: b)(body)
    header = "gzip" if coding == "gzip-twice" else coding
    try:
        checked = strict_model(asyncio.run(decode_body(sent, coding_of([header]), 1 << 20)))
    except BodyRefused:
        return
    assert checked == reference_model(body)
