"""Ids and timestamps for the hot path, cheap enough to make per request.

`new_ulid` and `iso_ms` give exactly what `shared.tokens.new_ulid` and `shared.clock.iso_ms`
give (tested against them), at a fraction of the cost: the ULID's time part and the ISO
second are formatted once per millisecond / second and reused, the rest is table lookups.
The random part of an id comes from a generator seeded from the OS at start: these ids are
published (headers, rows), so they need to be unique, not unpredictable.
"""

from __future__ import annotations

import os
import random
import time
from datetime import UTC, datetime

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]  # 10 bits → two characters
_random = random.Random(os.urandom(16))
_bits = _random.getrandbits


def _pairs(value: int, count: int) -> str:
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in range(10 * (count - 1), -1, -10)])


def ulid_at(ms: int, randomness: int) -> str:
    """The 26-character Crockford ULID of a millisecond time and 80 random bits."""
    p, r = _PAIRS, randomness
    return (
        _time_part(ms)
        + p[r >> 70 & 1023]
        + p[r >> 60 & 1023]
        + p[r >> 50 & 1023]
        + p[r >> 40 & 1023]
        + p[r >> 30 & 1023]
        + p[r >> 20 & 1023]
        + p[r >> 10 & 1023]
        + p[r & 1023]
    )


_last_ms = -1
_last_time_part = ""


def _time_part(ms: int) -> str:
    global _last_ms, _last_time_part
    if ms != _last_ms:
        _last_ms, _last_time_part = ms, _pairs(ms & ((1 << 48) - 1), 5)
    return _last_time_part


def new_ulid() -> str:
    return ulid_at(time.time_ns() // 1_000_000, _bits(80))


_last_second = -1
_last_prefix = ""


def iso_ms(ms: int) -> str:
    """ISO 8601 UTC with millisecond precision and a `Z` (the second's text is cached)."""
    global _last_second, _last_prefix
    second, milli = divmod(ms, 1000)
    if second != _last_second:
        _last_second = second
        _last_prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
    return f"{_last_prefix}{milli:03d}Z"
