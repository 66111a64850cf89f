"""`dataplane.usage_ask` by table: the body splice and the usage-only chunk's removal (pure)."""

from __future__ import annotations

import json
import random
import re

import pytest

from dataplane.bodies import BodyPeek, BodyRefused, strict_peek
from dataplane.usage_ask import _TOKEN, UsageStrip, asks_usage, with_usage
from tests.hostile.test_usage_asked import EVENTS, UPSTREAM, WITHOUT_USAGE_CHUNK


@pytest.mark.parametrize(
    "body,expect",
    [
        ('{"model":"m","stream":true}', '{"stream_options":{"include_usage":true},"model":"m","stream":true}'),
        (' {"stream":true}', ' {"stream_options":{"include_usage":true},"stream":true}'),
        ('{"stream":true,"stream_options":null}', '{"stream":true,"stream_options":{"include_usage":true}}'),
        (
            '{"stream_options":{"a":[1,{"b":"}"}]},"stream":true}',
            '{"stream_options":{"a":[1,{"b":"}"}],"include_usage":true},"stream":true}',
        ),
        (
            '{"x":{"stream_options":{}},"stream":true,"stream_options" : {} }',
            '{"x":{"stream_options":{}},"stream":true,"stream_options" : {"include_usage":true} }',
        ),
        (
            '{"x":"\\"stream_options\\":{}","stream_opti\\u006fns":{},"stream":true}',
            '{"x":"\\"stream_options\\":{}","stream_opti\\u006fns":{"include_usage":true},"stream":true}',
        ),
        # every other byte of stream_options as sent: no re-encoding (1e999 once became Infinity)
        (
            '{"stream":true,"stream_options":{"include_usage":false,"x":1e999}}',
            '{"stream":true,"stream_options":{"include_usage":true,"x":1e999}}',
        ),
        (
            '{"stream":true,"stream_options":{"note":"caf\\u00e9","n":1E2}}',
            '{"stream":true,"stream_options":{"note":"caf\\u00e9","n":1E2,"include_usage":true}}',
        ),
        (
            '{"stream":true,"stream_options":{ "include_usage" : null , "n" : 2 }}',
            '{"stream":true,"stream_options":{ "include_usage" : true , "n" : 2 }}',
        ),
        (
            '{"stream":true,"stream_options":{"n":{"include_usage":false},"include_usage":false}}',
            '{"stream":true,"stream_options":{"n":{"include_usage":false},"include_usage":true}}',
        ),
        (
            '{"stream":true,"stream_options":{"include\\u005fusage":false}}',
            '{"stream":true,"stream_options":{"include\\u005fusage":true}}',
        ),
        ('{"stream":true,"stream_options":{ }}', '{"stream":true,"stream_options":{ "include_usage":true}}'),
        ('{"stream":true,"stream_options":{"a":1 }}', '{"stream":true,"stream_options":{"a":1 ,"include_usage":true}}'),
    ],
)
def test_with_usage(body: str, expect: str) -> None:
    peek = strict_peek(body.encode())
    assert asks_usage("/v1/chat/completions", peek)
    asked = with_usage(body.encode(), peek)
    assert asked is not None and asked.decode() == expect
    assert strict_peek(asked).include_usage
    assert {k: v for k, v in json.loads(asked).items() if k != "stream_options"} == {
        k: v for k, v in json.loads(body).items() if k != "stream_options"
    }


def test_a_stream_options_that_is_not_an_object_is_refused_or_left_alone() -> None:
    body = b'{"stream":true,"stream_options":"yes"}'
    with pytest.raises(BodyRefused):
        strict_peek(body)
    assert with_usage(body, BodyPeek(None, True, False, True)) is None


@pytest.mark.parametrize(
    "path,body,asks",
    [
        ("/v1/chat/completions", b'{"stream":true,"stream_options":{"include_usage":true}}', False),
        ("/v1/chat/completions", b'{"stream":false}', False),
        ("/v1/responses", b'{"stream":true}', False),
        ("/v1/chat/completions", b'{"stream":true,"stream_options":{"include_usage":1}}', True),
    ],
)
def test_asks_usage(path: str, body: bytes, asks: bool) -> None:
    assert asks_usage(path, strict_peek(body)) is asks


@pytest.mark.parametrize("size", [1, 2, 7, 64, 1 << 20])
def test_the_usage_chunk_is_removed_however_the_stream_is_cut(size: int) -> None:
    strip = UsageStrip()
    raw = UPSTREAM.encode()
    out = b"".join(strip.feed(raw[i : i + size]) for i in range(0, len(raw), size)) + strip.flush()
    assert out.decode() == WITHOUT_USAGE_CHUNK and strip.dropped == 1


def test_crlf_events_and_a_usage_chunk_with_choices_pass() -> None:
    strip = UsageStrip()
    kept = EVENTS[1].replace("\n", "\r\n")
    assert strip.feed(kept.encode()) == kept.encode()
    other = 'data: {"choices":[{"index":0}],"usage":{"prompt_tokens":1}}\n\n'
    assert strip.feed(other.encode()) == other.encode() and strip.dropped == 0
    assert strip.feed(EVENTS[2].replace("\n", "\r\n").encode()) == b"" and strip.dropped == 1


def test_a_partial_event_is_held_only_up_to_its_end() -> None:
    strip = UsageStrip()
    assert strip.feed(b'data: {"choices":[') == b""
    assert strip.feed(b"{}]}\n\ndata: x") == b'data: {"choices":[{}]}\n\n'
    assert strip.flush() == b"data: x"


def test_the_top_level_scan_tokenises_as_the_plain_pattern() -> None:
    """`_TOKEN`'s unrolled string loop (fast on long strings) finds the tokens the plain one does."""
    plain = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\],:]', re.S)
    rnd = random.Random(21)
    for _ in range(3000):
        text = bytes(rnd.choice(b'ab"\\{}[],: \n\xc3') for _ in range(rnd.randrange(48)))
        assert [(m.span(), m.group()) for m in _TOKEN.finditer(text)] == [
            (m.span(), m.group()) for m in plain.finditer(text)
        ], text
