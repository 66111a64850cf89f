"""`BudgetWatch` (SPEC §18) by table: rows and instants in, crossings and gates out — 80 % and
100 % once per crossing per window, a lease refused until the *last* exhausted window of its
chain resets, late rows of a past window ignored — and, seeded, against `exhausted_budgets`
recomputed from the fold after every row."""

from __future__ import annotations

import os
import random
from typing import NamedTuple

import pytest

from controlplane.core.budgets import LevelBudget, exhausted_budgets
from controlplane.core.budgetwatch import NO_CHANGE, BudgetWatch
from controlplane.core.spend import SpendFold
from controlplane.core.spendscopes import TenancyMap
from controlplane.core.windows import Window
from tests.support.ledgerfiles import ms, stamp_of
from tests.support.rows import row

TENANCY = TenancyMap(team_of={"acme/pay": "payments", "acme/ledger": "payments"}, org_of={"payments": "acme"})


def day(level: str, usd: float) -> LevelBudget:
    return LevelBudget(level=level, window=Window.DAY, usd=usd)


def month(level: str, usd: float) -> LevelBudget:
    return LevelBudget(level=level, window=Window.MONTH, usd=usd)


class Spend(NamedTuple):
    at: str  # when control records it (the row finished then, unless `finished`)
    cost: float | None
    repo: str = "acme/pay"
    role: str | None = None
    finished: str | None = None  # a late row: it finished earlier


class Case(NamedTuple):
    name: str
    budgets: tuple[LevelBudget, ...]
    spends: tuple[Spend, ...]
    crossings: list[tuple[str, str, int]]  # (level, window, threshold), in order
    gates: dict[tuple[str, str | None], tuple[bool, str | None]]  # (repo, role) → (budgeted, refused until)


T = "2028-02-28T"
MIDNIGHT = "2028-02-29T00:00:00.000Z"
MONTH_END = "2028-03-01T00:00:00.000Z"
CASES = [
    Case(
        "below 80 %: nothing",
        (day("repo:acme/pay", 1.0),),
        (Spend(T + "10:00:00", 0.5),),
        [],
        {("acme/pay", None): (True, None)},
    ),
    Case(
        "80 % once, then 100 % once",
        (day("repo:acme/pay", 1.0),),
        (
            Spend(T + "10:00:00", 0.5),
            Spend(T + "10:01:00", 0.35),
            Spend(T + "10:02:00", 0.1),
            Spend(T + "10:03:00", 0.1),
            Spend(T + "10:04:00", 0.2),
        ),
        [("repo:acme/pay", "day", 80), ("repo:acme/pay", "day", 100)],
        {("acme/pay", None): (True, MIDNIGHT)},
    ),
    Case(
        "one row past both",
        (day("repo:acme/pay", 1.0),),
        (Spend(T + "10:00:00", 1.5),),
        [("repo:acme/pay", "day", 80), ("repo:acme/pay", "day", 100)],
        {("acme/pay", None): (True, MIDNIGHT)},
    ),
    Case(
        "exactly the budget is exhausted",
        (day("repo:acme/pay", 0.3),),
        (Spend(T + "10:00:00", 0.1), Spend(T + "10:00:01", 0.1), Spend(T + "10:00:02", 0.1)),
        [("repo:acme/pay", "day", 80), ("repo:acme/pay", "day", 100)],
        {("acme/pay", None): (True, MIDNIGHT)},
    ),
    Case(
        "another repo's spend leaves a repo budget alone",
        (day("repo:acme/pay", 1.0),),
        (Spend(T + "10:00:00", 5.0, repo="acme/web"),),
        [],
        {("acme/pay", None): (True, None), ("acme/web", None): (False, None)},
    ),
    Case(
        "a team budget counts its repos and holds each of them",
        (day("team:payments", 1.0),),
        (Spend(T + "10:00:00", 0.6), Spend(T + "10:00:01", 0.5, repo="acme/ledger")),
        [("team:payments", "day", 80), ("team:payments", "day", 100)],
        {("acme/pay", None): (True, MIDNIGHT), ("acme/ledger", "w"): (True, MIDNIGHT), ("solo/x", None): (False, None)},
    ),
    Case(
        "an org budget holds its teams' repos",
        (day("org:acme", 1.0),),
        (Spend(T + "10:00:00", 2.0),),
        [("org:acme", "day", 80), ("org:acme", "day", 100)],
        {("acme/ledger", None): (True, MIDNIGHT), ("solo/x", None): (False, None)},
    ),
    Case(
        "a binding budget holds that role only",
        (day("binding:acme/pay#writer", 1.0),),
        (Spend(T + "10:00:00", 1.0, role="writer"),),
        [("binding:acme/pay#writer", "day", 80), ("binding:acme/pay#writer", "day", 100)],
        {
            ("acme/pay", "writer"): (True, MIDNIGHT),
            ("acme/pay", "reviewer"): (False, None),
            ("acme/pay", None): (False, None),
        },
    ),
    Case(
        "the latest reset among the exhausted: a day inside an exhausted month waits for the month",
        (day("repo:acme/pay", 1.0), month("platform", 1.5)),
        (Spend(T + "10:00:00", 2.0),),
        [
            ("platform", "month", 80),
            ("platform", "month", 100),
            ("repo:acme/pay", "day", 80),
            ("repo:acme/pay", "day", 100),
        ],
        {("acme/pay", None): (True, MONTH_END), ("solo/x", None): (True, MONTH_END)},
    ),
    Case(
        "a platform budget governs everyone",
        (month("platform", 100.0),),
        (Spend(T + "10:00:00", 1.0),),
        [],
        {("solo/x", None): (True, None), ("acme/pay", "r"): (True, None)},
    ),
    Case(
        "an unpriced row spends nothing here",
        (day("repo:acme/pay", 1.0),),
        (Spend(T + "10:00:00", None),),
        [],
        {("acme/pay", None): (True, None)},
    ),
    Case(
        "a late row of yesterday does not count today",
        (day("repo:acme/pay", 1.0),),
        (Spend("2028-02-29T00:10:00", 5.0, finished="2028-02-28T23:59:00"),),
        [],
        {("acme/pay", None): (True, None)},
    ),
    Case(
        "the window resets: the hold lifts, and 80 % is a new crossing",
        (day("repo:acme/pay", 1.0),),
        (Spend(T + "23:00:00", 1.0), Spend("2028-02-29T00:00:01", 0.9)),
        [("repo:acme/pay", "day", 80), ("repo:acme/pay", "day", 100), ("repo:acme/pay", "day", 80)],
        {("acme/pay", None): (True, None)},
    ),
]


def run(case: Case) -> tuple[BudgetWatch, SpendFold, list[tuple[str, str, int]]]:
    fold, watch = SpendFold(), BudgetWatch()
    first = ms(case.spends[0].at) if case.spends else ms(T + "00:00:00")
    assert watch.configure(case.budgets, TENANCY, fold, first).crossings == ()
    seen = []
    for spend in case.spends:
        r = row(stamp_of(ms(spend.finished or spend.at)), repo=spend.repo, role=spend.role, cost=spend.cost)
        fold.add(r)
        change = watch.add(r, fold, ms(spend.at))
        seen += [(c.level, str(c.window), c.threshold) for c in change.crossings]
    return watch, fold, seen


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_budget_watch(case: Case) -> None:
    watch, _, seen = run(case)
    last = ms(case.spends[-1].at)
    assert seen == case.crossings
    for (repo, role), (budgeted, until) in case.gates.items():
        assert watch.gate(repo, role, last) == (budgeted, None if until is None else ms(until.rstrip("Z"))), (
            repo,
            role,
        )


def test_the_gate_lifts_at_the_reset_without_a_reseed() -> None:
    watch, _, _ = run(CASES[1])
    assert watch.gate("acme/pay", None, ms(MIDNIGHT.rstrip("Z")) - 1)[1] == ms(MIDNIGHT.rstrip("Z"))
    assert watch.gate("acme/pay", None, ms(MIDNIGHT.rstrip("Z"))) == (True, None)
    assert watch.exhausted(watch.budgets, ms(MIDNIGHT.rstrip("Z"))) == ()


def test_what_the_mint_is_told() -> None:
    watch, _, _ = run(CASES[8])
    at = ms(T + "10:00:00")
    found = watch.exhausted(watch.on_chain("acme/pay", None), at)
    assert [(e.level, e.window, e.spent_usd) for e in found] == [
        ("platform", Window.MONTH, 2.0),
        ("repo:acme/pay", Window.DAY, 2.0),
    ]
    assert max(e.retry_after_s for e in found) == (ms(MONTH_END.rstrip("Z")) - at) // 1000
    assert watch.exhausted([day("repo:acme/pay", 5.0)], at) == ()  # another amount: not the watched budget
    assert watch.states() == {"ok": 0, "warning": 0, "exhausted": 2}


def test_a_start_knows_what_is_exhausted_and_announces_nothing_again() -> None:
    fold = SpendFold()
    for second in range(3):
        fold.add(row(stamp_of(ms(T + f"10:00:0{second}")), cost=0.5))
    watch = BudgetWatch()
    change = watch.configure((day("repo:acme/pay", 1.0),), TENANCY, fold, ms(T + "11:00:00"), quiet=True)
    assert change.crossings == () and change.gates_changed
    assert watch.gate("acme/pay", None, ms(T + "11:00:00"))[1] == ms(MIDNIGHT.rstrip("Z"))
    later = row(stamp_of(ms(T + "11:00:01")), cost=0.5)
    fold.add(later)
    assert watch.add(later, fold, ms(T + "11:00:01")) is NO_CHANGE


def test_a_changed_amount_is_a_new_budget() -> None:
    fold, watch = SpendFold(), BudgetWatch()
    at = ms(T + "10:00:00")
    watch.configure((day("repo:acme/pay", 1.0),), TENANCY, fold, at)
    first = row(stamp_of(at), cost=0.9)
    fold.add(first)
    assert [c.threshold for c in watch.add(first, fold, at).crossings] == [80]
    assert watch.configure((day("repo:acme/pay", 2.0),), TENANCY, fold, at).crossings == ()  # 45 %
    second = row(stamp_of(at + 1000), cost=0.8)
    fold.add(second)
    assert [(c.threshold, c.usd) for c in watch.add(second, fold, at + 1000).crossings] == [(80, 2.0)]


def test_no_budget_anywhere_costs_one_test() -> None:
    watch = BudgetWatch()
    assert watch.add(row(stamp_of(ms(T + "10:00:00")), cost=5.0), SpendFold(), 0) is NO_CHANGE
    assert watch.gate("acme/pay", "r", 0) == (False, None)


def test_random_rows_agree_with_a_recount_of_the_fold() -> None:
    seed = int(os.environ.get("BUDGET_SEED") or random.randrange(1 << 30))
    print(f"seed={seed}")
    rng = random.Random(seed)
    budgets = (
        day("team:payments", 3.0),
        LevelBudget(level="repo:acme/pay", window=Window.HOUR, usd=0.7),
        month("platform", 25.0),
        day("binding:solo/x#w", 0.5),
        month("org:acme", 12.0),
    )
    fold, watch = SpendFold(), BudgetWatch()
    now = ms("2028-02-28T20:00:00")
    watch.configure(budgets, TENANCY, fold, now)
    for step in range(600):
        now += rng.choice([1000, 60_000, 600_000, 3_600_000])
        finished = now - (rng.randrange(0, 7_200_000) if rng.random() < 0.1 else 0)  # a few arrive late
        r = row(
            stamp_of(finished),
            repo=rng.choice(["acme/pay", "acme/ledger", "solo/x"]),
            role=rng.choice([None, "w"]),
            cost=rng.choice([None, 0.05, 0.2, 0.6]),
        )
        fold.add(r)
        watch.add(r, fold, now)
        if rng.random() < 0.05:
            watch.reseed(fold, now)
        if now >= watch.until_ms:  # an hour ended without a row in a budgeted scope: the tick's reseed
            watch.reseed(fold, now)
        expect = {(e.level, e.window) for e in exhausted_budgets(budgets, fold, TENANCY, now)}
        assert {(e.level, e.window) for e in watch.exhausted(budgets, now)} == expect, f"seed={seed} step={step}"
