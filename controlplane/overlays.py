"""What the mint reads from the two chains: the admin overlay and the routing policy.

The mint depends on these small interfaces, not on the stores, so selection can be tested
without files. `NoAdminOverlay` and `NoPolicy` are the defaults when no chain exists.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from controlplane.core.budgets import LevelBudget
from shared.codes import AdminState, Condition


class AdminOverlay(Protocol):
    def is_unavailable(self) -> bool: ...          # chain verdict corrupt → hold every v2 mint
    def state_of(self, account_id: str) -> AdminState: ...


class ResolvedPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The fold of every level for one (repo, role): what the mint obeys."""

    revision: int = 0
    account_order: tuple[str, ...] | None = None
    providers: tuple[str, ...] | None = None
    fallback_on: frozenset[Condition] = frozenset(Condition)
    max_fallback_hops: int = 1
    model_classes: dict[str, dict[str, str]] = {}
    provenance: dict[str, str] = {}                 # field (or model_classes.<class>.<binding>) → level label
    locked_by: dict[str, str] = {}                  # field → the least specific level that locked it
    vetoed: dict[str, tuple[str, ...]] = {}         # field → more specific setters a lock overruled
    ceilinged: tuple[str, ...] = ()                 # fields whose chosen value the platform ceiling cut
    budgets: tuple[LevelBudget, ...] = ()           # every budget on the chain, each for its own level (§18)


class PolicySource(Protocol):
    def is_unavailable(self) -> bool: ...          # chain unverifiable → hold every v2 mint
    def resolve(self, repo_slug: str, worker_role: str | None) -> ResolvedPolicy: ...


class NoAdminOverlay:
    def is_unavailable(self) -> bool:
        return False

    def state_of(self, account_id: str) -> AdminState:
        return AdminState.ENABLED


class NoPolicy:
    """No policy documents: registry order, every condition, the platform ceilings."""

    def __init__(self, fallback_on: tuple[Condition, ...], max_hops: int) -> None:
        self._resolved = ResolvedPolicy(fallback_on=frozenset(fallback_on), max_fallback_hops=max_hops)

    def is_unavailable(self) -> bool:
        return False

    def resolve(self, repo_slug: str, worker_role: str | None) -> ResolvedPolicy:
        return self._resolved
