"""`leaseholdctl budgets` and `leaseholdctl spend` (SPEC §18, scope `read`).

`budgets` prints every budget a policy level sets against its scope's spend in its current UTC
window: how much is spent and left, whether it is exhausted (and by how much it overshot), when
the window resets, and how many attempts had no price (their spend is unknown, not zero).
`spend --window hour|day|month --by repo|team|org|account|model|principal|binding` prints where
the money went in the current window, most first, with a total. `--json` prints the answer as
the control daemon gave it.
"""

from __future__ import annotations

import argparse
from typing import Any

from controlplane.cli.client import Client
from controlplane.cli.exits import Exit
from controlplane.cli.output import cell, emit, emit_json, render_table
from shared.codes import Scope

BUDGETS_PATH = "/control/v2/budgets"
SPEND_PATH = "/control/v2/spend"
WINDOWS = ("hour", "day", "month")
BYS = ("repo", "team", "org", "account", "model", "principal", "binding")
NONE_KEY = {"team": "(no team)", "org": "(no org)", "binding": "(no role)", "model": "(no model)"}
USAGE_KINDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens")


def usd(value: Any) -> str:
    return "-" if value is None else f"{value:,.4f}"


def used_text(budget: dict[str, Any]) -> str:
    limit, spent = budget.get("usd"), budget.get("spent_usd")
    if not limit or spent is None:
        return "-"
    return f"{100 * spent / limit:.0f}%"


def budget_rows(budgets: list[dict[str, Any]]) -> str:
    """The budgets as a table (also under `policy explain`)."""
    rows = [
        (
            b.get("level"),
            b.get("window"),
            usd(b.get("usd")),
            usd(b.get("spent_usd")),
            usd(b.get("remaining_usd")),
            used_text(b),
            "EXHAUSTED" if b.get("exhausted") else "no",
            usd(b.get("overshoot_usd")) if b.get("overshoot_usd") else "-",
            b.get("resets_at"),
            b.get("unpriced_attempts"),
        )
        for b in budgets
    ]
    return render_table(
        ("LEVEL", "WINDOW", "USD", "SPENT", "REMAINING", "USED", "EXHAUSTED", "OVERSHOOT", "RESETS AT", "UNPRICED"),
        rows,
    )


def budgets_table(body: dict[str, Any]) -> str:
    budgets = body.get("budgets") or []
    footer = f"as of {cell(body.get('as_of'))}, policy revision {cell(body.get('policy_revision'))}"
    if not budgets:
        return "no budget is set: no policy level has `budgets`\n" + footer
    if any(b.get("unpriced_attempts") for b in budgets):
        footer += "\nUNPRICED counts attempts on a model with no price: their cost is unknown, not zero"
    return budget_rows(budgets) + "\n" + footer


def _tokens(usage: dict[str, Any] | None) -> tuple[str, str]:
    usage = usage or {}
    return (
        f"{usage.get('input_tokens', 0)}/{usage.get('output_tokens', 0)}",
        f"{usage.get('cache_read_tokens', 0)}/{usage.get('cache_creation_tokens', 0)}",
    )


def spend_table(body: dict[str, Any]) -> str:
    by = str(body.get("by"))
    head = (
        f"spend by {by}, this {cell(body.get('window'))} (from {cell(body.get('window_start'))}), "
        f"as of {cell(body.get('as_of'))}"
    )
    rows = body.get("rows") or []
    if not rows:
        return head + "\nnothing recorded in this window"
    lines = [
        (
            r.get("key") if r.get("key") is not None else NONE_KEY.get(by, "-"),
            usd(r.get("cost_usd")),
            r.get("attempts"),
            r.get("unpriced_attempts"),
            *_tokens(r.get("usage")),
        )
        for r in rows
    ]
    total_usage = {kind: sum((r.get("usage") or {}).get(kind, 0) for r in rows) for kind in USAGE_KINDS}
    lines.append(
        (
            "TOTAL",
            usd(sum(r.get("cost_usd") or 0 for r in rows)),
            sum(r.get("attempts") or 0 for r in rows),
            sum(r.get("unpriced_attempts") or 0 for r in rows),
            *_tokens(total_usage),
        )
    )
    table = render_table((by.upper(), "COST USD", "ATTEMPTS", "UNPRICED", "TOKENS IN/OUT", "CACHE READ/WRITE"), lines)
    return head + "\n" + table


def run_budgets(args: argparse.Namespace, client: Client) -> int:
    body = client.get(BUDGETS_PATH, Scope.READ)
    emit_json(body) if args.json else emit(budgets_table(body))
    return Exit.OK


def run_spend(args: argparse.Namespace, client: Client) -> int:
    body = client.get(SPEND_PATH, Scope.READ, {"window": args.window, "by": args.by})
    emit_json(body) if args.json else emit(spend_table(body))
    return Exit.OK


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("budgets", parents=[common], help="every budget against its spend in its window")
    p.set_defaults(run=run_budgets)

    p = sub.add_parser("spend", parents=[common], help="spend in the current hour, day or month, grouped")
    p.add_argument("--window", choices=WINDOWS, default="day", help="UTC calendar window (default day)")
    p.add_argument("--by", choices=BYS, default="repo", help="what to group by (default repo)")
    p.set_defaults(run=run_spend)
