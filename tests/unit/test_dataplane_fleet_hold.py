"""When the data plane refuses a ceilinged account in fleet mode (SPEC §16, §19), by table: its
host's place lapsed, or one of its Redis loops keeps failing; otherwise it serves."""

from __future__ import annotations

import pytest

from dataplane.admission import hold_reason

HOLDS = [
    (False, [], None),
    (True, [], "place in the fleet has lapsed"),
    (True, ["standing"], "place in the fleet has lapsed"),  # the lapse is the first cause named
    (False, ["standing"], "fleet loop standing keeps failing"),
    (False, ["standing", "upkeep"], "fleet loops standing, upkeep keep failing"),
]


@pytest.mark.parametrize("lapsed,failing,says", HOLDS)
def test_hold_reason(lapsed: bool, failing: list[str], says: str | None) -> None:
    reason = hold_reason(lapsed, failing)
    if says is None:
        assert reason is None
    else:
        assert reason is not None and says in reason
