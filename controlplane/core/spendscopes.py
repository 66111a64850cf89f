"""Spend read by scope (SPEC §18, §10): a level's cell (`scope_cell`), a row's and a binding's
chain of levels (`scopes_of`, `chain_of`), and the spend view's rows (`spend_entries`).

Pure reads over whatever holds the cells (`SpendCells`: a host's own `SpendFold`, or the fleet's
`FleetCells`). Teams and orgs are summed from their repos under the tenancy the policy holds now
(`TenancyMap`), so a repo that moves team takes its spend with it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import msgspec

from controlplane.core.spend import (
    ATTEMPTS,
    CACHE_CREATION,
    CACHE_READ,
    COST,
    INPUT,
    OUTPUT,
    UNPRICED,
    By,
    Cell,
    Dim,
    Key,
    SpendRow,
    add_cell,
)
from shared.wire import Usage


class SpendCells(Protocol):
    """What every view and budget reads: a host's own `SpendFold`, or `FleetCells`."""

    def cell(self, window_key: str, dim: Dim, key: Key) -> Cell: ...

    def cells(self, window_key: str, dim: Dim) -> dict[Key, Cell]: ...


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
    return Totals(
        cost_usd=usd(cell[COST]),
        attempts=int(cell[ATTEMPTS]),
        unpriced_attempts=int(cell[UNPRICED]),
        usage=_usage_of(cell),
    )


def _usage_of(cell: Cell) -> Usage:
    return Usage(
        input_tokens=int(cell[INPUT]),
        output_tokens=int(cell[OUTPUT]),
        cache_read_tokens=int(cell[CACHE_READ]),
        cache_creation_tokens=int(cell[CACHE_CREATION]),
    )


def _sum(cells: Iterable[Cell]) -> Cell:
    total = [0.0, 0, 0, 0, 0, 0, 0]
    for cell in cells:
        add_cell(total, cell)
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


_KEPT: Mapping[By, Dim] = {
    By.REPO: Dim.REPO,
    By.BINDING: Dim.BINDING,
    By.ACCOUNT: Dim.ACCOUNT,
    By.MODEL: Dim.MODEL,
    By.PRINCIPAL: Dim.PRINCIPAL,
}


def spend_entries(fold: SpendCells, window_key: str, by: By, tenancy: TenancyMap) -> list[SpendEntry]:
    """The spend view's rows: most spent first, then by key."""
    if by in _KEPT:
        grouped = fold.cells(window_key, _KEPT[by])
    else:
        owner = tenancy.team_of.get if by == By.TEAM else tenancy.org_of_repo
        grouped = {}
        for repo, cell in fold.cells(window_key, Dim.REPO).items():
            add_cell(grouped.setdefault(owner(str(repo)), [0.0, 0, 0, 0, 0, 0, 0]), cell)
    entries = [
        SpendEntry(
            key=key,
            cost_usd=usd(cell[COST]),
            attempts=int(cell[ATTEMPTS]),
            unpriced_attempts=int(cell[UNPRICED]),
            usage=_usage_of(cell),
        )
        for key, cell in grouped.items()
    ]
    return sorted(entries, key=lambda e: (-e.cost_usd, -e.attempts, e.key is None, e.key or ""))
