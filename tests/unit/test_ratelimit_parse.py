"""The rate-limit header parser by table (SPEC §22): both wires, both reset forms, and hostile
values (negative, huge, garbage), each ignored rather than believed."""

from __future__ import annotations

from typing import NamedTuple

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from dataplane.ratelimits import (
    MAX_COUNT,
    parse_count,
    parse_duration_ms,
    parse_rfc3339_ms,
    rate_limits_of,
    reset_at_ms,
)
from dataplane.wires.table import WIRES
from shared.clock import iso_ms, now_ms
from shared.wire import RateLimit, RateLimits

ARRIVAL = 1_800_000_000_000  # 2027-01-15T08:00:00Z
ARRIVAL_ISO = iso_ms(ARRIVAL)


class Count(NamedTuple):
    text: str | None
    value: int | None


COUNTS = [
    Count("0", 0),
    Count("50", 50),
    Count("4000000", 4_000_000),
    Count("007", 7),
    Count(str(MAX_COUNT), MAX_COUNT),
    Count(str(MAX_COUNT + 1), None),
    Count("9" * 40, None),
    Count("-1", None),
    Count("+5", None),
    Count("1.5", None),
    Count("1e6", None),
    Count("", None),
    Count(" 5", None),
    Count("５", None),
    Count("²", None),
    Count("0x10", None),
    Count("NaN", None),
    Count(None, None),
]


@pytest.mark.parametrize("case", COUNTS, ids=[repr(c.text) for c in COUNTS])
def test_parse_count(case: Count) -> None:
    assert parse_count(case.text) == case.value


DURATIONS = [
    ("6m0s", 360_000.0),
    ("120ms", 120.0),
    ("1s", 1000.0),
    ("0.5s", 500.0),
    ("0", 0.0),
    ("1h2m3s", 3_723_000.0),
    ("3.272s", 3272.0),
    ("17ms", 17.0),
    ("2m30.5s", 150_500.0),
    ("500us", 0.5),
    ("1h", 3_600_000.0),
    ("-1s", None),
    ("", None),
    ("s", None),
    ("1", None),
    ("1x", None),
    ("1.5.3s", None),
    ("1s ", None),
    ("1 s", None),
    ("abc", None),
    ("1s2", None),
    ("9" * 60 + "s", None),
    ("NaNs", None),
    ("infs", None),
    (".5s", None),
    ("٣s", None),  # a non-ASCII digit (a regex's \\d took it)
    ("1.s", None),
    ("1h.5s", None),
    ("1m-1s", None),
    ("1sms", None),
    ("µs", None),
]


@pytest.mark.parametrize("text,ms", DURATIONS, ids=[d[0] or "empty" for d in DURATIONS])
def test_parse_duration(text: str, ms: float | None) -> None:
    assert parse_duration_ms(text) == ms


RFC3339 = [
    ("2027-01-15T08:01:00Z", ARRIVAL + 60_000),
    ("2027-01-15T08:00:00.5Z", ARRIVAL + 500),
    ("2027-01-15T09:00:00+01:00", ARRIVAL),
    ("2027-01-15t08:00:01z", None),
    ("2027-01-15T08:00:00", None),
    ("2027-01-15", None),
    ("yesterday", None),
    ("", None),
    ("2027-13-15T08:00:00Z", None),
    ("9999-12-31T23:59:59Z", 253_402_300_799_000),
    ("2027-01-15T08:00:00Z" + "0" * 40, None),
]


@pytest.mark.parametrize("text,ms", RFC3339, ids=[r[0][:30] or "empty" for r in RFC3339])
def test_parse_rfc3339(text: str, ms: int | None) -> None:
    assert parse_rfc3339_ms(text) == ms


RESETS = [
    ("anthropic", "2027-01-15T08:01:00Z", ARRIVAL + 60_000),
    ("anthropic", "2027-01-15T07:59:00Z", ARRIVAL - 60_000),  # in the past: kept (ignored when judged)
    ("anthropic", "9999-12-31T23:59:59Z", None),  # beyond a week: garbage
    ("anthropic", "1970-01-01T00:00:00Z", None),
    ("anthropic", "6m0s", None),  # the other wire's form
    ("anthropic", "0001-01-01T00:00:00+01:00", None),  # parses, but no datetime holds it as UTC
    ("anthropic", "9999-12-31T23:59:59-01:00", None),
    ("openai", "6m0s", ARRIVAL + 360_000),
    ("openai", "120ms", ARRIVAL + 120),
    ("openai", "0.5s", ARRIVAL + 500),
    ("openai", "200h", None),
    ("openai", "2027-01-15T08:01:00Z", None),
    ("openai", None, None),
]


@pytest.mark.parametrize("wire,text,ms", RESETS, ids=[f"{r[0]}-{r[1]}" for r in RESETS])
def test_reset_at(wire: str, text: str | None, ms: int | None) -> None:
    assert reset_at_ms(text, WIRES[wire].rate_limits.absolute_reset, ARRIVAL) == ms


def headers(pairs: dict[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


ANTHROPIC_FULL = {
    "anthropic-ratelimit-requests-limit": "50",
    "anthropic-ratelimit-requests-remaining": "49",
    "anthropic-ratelimit-requests-reset": "2027-01-15T08:00:01Z",
    "anthropic-ratelimit-tokens-limit": "40000",
    "anthropic-ratelimit-tokens-remaining": "2000",
    "anthropic-ratelimit-tokens-reset": "2027-01-15T08:00:30Z",
    "anthropic-ratelimit-input-tokens-limit": "30000",
    "anthropic-ratelimit-input-tokens-remaining": "1000",
    "anthropic-ratelimit-input-tokens-reset": "2027-01-15T08:00:30Z",
    "Anthropic-RateLimit-Output-Tokens-Limit": "8000",
    "anthropic-ratelimit-output-tokens-remaining": "8000",
    "anthropic-ratelimit-output-tokens-reset": "2027-01-15T08:00:00Z",
    "request-id": "req_1",
    "content-type": "application/json",
}
OPENAI_FULL = {
    "x-ratelimit-limit-requests": "500",
    "x-ratelimit-remaining-requests": "499",
    "x-ratelimit-reset-requests": "120ms",
    "x-ratelimit-limit-tokens": "30000",
    "x-ratelimit-remaining-tokens": "29000",
    "x-ratelimit-reset-tokens": "6m0s",
}


class Headers(NamedTuple):
    name: str
    wire: str
    pairs: dict[str, str]
    expected: RateLimits | None


def at(offset_ms: int) -> str:
    return iso_ms(ARRIVAL + offset_ms)


HEADERS = [
    Headers(
        "anthropic, every kind",
        "anthropic",
        ANTHROPIC_FULL,
        RateLimits(
            observed_at=ARRIVAL_ISO,
            requests=RateLimit(limit=50, remaining=49, reset_at=at(1000)),
            tokens=RateLimit(limit=40000, remaining=2000, reset_at=at(30_000)),
            input_tokens=RateLimit(limit=30000, remaining=1000, reset_at=at(30_000)),
            output_tokens=RateLimit(limit=8000, remaining=8000, reset_at=at(0)),
        ),
    ),
    Headers(
        "openai, both kinds",
        "openai",
        OPENAI_FULL,
        RateLimits(
            observed_at=ARRIVAL_ISO,
            requests=RateLimit(limit=500, remaining=499, reset_at=at(120)),
            tokens=RateLimit(limit=30000, remaining=29000, reset_at=at(360_000)),
        ),
    ),
    Headers("no header at all", "anthropic", {"request-id": "r"}, None),
    Headers("the other wire's headers are not read", "openai", ANTHROPIC_FULL, None),
    Headers("anthropic headers on the openai wire's reader", "anthropic", OPENAI_FULL, None),
    Headers("only a limit: nothing to steer by", "openai", {"x-ratelimit-limit-tokens": "5"}, None),
    Headers(
        "negative remaining: the kind is left out",
        "openai",
        {**OPENAI_FULL, "x-ratelimit-remaining-tokens": "-5"},
        RateLimits(observed_at=ARRIVAL_ISO, requests=RateLimit(limit=500, remaining=499, reset_at=at(120))),
    ),
    Headers(
        "garbage everywhere but one remaining",
        "openai",
        {
            "x-ratelimit-limit-requests": "lots",
            "x-ratelimit-remaining-requests": "3",
            "x-ratelimit-reset-requests": "soon",
            "x-ratelimit-remaining-tokens": "9" * 30,
        },
        RateLimits(observed_at=ARRIVAL_ISO, requests=RateLimit(limit=None, remaining=3, reset_at=None)),
    ),
    Headers(
        "huge limit and a reset a year away",
        "anthropic",
        {
            "anthropic-ratelimit-tokens-limit": str(10**18),
            "anthropic-ratelimit-tokens-remaining": "10",
            "anthropic-ratelimit-tokens-reset": "2028-01-15T08:00:00Z",
        },
        RateLimits(observed_at=ARRIVAL_ISO, tokens=RateLimit(limit=None, remaining=10, reset_at=None)),
    ),
]


@pytest.mark.parametrize("case", HEADERS, ids=[h.name for h in HEADERS])
def test_rate_limits_of(case: Headers) -> None:
    assert rate_limits_of(headers(case.pairs), WIRES[case.wire].rate_limits, lambda: ARRIVAL) == case.expected


def test_the_clock_is_read_only_when_a_header_is_present() -> None:
    def clock() -> int:
        raise AssertionError("read the clock for an answer without rate-limit headers")

    assert rate_limits_of(headers({"content-type": "application/json"}), WIRES["anthropic"].rate_limits, clock) is None
    assert rate_limits_of(headers({"x-ratelimit-limit-tokens": "9"}), WIRES["openai"].rate_limits, clock) is None


@pytest.mark.parametrize("ms", [0, 999, 1_000, ARRIVAL, ARRIVAL + 123, ARRIVAL + 86_400_999])
def test_the_memoized_iso_is_the_shared_one(ms: int) -> None:
    from dataplane.ratelimits import iso_ms as memoized

    assert memoized(ms) == iso_ms(ms) == memoized(ms)


def test_kinds_sharing_a_reset_text_and_kinds_with_their_own() -> None:
    pairs = {
        "x-ratelimit-remaining-requests": "1",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-remaining-tokens": "2",
        "x-ratelimit-reset-tokens": "1s",
    }
    parsed = rate_limits_of(headers(pairs), WIRES["openai"].rate_limits, lambda: ARRIVAL)
    assert parsed is not None and parsed.requests.reset_at == parsed.tokens.reset_at == at(1000)
    pairs["x-ratelimit-reset-tokens"] = "2s"
    parsed = rate_limits_of(headers(pairs), WIRES["openai"].rate_limits, lambda: ARRIVAL + 5)
    assert parsed is not None and (parsed.requests.reset_at, parsed.tokens.reset_at) == (at(1005), at(2005))


def test_the_memos_stay_bounded_and_agree_with_a_fresh_parse() -> None:
    from dataplane import ratelimits

    for n in range(3 * ratelimits.MEMO_MAX):
        offset = n * 1000
        assert reset_at_ms(f"{n}ms", False, ARRIVAL) == ARRIVAL + n
        assert reset_at_ms(at(offset).replace(".000Z", "Z"), True, ARRIVAL) == ARRIVAL + offset
        assert ratelimits.iso_ms(ARRIVAL + offset) == at(offset)
        assert ratelimits._limit(str(n)) == n
    for memo in (ratelimits._absolute, ratelimits._relative, ratelimits._seconds, ratelimits._limits):
        assert 0 < len(memo) <= ratelimits.MEMO_MAX
    assert ratelimits._limit("-1") is None and ratelimits._limit("-1") is None


@pytest.mark.parametrize("wire", ["anthropic", "openai"])
def test_the_benchmark_stubs_sets_parse_whole(wire: str) -> None:
    """`make bench`'s stub (`--rate-limit-headers`) sends sets the parser reads in full, so the
    benchmark pays the whole parse on every answer, as production does."""
    from tests.support.stub_ratelimits import RateLimitHeaders, go_duration

    assert [go_duration(ms) for ms in (6, 999, 1000, 6500, 60_000, 61_500)] == [
        "6ms",
        "999ms",
        "1s",
        "6.5s",
        "1m0s",
        "1m1.5s",
    ]
    stub = RateLimitHeaders()
    for _ in range(3):
        parsed = rate_limits_of(headers(stub.headers(wire)), WIRES[wire].rate_limits, now_ms)  # its resets: now's
        assert parsed is not None
        kinds = [k for k in ("requests", "tokens", "input_tokens", "output_tokens") if getattr(parsed, k)]
        assert len(kinds) == (4 if wire == "anthropic" else 2)
        for kind in kinds:
            limit = getattr(parsed, kind)
            assert limit.limit and limit.remaining is not None and limit.remaining >= limit.limit * 3 // 4
            assert limit.reset_at is not None
