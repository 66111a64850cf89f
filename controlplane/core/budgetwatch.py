"""Budget enforcement's state (SPEC §18): which budgets are exhausted now, kept current row by
row. Pure: no I/O, no clock — every instant is an argument, the spend fold is handed in.

`BudgetWatch` holds, for each budget of the policy, its scope's spend in the window in progress:
seeded from the spend fold (`scope_cell`) whenever the budgets, the tenancy or the hour change
(`configure`, `reseed`), and between those moved by each priced row's cost (`add`), so the row
path never re-reads the fold. A row costs one test when no budget exists anywhere, one memoized
dict lookup when its chain has none, and a few additions per budget of its chain otherwise.

What it answers:
- **crossings** — a budget's spend reached 80 % or 100 % of its `usd`: once per budget
  (level, window, usd: a changed amount is a new budget) per window. A reseed that only
  rebuilds what was already known (`quiet`: a restart) reports none.
- **exhausted** — the budgets at or past 100 %, each until its window resets.
- **gates** — for a (repo, role): whether any budget governs its chain (`budgeted`), and until
  when its requests are refused: the *latest* reset among the exhausted budgets of its chain,
  since a request may proceed only once every one of them has reset (a day budget exhausted
  inside an exhausted month waits for the month).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from controlplane.core.budgets import Exhausted, LevelBudget
from controlplane.core.spend import COST, SpendRow
from controlplane.core.spendscopes import SpendCells, TenancyMap, chain_of, scope_cell, usd
from controlplane.core.windows import Window, bounds_ms, hour_key, key_at, window_at
from shared.bounds import retry_after_ms

THRESHOLDS = ((80, 0.8), (100, 1.0))  # percent, and the share of `usd` it is
CHAIN_MEMO_MAX = 4096  # (repo, role) pairs come from workers: bounded, cleared when full


class Crossing(msgspec.Struct, frozen=True, kw_only=True):
    """A budget's spend reached `threshold` percent of its `usd` in the window in progress."""

    level: str
    window: Window
    usd: float
    spent_usd: float
    threshold: int
    window_start_ms: int
    resets_at_ms: int


class Change(msgspec.Struct, frozen=True, kw_only=True):
    crossings: tuple[Crossing, ...] = ()
    gates_changed: bool = False  # some lease's gate may differ: push them again


NO_CHANGE = Change()


def reached(spent: float, budget_usd: float) -> tuple[int, ...]:
    """The thresholds a spend (rounded as the views show it) has reached."""
    return tuple(percent for percent, share in THRESHOLDS if spent >= budget_usd * share)


class BudgetWatch:
    def __init__(self) -> None:
        self.budgets: tuple[LevelBudget, ...] = ()
        self.tenancy = TenancyMap()
        self.until_ms = 0  # the hour in progress ends: reseed
        self._levels: dict[str, tuple[LevelBudget, ...]] = {}
        self._chains: dict[tuple[str, str | None], tuple[str, ...]] = {}
        self._keys: dict[Window, str] = {}
        # Per budget a `Slot` [window key, spend, 80 % of usd, budget], by level for the row path
        # (`_plan`: no enum is hashed there) and by (level, window) for everything else.
        self._plan: dict[str, tuple[list[Any], ...]] = {}
        self._slots: dict[tuple[str, Window], list[Any]] = {}
        self._crossed: set[tuple[str, Window, str, float, int]] = set()
        self._exhausted: dict[tuple[str, Window], int] = {}  # → when its window resets
        self._retry_at: dict[str, int] = {}  # level → latest reset among its exhausted

    # ---- keeping it current -----------------------------------------------------------------

    def configure(
        self, budgets: Iterable[LevelBudget], tenancy: TenancyMap, fold: SpendCells, at_ms: int, *, quiet: bool = False
    ) -> Change:
        """New budgets or tenancy (a policy write, or the start): everything is re-read."""
        before = set(self._levels)
        self.budgets = tuple(budgets)
        self.tenancy = tenancy
        levels: dict[str, list[LevelBudget]] = {}
        for budget in self.budgets:
            levels.setdefault(budget.level, []).append(budget)
        self._levels = {level: tuple(found) for level, found in levels.items()}
        self._chains = {}
        change = self.reseed(fold, at_ms, quiet=quiet)
        if set(self._levels) != before and not change.gates_changed:
            change = msgspec.structs.replace(change, gates_changed=True)
        return change

    def reseed(self, fold: SpendCells, at_ms: int, *, quiet: bool = False) -> Change:
        """Every budget's spend in its window at `at_ms`, from the fold (the hour changed)."""
        self._keys = {window: key_at(window, at_ms) for window in Window}
        self.until_ms = window_at(Window.HOUR, at_ms)[2]
        before = dict(self._retry_at)
        self._slots, self._exhausted, self._retry_at = {}, {}, {}
        self._crossed = {mark for mark in self._crossed if self._keys[mark[1]] == mark[2]}
        plan: dict[str, list[list[Any]]] = {}
        crossings: list[Crossing] = []
        for budget in self.budgets:
            key = self._keys[budget.window]
            spent = scope_cell(fold, budget.level, key, self.tenancy)[COST]
            slot = [key, spent, budget.usd * THRESHOLDS[0][1] - 1e-8, budget]  # `usd` rounds to 8 places
            self._slots[(budget.level, budget.window)] = slot
            plan.setdefault(budget.level, []).append(slot)
            self._judge(budget, spent, crossings)
        self._plan = {level: tuple(slots) for level, slots in plan.items()}
        return Change(crossings=() if quiet else tuple(crossings), gates_changed=self._retry_at != before)

    def add(self, row: SpendRow, fold: SpendCells, at_ms: int) -> Change:
        """One recorded row, already folded into `fold`."""
        cost = row.cost_usd
        if not cost or not self._levels:
            return NO_CHANGE
        labels = self._chains.get((row.repo_slug, row.worker_role))
        if labels is None:
            labels = self.chain(row.repo_slug, row.worker_role)
        if not labels:
            return NO_CHANGE
        if at_ms >= self.until_ms:
            return self.reseed(fold, at_ms)  # the fold holds this row already
        stamp = row.finished_at
        if stamp is None:
            return NO_CHANGE
        if stamp[-1:] != "Z":  # the daemons' own stamps are UTC `...Z`, which window keys prefix
            stamp = hour_key(stamp)
            if stamp is None:
                return NO_CHANGE
        crossings: list[Crossing] = []
        changed = False
        plan = self._plan
        for label in labels:
            for slot in plan[label]:
                if not stamp.startswith(slot[0]):
                    continue  # a late row of a window that no longer gates anything
                spent = slot[1] = slot[1] + cost
                if spent >= slot[2]:
                    changed = self._judge(slot[3], spent, crossings) or changed
        if not crossings and not changed:
            return NO_CHANGE
        return Change(crossings=tuple(crossings), gates_changed=changed)

    def _judge(self, budget: LevelBudget, spent: float, crossings: list[Crossing]) -> bool:
        """Note the thresholds `spent` reached; True when the budget just became exhausted."""
        key = self._keys[budget.window]
        shown = usd(spent)
        start_ms, resets_ms = bounds_ms(budget.window, key)
        for percent in reached(shown, budget.usd):
            mark = (budget.level, budget.window, key, budget.usd, percent)
            if mark not in self._crossed:
                self._crossed.add(mark)
                crossings.append(
                    Crossing(
                        level=budget.level,
                        window=budget.window,
                        usd=budget.usd,
                        spent_usd=shown,
                        threshold=percent,
                        window_start_ms=start_ms,
                        resets_at_ms=resets_ms,
                    )
                )
        slot = (budget.level, budget.window)
        if shown < budget.usd or slot in self._exhausted:
            return False
        self._exhausted[slot] = resets_ms
        self._retry_at[budget.level] = max(self._retry_at.get(budget.level, 0), resets_ms)
        return True

    # ---- what enforcement asks --------------------------------------------------------------

    def chain(self, repo: str, role: str | None) -> tuple[str, ...]:
        """The levels of a (repo, role)'s chain that set a budget (memoized)."""
        key = (repo, role)
        found = self._chains.get(key)
        if found is None:
            if len(self._chains) >= CHAIN_MEMO_MAX:
                self._chains.clear()
            levels = self._levels
            found = self._chains[key] = tuple(label for label in chain_of(repo, role, self.tenancy) if label in levels)
        return found

    def gate(self, repo: str, role: str | None, at_ms: int) -> tuple[bool, int | None]:
        """(budgeted, refused until): what a lease of this (repo, role) carries."""
        labels = self.chain(repo, role)
        if not labels:
            return False, None
        retry = max((self._retry_at[label] for label in labels if label in self._retry_at), default=None)
        return True, retry if retry is not None and retry > at_ms else None

    def exhausted(self, budgets: Iterable[LevelBudget], at_ms: int) -> tuple[Exhausted, ...]:
        """Which of `budgets` (a chain's) hold a mint at `at_ms`, in order."""
        found = []
        for budget in budgets:
            slot = (budget.level, budget.window)
            resets_ms = self._exhausted.get(slot)
            if resets_ms is not None and resets_ms > at_ms and budget in self._levels.get(budget.level, ()):
                found.append(
                    Exhausted(
                        level=budget.level,
                        window=budget.window,
                        usd=budget.usd,
                        spent_usd=usd(self._slots[slot][1]),
                        resets_at_ms=resets_ms,
                        retry_after_s=retry_after_ms(resets_ms - at_ms),
                    )
                )
        return tuple(found)

    def on_chain(self, repo: str, role: str | None) -> tuple[LevelBudget, ...]:
        """Every budget of a (repo, role)'s chain, least → most specific."""
        return tuple(budget for label in self.chain(repo, role) for budget in self._levels[label])

    def states(self) -> dict[str, int]:
        """How many budgets are `ok`, `warning` (80 % reached) and `exhausted` now."""
        counts = {"ok": 0, "warning": 0, "exhausted": 0}
        for budget in self.budgets:
            slot = self._slots.get((budget.level, budget.window))
            thresholds = reached(usd(slot[1] if slot is not None else 0.0), budget.usd)
            counts["exhausted" if 100 in thresholds else "warning" if thresholds else "ok"] += 1
        return counts


def exhausted_levels(exhausted: Sequence[Exhausted]) -> str:
    """`day budget of team:payments, month budget of platform`: for a refusal's message."""
    return ", ".join(f"{e.window} budget of {e.level}" for e in exhausted)
