"""Provider rate-limit headroom (SPEC §22): observations and the floor. Pure.

An `Observation` is one kind of an account's rate limit as one upstream answer stated it
(`limit`, `remaining`, `reset_at_ms`) and when that answer arrived (`observed_at_ms`). Control
keeps the newest per account and kind (`newer`); a row's `rate_limits` is hostile input until
`observations_of` range-checked it.

The floor (`min_headroom_percent`, §10) rules an account out while any kind it reported is
*low*: `remaining` below that share of `limit`, with `reset_at` still ahead. An observation
whose reset has passed says nothing about now (the window refilled), and one without a reset
or a limit cannot be judged: neither counts. So every skip lifts by itself at its reset.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

import msgspec

from shared.wire import RATE_LIMIT_KINDS, RateLimits

MAX_COUNT = 10**12
MAX_RESET_MS = 7 * 86_400_000  # a reset further than this from its answer is garbage
MAX_FLOOR_PERCENT = 50


class Observation(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    limit: int | None
    remaining: int
    reset_at_ms: int | None
    observed_at_ms: int


def iso_to_ms(text: object) -> int | None:
    """An ISO 8601 time with an offset in epoch ms; anything else None."""
    if not isinstance(text, str) or not 0 < len(text) <= 40:
        return None
    try:
        when = datetime.fromisoformat(text)
        return None if when.tzinfo is None else int(when.timestamp() * 1000)
    except (ValueError, OverflowError):
        return None


def _count(value: object) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT
    return value if ok else None  # type: ignore[return-value]


def valid(observation: Observation) -> bool:
    """In range: counts within 0..MAX_COUNT, a reset within `MAX_RESET_MS` of its answer."""
    if _count(observation.remaining) is None or (observation.limit is not None and _count(observation.limit) is None):
        return False
    reset = observation.reset_at_ms
    return reset is None or abs(reset - observation.observed_at_ms) <= MAX_RESET_MS


def observations_of(rate_limits: RateLimits) -> dict[str, Observation]:
    """A row's `rate_limits` → kind → observation; a kind out of range is left out."""
    observed_at = iso_to_ms(rate_limits.observed_at)
    if observed_at is None:
        return {}
    found: dict[str, Observation] = {}
    for kind in RATE_LIMIT_KINDS:
        stated = getattr(rate_limits, kind)
        if stated is None or _count(stated.remaining) is None:
            continue
        observation = Observation(
            limit=_count(stated.limit),
            remaining=stated.remaining,
            reset_at_ms=iso_to_ms(stated.reset_at),
            observed_at_ms=observed_at,
        )
        if valid(observation):
            found[kind] = observation
    return found


def newer(held: Observation | None, incoming: Observation) -> bool:
    """The newest observation wins (a tie goes to the incoming one: it was recorded later)."""
    return held is None or incoming.observed_at_ms >= held.observed_at_ms


def current(observation: Observation, now_ms: int) -> bool:
    """Judgeable now: a limit, and a reset still ahead."""
    return (
        observation.limit is not None
        and observation.limit > 0
        and observation.reset_at_ms is not None
        and observation.reset_at_ms > now_ms
    )


def headroom_percent(observation: Observation) -> float | None:
    """`remaining` as a share of `limit`, in percent (capped at 100); None without a limit."""
    if observation.limit is None or observation.limit <= 0:
        return None
    return min(100.0, observation.remaining * 100.0 / observation.limit)


def is_low(observation: Observation, floor_percent: int, now_ms: int) -> bool:
    """Below the floor now (integer arithmetic: no rounding decides a skip)."""
    return (
        floor_percent > 0
        and current(observation, now_ms)
        and observation.remaining * 100 < floor_percent * observation.limit  # type: ignore[operator]
    )


def low_kinds(observations: Mapping[str, Observation], floor_percent: int, now_ms: int) -> tuple[str, ...]:
    """Every kind below the floor now, in `RATE_LIMIT_KINDS` order."""
    if floor_percent <= 0:
        return ()
    return tuple(
        kind for kind in RATE_LIMIT_KINDS if kind in observations and is_low(observations[kind], floor_percent, now_ms)
    )


def lifts_at(observations: Mapping[str, Observation], floor_percent: int, now_ms: int) -> int | None:
    """When the floor stops ruling the account out by itself: the last reset of its low kinds."""
    resets = [observations[kind].reset_at_ms for kind in low_kinds(observations, floor_percent, now_ms)]
    return max((r for r in resets if r is not None), default=None)


def floors_of(values: Iterable[int | None]) -> tuple[int, ...]:
    """The distinct floors a policy sets anywhere (0 = off is none), ascending."""
    return tuple(sorted({v for v in values if v is not None and 0 < v <= MAX_FLOOR_PERCENT}))


def crossings(was_low: frozenset[int], is_low_now: frozenset[int]) -> tuple[tuple[int, bool], ...]:
    """(floor, below) for every floor the account crossed: below it now, or recovered."""
    below = [(f, True) for f in is_low_now - was_low]
    return tuple(sorted(below + [(f, False) for f in was_low - is_low_now]))
