"""The fleet's spend (SPEC §18, §16): a host's own `SpendFold` plus the windows every other host
published, read as one (`FleetCells`), and the triples a window travels between hosts as.

Pure: `controlplane/fleet/spend.py` does the Redis side (publish, pull) and hands the decoded
windows here. Other hosts' windows are replaced whole, never added to, so a re-publish never
counts twice."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from controlplane.core.spend import (
    CELL_SIZE,
    DIMS,
    Cell,
    Dim,
    Key,
    SpendFold,
    WindowCells,
    add_cell,
    empty_window,
    merge_window,
)

# A window's cells as they travel between hosts: (dimension, key, cell) triples.
Triples = list[tuple[str, Key, Cell]]


def window_triples(fold: SpendFold, window_key: str) -> Triples:
    """One window of a fold (the open hour rolled in), as triples."""
    return [(str(dim), key, cell) for dim in DIMS for key, cell in fold.cells(window_key, dim).items()]


def window_of(triples: Iterable[tuple[str, Key, Cell]]) -> WindowCells:
    window = empty_window()
    for dim, key, cell in triples:
        cells = window.get(dim)  # type: ignore[call-overload]  # a Dim is its str
        if cells is not None:
            held = cells.get(key)
            if held is None:
                cells[key] = [float(cell[0])] + [int(v) for v in cell[1:CELL_SIZE]]
            else:
                add_cell(held, cell)
    return window


class FleetCells:
    """A host's own fold plus the windows every other host of the fleet published: the fleet's
    spend. Each other host's windows are replaced whole by what it last published (absolute
    totals, never increments, so a re-publish never counts twice); `others` holds their sum per
    window key. Reads add the two; the own fold stays the only thing a row moves."""

    def __init__(self, own: SpendFold) -> None:
        self.own = own
        self.hosts: dict[str, dict[str, WindowCells]] = {}  # host → window key → cells
        self.others: dict[str, WindowCells] = {}

    def replace(self, host: str, windows: Mapping[str, WindowCells]) -> bool:
        """A host's latest windows (those named); True when any total changed."""
        held = self.hosts.setdefault(host, {})
        changed = [key for key, window in windows.items() if held.get(key) != window]
        for key in changed:
            held[key] = windows[key]
            total = empty_window()
            for host_windows in self.hosts.values():
                window = host_windows.get(key)
                if window is not None:
                    merge_window(total, window)
            self.others[key] = total
        return bool(changed)

    def prune(self, oldest_key: str) -> None:
        for windows in (self.others, *self.hosts.values()):
            for key in [k for k in windows if k < oldest_key]:
                del windows[key]

    def cell(self, window_key: str, dim: Dim, key: Key) -> Cell:
        total = self.own.cell(window_key, dim, key)
        window = self.others.get(window_key)
        held = None if window is None else window[dim].get(key)
        if held is not None:
            add_cell(total, held)
        return total

    def cells(self, window_key: str, dim: Dim) -> dict[Key, Cell]:
        out = self.own.cells(window_key, dim)
        window = self.others.get(window_key)
        for key, held in ({} if window is None else window[dim]).items():
            add_cell(out.setdefault(key, [0.0, 0, 0, 0, 0, 0, 0]), held)
        return out
