"""Budgets (SPEC §18): each level's `{window, usd}` against its scope's spend. Pure.

Budgets do not fold like the other policy fields: every level on a chain that sets one applies,
each to its own scope (the level's label names it), so a chain carries a list of
`LevelBudget`s (`core.policy.fold_budgets`) and none overrides another — a team's $50 a day
holds over its repo's $100 a day. A budget is exhausted once its window's spend reaches `usd`;
what was already in flight when it did is the overshoot (`max(0, spent − usd)`), published, not
hidden. `exhausted_budgets` is what enforcement asks: which budgets of a chain hold it now, and
when each window resets.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any

import msgspec

from controlplane.core.spend import COST, UNPRICED
from controlplane.core.spendscopes import SpendCells, TenancyMap, scope_cell, usd
from controlplane.core.windows import Window, iso, window_at

WINDOWS = tuple(str(w) for w in Window)
LEVEL_RANK = {"platform": 0, "org": 1, "team": 2, "repo": 3, "binding": 4}  # least → most specific


class BudgetEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One entry of a level document's `budgets`, as stored. Checked by value
    (`entry_problems`), not by type, so every bad entry is named at once."""

    window: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    usd: float


class EntryProblems(msgspec.Struct, frozen=True, kw_only=True):
    """The windows named by each problem of one `budgets` list (empty: none)."""

    unknown_windows: tuple[str, ...] = ()
    bad_usd: tuple[str, ...] = ()  # not a number above 0
    duplicates: tuple[str, ...] = ()  # at most one budget per window


def entry_problems(entries: Sequence[BudgetEntry]) -> EntryProblems:
    windows = [e.window for e in entries]
    return EntryProblems(
        unknown_windows=tuple(dict.fromkeys(w for w in windows if w not in WINDOWS)),
        bad_usd=tuple(e.window for e in entries if not (math.isfinite(e.usd) and e.usd > 0)),
        duplicates=tuple(dict.fromkeys(w for i, w in enumerate(windows) if w in windows[:i])),
    )


class LevelBudget(msgspec.Struct, frozen=True, kw_only=True):
    level: str  # the level label that set it, which is also the scope it governs
    window: Window
    usd: float


class BudgetStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One row of `GET /control/v2/budgets`, spelled as SPEC §18 spells it."""

    level: str
    window: Window
    usd: float
    spent_usd: float
    remaining_usd: float
    exhausted: bool
    window_start: str
    resets_at: str
    overshoot_usd: float
    unpriced_attempts: int


class Exhausted(msgspec.Struct, frozen=True, kw_only=True):
    level: str
    window: Window
    usd: float
    spent_usd: float
    resets_at_ms: int
    retry_after_s: int  # whole seconds until the window resets, at least 1


def budgets_of(levels: Iterable[tuple[str, Sequence[BudgetEntry] | None]]) -> tuple[LevelBudget, ...]:
    """Not a fold: every level's budgets, each for its own scope, in the order given (a chain's
    layers, least → most specific); entries are already checked, so every window is known."""
    return tuple(
        LevelBudget(level=label, window=Window(entry.window), usd=entry.usd)
        for label, entries in levels
        for entry in entries or ()
    )


def level_order(label: str) -> tuple[int, str]:
    """Sort key of level labels: least → most specific, then by name."""
    return LEVEL_RANK.get(label.partition(":")[0], len(LEVEL_RANK)), label


def all_budgets(documents: Mapping[str, Any]) -> tuple[LevelBudget, ...]:
    """Every budget any level document (label → `LevelDocument`) sets: the budgets view."""
    return budgets_of((label, documents[label].budgets) for label in sorted(documents, key=level_order))


def budget_status(budget: LevelBudget, fold: SpendCells, tenancy: TenancyMap, at_ms: int) -> BudgetStatus:
    key, start_ms, resets_ms = window_at(budget.window, at_ms)
    cell = scope_cell(fold, budget.level, key, tenancy)
    spent = usd(cell[COST])
    return BudgetStatus(
        level=budget.level,
        window=budget.window,
        usd=budget.usd,
        spent_usd=spent,
        remaining_usd=usd(max(0.0, budget.usd - spent)),
        exhausted=spent >= budget.usd,
        window_start=iso(start_ms),
        resets_at=iso(resets_ms),
        overshoot_usd=usd(max(0.0, spent - budget.usd)),
        unpriced_attempts=int(cell[UNPRICED]),
    )


def exhausted_budgets(
    budgets: Iterable[LevelBudget], fold: SpendCells, tenancy: TenancyMap, at_ms: int
) -> tuple[Exhausted, ...]:
    """The budgets among `budgets` (a chain's, or every level's) exhausted at `at_ms`, in order."""
    found = []
    for budget in budgets:
        key, _, resets_ms = window_at(budget.window, at_ms)
        spent = usd(scope_cell(fold, budget.level, key, tenancy)[COST])
        if spent >= budget.usd:
            found.append(
                Exhausted(
                    level=budget.level,
                    window=budget.window,
                    usd=budget.usd,
                    spent_usd=spent,
                    resets_at_ms=resets_ms,
                    retry_after_s=max(1, -((at_ms - resets_ms) // 1000)),
                )
            )
    return tuple(found)


def retry_after_s(exhausted: Iterable[Exhausted]) -> int | None:
    """How long a held mint waits: until the last of its exhausted windows resets."""
    waits = [e.retry_after_s for e in exhausted]
    return max(waits) if waits else None
