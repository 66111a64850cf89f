"""The headroom core (SPEC §22) by table: what a row's `rate_limits` becomes, newest wins, and
when a floor rules an account out (never on a passed reset, never without a limit)."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from controlplane.core.headroom import (
    Observation,
    crossings,
    floors_of,
    headroom_percent,
    is_low,
    lifts_at,
    low_kinds,
    newer,
    observations_of,
)
from shared.clock import iso_ms
from shared.wire import RateLimit, RateLimits

NOW = 1_800_000_000_000


def obs(remaining: int, limit: int | None = 100, reset_in: int | None = 60_000, at: int = NOW) -> Observation:
    return Observation(
        limit=limit, remaining=remaining, reset_at_ms=None if reset_in is None else NOW + reset_in, observed_at_ms=at
    )


class Low(NamedTuple):
    name: str
    observation: Observation
    floor: int
    low: bool


LOWS = [
    Low("below the floor", obs(9), 10, True),
    Low("exactly at the floor is not below", obs(10), 10, False),
    Low("above", obs(50), 10, False),
    Low("floor 0 is off", obs(0), 0, False),
    Low("reset passed: ignored", obs(0, reset_in=-1), 10, False),
    Low("reset now: ignored", obs(0, reset_in=0), 10, False),
    Low("no reset: cannot lift, not judged", obs(0, reset_in=None), 10, False),
    Low("no limit: not judged", obs(0, limit=None), 10, False),
    Low("limit 0: not judged", obs(0, limit=0), 10, False),
    Low("integer arithmetic: 4999/100000 < 5 %", obs(4999, limit=100_000), 5, True),
    Low("integer arithmetic: 5000/100000 is 5 %", obs(5000, limit=100_000), 5, False),
    Low("remaining above limit", obs(150), 50, False),
    Low("floor 50, remaining 0", obs(0), 50, True),
]


@pytest.mark.parametrize("case", LOWS, ids=[c.name for c in LOWS])
def test_is_low(case: Low) -> None:
    assert is_low(case.observation, case.floor, NOW) is case.low


def test_low_kinds_and_lifts_at_the_last_low_reset() -> None:
    held = {"requests": obs(1, reset_in=1_000), "tokens": obs(5, reset_in=30_000), "output_tokens": obs(90)}
    assert low_kinds(held, 10, NOW) == ("requests", "tokens")
    assert lifts_at(held, 10, NOW) == NOW + 30_000
    assert low_kinds(held, 10, NOW + 1_000) == ("tokens",)  # the requests window refilled
    assert low_kinds(held, 10, NOW + 30_000) == ()
    assert lifts_at(held, 10, NOW + 30_000) is None
    assert low_kinds(held, 0, NOW) == ()


def test_newest_wins() -> None:
    old, new = obs(1, at=NOW - 5), obs(90, at=NOW)
    assert newer(None, old) and newer(old, new) and not newer(new, old)
    assert newer(new, obs(3, at=NOW))  # a tie: the later recorded


def rl(**kinds: RateLimit) -> RateLimits:
    return RateLimits(observed_at=iso_ms(NOW), **kinds)


class Row(NamedTuple):
    name: str
    stated: RateLimits
    expected: dict[str, Observation]


ROWS = [
    Row(
        "two kinds",
        rl(
            requests=RateLimit(limit=50, remaining=4, reset_at=iso_ms(NOW + 1000)),
            tokens=RateLimit(limit=None, remaining=7, reset_at=None),
        ),
        {
            "requests": Observation(limit=50, remaining=4, reset_at_ms=NOW + 1000, observed_at_ms=NOW),
            "tokens": Observation(limit=None, remaining=7, reset_at_ms=None, observed_at_ms=NOW),
        },
    ),
    Row("negative remaining: left out", rl(requests=RateLimit(limit=50, remaining=-1)), {}),
    Row("remaining missing: left out", rl(requests=RateLimit(limit=50)), {}),
    Row("huge remaining: left out", rl(tokens=RateLimit(limit=5, remaining=10**15)), {}),
    Row(
        "huge limit: limit dropped",
        rl(tokens=RateLimit(limit=10**15, remaining=5)),
        {"tokens": Observation(limit=None, remaining=5, reset_at_ms=None, observed_at_ms=NOW)},
    ),
    Row(
        "reset years away: the kind is left out",
        rl(tokens=RateLimit(limit=5, remaining=5, reset_at="2090-01-01T00:00:00Z")),
        {},
    ),
    Row(
        "garbage reset: no reset",
        rl(tokens=RateLimit(limit=5, remaining=5, reset_at="soon")),
        {"tokens": Observation(limit=5, remaining=5, reset_at_ms=None, observed_at_ms=NOW)},
    ),
    Row(
        "garbage observed_at: nothing", RateLimits(observed_at="yesterday", tokens=RateLimit(limit=5, remaining=5)), {}
    ),
]


@pytest.mark.parametrize("case", ROWS, ids=[c.name for c in ROWS])
def test_observations_of(case: Row) -> None:
    assert observations_of(case.stated) == case.expected


def test_headroom_percent_floors_and_crossings() -> None:
    assert headroom_percent(obs(25)) == 25.0
    assert headroom_percent(obs(250)) == 100.0
    assert headroom_percent(obs(1, limit=None)) is None
    assert floors_of([None, 0, 10, 20, 10, 51, -1]) == (10, 20)
    assert crossings(frozenset({10}), frozenset({10, 20})) == ((20, True),)
    assert crossings(frozenset({10, 20}), frozenset()) == ((10, False), (20, False))
    assert crossings(frozenset({5}), frozenset({5})) == ()
