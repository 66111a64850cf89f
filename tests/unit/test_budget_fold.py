"""Budgets on a chain (SPEC §10, §18) by table: not folded, never locked — every level of the
dispatch's chain that sets one is collected, for its own scope, least → most specific."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from controlplane.core.budgets import LevelBudget, all_budgets, level_order
from controlplane.core.policy import Ceiling, fold_records, resolve
from controlplane.core.windows import Window
from shared.codes import Condition

CEIL = Ceiling(fallback_on=frozenset(Condition), max_fallback_hops=1)
REPO, ROLE = "acme/pay", "reviewer"
TENANCY = {"org:acme": {"teams": ["payments"]}, "team:payments": {"repos": [REPO]}}


def day(usd: float) -> dict[str, Any]:
    return {"window": "day", "usd": usd}


def resolved_budgets(docs: dict[str, dict[str, Any]], repo: str = REPO, role: str | None = ROLE) -> list[tuple]:
    merged = {k: dict(v) for k, v in TENANCY.items()}
    for label, doc in docs.items():
        merged.setdefault(label, {}).update(doc)
    state = fold_records([{"seq": n, "name": k, "document": v} for n, (k, v) in enumerate(merged.items(), 1)])
    assert not state.unreadable
    return [(b.level, str(b.window), b.usd) for b in resolve(state, repo, role, CEIL, revision=1).budgets]


class Case(NamedTuple):
    name: str
    given: dict[str, dict[str, Any]]
    expect: list[tuple[str, str, float]]


CASES = [
    Case("no budget anywhere", {}, []),
    Case(
        "a platform budget applies to every chain", {"platform": {"budgets": [day(1000)]}}, [("platform", "day", 1000)]
    ),
    Case(
        "cumulative: every level keeps its own",
        {
            "platform": {"budgets": [day(1000)]},
            "org:acme": {"budgets": [day(500)]},
            "team:payments": {"budgets": [day(50)]},
            f"repo:{REPO}": {"budgets": [day(100)]},
            f"binding:{REPO}#{ROLE}": {"budgets": [day(10)]},
        },
        [
            ("platform", "day", 1000),
            ("org:acme", "day", 500),
            ("team:payments", "day", 50),
            (f"repo:{REPO}", "day", 100),
            (f"binding:{REPO}#{ROLE}", "day", 10),
        ],
    ),
    Case(
        "a team's budget stands over its repo's larger one",
        {"team:payments": {"budgets": [day(50)]}, f"repo:{REPO}": {"budgets": [day(100)]}},
        [("team:payments", "day", 50), (f"repo:{REPO}", "day", 100)],
    ),
    Case(
        "windows of one level, in document order",
        {f"repo:{REPO}": {"budgets": [{"window": "month", "usd": 900}, {"window": "hour", "usd": 5}]}},
        [(f"repo:{REPO}", "month", 900), (f"repo:{REPO}", "hour", 5)],
    ),
    Case(
        "a lock on another field does not touch budgets",
        {
            "platform": {"locks": ["account_order"], "account_order": ["legacy-anthropic"], "budgets": [day(1000)]},
            f"repo:{REPO}": {"account_order": ["legacy-openai"], "budgets": [day(100)]},
        },
        [("platform", "day", 1000), (f"repo:{REPO}", "day", 100)],
    ),
    Case("another repo's budget is not on this chain", {"repo:acme/web": {"budgets": [day(1)]}}, []),
    Case("another binding's budget is not on this chain", {f"binding:{REPO}#writer": {"budgets": [day(1)]}}, []),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_budgets_on_the_chain(case: Case) -> None:
    assert resolved_budgets(case.given) == case.expect


def test_without_a_role_the_binding_level_is_not_on_the_chain() -> None:
    docs = {f"binding:{REPO}#{ROLE}": {"budgets": [day(10)]}, f"repo:{REPO}": {"budgets": [day(100)]}}
    assert resolved_budgets(docs, role=None) == [(f"repo:{REPO}", "day", 100)]


def test_a_repo_outside_any_team_has_only_platform_and_repo() -> None:
    docs = {
        "platform": {"budgets": [day(1000)]},
        "team:payments": {"budgets": [day(50)]},
        "repo:solo/x": {"budgets": [day(5)]},
    }
    assert resolved_budgets(docs, repo="solo/x", role=None) == [("platform", "day", 1000), ("repo:solo/x", "day", 5)]


def test_every_budget_of_every_level_least_specific_first() -> None:
    state = fold_records(
        [
            {"seq": 1, "name": f"repo:{REPO}", "document": {"budgets": [day(100)]}},
            {"seq": 2, "name": "team:payments", "document": {"repos": [REPO], "budgets": [day(50)]}},
            {"seq": 3, "name": "binding:a/b#r", "document": {"budgets": [{"window": "hour", "usd": 1}]}},
            {"seq": 4, "name": "platform", "document": {"budgets": [{"window": "month", "usd": 10_000}]}},
            {"seq": 5, "name": "org:acme", "document": {"teams": ["payments"]}},
        ]
    )
    assert all_budgets(state.documents) == (
        LevelBudget(level="platform", window=Window.MONTH, usd=10_000),
        LevelBudget(level="team:payments", window=Window.DAY, usd=50),
        LevelBudget(level=f"repo:{REPO}", window=Window.DAY, usd=100),
        LevelBudget(level="binding:a/b#r", window=Window.HOUR, usd=1),
    )
    assert sorted(["repo:a", "binding:a#r", "platform", "team:t", "org:o"], key=level_order) == [
        "platform",
        "org:o",
        "team:t",
        "repo:a",
        "binding:a#r",
    ]
