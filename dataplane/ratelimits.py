"""The provider's rate-limit headers of one upstream answer → `RateLimits` (SPEC §22). Pure.

Anthropic sends `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
remaining,reset}`, the reset as an RFC 3339 time; OpenAI sends `x-ratelimit-{limit,remaining,
reset}-{requests,tokens}`, the reset as a Go duration (`6m0s`, `120ms`, `1s`, `0.5s`) counted
from the answer's arrival. The headers still pass to the worker unchanged; this only reads them.

Cost on the hot path (`python -m bench.ratelimit_parse` measures it): a kind is looked at only
when its `remaining` header is present (four absent-key lookups on the Anthropic wire, two on the
OpenAI wire, for an answer without any), and the clock is read only then. Where they are present,
each is one dict lookup (`CIMultiDictProxy.get`; iterating the headers instead costs more than all
the lookups), a count is `int()` behind two `str` tests, and every reset text is parsed once: the
memo maps an RFC 3339 text straight to its epoch ms and its ISO form, a duration to its ms (an
account's answers repeat the same reset texts for a whole window), and an ISO second is formatted
once. The memos are bounded dicts, cleared when full.

Every value is hostile until parsed: a count that is not plain ASCII digits, or above
`MAX_COUNT`; a reset that does not parse, names no offset, or lies outside `MAX_RESET_MS` of
the arrival, is ignored (that field is null; a kind without a usable `remaining` is left out).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from multidict import istr

from dataplane.stamps import MILLIS
from shared.wire import RATE_LIMIT_KINDS, RateLimit, RateLimits

MAX_COUNT = 10**12  # no provider states a limit near this; larger is garbage
MAX_DIGITS = len(str(MAX_COUNT))
MAX_RESET_MS = 7 * 86_400_000  # a reset further than a week from the answer is garbage
MAX_RESET_TEXT = 40  # longer than any RFC 3339 time or duration a provider sends

# (kind, limit header, remaining header, reset header): a wire's names (`dataplane/wires/`).
Names = tuple[tuple[str, str, str, str], ...]


class RateLimitHeaders:
    """One wire's rate-limit headers, and whether its reset is an absolute RFC 3339 time
    (Anthropic) rather than a duration counted from the answer's arrival (OpenAI). `slotted`
    is `names` as the parser walks it: each kind as its slot in `RateLimits`, each header name
    an `istr` (multidict looks it up without lowering it first)."""

    __slots__ = ("names", "absolute_reset", "slotted")

    def __init__(self, names: Names, absolute_reset: bool) -> None:
        self.names = names
        self.absolute_reset = absolute_reset
        self.slotted = tuple(
            (RATE_LIMIT_KINDS.index(kind), istr(limit), istr(remaining), istr(reset))
            for kind, limit, remaining, reset in names
        )


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
_DIGITS = frozenset("0123456789")


def parse_count(text: str | None) -> int | None:
    """A non-negative integer of plain ASCII digits, at most `MAX_COUNT`; else None."""
    if text is None or len(text) > MAX_DIGITS or not text.isdigit() or not text.isascii():
        return None
    value = int(text)
    return value if value <= MAX_COUNT else None


def _number_end(text: str, at: int) -> int:
    """Where the ASCII digits starting at `at` end."""
    end = len(text)
    while at < end and text[at] in _DIGITS:
        at += 1
    return at


def parse_duration_ms(text: str) -> float | None:
    """A Go duration (`1h2m3.5s`, `6m0s`, `120ms`, `0.5s`, `0`) in milliseconds; else None.
    No sign: a negative reset is garbage. Hand-rolled (no regex): number, unit, repeated."""
    if not text or len(text) > MAX_RESET_TEXT:
        return None
    if text == "0":
        return 0.0
    total, at, end = 0.0, 0, len(text)
    while at < end:
        digits = _number_end(text, at)
        if digits == at:
            return None  # a unit without a number, or a sign
        if digits < end and text[digits] == ".":
            fraction = _number_end(text, digits + 1)
            if fraction == digits + 1:
                return None
            digits = fraction
        unit = digits
        while unit < end and text[unit] not in _DIGITS:
            unit += 1
        scale = _UNIT_MS.get(text[digits:unit])
        if scale is None:
            return None
        total += float(text[at:digits]) * scale
        at = unit
    return total


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


_absolute: dict[str, tuple[int, str] | None] = {}  # RFC 3339 text → (epoch ms, ISO) or None
_relative: dict[str, int | None] = {}  # duration text → whole ms (rounded once) or None
_seconds: dict[int, str] = {}  # epoch second → its ISO text
_limits: dict[str, int | None] = {}  # a limit header's text → its count or None


def _absolute_reset(text: str) -> tuple[int, str] | None:
    try:
        return _absolute[text]
    except KeyError:
        pass
    if len(_absolute) >= MEMO_MAX:
        _absolute.clear()
    at = parse_rfc3339_ms(text)
    try:
        value = _absolute[text] = None if at is None else (at, iso_ms(at))
    except (ValueError, OverflowError, OSError):  # a time no datetime holds (year 0, year 10000)
        value = _absolute[text] = None
    return value


def _relative_reset(text: str) -> int | None:
    try:
        return _relative[text]
    except KeyError:
        pass
    if len(_relative) >= MEMO_MAX:
        _relative.clear()
    after = parse_duration_ms(text)
    value = _relative[text] = None if after is None else round(after)
    return value


def iso_ms(ms: int) -> str:
    """ISO 8601 UTC with milliseconds and a `Z`, as `shared.clock.iso_ms` (the second memoized)."""
    second, milli = divmod(ms, 1000)
    prefix = _seconds.get(second)
    if prefix is None:
        if len(_seconds) >= MEMO_MAX:
            _seconds.clear()
        prefix = _seconds[second] = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
    return prefix + MILLIS[milli]


def reset_at_ms(text: str | None, absolute: bool, arrival_ms: int) -> int | None:
    """The reset as an absolute time, within `MAX_RESET_MS` of the arrival; else None."""
    if text is None:
        return None
    if absolute:
        parsed = _absolute_reset(text)
        at = None if parsed is None else parsed[0]
    else:
        after = _relative_reset(text)
        at = None if after is None else arrival_ms + after
    if at is None or abs(at - arrival_ms) > MAX_RESET_MS:
        return None
    return at


def _reset_iso(text: str | None, absolute: bool, arrival_ms: int) -> str | None:
    """`reset_at_ms` as ISO text; an RFC 3339 reset's ISO form comes from the memo."""
    if text is None:
        return None
    if absolute:
        parsed = _absolute_reset(text)
        if parsed is None or abs(parsed[0] - arrival_ms) > MAX_RESET_MS:
            return None
        return parsed[1]
    after = _relative_reset(text)
    if after is None or after > MAX_RESET_MS:
        return None
    return iso_ms(arrival_ms + after)


def _limit(text: str | None) -> int | None:
    """`parse_count`, memoized: an account's answers state the same limits all day."""
    if text is None:
        return None
    try:
        return _limits[text]
    except KeyError:
        pass
    if len(_limits) >= MEMO_MAX:
        _limits.clear()
    value = _limits[text] = parse_count(text)
    return value


def rate_limits_of(headers: Mapping[str, str], wire: RateLimitHeaders, clock: Callable[[], int]) -> RateLimits | None:
    """The answer's rate limits (headers named as `wire` names them), or None when it carried
    no usable `remaining` header. `clock()` (epoch ms: the answer's arrival) is read only when
    one is present. Each kind lands in its slot and `RateLimits` is built with named fields:
    `RateLimits(**found)` costs a µs more than the rest of the parse. A limit's memo is read
    inline (a miss parses it)."""
    absolute = wire.absolute_reset
    get = headers.get
    limits = _limits
    slots: list[RateLimit | None] | None = None
    arrival_ms = 0
    last_text: str | None = None  # kinds often share one reset text: it is looked up once
    last_iso: str | None = None
    for slot, limit_name, remaining_name, reset_name in wire.slotted:
        raw = get(remaining_name)
        if raw is None or len(raw) > MAX_DIGITS or not raw.isascii() or not raw.isdigit():
            continue
        remaining = int(raw)
        if remaining > MAX_COUNT:
            continue
        if slots is None:
            slots, arrival_ms = [None, None, None, None], clock()
        text = get(reset_name)
        if text is None or text != last_text:
            last_text, last_iso = text, _reset_iso(text, absolute, arrival_ms)
        limit_text = get(limit_name)
        limit = None if limit_text is None else limits.get(limit_text, _MISS)
        if limit is _MISS:
            limit = _limit(limit_text)
        slots[slot] = RateLimit(limit=limit, remaining=remaining, reset_at=last_iso)  # type: ignore[arg-type]
    if slots is None:
        return None
    requests, tokens, input_tokens, output_tokens = slots
    return RateLimits(
        observed_at=iso_ms(arrival_ms),
        requests=requests,
        tokens=tokens,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )


_MISS = object()
