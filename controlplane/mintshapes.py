"""The v2 mint's shapes (SPEC §5, §6): the request body, the answers' bodies, the holds'
Retry-After floors, and the seam the desk grants through.
"""

from __future__ import annotations

from typing import Annotated, Protocol

import msgspec

from controlplane.core.fallback import Lineage
from controlplane.core.hop import FallbackDriver
from controlplane.core.selection import Skipped
from controlplane.decisions import Decision
from controlplane.registry import AccountSpec
from shared.bounds import TtlSeconds
from shared.clock import iso_ms
from shared.codes import HTTP_STATUS, Outcome, Refusal
from shared.wire import Lease

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]

# Retry-After of each hold, in seconds, when nothing more precise is known.
HOLD_RETRY_S: dict[Refusal, int] = {
    Refusal.NO_ELIGIBLE_ACCOUNT: 5,
    Refusal.ACCOUNT_STATE_UNAVAILABLE: 10,
    Refusal.POLICY_UNAVAILABLE: 10,
    Refusal.FALLBACK_LINEAGE_UNKNOWN: 30,
    Refusal.FALLBACK_LEASE_STILL_HELD: 1,
    Refusal.FALLBACK_NOT_AUTHORISED: 2,
    Refusal.FALLBACK_BUDGET_EXHAUSTED: 60,
    Refusal.BUDGET_EXHAUSTED: 60,  # the decision says until the window resets; this is a floor
    Refusal.FLEET_STATE_UNAVAILABLE: 1,  # a Redis reply waits 1 s at most; recovery is automatic
}


class MintV2(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    dispatch_id: Name
    repo_slug: Name
    principal_kind: Name
    principal_id: Name
    worker_role: Name | None = None
    model: Name | None = None
    model_class: Name | None = None
    ttl_seconds: TtlSeconds | None = None
    retry_of_mint_decision_id: Name | None = None
    supersedes_mint_decision_id: Name | None = None
    fallback_driver: FallbackDriver = FallbackDriver.CALLER


class Granter(Protocol):
    """What the desk needs of the service: store and replicate a lease, release a slot."""

    async def grant(self, lease: Lease, account: AccountSpec, token: str) -> object: ...
    async def release(self, lease: Lease) -> None: ...
    async def rebind(self, lease: Lease) -> None: ...


def lineage_of(dispatch_id: str, repo_slug: str, model: str | None, model_class: str | None) -> Lineage:
    return Lineage(dispatch_id, repo_slug, model if model is not None else "class:" + str(model_class))


def skips_view(skipped: tuple[Skipped, ...]) -> list[dict]:
    return [{"account_id": s.account_id, "position": s.position, "code": str(s.code)} for s in skipped]


def selected_body(decision: Decision, lease: Lease, token: str, base_url: str, skipped: tuple[Skipped, ...]) -> dict:
    """201: the account chosen and the key that reaches it (SPEC §5)."""
    return {
        "outcome": str(Outcome.SELECTED),
        "mint_decision_id": decision.mint_decision_id,
        "account_id": decision.account_id,
        "fallback_position": decision.fallback_position,
        "hop": decision.hop,
        "token": token,
        "key_id": lease.key_id,
        "expires_at": iso_ms(lease.expires_at_ms),
        "base_url": base_url,
        "effective_model": decision.effective_model,
        "skipped": skips_view(skipped),
        "policy_revision": decision.policy_revision,
        "fallback_driver": decision.driver,
    }


def refused_body(decision: Decision) -> dict:
    """A hold (503) or a rejection: the outcome, its reason and what was skipped."""
    return {
        "outcome": str(decision.outcome),
        "refusal_reason": str(decision.refusal_reason),
        "mint_decision_id": decision.mint_decision_id,
        "skipped": skips_view(decision.skipped),
        "policy_revision": decision.policy_revision,
    }


assert all(HTTP_STATUS[r] == 503 for r in HOLD_RETRY_S)
