"""The garbage collector tuned for a long-running daemon: `settle_heap()`, once, when serving starts;
and `HeapTrimmer`, glibc's kept pages handed back after traffic.

Both daemons allocate a few dozen container objects per request (a task, futures, the row, its
frames); almost all die by reference counting within the request. CPython's defaults (a young
collection every 700 net allocations, a full one every 100 young ones) suit a short script, not
a daemon whose heap already holds every imported module: each full collection walks all of it,
so a larger import set makes every request dearer. `settle_heap` moves what start-up built
(modules, classes, settings, the wiring) into the permanent generation (`gc.freeze`: never
scanned again, never freed, as it would never be anyway), and makes young collections rarer
(`YOUNG_THRESHOLD`): a request's objects are then mostly gone before one runs, instead of being
promoted to an older generation while in flight and scanned there. Cycles are still collected;
the bound on memory between two collections is `YOUNG_THRESHOLD` tracked objects (a few MiB).

No collection runs first: a full one walks the ~45k objects start-up built (10-50 ms of CPU, on
the path to ready, since both daemons settle once they listen) and finds nothing to free (0
unreachable objects after either daemon's start, measured; issue 27). Whatever garbage start-up
might leave is frozen with the rest: a few objects at most, never scanned, never freed.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

# Net allocations of tracked objects between two young collections (CPython's default: 700).
YOUNG_THRESHOLD = 10_000
# Young collections per middle one, middle ones per full one (CPython's defaults: 10, 10).
OLDER_THRESHOLDS = (10, 10)


def settle_heap() -> None:
    """Freeze what exists now (start-up's objects) and space the young collections out."""
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)


class HeapTrimmer:
    """Hands the heap pages glibc keeps after a burst of traffic back to the system
    (`malloc_trim`), so RSS follows the live set rather than the peak; a no-op where
    malloc_trim does not exist. Called every few seconds by control's reaper.

    It trims only when a young collection ran since its last call (at least `YOUNG_THRESHOLD`
    net container allocations, i.e. traffic), and once more at the first call that sees none
    after one that did (what the end of a burst freed). An idle daemon has nothing to give back (measured:
    0 KiB right after start), so it never loads ctypes (~1 MiB of idle RSS; issue 27).
    """

    def __init__(self) -> None:
        self._seen = _young_collections()
        self._trailing = False  # the call after the last one that saw traffic trims too
        self._trim: Callable[[], object] | None = None

    def __call__(self) -> bool:
        """Trim if there was traffic since the last call, or the last call saw some; whether it did."""
        now = _young_collections()
        active, self._seen = now != self._seen, now
        if not (active or self._trailing):
            return False
        self._trailing = active
        if self._trim is None:
            self._trim = _malloc_trim()
        self._trim()
        return True


def _young_collections() -> int:
    return int(gc.get_stats()[0]["collections"])


def _malloc_trim() -> Callable[[], object]:
    import ctypes  # here, at the first trim (no `ctypes.util.find_library`: it runs `ldconfig -p`)

    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    return lambda: trim(0)
