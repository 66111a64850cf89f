"""Spend accounting (SPEC §18): a fold over terminal attempt rows, per UTC window, per dimension.

Pure: no I/O, no clock; windows come from each row's `finished_at` (`core.windows`). Spend is
the sum of `cost_usd`; a row whose cost is null *because its model has no price* (it has usage)
or *because a served answer carried no usage* (`cost_reason` `unpriced`, SPEC §19) is counted in
`unpriced_attempts`, never as 0 spend; any other row without usage (a refusal, a failure before
any token) is an attempt that cost nothing. Token sums add
the row's `usage`.

What the fold keeps, per window key (`core.windows`): cells for the platform, each repo, each
binding (`repo#role`), account, model (served, else requested: the priced one) and principal.
Teams and orgs are not kept: a team's spend is its repos' and an org's its teams' repos', summed
at read time under the tenancy the policy holds *now* (`TenancyMap`), so a repo that moves team
takes its spend with it, and a rebuilt book and a running one always agree.

A cell is a 7-slot list (`COST`, `ATTEMPTS`, `UNPRICED`, then the four token kinds) rather than a
Struct: the fold runs for every recorded row, and the hot path is one dict lookup and seven
additions — rows of the hour in progress go to one cell per distinct (repo, binding, account,
model, principal) tuple (`fine`), which is rolled into the per-dimension cells of its hour, day
and month only when a row of a later hour arrives or a summary is taken. Reads never mutate.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Protocol

from controlplane.core.windows import hour_key
from shared.wire import Usage

COST, ATTEMPTS, UNPRICED, INPUT, OUTPUT, CACHE_READ, CACHE_CREATION = range(7)
CELL_SIZE = 7
Cell = list[float]  # [cost_usd, attempts, unpriced_attempts, input, output, cache_read, cache_creation]
Key = str | None


class Dim(StrEnum):
    """What the fold keeps per window (the platform's one cell has the key "")."""

    PLATFORM = "platform"
    REPO = "repo"
    BINDING = "binding"
    ACCOUNT = "account"
    MODEL = "model"
    PRINCIPAL = "principal"


class By(StrEnum):
    """What the spend view groups by (`?by=`): the kept dimensions, plus team and org."""

    REPO = "repo"
    TEAM = "team"
    ORG = "org"
    ACCOUNT = "account"
    MODEL = "model"
    PRINCIPAL = "principal"
    BINDING = "binding"


DIMS = tuple(Dim)
# A `Combo` is (repo, binding, account, model, principal): the key of `Dim` i + 1 at index i.
Combo = tuple[str, Key, str, Key, str]


class SpendRow(Protocol):
    """The row fields the fold reads: an `AttemptRow`, or the ledger's lighter decoding of one."""

    # Read-only (properties), so frozen Structs conform.
    @property
    def finished_at(self) -> str | None: ...
    @property
    def repo_slug(self) -> str: ...
    @property
    def worker_role(self) -> str | None: ...
    @property
    def account_id(self) -> str: ...
    @property
    def served_model(self) -> str | None: ...
    @property
    def requested_model(self) -> str | None: ...
    @property
    def principal_id(self) -> str: ...
    @property
    def cost_usd(self) -> float | None: ...
    @property
    def cost_reason(self) -> str | None: ...
    @property
    def usage(self) -> Usage | None: ...


UNPRICED_REASON = "unpriced"  # `CostReason.UNPRICED` as the row spells it


def combo_of(row: SpendRow) -> Combo:
    role = row.worker_role
    return (
        row.repo_slug,
        None if role is None else f"{row.repo_slug}#{role}",
        row.account_id,
        row.served_model or row.requested_model,
        row.principal_id,
    )


def dim_keys(combo: Combo) -> tuple[tuple[Dim, Key], ...]:
    return (
        (Dim.PLATFORM, ""),
        (Dim.REPO, combo[0]),
        (Dim.BINDING, combo[1]),
        (Dim.ACCOUNT, combo[2]),
        (Dim.MODEL, combo[3]),
        (Dim.PRINCIPAL, combo[4]),
    )


def add_cell(into: Cell, cell: Cell) -> None:
    into[0] += cell[0]
    into[1] += cell[1]
    into[2] += cell[2]
    into[3] += cell[3]
    into[4] += cell[4]
    into[5] += cell[5]
    into[6] += cell[6]


WindowCells = dict[Dim, dict[Key, Cell]]


def empty_window() -> WindowCells:
    return {dim: {} for dim in DIMS}


def merge_combo(window: WindowCells, combo: Combo, cell: Cell) -> None:
    for dim, key in dim_keys(combo):
        cells = window[dim]
        held = cells.get(key)
        if held is None:
            cells[key] = list(cell)
        else:
            add_cell(held, cell)


def merge_window(into: WindowCells, window: WindowCells) -> None:
    for dim, cells in window.items():
        target = into[dim]
        for key, cell in cells.items():
            held = target.get(key)
            if held is None:
                target[key] = list(cell)
            else:
                add_cell(held, cell)


class SpendFold:
    """Every window's cells; `add` one row, `merge` a summary's cell, read with `cell` / `cells`."""

    def __init__(self) -> None:
        self.open_hour: str | None = None
        self.fine: dict[Combo, Cell] = {}
        self.windows: dict[str, WindowCells] = {}
        self.rows = 0
        self._fine_rollup: WindowCells | None = None

    def add(self, row: SpendRow) -> bool:
        """Account one terminal row; False (nothing counted) when its `finished_at` is no instant."""
        stamp = row.finished_at
        hour = self.open_hour
        if stamp is None or stamp[:13] != hour or stamp[-1:] != "Z":  # not the hour in progress
            hour = hour_key(stamp)
            if hour is None:
                return False
            if self.open_hour is not None and hour < self.open_hour:
                self._add_late(hour, row)  # a late row of an hour already rolled up
                return True
            self.settle()
            self.open_hour = hour
        role = row.worker_role
        combo = (
            row.repo_slug,
            None if role is None else f"{row.repo_slug}#{role}",
            row.account_id,
            row.served_model or row.requested_model,
            row.principal_id,
        )
        cell = self.fine.get(combo)
        if cell is None:
            cell = self.fine[combo] = [0.0, 0, 0, 0, 0, 0, 0]
        self._fine_rollup = None
        self.rows += 1
        # what `_count` does, inline: this is the per-row path
        cell[1] += 1
        usage, cost = row.usage, row.cost_usd
        if cost is not None:
            cell[0] += cost
        elif usage is not None or row.cost_reason == UNPRICED_REASON:
            cell[2] += 1
        if usage is not None:
            cell[3] += usage.input_tokens
            cell[4] += usage.output_tokens
            cell[5] += usage.cache_read_tokens
            cell[6] += usage.cache_creation_tokens
        return True

    def _add_late(self, hour: str, row: SpendRow) -> None:
        cell = [0.0, 0, 0, 0, 0, 0, 0]
        self._count(cell, row)
        for key in (hour, hour[:10], hour[:7]):
            merge_combo(self._window(key), combo_of(row), cell)
        self.rows += 1

    @staticmethod
    def _count(cell: Cell, row: SpendRow) -> None:
        cell[ATTEMPTS] += 1
        usage = row.usage
        if row.cost_usd is not None:
            cell[COST] += row.cost_usd
        elif usage is not None or row.cost_reason == UNPRICED_REASON:
            cell[UNPRICED] += 1
        if usage is not None:
            cell[INPUT] += usage.input_tokens
            cell[OUTPUT] += usage.output_tokens
            cell[CACHE_READ] += usage.cache_read_tokens
            cell[CACHE_CREATION] += usage.cache_creation_tokens

    def _window(self, key: str) -> WindowCells:
        window = self.windows.get(key)
        if window is None:
            window = self.windows[key] = empty_window()
        return window

    def settle(self) -> None:
        """Roll the open hour's cells into its hour, day and month (a read never needs this):
        once per dimension and combination, then once per dimension's key and window."""
        rolled = self._rolled_fine()
        if rolled is not None and self.open_hour is not None:
            hour = self.open_hour
            for key in (hour, hour[:10], hour[:7]):
                merge_window(self._window(key), rolled)
        self.fine = {}
        self._fine_rollup = None

    def merge(self, window_key: str, cells: Iterable[tuple[str, Key, Cell]]) -> None:
        """Add cells of a summary, `(dimension, key, cell)`, to the window `window_key`."""
        window = self._window(window_key)
        for dim, key, cell in cells:
            target = window[dim]  # type: ignore[index]  # a Dim is its str; lookups agree
            held = target.get(key)
            if held is None:
                target[key] = list(cell)
            else:
                add_cell(held, cell)

    def prune(self, oldest_key: str) -> None:
        """Forget every window that ends before the one `oldest_key` names (a month key keeps that
        month and everything after it: keys of one instant sort hour > day > month)."""
        if self.open_hour is not None and self.open_hour < oldest_key:
            self.fine, self.open_hour, self._fine_rollup = {}, None, None
        for key in [k for k in self.windows if k < oldest_key]:
            del self.windows[key]

    # ---- reads ----------------------------------------------------------------------------

    def _rolled_fine(self) -> WindowCells | None:
        """The open hour's cells per dimension (kept until the next row changes them)."""
        if not self.fine:
            return None
        if self._fine_rollup is None:
            rollup = empty_window()
            for combo, cell in self.fine.items():
                merge_combo(rollup, combo, cell)
            self._fine_rollup = rollup
        return self._fine_rollup

    def _open_cells(self, window_key: str) -> WindowCells | None:
        if self.open_hour is None or not self.open_hour.startswith(window_key):
            return None
        return self._rolled_fine()

    def cell(self, window_key: str, dim: Dim, key: Key) -> Cell:
        """A copy of one cell of the window (zeros when nothing was counted)."""
        total = [0.0, 0, 0, 0, 0, 0, 0]
        for source in (self.windows.get(window_key), self._open_cells(window_key)):
            held = None if source is None else source[dim].get(key)
            if held is not None:
                add_cell(total, held)
        return total

    def cells(self, window_key: str, dim: Dim) -> dict[Key, Cell]:
        """Copies of every cell of one dimension in the window."""
        out: dict[Key, Cell] = {}
        for source in (self.windows.get(window_key), self._open_cells(window_key)):
            for key, held in ({} if source is None else source[dim]).items():
                add_cell(out.setdefault(key, [0.0, 0, 0, 0, 0, 0, 0]), held)
        return out

    def summary(self) -> dict[str, WindowCells]:
        """Every window with the open hour rolled in: what a segment summary stores."""
        self.settle()
        return self.windows
