"""The hot path's ids and timestamps are exactly the shared formats, only cheaper."""

from __future__ import annotations

import os

import pytest

from dataplane import stamps
from shared.clock import iso_ms
from shared.tokens import KEY_ID_RE, ulid

TIMES = [0, 1, 999, 1000, 1_700_000_000_000, 1_700_000_000_999, 1_767_225_599_999, 4_102_444_799_999]


@pytest.mark.parametrize("ms", TIMES)
def test_iso_ms_matches_the_shared_format(ms: int) -> None:
    assert stamps.iso_ms(ms) == iso_ms(ms)
    assert stamps.iso_ms(ms) == iso_ms(ms)  # the cached second gives the same text


def test_iso_ms_across_seconds_in_any_order() -> None:
    for ms in [1_700_000_000_500, 1_700_000_001_000, 1_700_000_000_001, 1_700_000_001_999]:
        assert stamps.iso_ms(ms) == iso_ms(ms)


@pytest.mark.parametrize("ms", TIMES + [2**48 - 1])
def test_ulid_matches_the_shared_encoding(ms: int) -> None:
    for _ in range(20):
        randomness = os.urandom(10)
        assert stamps.ulid_at(ms, int.from_bytes(randomness, "big")) == ulid(ms, randomness)


def test_new_ulids_are_well_formed_and_distinct() -> None:
    made = [stamps.new_ulid() for _ in range(2000)]
    assert all(KEY_ID_RE.match(u) for u in made)
    assert len(set(made)) == len(made)


def test_the_random_characters_are_uniform_over_crockford() -> None:
    """Each random character is the low five bits of a random byte: every Crockford character
    comes from exactly 8 of the 256 byte values (no bias), and nothing else comes out."""
    table = stamps._RANDOM_CHARS
    counts = {c: sum(1 for b in range(256) if chr(table[b]) == c) for c in stamps._CROCKFORD}
    assert set(counts.values()) == {8}
    assert {chr(table[b]) for b in range(256)} == set(stamps._CROCKFORD)


def test_a_new_ulid_carries_the_current_millisecond() -> None:
    import time

    before = time.time_ns() // 1_000_000
    made = stamps.new_ulid()
    after = time.time_ns() // 1_000_000
    assert ulid(before, bytes(10))[:10] <= made[:10] <= ulid(after, bytes(10))[:10]
