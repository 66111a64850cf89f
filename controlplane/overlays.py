"""What the mint reads from the two chains — the admin overlay and the routing policy — and
from the budgets' enforcement (SPEC §18) and the rate-limit headroom (SPEC §22).

The mint depends on these small interfaces, not on the stores, so selection can be tested
without files. `NoAdminOverlay`, `NoPolicy`, `NoBudgets` and `NoHeadroom` are the defaults when none exists.
"""

from __future__ import annotations

from typing import Protocol

from controlplane.core.budgets import Exhausted, LevelBudget
from controlplane.core.policy import ResolvedPolicy
from shared.codes import AdminState, Condition


class AdminOverlay(Protocol):
    async def refresh(self) -> None: ...  # read the chain as it is now (fleet: off the loop)
    def is_unavailable(self) -> bool: ...  # chain verdict corrupt → hold every v2 mint
    def state_of(self, account_id: str) -> AdminState: ...


class PolicySource(Protocol):
    async def refresh(self) -> None: ...  # read the chain as it is now (fleet: off the loop)
    def is_unavailable(self) -> bool: ...  # chain unverifiable → hold every v2 mint
    def resolve(self, repo_slug: str, worker_role: str | None) -> ResolvedPolicy: ...


class BudgetFacts(Protocol):
    """`controlplane.budgetguard.BudgetGuard`: the budgets' state, kept current row by row."""

    def exhausted(self, budgets: tuple[LevelBudget, ...], revision: int | None = None) -> tuple[Exhausted, ...]: ...
    def on_chain(self, repo_slug: str, worker_role: str | None) -> tuple[LevelBudget, ...]: ...
    def is_priced(self, model: str) -> bool: ...


class HeadroomFacts(Protocol):
    """`controlplane.headroom.HeadroomBook`: each account's provider rate-limit headroom (§22)."""

    def low(self, account_id: str, floor_percent: int, now: int) -> bool: ...
    def lifts_at(self, account_id: str, floor_percent: int, now: int) -> int | None: ...


class NoAdminOverlay:
    async def refresh(self) -> None:
        return None

    def is_unavailable(self) -> bool:
        return False

    def state_of(self, account_id: str) -> AdminState:
        return AdminState.ENABLED


class NoPolicy:
    """No policy documents: registry order, every condition, the platform ceilings."""

    def __init__(self, fallback_on: tuple[Condition, ...], max_hops: int) -> None:
        self._resolved = ResolvedPolicy(fallback_on=frozenset(fallback_on), max_fallback_hops=max_hops)

    async def refresh(self) -> None:
        return None

    def is_unavailable(self) -> bool:
        return False

    def resolve(self, repo_slug: str, worker_role: str | None) -> ResolvedPolicy:
        return self._resolved


class NoBudgets:
    """No budget anywhere: nothing is held, nothing needs a price."""

    def exhausted(self, budgets: tuple[LevelBudget, ...], revision: int | None = None) -> tuple[Exhausted, ...]:
        return ()

    def on_chain(self, repo_slug: str, worker_role: str | None) -> tuple[LevelBudget, ...]:
        return ()

    def is_priced(self, model: str) -> bool:
        return True


class NoHeadroom:
    """No observation anywhere: no floor ever rules an account out."""

    def low(self, account_id: str, floor_percent: int, now: int) -> bool:
        return False

    def lifts_at(self, account_id: str, floor_percent: int, now: int) -> int | None:
        return None
