"""A data plane's own reading of its host's place in the fleet (SPEC §16): it stops serving
ceilinged accounts half a beat before any host may declare it dead and reuse its slots."""

import pytest

from dataplane.admission import has_lapsed, lapse_ms


@pytest.mark.parametrize(
    "age_ms, ttl_ms, lapsed",
    [
        (0, 3000, False),
        (1000, 3000, False),  # one beat late is normal
        (2499, 3000, False),
        (2500, 3000, True),  # TTL − half a beat (beats are TTL/3)
        (2999, 3000, True),  # before the reaper may act (at TTL)
        (None, 3000, True),  # no heartbeat at all: reaped, or never joined
        (8000, 10_000, False),
        (8334, 10_000, True),
    ],
)
def test_a_place_lapses_before_the_ttl(age_ms, ttl_ms, lapsed) -> None:
    assert has_lapsed(age_ms, ttl_ms) is lapsed


@pytest.mark.parametrize("ttl_s", [3, 10, 120])
def test_the_lapse_leaves_room_for_a_check_before_the_ttl(ttl_s) -> None:
    ttl_ms = ttl_s * 1000
    check_ms = ttl_ms / 12  # FleetAdmission.check_interval_s
    assert lapse_ms(ttl_ms) + 2 * check_ms <= ttl_ms
