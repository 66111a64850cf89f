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
    """The ULID's ten time characters (five 10-bit pairs), from two small ints: the top 18 bits
    and the low 30 (no 48-bit arithmetic per pair)."""
    global _last_ms, _last_time_part
    if ms != _last_ms:
        p = _PAIRS
        high, low = ms >> 30 & 0x3FFFF, ms & 0x3FFFFFFF
        _last_ms = ms
        _last_time_part = _join((p[high >> 10], p[high & 1023], p[low >> 20], p[low >> 10 & 1023], p[low & 1023]))
    return _last_time_part


def new_ulid() -> str:
    """A ULID of now: its ten time characters (`_time_part`) and sixteen random ones, each from
    the low five bits of a random byte (`_RANDOM_CHARS`: one `translate` for all sixteen, no
    arithmetic per character); 80 random bits, as `ulid_at` of them would spell them."""
    return _time_part(time.time_ns() // 1_000_000) + _bits(128).to_bytes(16, "little").translate(_RANDOM_CHARS).decode(
        "ascii"
    )


# byte → the Crockford character of its low five bits (each of the 32 from 8 of the 256 bytes)
_RANDOM_CHARS = bytes.maketrans(bytes(range(256)), bytes(ord(_CROCKFORD[b & 31]) for b in range(256)))
_join = "".join


_last_second = -1
_last_prefix = ""


def iso_ms(ms: int) -> str:
    """ISO 8601 UTC with millisecond precision and a `Z` (the second's text is cached, the
    millisecond's is a table entry: no format spec is parsed per call)."""
    global _last_second, _last_prefix
    second, milli = divmod(ms, 1000)
    if second != _last_second:
        _last_second = second
        _last_prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
    return _last_prefix + MILLIS[milli]


MILLIS = tuple(f"{milli:03d}Z" for milli in range(1000))  # a millisecond → its ISO text and `Z`
