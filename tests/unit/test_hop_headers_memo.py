"""The hop's header rules (issue 27: the per-name memo upstream, multidict's case-insensitive
`keys() &` downstream) drop exactly what the plain rule drops (`name.lower() in drop`), whatever
the names' case and repeats, on both directions; a `Connection` header naming more takes the
plain path; the memo of peer-chosen names is bounded."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from dataplane import upstreams
from dataplane.upstreams import (
    DROP_DOWNSTREAM,
    DROP_UPSTREAM,
    KEEP_MEMO_MAX,
    downstream_headers,
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


def downstream_pairs(upstream: CIMultiDictProxy[str]) -> list[tuple[str, str]]:
    return list(downstream_headers(upstream).items())


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
        upstream_headers(_headers([(f"X-Peer-{n}", "1")]), "x-api-key", "sk-ant-test-credential")
    assert len(upstreams._KEEP_UPSTREAM) <= KEEP_MEMO_MAX


_SPELLINGS = st.sampled_from(NAMES).flatmap(
    lambda name: st.sampled_from([name, name.lower(), name.upper(), name.title(), name.swapcase()])
)
_CONNECTION = st.lists(st.sampled_from([*NAMES, "keep-alive", "close", " x-custom "]), max_size=3).map(", ".join)


@given(st.lists(st.tuples(_SPELLINGS, st.sampled_from(["1", "2", ""])), max_size=12), st.none() | _CONNECTION)
def test_downstream_drops_what_the_plain_rule_drops_for_any_spelling_and_repeats(
    pairs: list[tuple[str, str]], connection: str | None
) -> None:
    if connection is not None:
        pairs = [*pairs, ("Connection", connection)]
    drop = set(DROP_DOWNSTREAM)
    for value in (v for k, v in pairs if k.lower() == "connection"):
        drop.update(token.strip().lower() for token in value.split(",") if token.strip())
    assert downstream_pairs(_headers(pairs)) == [(k, v) for k, v in pairs if k.lower() not in drop]
