"""`settle_heap`: start-up's objects frozen out of the collector's reach, young collections spaced."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

from shared.heap import OLDER_THRESHOLDS, YOUNG_THRESHOLD, settle_heap
from tests.support.harness import REPO


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


# A fresh interpreter, its collections only the explicit ones: the trimmer idle (no collection
# since it was made), after traffic (whether it trimmed, whether ctypes was loaded, how much RSS
# ~20 MiB of freed small blocks, every 50th kept so glibc cannot give them back by itself, left
# after the trim), then at the first quiet call after traffic, then at the next.
TRIMMER = """
import gc, json, sys
gc.disable()
from shared.heap import HeapTrimmer

def rss_kib():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4

trimmer = HeapTrimmer()
seen = [trimmer(), "ctypes" in sys.modules]
blocks = [bytes(1024) + bytes([i % 256]) for i in range(20_000)]
kept = blocks[::50]
del blocks
gc.collect(0)  # what traffic does: young collections
before = rss_kib()
seen += [trimmer(), "ctypes" in sys.modules, before - rss_kib(), trimmer(), trimmer()]
print(json.dumps(seen))
"""


def test_the_heap_trimmer_trims_after_traffic_and_loads_nothing_while_idle() -> None:
    done = subprocess.run(
        [sys.executable, "-c", TRIMMER], cwd=str(REPO), capture_output=True, text=True, timeout=60, check=True
    )
    idle_trimmed, idle_ctypes, trimmed, ctypes_loaded, given_back_kib, trailing, quiet = json.loads(done.stdout)
    assert (idle_trimmed, idle_ctypes) == (False, False)
    assert (trimmed, ctypes_loaded) == (True, True)
    assert given_back_kib > 10 * 1024  # most of the ~20 MiB freed
    assert (trailing, quiet) == (True, False)  # once more after the traffic, then nothing
