"""The upstream request head's serializer (`upstream_client.serialize_head`) by table against
aiohttp's own (`_serialize_headers`, the oracle): the same bytes for every line it accepts, the
same `ValueError` for every line it refuses."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict, istr

from dataplane.aiohttp_private import serialize_headers
from dataplane.upstream_client import serialize_head

ACCEPTED = [
    ("POST /v1/messages?beta=true HTTP/1.1", [("Host", "127.0.0.1:9"), ("x-api-key", "sk-ant-x")]),
    ("GET / HTTP/1.1", []),
    ("GET / HTTP/1.1", [("x-empty", "")]),
    ("GET / HTTP/1.1", [("x-tab", "a\tb"), ("x-space", " padded ")]),
    ("GET / HTTP/1.1", [("x-utf8", "caf\u00e9 \u2603 \U0001f600")]),
    ("GET / HTTP/1.1", [("x-surrogate", "a\udcffb"), ("x-pair", "\ud83d\ude00")]),  # surrogateescape'd
    ("GET / HTTP/1.1", [(istr("X-Istr"), "v"), ("x-dup", "1"), ("x-dup", "2")]),
    ("GET / HTTP/1.1", [("x-latin", "\u00ff\u0100\u07ff\u0800\uffff")]),
]
REFUSED = [
    ("GET / HTTP/1.1", [("x-a", "a\r\nx-injected: 1")]),
    ("GET / HTTP/1.1", [("x-a", "a\nb")]),
    ("GET / HTTP/1.1", [("x-a", "a\rb")]),
    ("GET / HTTP/1.1", [("x-a\r\n", "b")]),
    ("GET / HTTP/1.1", [("x-a", "a\x00b")]),
    ("GET / HTTP/1.1", [("x-a", "a\x7fb")]),
    ("GET / HTTP/1.1", [("x-a", "a\x1bb")]),
    ("GET / HTTP/1.1", [("x-a", "\x0b")]),
    ("GET /\r\n HTTP/1.1", [("x-a", "b")]),
    ("GET /\x00 HTTP/1.1", []),
]


@pytest.mark.parametrize("line,pairs", ACCEPTED)
def test_the_head_is_aiohttps_byte_for_byte(line: str, pairs: list[tuple[str, str]]) -> None:
    assert serialize_head(line, pairs) == serialize_headers(line, CIMultiDict(pairs))


@pytest.mark.parametrize("line,pairs", REFUSED)
def test_a_control_character_is_refused_as_aiohttp_refuses_it(line: str, pairs: list[tuple[str, str]]) -> None:
    with pytest.raises(ValueError):
        serialize_headers(line, CIMultiDict(pairs))
    with pytest.raises(ValueError, match="Forbidden control character"):
        serialize_head(line, pairs)
