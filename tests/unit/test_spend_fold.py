"""The spend fold by table (SPEC §18): UTC windows, the scope chain, unpriced rows, budgets.

Each case folds its rows and asserts `(cost_usd, attempts, unpriced_attempts)` of scopes in
windows; a seeded random test checks the fold, rows in any order, against a plain recount.
"""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime
from typing import NamedTuple

import msgspec
import pytest

from controlplane.core.budgets import LevelBudget, budget_status, exhausted_budgets, retry_after_s
from controlplane.core.spend import By, Dim, SpendFold
from controlplane.core.spendscopes import TenancyMap, scope_cell, scopes_of, spend_entries, totals_of
from controlplane.core.windows import Window
from tests.support.rows import row

TENANCY = TenancyMap(
    team_of={"acme/pay": "payments", "acme/ledger": "payments", "acme/web": "web"},
    org_of={"payments": "acme", "web": "acme"},
)
Seen = tuple[float, int, int]  # cost_usd, attempts, unpriced_attempts


def ms(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp).replace(tzinfo=UTC).timestamp() * 1000)


def fold(rows) -> SpendFold:
    book = SpendFold()
    for r in rows:
        book.add(r)
    return book


def seen(book: SpendFold, window_key: str, scope: str, tenancy: TenancyMap = TENANCY) -> Seen:
    t = totals_of(scope_cell(book, scope, window_key, tenancy))
    return t.cost_usd, t.attempts, t.unpriced_attempts


class Case(NamedTuple):
    name: str
    given: list
    expect: dict[tuple[str, str], Seen]  # (window key, scope) → seen


CASES = [
    Case(
        "either side of UTC midnight: two days, two hours, one month",
        [row("2026-11-29T23:59:59.999Z", cost=1.0), row("2026-11-30T00:00:00.000Z", cost=2.0)],
        {
            ("2026-11-29", "platform"): (1.0, 1, 0),
            ("2026-11-30", "platform"): (2.0, 1, 0),
            ("2026-11-29T23", "platform"): (1.0, 1, 0),
            ("2026-11-30T00", "platform"): (2.0, 1, 0),
            ("2026-11", "platform"): (3.0, 2, 0),
        },
    ),
    Case(
        "either side of a month's end",
        [
            row("2026-11-30T23:59:59.999Z", cost=1.0),
            row("2026-12-01T00:00:00.000Z", cost=2.0),
            row("2026-12-31T23:59:59.999Z", cost=4.0),
            row("2027-01-01T00:00:00.000Z", cost=8.0),
        ],
        {
            ("2026-11", "platform"): (1.0, 1, 0),
            ("2026-12", "platform"): (6.0, 2, 0),
            ("2027-01", "platform"): (8.0, 1, 0),
            ("2026-12-31", "platform"): (4.0, 1, 0),
        },
    ),
    Case(
        "the leap day is its own day in February",
        [
            row("2028-02-28T12:00:00.000Z", cost=1.0),
            row("2028-02-29T00:00:00.000Z", cost=2.0),
            row("2028-02-29T23:59:59.999Z", cost=4.0),
            row("2028-03-01T00:00:00.000Z", cost=8.0),
        ],
        {
            ("2028-02-29", "platform"): (6.0, 2, 0),
            ("2028-02", "platform"): (7.0, 3, 0),
            ("2028-03", "platform"): (8.0, 1, 0),
            ("2028-03-01", "platform"): (8.0, 1, 0),
        },
    ),
    Case(
        "an offset stamp counts in its UTC window",
        [row("2026-12-01T01:30:00+02:00", cost=1.0)],
        {("2026-11-30", "platform"): (1.0, 1, 0), ("2026-12", "platform"): (0.0, 0, 0)},
    ),
    Case(
        "cumulative levels: a binding's row spends in every scope of its chain",
        [row("2026-11-30T10:00:00.000Z", role="reviewer", cost=1.5)],
        {
            ("2026-11-30", s): (1.5, 1, 0)
            for s in ("platform", "org:acme", "team:payments", "repo:acme/pay", "binding:acme/pay#reviewer")
        },
    ),
    Case(
        "a team sums its repos, an org its teams, the platform everything",
        [
            row("2026-11-30T10:00:00.000Z", repo="acme/pay", cost=1.0),
            row("2026-11-30T10:05:00.000Z", repo="acme/ledger", cost=2.0),
            row("2026-11-30T10:06:00.000Z", repo="acme/web", cost=4.0),
            row("2026-11-30T10:07:00.000Z", repo="solo/x", cost=8.0),
        ],
        {
            ("2026-11-30", "team:payments"): (3.0, 2, 0),
            ("2026-11-30", "team:web"): (4.0, 1, 0),
            ("2026-11-30", "org:acme"): (7.0, 3, 0),
            ("2026-11-30", "platform"): (15.0, 4, 0),
            ("2026-11-30", "repo:solo/x"): (8.0, 1, 0),
            ("2026-11-30", "team:none"): (0.0, 0, 0),
        },
    ),
    Case(
        "roles are separate bindings of one repo",
        [
            row("2026-11-30T10:00:00.000Z", role="reviewer", cost=1.0),
            row("2026-11-30T10:00:00.000Z", role="writer", cost=2.0),
            row("2026-11-30T10:00:00.000Z", cost=4.0),
        ],
        {
            ("2026-11-30", "binding:acme/pay#reviewer"): (1.0, 1, 0),
            ("2026-11-30", "binding:acme/pay#writer"): (2.0, 1, 0),
            ("2026-11-30", "repo:acme/pay"): (7.0, 3, 0),
        },
    ),
    Case(
        "a priced model's null cost is unpriced, never 0 spend",
        [
            row("2026-11-30T10:00:00.000Z", cost=None, model="claude-house-1"),
            row("2026-11-30T10:01:00.000Z", cost=0.25),
        ],
        {("2026-11-30T10", "repo:acme/pay"): (0.25, 2, 1), ("2026-11", "team:payments"): (0.25, 2, 1)},
    ),
    Case(
        "a row without usage is an attempt that cost nothing",
        [row("2026-11-30T10:00:00.000Z", cost=None, usage=None, status="refused")],
        {("2026-11-30", "platform"): (0.0, 1, 0)},
    ),
    Case(
        "a served row without usage is unpriced (SPEC §19), never 0 spend in silence",
        [
            msgspec.structs.replace(row("2026-11-30T10:00:00.000Z", cost=None, usage=None), cost_reason="unpriced"),
            msgspec.structs.replace(
                row("2026-11-30T10:00:01.000Z", cost=None, usage=None),
                cost_reason="unpriced",
                finished_at="2026-11-30T10:00:01.000Z",
            ),
            row("2026-11-30T10:01:00.000Z", cost=0.25),
        ],
        {("2026-11-30T10", "repo:acme/pay"): (0.25, 3, 2), ("2026-11", "platform"): (0.25, 3, 2)},
    ),
    Case(
        "a late served row without usage is unpriced too",
        [
            row("2026-11-30T11:00:00.000Z", cost=1.0),
            msgspec.structs.replace(row("2026-11-30T10:00:00.000Z", cost=None, usage=None), cost_reason="unpriced"),
        ],
        {("2026-11-30T10", "platform"): (0.0, 1, 1), ("2026-11-30", "platform"): (1.0, 2, 1)},
    ),
    Case(
        "a late row lands in its own (already rolled) hour",
        [
            row("2026-11-30T10:59:00.000Z", cost=1.0),
            row("2026-11-30T11:00:01.000Z", cost=2.0),
            row("2026-11-30T10:59:59.000Z", cost=4.0),
            row("2026-11-30T11:30:00.000Z", cost=8.0),
        ],
        {
            ("2026-11-30T10", "platform"): (5.0, 2, 0),
            ("2026-11-30T11", "platform"): (10.0, 2, 0),
            ("2026-11-30", "repo:acme/pay"): (15.0, 4, 0),
        },
    ),
    Case(
        "a row whose finished_at is no instant counts nowhere",
        [row("not-a-time", cost=1.0), row("2026-11-30T10:00:00.000Z", cost=2.0)],
        {("2026-11-30", "platform"): (2.0, 1, 0)},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fold(case: Case) -> None:
    book = fold(case.given)
    assert {k: seen(book, *k) for k in case.expect} == case.expect
    book.settle()  # rolling the open hour changes no answer
    assert {k: seen(book, *k) for k in case.expect} == case.expect


def test_token_sums_and_dimensions() -> None:
    book = fold(
        [
            row("2026-11-30T10:00:00.000Z", usage=(10, 20, 30, 40), account="a", model="m1", principal="p"),
            row(
                "2026-11-30T10:00:01.000Z", usage=(1, 2, 3, 4), account="b", model="m1", principal="p", role="reviewer"
            ),
            row("2026-11-30T10:00:02.000Z", usage=None, cost=None, account="b", model=None, principal="q"),
        ]
    )
    entries = {e.key: e for e in spend_entries(book, "2026-11-30", By.MODEL, TENANCY)}
    assert set(entries) == {"m1", None}
    usage = entries["m1"].usage
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_creation_tokens) == (
        11,
        22,
        33,
        44,
    )
    assert [(e.key, e.attempts) for e in spend_entries(book, "2026-11-30", By.ACCOUNT, TENANCY)] == [("b", 2), ("a", 1)]
    assert {e.key for e in spend_entries(book, "2026-11-30", By.PRINCIPAL, TENANCY)} == {"p", "q"}
    assert {e.key: e.attempts for e in spend_entries(book, "2026-11-30", By.BINDING, TENANCY)} == {
        "acme/pay#reviewer": 1,
        None: 2,
    }
    assert [(e.key, e.cost_usd) for e in spend_entries(book, "2026-11-30", By.TEAM, TENANCY)] == [("payments", 1.0)]
    assert spend_entries(book, "2026-11-29", By.REPO, TENANCY) == []


def test_team_and_org_views_follow_the_tenancy_of_now() -> None:
    book = fold(
        [
            row("2026-11-30T10:00:00.000Z", repo="acme/pay", cost=1.0),
            row("2026-11-30T10:00:00.000Z", repo="solo/x", cost=2.0),
        ]
    )
    assert [(e.key, e.cost_usd) for e in spend_entries(book, "2026-11", By.TEAM, TENANCY)] == [
        (None, 2.0),
        ("payments", 1.0),
    ]
    moved = TenancyMap(team_of={"acme/pay": "web", "solo/x": "web"}, org_of={"web": "globex"})
    assert [(e.key, e.cost_usd) for e in spend_entries(book, "2026-11", By.ORG, moved)] == [("globex", 3.0)]
    assert seen(book, "2026-11", "team:payments", moved) == (0.0, 0, 0)


def test_the_scopes_of_a_row() -> None:
    assert scopes_of(row("2026-11-30T10:00:00.000Z", role="reviewer"), TENANCY) == (
        "platform",
        "org:acme",
        "team:payments",
        "repo:acme/pay",
        "binding:acme/pay#reviewer",
    )
    assert scopes_of(row("2026-11-30T10:00:00.000Z", repo="solo/x"), TENANCY) == ("platform", "repo:solo/x")


def test_prune_keeps_the_month_and_after() -> None:
    book = fold([row("2026-10-31T23:00:00.000Z"), row("2026-11-01T00:00:00.000Z"), row("2026-11-30T10:00:00.000Z")])
    book.prune("2026-11")
    assert sorted(book.windows) == ["2026-11", "2026-11-01", "2026-11-01T00"] and book.open_hour == "2026-11-30T10"
    assert seen(book, "2026-11", "platform")[1] == 2 and seen(book, "2026-10", "platform")[1] == 0


# ---- budgets against the fold ----------------------------------------------------------------


class BudgetCase(NamedTuple):
    name: str
    given: list
    budgets: list[LevelBudget]
    at: str
    expect: list[tuple[str, str, float, float, bool, float]]  # level, window, spent, remaining, exhausted, overshoot


DAY_ROWS = [
    row("2026-11-30T09:00:00.000Z", repo="acme/pay", cost=40.0),
    row("2026-11-30T10:00:00.000Z", repo="acme/ledger", cost=20.0),
]
BUDGETS = [
    BudgetCase(
        "a team's budget holds over its repo's larger one",
        DAY_ROWS,
        [
            LevelBudget(level="team:payments", window=Window.DAY, usd=50),
            LevelBudget(level="repo:acme/pay", window=Window.DAY, usd=100),
        ],
        "2026-11-30T12:00:00",
        [("team:payments", "day", 60.0, 0.0, True, 10.0), ("repo:acme/pay", "day", 40.0, 60.0, False, 0.0)],
    ),
    BudgetCase(
        "reaching the budget exactly is exhausted",
        DAY_ROWS,
        [LevelBudget(level="repo:acme/ledger", window=Window.DAY, usd=20)],
        "2026-11-30T12:00:00",
        [("repo:acme/ledger", "day", 20.0, 0.0, True, 0.0)],
    ),
    BudgetCase(
        "yesterday's spend is not today's",
        DAY_ROWS,
        [
            LevelBudget(level="platform", window=Window.DAY, usd=50),
            LevelBudget(level="platform", window=Window.MONTH, usd=50),
        ],
        "2026-12-01T00:00:00",
        [("platform", "day", 0.0, 50.0, False, 0.0), ("platform", "month", 0.0, 50.0, False, 0.0)],
    ),
    BudgetCase(
        "an hour budget sees its hour only",
        DAY_ROWS,
        [LevelBudget(level="org:acme", window=Window.HOUR, usd=30)],
        "2026-11-30T10:59:59.999",
        [("org:acme", "hour", 20.0, 10.0, False, 0.0)],
    ),
]


@pytest.mark.parametrize("case", BUDGETS, ids=[c.name for c in BUDGETS])
def test_budget_status(case: BudgetCase) -> None:
    book = fold(case.given)
    got = [budget_status(b, book, TENANCY, ms(case.at)) for b in case.budgets]
    assert [
        (s.level, str(s.window), s.spent_usd, s.remaining_usd, s.exhausted, s.overshoot_usd) for s in got
    ] == case.expect


def test_exhausted_budgets_say_when_each_window_resets() -> None:
    book = fold(DAY_ROWS + [row("2026-11-30T11:00:00.000Z", repo="acme/pay", cost=None, model="x")])
    chain = [
        LevelBudget(level="platform", window=Window.MONTH, usd=55),
        LevelBudget(level="team:payments", window=Window.DAY, usd=50),
        LevelBudget(level="repo:acme/pay", window=Window.DAY, usd=100),
    ]
    at = ms("2026-11-30T23:59:30")
    found = exhausted_budgets(chain, book, TENANCY, at)
    assert [(e.level, e.resets_at_ms, e.retry_after_s) for e in found] == [
        ("platform", ms("2026-12-01T00:00:00"), 30),
        ("team:payments", ms("2026-12-01T00:00:00"), 30),
    ]
    assert retry_after_s(found) == 30 and retry_after_s(()) is None
    status = budget_status(chain[2], book, TENANCY, at)
    assert (status.unpriced_attempts, status.window_start, status.resets_at) == (
        1,
        "2026-11-30T00:00:00.000Z",
        "2026-12-01T00:00:00.000Z",
    )
    assert exhausted_budgets(chain, book, TENANCY, ms("2026-12-01T00:00:00")) == ()


def test_the_fold_in_any_order_matches_a_recount() -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    rng = random.Random(seed)
    rows = []
    for _ in range(2000):
        at = datetime(2028, 2, 27, tzinfo=UTC).timestamp() + rng.uniform(0, 3 * 86400)
        stamp = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        priced = rng.random() < 0.9
        rows.append(
            row(
                stamp,
                repo=rng.choice(["acme/pay", "acme/ledger", "acme/web", "solo/x"]),
                role=rng.choice([None, "reviewer", "writer"]),
                account=rng.choice(["a", "b"]),
                model=rng.choice(["m1", "m2", None]),
                principal=rng.choice(["p1", "p2", "p3"]),
                cost=round(rng.uniform(0, 2), 8) if priced else None,
                usage=(rng.randrange(100), rng.randrange(100), 0, 0) if rng.random() < 0.95 else None,
            )
        )
    rows.sort(key=lambda r: r.finished_at)
    for i in range(0, len(rows) - 1, 7):  # mostly in order, as rows arrive, with some late ones
        if rng.random() < 0.3:
            rows[i], rows[i + 1] = rows[i + 1], rows[i]
    book = fold(rows)
    expect: dict[tuple[str, str], list] = defaultdict(lambda: [0.0, 0, 0])
    for r in rows:
        for key in (r.finished_at[:13], r.finished_at[:10], r.finished_at[:7]):
            for scope in scopes_of(r, TENANCY):
                cell = expect[(key, scope)]
                cell[0] += r.cost_usd or 0.0
                cell[1] += 1
                cell[2] += r.cost_usd is None and r.usage is not None
    for (key, scope), (cost, attempts, unpriced) in expect.items():
        got = seen(book, key, scope)
        assert got[1:] == (attempts, unpriced) and got[0] == pytest.approx(cost, abs=1e-6), (seed, key, scope)
    assert seen(book, "2028-02", "platform")[1] + seen(book, "2028-03", "platform")[1] == len(rows)
    assert Dim.PLATFORM in book.summary()["2028-02-29"]
