"""The candidate list of a v2 mint: the registry's answer, narrowed and ordered by policy.

Pure. `account_order` narrows and orders (never adds); `providers` prunes by binding; a
`model_class` resolves the effective model per candidate's binding, so one class may span
bindings. Positions are indices into the returned list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from controlplane.core.policy import ResolvedPolicy
from controlplane.core.selection import Candidate


class ServingAccount(Protocol):
    """What candidates read of an account (the registry's `AccountSpec` is one)."""

    @property
    def id(self) -> str: ...
    @property
    def provider_binding(self) -> str: ...
    def serves(self, model: str) -> bool: ...


def build_candidates(
    accounts: Sequence[ServingAccount], policy: ResolvedPolicy, model: str | None, model_class: str | None
) -> tuple[Candidate, ...]:
    pairs: list[tuple[ServingAccount, str]] = []
    if model_class is not None:
        by_binding = policy.model_classes.get(model_class, {})
        for account in accounts:
            effective = by_binding.get(str(account.provider_binding))
            if effective is not None and account.serves(effective):
                pairs.append((account, effective))
    elif model is not None:
        pairs = [(a, model) for a in accounts if a.serves(model)]
    if policy.account_order is not None:
        by_id = {a.id: (a, m) for a, m in pairs}
        pairs = [by_id[i] for i in policy.account_order if i in by_id]
    if policy.providers is not None:
        allowed = set(policy.providers)
        pairs = [(a, m) for a, m in pairs if str(a.provider_binding) in allowed]
    return tuple(
        Candidate(account_id=a.id, position=i, provider_binding=str(a.provider_binding), effective_model=m)
        for i, (a, m) in enumerate(pairs)
    )
