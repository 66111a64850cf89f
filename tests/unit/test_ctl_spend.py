"""`leaseholdctl budgets` and `spend` renderings, and their arguments."""

from __future__ import annotations

import pytest

from controlplane.cli.spend import budgets_table, spend_table
from controlplane.ctl import build_parser

BUDGET = {
    "level": "team:payments",
    "window": "day",
    "usd": 50.0,
    "spent_usd": 60.5,
    "remaining_usd": 0.0,
    "exhausted": True,
    "window_start": "2026-11-30T00:00:00.000Z",
    "resets_at": "2026-12-01T00:00:00.000Z",
    "overshoot_usd": 10.5,
    "unpriced_attempts": 2,
}
USAGE = {"input_tokens": 10, "output_tokens": 20, "cache_read_tokens": 30, "cache_creation_tokens": 40}


def test_budgets_table_shows_each_fact_in_its_column() -> None:
    ok = {
        **BUDGET,
        "level": "repo:acme/pay",
        "usd": 100.0,
        "spent_usd": 25.0,
        "remaining_usd": 75.0,
        "exhausted": False,
        "overshoot_usd": 0.0,
        "unpriced_attempts": 0,
    }
    lines = budgets_table({"as_of": "2026-11-30T12:00:00.000Z", "policy_revision": 3, "budgets": [BUDGET, ok]})
    head, exhausted, fine, footer, note = lines.splitlines()
    assert head.split() == [
        "LEVEL",
        "WINDOW",
        "USD",
        "SPENT",
        "REMAINING",
        "USED",
        "EXHAUSTED",
        "OVERSHOOT",
        "RESETS",
        "AT",
        "UNPRICED",
    ]
    assert exhausted.split() == [
        "team:payments",
        "day",
        "50.0000",
        "60.5000",
        "0.0000",
        "121%",
        "EXHAUSTED",
        "10.5000",
        "2026-12-01T00:00:00.000Z",
        "2",
    ]
    assert fine.split()[5:8] == ["25%", "no", "-"]
    assert "policy revision 3" in footer and "unknown, not zero" in note


def test_no_budget_says_so() -> None:
    assert budgets_table({"budgets": [], "policy_revision": 0}).startswith("no budget is set")


def test_spend_table_names_what_has_no_key_and_totals() -> None:
    body = {
        "window": "day",
        "by": "team",
        "window_start": "2026-11-30T00:00:00.000Z",
        "as_of": "x",
        "rows": [
            {"key": "payments", "cost_usd": 1.5, "attempts": 3, "unpriced_attempts": 1, "usage": USAGE},
            {"key": None, "cost_usd": 0.25, "attempts": 1, "unpriced_attempts": 0, "usage": USAGE},
        ],
    }
    head, columns, first, second, total = spend_table(body).splitlines()
    assert head.startswith("spend by team, this day (from 2026-11-30T00:00:00.000Z)")
    assert columns.split()[:2] == ["TEAM", "COST"]
    assert first.split() == ["payments", "1.5000", "3", "1", "10/20", "30/40"]
    assert second.split()[:2] == ["(no", "team)"]
    assert total.split() == ["TOTAL", "1.7500", "4", "1", "20/40", "60/80"]
    assert spend_table({**body, "rows": []}).endswith("nothing recorded in this window")


@pytest.mark.parametrize(
    "argv,window,by",
    [(["spend"], "day", "repo"), (["spend", "--window", "month", "--by", "binding"], "month", "binding")],
)
def test_spend_arguments(argv: list[str], window: str, by: str) -> None:
    args = build_parser().parse_args(argv)
    assert (args.window, args.by) == (window, by)


def test_a_bad_window_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["spend", "--window", "week"])
    assert caught.value.code == 2


def test_policy_explain_shows_the_chain_budgets() -> None:
    from controlplane.cli.policy import describe_explain

    text = describe_explain({"resolved": {}, "candidates": [], "budgets": [BUDGET]})
    assert "BUDGETS ON THIS CHAIN" in text and "team:payments" in text and "EXHAUSTED" in text
    assert "BUDGETS" not in describe_explain({"resolved": {}, "candidates": [], "budgets": []})
