"""The hop's header rules with the per-name memo (issue 27) drop exactly what the plain rule
drops (`name.lower() in drop`), whatever the names' case, on both directions; a `Connection`
header naming more takes the plain path; the memo of peer-chosen names is bounded."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

from dataplane import upstreams
from dataplane.upstreams import (
    DROP_DOWNSTREAM,
    DROP_UPSTREAM,
    KEEP_MEMO_MAX,
    downstream_pairs,
    upstream_headers,
)

NAMES = [
    "Content-Type",
    "content-type",
    "Host",
    "HOST",
    "X-Api-Key",
    "Authorization",
    "Keep-Alive",
    "TE",
    "Transfer-Encoding",
    "Content-Length",
    "Upgrade",
    "OpenAI-Organization",
    "anthropic-version",
    "Anthropic-Ratelimit-Tokens-Remaining",
    "X-Custom",
]


def _headers(pairs: list[tuple[str, str]]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


def test_both_directions_drop_what_the_plain_rule_drops() -> None:
    pairs = [(name, f"v{n}") for n, name in enumerate(NAMES)]
    for _ in range(2):  # the second round answers from the memo
        down = downstream_pairs(_headers(pairs))
        assert down == [(k, v) for k, v in pairs if k.lower() not in DROP_DOWNSTREAM]
        up = upstream_headers(_headers(pairs), "x-api-key", "sk-ant-test-credential")
        kept = [(k, v) for k, v in pairs if k.lower() not in DROP_UPSTREAM]
        assert list(up.items()) == [*kept, ("x-api-key", "sk-ant-test-credential")]


def test_a_connection_header_naming_more_drops_those_too() -> None:
    pairs = [("Connection", "keep-alive, X-Custom"), ("X-Custom", "1"), ("X-Other", "2")]
    assert downstream_pairs(_headers(pairs)) == [("X-Other", "2")]
    up = upstream_headers(_headers(pairs), "bearer", "sk-test-credential")
    assert list(up.items()) == [("X-Other", "2"), ("Authorization", "Bearer sk-test-credential")]
    assert downstream_pairs(_headers([("X-Custom", "1")])) == [("X-Custom", "1")]  # not remembered as dropped


def test_the_memo_is_bounded() -> None:
    for n in range(KEEP_MEMO_MAX + 10):
        downstream_pairs(_headers([(f"X-Peer-{n}", "1")]))
    assert len(upstreams._KEEP_DOWNSTREAM) <= KEEP_MEMO_MAX
