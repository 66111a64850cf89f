"""The garbage collector tuned for a long-running daemon: `settle_heap()`, once, when serving starts.

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

# Net allocations of tracked objects between two young collections (CPython's default: 700).
YOUNG_THRESHOLD = 10_000
# Young collections per middle one, middle ones per full one (CPython's defaults: 10, 10).
OLDER_THRESHOLDS = (10, 10)


def settle_heap() -> None:
    """Freeze what exists now (start-up's objects) and space the young collections out."""
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
