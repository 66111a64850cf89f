"""The provider's rate-limit headers of one upstream answer → `RateLimits` (SPEC §22). Pure.

Anthropic sends `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
remaining,reset}`, the reset as an RFC 3339 time; OpenAI sends `x-ratelimit-{limit,remaining,
reset}-{requests,tokens}`, the reset as a Go duration (`6m0s`, `120ms`, `1s`, `0.5s`) counted
from the answer's arrival. The headers still pass to the worker unchanged; this only reads them.

Cost on the hot path: a kind is looked at only when its `remaining` header is present (four
absent-key lookups on the Anthropic wire, two on the OpenAI wire, for an answer without any:
`python -m bench.ratelimit_parse` measures it), and the clock is read only then. Where they are
present, the parsing of a reset text and the formatting of a second are memoized (an account's
answers repeat the same reset texts and seconds for a whole window), in bounded dicts.

Every value is hostile until parsed: a count that is not plain ASCII digits, or above
`MAX_COUNT`; a reset that does not parse, names no offset, or lies outside `MAX_RESET_MS` of
the arrival, is ignored (that field is null; a kind without a usable `remaining` is left out).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import NamedTuple

from shared.wire import RateLimit, RateLimits

MAX_COUNT = 10**12  # no provider states a limit near this; larger is garbage
MAX_DIGITS = len(str(MAX_COUNT))
MAX_RESET_MS = 7 * 86_400_000  # a reset further than a week from the answer is garbage
MAX_RESET_TEXT = 40  # longer than any RFC 3339 time or duration a provider sends

# (kind, limit header, remaining header, reset header): a wire's names (`dataplane/wires/`).
Names = tuple[tuple[str, str, str, str], ...]


class RateLimitHeaders(NamedTuple):
    """One wire's rate-limit headers, and whether its reset is an absolute RFC 3339 time
    (Anthropic) rather than a duration counted from the answer's arrival (OpenAI)."""

    names: Names
    absolute_reset: bool


MEMO_MAX = 512  # entries per memo; cleared when full

_UNIT_MS = {
    "h": 3_600_000.0,
    "m": 60_000.0,
    "s": 1000.0,
    "ms": 1.0,
    "us": 0.001,
    "µs": 0.001,
    "μs": 0.001,
    "ns": 0.000001,
}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|μs|ns)")


def parse_count(text: str | None) -> int | None:
    """A non-negative integer of plain ASCII digits, at most `MAX_COUNT`; else None."""
    if text is None or not text or len(text) > MAX_DIGITS or not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value <= MAX_COUNT else None


def parse_duration_ms(text: str) -> float | None:
    """A Go duration (`1h2m3.5s`, `6m0s`, `120ms`, `0.5s`, `0`) in milliseconds; else None.
    No sign: a negative reset is garbage."""
    if not text or len(text) > MAX_RESET_TEXT:
        return None
    if text == "0":
        return 0.0
    total, at = 0.0, 0
    for match in _DURATION.finditer(text):
        if match.start() != at:
            return None
        total += float(match.group(1)) * _UNIT_MS[match.group(2)]
        at = match.end()
    return total if at == len(text) and at > 0 else None


def parse_rfc3339_ms(text: str) -> int | None:
    """An RFC 3339 time with its offset (`2026-12-01T21:05:00Z`) in epoch ms; else None."""
    if not text or len(text) > MAX_RESET_TEXT or "T" not in text.upper():
        return None
    try:
        when = datetime.fromisoformat(text)
        if when.tzinfo is None:
            return None
        return int(when.timestamp() * 1000)
    except (ValueError, OverflowError):
        return None


_parsed: dict[tuple[bool, str], int | float | None] = {}  # (anthropic?, text) → ms or None
_seconds: dict[int, str] = {}  # epoch second → its ISO text


def _parse_reset(anthropic: bool, text: str) -> int | float | None:
    key = (anthropic, text)
    try:
        return _parsed[key]
    except KeyError:
        pass
    if len(_parsed) >= MEMO_MAX:
        _parsed.clear()
    value = _parsed[key] = parse_rfc3339_ms(text) if anthropic else parse_duration_ms(text)
    return value


def iso_ms(ms: int) -> str:
    """ISO 8601 UTC with milliseconds and a `Z`, as `shared.clock.iso_ms` (the second memoized)."""
    second, milli = divmod(ms, 1000)
    prefix = _seconds.get(second)
    if prefix is None:
        if len(_seconds) >= MEMO_MAX:
            _seconds.clear()
        prefix = _seconds[second] = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
    return f"{prefix}{milli:03d}Z"


def reset_at_ms(text: str | None, absolute: bool, arrival_ms: int) -> int | None:
    """The reset as an absolute time, within `MAX_RESET_MS` of the arrival; else None."""
    if text is None:
        return None
    if absolute:
        at = _parse_reset(True, text)
    else:
        after = _parse_reset(False, text)
        at = None if after is None else int(arrival_ms + round(after))
    if at is None or abs(at - arrival_ms) > MAX_RESET_MS:
        return None
    return int(at)


def rate_limits_of(headers: Mapping[str, str], wire: RateLimitHeaders, clock: Callable[[], int]) -> RateLimits | None:
    """The answer's rate limits (headers named as `wire` names them), or None when it carried
    no usable `remaining` header. `clock()` (epoch ms: the answer's arrival) is read only when
    one is present."""
    names, absolute = wire
    get = headers.get
    found: dict[str, RateLimit] | None = None
    arrival_ms = 0
    resets: dict[str | None, str | None] = {}  # this answer's reset texts (kinds often share one)
    for kind, limit_name, remaining_name, reset_name in names:
        raw = get(remaining_name)
        if raw is None:
            continue
        remaining = parse_count(raw)
        if remaining is None:
            continue
        if found is None:
            found, arrival_ms = {}, clock()
        text = get(reset_name)
        if text in resets:
            reset_at = resets[text]
        else:
            reset = reset_at_ms(text, absolute, arrival_ms)
            reset_at = resets[text] = None if reset is None else iso_ms(reset)
        found[kind] = RateLimit(limit=parse_count(get(limit_name)), remaining=remaining, reset_at=reset_at)
    if found is None:
        return None
    return RateLimits(observed_at=iso_ms(arrival_ms), **found)
