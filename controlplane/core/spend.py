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

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Protocol

import msgspec

from controlplane.core.windows import hour_key
from shared.wire import Usage

COST, ATTEMPTS, UNPRICED, INPUT, OUTPUT, CACHE_READ, CACHE_CREATION = range(7)
CELL_SIZE = 7
Cell = list   # [cost_usd, attempts, unpriced_attempts, input, output, cache_read, cache_creation]
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

    finished_at: str | None
    repo_slug: str
    worker_role: str | None
    account_id: str
    served_model: str | None
    requested_model: str | None
    principal_id: str
    cost_usd: float | None
    cost_reason: str | None
    usage: Usage | None


UNPRICED_REASON = "unpriced"   # `CostReason.UNPRICED` as the row spells it


def combo_of(row: SpendRow) -> Combo:
    role = row.worker_role
    return (row.repo_slug, None if role is None else f"{row.repo_slug}#{role}", row.account_id,
            row.served_model or row.requested_model, row.principal_id)


def dim_keys(combo: Combo) -> tuple[tuple[Dim, Key], ...]:
    return ((Dim.PLATFORM, ""), (Dim.REPO, combo[0]), (Dim.BINDING, combo[1]), (Dim.ACCOUNT, combo[2]),
            (Dim.MODEL, combo[3]), (Dim.PRINCIPAL, combo[4]))


def _add(into: Cell, cell: Cell) -> None:
    into[0] += cell[0]
    into[1] += cell[1]
    into[2] += cell[2]
    into[3] += cell[3]
    into[4] += cell[4]
    into[5] += cell[5]
    into[6] += cell[6]


WindowCells = dict[Dim, dict[Key, Cell]]


def _empty_window() -> WindowCells:
    return {dim: {} for dim in DIMS}


def merge_combo(window: WindowCells, combo: Combo, cell: Cell) -> None:
    for dim, key in dim_keys(combo):
        cells = window[dim]
        held = cells.get(key)
        if held is None:
            cells[key] = list(cell)
        else:
            _add(held, cell)


def merge_window(into: WindowCells, window: WindowCells) -> None:
    for dim, cells in window.items():
        target = into[dim]
        for key, cell in cells.items():
            held = target.get(key)
            if held is None:
                target[key] = list(cell)
            else:
                _add(held, cell)


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
        if stamp is None or stamp[:13] != hour or stamp[-1:] != "Z":   # not the hour in progress
            hour = hour_key(stamp)
            if hour is None:
                return False
            if self.open_hour is not None and hour < self.open_hour:
                self._add_late(hour, row)   # a late row of an hour already rolled up
                return True
            self.settle()
            self.open_hour = hour
        role = row.worker_role
        combo = (row.repo_slug, None if role is None else f"{row.repo_slug}#{role}",
                 row.account_id, row.served_model or row.requested_model, row.principal_id)
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
            window = self.windows[key] = _empty_window()
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
            target = window[dim]  # type: ignore[index]  (a Dim is its str; lookups agree)
            held = target.get(key)
            if held is None:
                target[key] = list(cell)
            else:
                _add(held, cell)

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
            rollup = _empty_window()
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
                _add(total, held)
        return total

    def cells(self, window_key: str, dim: Dim) -> dict[Key, Cell]:
        """Copies of every cell of one dimension in the window."""
        out: dict[Key, Cell] = {}
        for source in (self.windows.get(window_key), self._open_cells(window_key)):
            for key, held in ({} if source is None else source[dim]).items():
                _add(out.setdefault(key, [0.0, 0, 0, 0, 0, 0, 0]), held)
        return out

    def summary(self) -> dict[str, WindowCells]:
        """Every window with the open hour rolled in: what a segment summary stores."""
        self.settle()
        return self.windows


# ---- the fleet's spend (SPEC §18, §16) ----------------------------------------------------------

class SpendCells(Protocol):
    """What every view and budget reads: a host's own `SpendFold`, or `FleetCells`."""

    def cell(self, window_key: str, dim: Dim, key: Key) -> Cell: ...

    def cells(self, window_key: str, dim: Dim) -> dict[Key, Cell]: ...


# A window's cells as they travel between hosts: (dimension, key, cell) triples.
Triples = list[tuple[str, Key, Cell]]


def window_triples(fold: SpendFold, window_key: str) -> Triples:
    """One window of a fold (the open hour rolled in), as triples."""
    return [(str(dim), key, cell) for dim in DIMS for key, cell in fold.cells(window_key, dim).items()]


def window_of(triples: Iterable[tuple[str, Key, Cell]]) -> WindowCells:
    window = _empty_window()
    for dim, key, cell in triples:
        cells = window.get(dim)  # type: ignore[call-overload]  (a Dim is its str)
        if cells is not None:
            held = cells.get(key)
            if held is None:
                cells[key] = [float(cell[0])] + [int(v) for v in cell[1:CELL_SIZE]]
            else:
                _add(held, cell)
    return window


class FleetCells:
    """A host's own fold plus the windows every other host of the fleet published: the fleet's
    spend. Each other host's windows are replaced whole by what it last published (absolute
    totals, never increments, so a re-publish never counts twice); `others` holds their sum per
    window key. Reads add the two; the own fold stays the only thing a row moves."""

    def __init__(self, own: SpendFold) -> None:
        self.own = own
        self.hosts: dict[str, dict[str, WindowCells]] = {}   # host → window key → cells
        self.others: dict[str, WindowCells] = {}

    def replace(self, host: str, windows: Mapping[str, WindowCells]) -> bool:
        """A host's latest windows (those named); True when any total changed."""
        held = self.hosts.setdefault(host, {})
        changed = [key for key, window in windows.items() if held.get(key) != window]
        for key in changed:
            held[key] = windows[key]
            total = _empty_window()
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
            _add(total, held)
        return total

    def cells(self, window_key: str, dim: Dim) -> dict[Key, Cell]:
        out = self.own.cells(window_key, dim)
        window = self.others.get(window_key)
        for key, held in ({} if window is None else window[dim]).items():
            _add(out.setdefault(key, [0.0, 0, 0, 0, 0, 0, 0]), held)
        return out


# ---- views over the fold ---------------------------------------------------------------------

class TenancyMap(msgspec.Struct, frozen=True, kw_only=True):
    """The policy's tenancy (SPEC §10): repo → team, team → org."""

    team_of: dict[str, str] = {}
    org_of: dict[str, str] = {}

    def org_of_repo(self, repo: str) -> str | None:
        team = self.team_of.get(repo)
        return None if team is None else self.org_of.get(team)


class Totals(msgspec.Struct, frozen=True, kw_only=True):
    cost_usd: float
    attempts: int
    unpriced_attempts: int
    usage: Usage


class SpendEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One row of the spend view: `key` null gathers what has none (no team, no role, no model)."""

    key: str | None
    cost_usd: float
    attempts: int
    unpriced_attempts: int
    usage: Usage


def usd(value: float) -> float:
    """Costs are priced to 8 decimals (`core.pricing`); sums are shown the same way."""
    return round(value, 8) + 0.0


def totals_of(cell: Cell) -> Totals:
    return Totals(cost_usd=usd(cell[COST]), attempts=int(cell[ATTEMPTS]), unpriced_attempts=int(cell[UNPRICED]),
                  usage=_usage_of(cell))


def _usage_of(cell: Cell) -> Usage:
    return Usage(input_tokens=int(cell[INPUT]), output_tokens=int(cell[OUTPUT]),
                 cache_read_tokens=int(cell[CACHE_READ]), cache_creation_tokens=int(cell[CACHE_CREATION]))


def _sum(cells: Iterable[Cell]) -> Cell:
    total = [0.0, 0, 0, 0, 0, 0, 0]
    for cell in cells:
        _add(total, cell)
    return total


def scope_cell(fold: SpendCells, label: str, window_key: str, tenancy: TenancyMap) -> Cell:
    """The spend of one scope — a level label (`platform`, `org:<id>`, `team:<id>`,
    `repo:<slug>`, `binding:<slug>#<role>`) — in one window."""
    kind, _, name = label.partition(":")
    if label == "platform":
        return fold.cell(window_key, Dim.PLATFORM, "")
    if kind == "repo":
        return fold.cell(window_key, Dim.REPO, name)
    if kind == "binding":
        return fold.cell(window_key, Dim.BINDING, name)
    repos = fold.cells(window_key, Dim.REPO)
    if kind == "team":
        return _sum(cell for repo, cell in repos.items() if tenancy.team_of.get(str(repo)) == name)
    if kind == "org":
        return _sum(cell for repo, cell in repos.items() if tenancy.org_of_repo(str(repo)) == name)
    return [0.0, 0, 0, 0, 0, 0, 0]


def scopes_of(row: SpendRow, tenancy: TenancyMap) -> tuple[str, ...]:
    """Every scope a row spends in, least → most specific (the level labels of its chain)."""
    return chain_of(row.repo_slug, row.worker_role, tenancy)


def chain_of(repo: str, role: str | None, tenancy: TenancyMap) -> tuple[str, ...]:
    """The level labels of a (repo, role)'s chain, least → most specific: every scope its
    attempts spend in, and every level whose budget governs its leases."""
    team = tenancy.team_of.get(repo)
    org = None if team is None else tenancy.org_of.get(team)
    labels = ["platform"]
    labels += [f"org:{org}"] if org is not None else []
    labels += [f"team:{team}"] if team is not None else []
    labels.append(f"repo:{repo}")
    labels += [f"binding:{repo}#{role}"] if role is not None else []
    return tuple(labels)


_KEPT: Mapping[By, Dim] = {By.REPO: Dim.REPO, By.BINDING: Dim.BINDING, By.ACCOUNT: Dim.ACCOUNT,
                           By.MODEL: Dim.MODEL, By.PRINCIPAL: Dim.PRINCIPAL}


def spend_entries(fold: SpendCells, window_key: str, by: By, tenancy: TenancyMap) -> list[SpendEntry]:
    """The spend view's rows: most spent first, then by key."""
    if by in _KEPT:
        grouped = fold.cells(window_key, _KEPT[by])
    else:
        owner = tenancy.team_of.get if by == By.TEAM else tenancy.org_of_repo
        grouped = {}
        for repo, cell in fold.cells(window_key, Dim.REPO).items():
            _add(grouped.setdefault(owner(str(repo)), [0.0, 0, 0, 0, 0, 0, 0]), cell)
    entries = [SpendEntry(key=key, cost_usd=usd(cell[COST]), attempts=int(cell[ATTEMPTS]),
                          unpriced_attempts=int(cell[UNPRICED]), usage=_usage_of(cell))
               for key, cell in grouped.items()]
    return sorted(entries, key=lambda e: (-e.cost_usd, -e.attempts, e.key is None, e.key or ""))
