"""The fleet's spend as views and budgets read it (SPEC §18 "Fleet mode"): a host's own fold
plus the windows every other host last published, each host's replaced whole (`FleetCells`)."""

from __future__ import annotations

import pytest

from controlplane.core.budgets import LevelBudget, exhausted_budgets
from controlplane.core.fleetcells import FleetCells, window_of, window_triples
from controlplane.core.spend import COST, By, Dim, SpendFold
from controlplane.core.spendscopes import TenancyMap, scope_cell, spend_entries
from controlplane.core.windows import Window
from tests.support.rows import row

HOUR, DAY, MONTH = "2026-12-01T10", "2026-12-01", "2026-12"
AT = "2026-12-01T10:15:00.000Z"
AT_MS = 1_796_119_200_000 + 15 * 60_000  # 2026-12-01T10:15Z
TENANCY = TenancyMap(team_of={"acme/pay": "payments", "acme/web": "web"}, org_of={"payments": "acme", "web": "acme"})


def fold_of(*rows) -> SpendFold:
    fold = SpendFold()
    for r in rows:
        fold.add(r)
    return fold


def published(fold: SpendFold, *keys: str) -> dict:
    """What a host publishes: each window as triples, as they travel (through `window_of`)."""
    return {key: window_of(window_triples(fold, key)) for key in keys}


def test_a_window_survives_the_trip_between_hosts() -> None:
    fold = fold_of(row(AT, cost=0.25, role="reviewer"), row(AT, repo="acme/web", model=None, cost=None))
    window = published(fold, HOUR)[HOUR]
    for dim in Dim:
        assert window[dim] == fold.cells(HOUR, dim)


@pytest.mark.parametrize(
    "own, others, label, spent",
    [
        ((0.5,), (), "platform", 0.5),  # embedded-like: own only
        ((0.5,), ((0.25,),), "platform", 0.75),  # one other host
        ((), ((0.25, 0.25), (1.0,)), "platform", 1.5),  # two others, nothing here
        ((0.5,), ((0.25,),), "team:payments", 0.75),  # teams sum repos at read time
        ((0.5,), ((0.25,),), "org:acme", 0.75),
        ((0.5,), ((0.25,),), "repo:acme/web", 0.0),
    ],
)
def test_a_scope_spends_what_every_host_spent(own, others, label, spent) -> None:
    cells = FleetCells(fold_of(*(row(AT, cost=c) for c in own)))
    for n, costs in enumerate(others):
        cells.replace(f"h{n}", published(fold_of(*(row(AT, cost=c) for c in costs)), HOUR, DAY, MONTH))
    for key in (HOUR, DAY, MONTH):
        assert scope_cell(cells, label, key, TENANCY)[COST] == pytest.approx(spent)


def test_a_republish_replaces_never_adds() -> None:
    cells = FleetCells(SpendFold())
    other = fold_of(row(AT, cost=0.5))
    assert cells.replace("h2", published(other, HOUR, DAY, MONTH)) is True
    assert cells.replace("h2", published(other, HOUR, DAY, MONTH)) is False  # the same totals again
    other.add(row(AT, cost=0.25))
    assert cells.replace("h2", published(other, HOUR)) is True  # only the hour moved
    assert cells.cell(HOUR, Dim.PLATFORM, "")[COST] == pytest.approx(0.75)
    assert cells.cell(DAY, Dim.PLATFORM, "")[COST] == pytest.approx(0.5)  # not re-published yet
    assert cells.own.cell(HOUR, Dim.PLATFORM, "")[COST] == 0  # the own fold is untouched


def test_reads_merge_keys_across_hosts_and_the_views_agree() -> None:
    cells = FleetCells(fold_of(row(AT, account="a1", cost=0.5)))
    cells.replace("h2", published(fold_of(row(AT, account="a1", cost=0.25), row(AT, account="a2", cost=1.0)), MONTH))
    assert {k: c[COST] for k, c in cells.cells(MONTH, Dim.ACCOUNT).items()} == {"a1": 0.75, "a2": 1.0}
    entries = spend_entries(cells, MONTH, By.ACCOUNT, TENANCY)
    assert [(e.key, e.cost_usd, e.attempts) for e in entries] == [("a2", 1.0, 1), ("a1", 0.75, 2)]


def test_a_budget_exhausted_by_another_host_is_exhausted_here() -> None:
    budget = LevelBudget(level="team:payments", window=Window.DAY, usd=1.0)
    cells = FleetCells(fold_of(row(AT, cost=0.5)))
    assert exhausted_budgets((budget,), cells, TENANCY, AT_MS) == ()
    cells.replace("h2", published(fold_of(row(AT, cost=0.5)), DAY))
    (held,) = exhausted_budgets((budget,), cells, TENANCY, AT_MS)
    assert held.spent_usd == 1.0


def test_prune_forgets_earlier_months_of_every_host() -> None:
    cells = FleetCells(SpendFold())
    cells.replace(
        "h2", published(fold_of(row("2026-11-30T23:59:00.000Z", cost=1.0), row(AT, cost=0.5)), "2026-11", MONTH)
    )
    cells.prune(MONTH)
    assert set(cells.others) == {MONTH} and set(cells.hosts["h2"]) == {MONTH}
