"""`settle_heap`: start-up's objects frozen out of the collector's reach, young collections spaced."""

from __future__ import annotations

import gc

from shared.heap import OLDER_THRESHOLDS, YOUNG_THRESHOLD, settle_heap


def test_settle_heap_freezes_and_spaces_collections() -> None:
    before = gc.get_threshold()
    made_before = object()
    try:
        settle_heap()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
        assert made_before is not None and gc.is_tracked([made_before])  # nothing else changes
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1  # cycles made after it are still collected
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_settle_heap_runs_no_collection() -> None:
    """A collection here walks every object start-up built, on the path to ready (issue 27)."""
    before = gc.get_threshold()
    ran: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            ran.append(info["generation"])

    gc.callbacks.append(record)
    try:
        settle_heap()
    finally:
        gc.callbacks.remove(record)
        gc.unfreeze()
        gc.set_threshold(*before)
    assert ran == []
