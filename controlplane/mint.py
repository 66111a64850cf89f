"""The v2 mint (SPEC §5, §6, §8): identity and intent in, an account chosen by the gateway.

Reading order of `mint_v2`: chains available? → policy → candidates → citation
(`authorise_fallback`) → live facts → `select_account` → reserve the lease slot (the
reservation decides; selection's capacity check was advisory) → grant → record the decision.
Every decision — selected, held or rejected — is recorded with its lineage.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from controlplane.core.candidates import build_candidates
from controlplane.core.fallback import CitationKind, CitedDecision, Lineage, authorise_fallback
from controlplane.core.selection import Candidate, LiveFacts, Selection, Skipped, select_account
from controlplane.decisions import Decision
from controlplane.overlays import AdminOverlay, PolicySource, ResolvedPolicy
from controlplane.service import ControlService
from shared.clock import iso_ms, now_ms
from shared.codes import HTTP_STATUS, Outcome, Refusal, Skip
from shared.errors import GatewayError
from shared.tokens import new_token, new_ulid
from shared.wire import Lease

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Ttl = Annotated[int, msgspec.Meta(ge=60, le=86400)]

# Retry-After of each hold, in seconds, when nothing more precise is known.
HOLD_RETRY_S: dict[Refusal, int] = {
    Refusal.NO_ELIGIBLE_ACCOUNT: 5,
    Refusal.ACCOUNT_STATE_UNAVAILABLE: 10,
    Refusal.POLICY_UNAVAILABLE: 10,
    Refusal.FALLBACK_LINEAGE_UNKNOWN: 30,
    Refusal.FALLBACK_LEASE_STILL_HELD: 1,
    Refusal.FALLBACK_NOT_AUTHORISED: 2,
    Refusal.FALLBACK_BUDGET_EXHAUSTED: 60,
}


class MintV2(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    dispatch_id: Name
    repo_slug: Name
    principal_kind: Name
    principal_id: Name
    worker_role: Name | None = None
    model: Name | None = None
    model_class: Name | None = None
    ttl_seconds: Ttl | None = None
    retry_of_mint_decision_id: Name | None = None
    supersedes_mint_decision_id: Name | None = None


class MintAnswer(msgspec.Struct, frozen=True):
    status: int
    body: dict
    retry_after_s: int | None = None


def _skips(skipped: tuple[Skipped, ...]) -> list[dict]:
    return [{"account_id": s.account_id, "position": s.position, "code": str(s.code)} for s in skipped]


class MintDesk:
    def __init__(self, service: ControlService, admin: AdminOverlay, policy: PolicySource) -> None:
        self.service = service
        self.admin = admin
        self.policy = policy

    # ---- entry points -------------------------------------------------------------------

    async def mint_v2(self, body: MintV2) -> MintAnswer:
        if (body.model is None) == (body.model_class is None):
            raise GatewayError(Refusal.INVALID_REQUEST, "give exactly one of model or model_class")
        if body.retry_of_mint_decision_id and body.supersedes_mint_decision_id:
            raise GatewayError(Refusal.INVALID_REQUEST,
                               "retry_of_mint_decision_id and supersedes_mint_decision_id are mutually exclusive")
        lineage = Lineage(body.dispatch_id, body.repo_slug,
                          body.model if body.model is not None else "class:" + str(body.model_class))
        base = Decision(mint_decision_id="md_" + new_ulid(), outcome=Outcome.HELD, lineage=lineage,
                        at_ms=now_ms(), model_class=body.model_class,
                        retry_of=body.retry_of_mint_decision_id,
                        supersedes=body.supersedes_mint_decision_id, worker_role=body.worker_role)
        if self.admin.is_unavailable():
            return self._refuse(base, Outcome.HELD, Refusal.ACCOUNT_STATE_UNAVAILABLE)
        if self.policy.is_unavailable():
            return self._refuse(base, Outcome.HELD, Refusal.POLICY_UNAVAILABLE)
        policy = self.policy.resolve(body.repo_slug, body.worker_role)
        base = msgspec.structs.replace(base, policy_revision=policy.revision)
        candidates = build_candidates(self.service.registry.accounts, policy, body.model, body.model_class)
        if not candidates:
            return self._refuse(base, Outcome.REJECTED, Refusal.MODEL_NOT_SERVED)
        start, hop, refusal = self._start(body, lineage, candidates, policy)
        if refusal is not None:
            return self._refuse(base, refusal[0], refusal[1])
        selection = select_account(candidates, self.live_facts(candidates), start)
        return await self._conclude(base, body, selection, hop, policy, predecessor=None)

    async def renew(self, key_id: str, ttl_seconds: int | None) -> MintAnswer:
        """A successor on the same account and position; no citation; the caller revokes after."""
        prior = self.service.decisions.for_key(key_id)
        lease = self.service.keys.get(key_id)
        if prior is None or lease is None or prior.account_id is None:
            raise GatewayError(Refusal.DECISION_UNKNOWN, "no live v2 lease with this key_id")
        base = msgspec.structs.replace(prior, mint_decision_id="md_" + new_ulid(), at_ms=now_ms(),
                                       outcome=Outcome.HELD, key_id=None, skipped=(), retry_of=None,
                                       supersedes=None, renewal_of=prior.mint_decision_id)
        if self.admin.is_unavailable():
            return self._refuse(base, Outcome.HELD, Refusal.ACCOUNT_STATE_UNAVAILABLE)
        candidate = Candidate(account_id=prior.account_id, position=prior.fallback_position or 0,
                              provider_binding=str(self.service.registry.get(prior.account_id).provider_binding),
                              effective_model=prior.effective_model or "")
        live = self.live_facts((candidate,), renewing=key_id)
        selection = select_account((candidate,), live, 0)
        if selection.chosen is not None:
            selection = msgspec.structs.replace(selection, chosen=candidate)
        body = MintV2(dispatch_id=prior.lineage.dispatch_id, repo_slug=lease.repo_slug,
                      principal_kind=lease.principal_kind, principal_id=lease.principal_id,
                      worker_role=lease.worker_role, model=prior.effective_model, ttl_seconds=ttl_seconds)
        return await self._conclude(base, body, selection, prior.hop, None, predecessor=key_id)

    # ---- steps --------------------------------------------------------------------------

    def _start(self, body: MintV2, lineage: Lineage, candidates: tuple[Candidate, ...],
               policy: ResolvedPolicy) -> tuple[int, int, tuple[Outcome, Refusal] | None]:
        """Where the scan starts and which hop this is; or a refusal of the citation."""
        cited_id = body.retry_of_mint_decision_id or body.supersedes_mint_decision_id
        dispatch_live = bool(self.service.decisions.live_keys(body.repo_slug, body.dispatch_id))
        if cited_id is None:
            if dispatch_live:  # one live lease per dispatch: revoke, then re-mint
                return 0, 0, (Outcome.HELD, Refusal.FALLBACK_LEASE_STILL_HELD)
            return 0, 0, None
        kind = CitationKind.RETRY if body.retry_of_mint_decision_id else CitationKind.SUPERSEDE
        verdict = authorise_fallback(kind, self._cited(cited_id, candidates), lineage,
                                     policy.fallback_on,
                                     min(policy.max_fallback_hops, self.service.settings.max_fallback_hops))
        if verdict.refusal is None and dispatch_live:
            # The cited lease is gone but another of this dispatch (a renewal, a sibling hop) is not.
            return 0, 0, (Outcome.HELD, Refusal.FALLBACK_LEASE_STILL_HELD)
        if verdict.refusal is not None:
            return 0, 0, (verdict.outcome, verdict.refusal)
        return verdict.start_position, verdict.hop, None

    def _cited(self, decision_id: str, candidates: tuple[Candidate, ...]) -> CitedDecision | None:
        decisions = self.service.decisions
        cited = decisions.get(decision_id)
        if cited is None:
            refused = decisions.refused_outcome(decision_id)
            if refused is None:
                return None
            # Only the outcome of a refused decision is kept; it alone decides the verdict
            # (`fallback-cited-decision-not-selected` is checked before the rest).
            return CitedDecision(outcome=refused, lineage=Lineage("", "", ""), hop=0, lease_released=True,
                                 terminal_conditions=(), position_now=None)
        position_now = next((c.position for c in candidates if c.account_id == cited.account_id), None)
        released = cited.key_id is None or not self.service.lease_capacity.holds(cited.key_id)
        return CitedDecision(outcome=cited.outcome, lineage=cited.lineage, hop=cited.hop,
                             lease_released=released,
                             terminal_conditions=decisions.evidence(decision_id),
                             position_now=position_now)

    def live_facts(self, candidates: tuple[Candidate, ...], renewing: str | None = None) -> dict[str, LiveFacts]:
        """What is true of each candidate's account now (also read by policy explain's dry run)."""
        service, now = self.service, now_ms()
        facts: dict[str, LiveFacts] = {}
        for candidate in candidates:
            account = service.registry.get(candidate.account_id)
            assert account is not None
            ceiling = account.lease_capacity
            if ceiling is not None and renewing is not None and service.lease_capacity.holds(renewing):
                ceiling += 1  # the predecessor's slot is about to be returned
            facts[account.id] = LiveFacts(
                configured=service.configured(account),
                administrative_state=self.admin.state_of(account.id),
                circuit_admits=service.circuits.admits(account.id, now),
                lease_room=service.lease_capacity.has_room(account.id, ceiling))
        return facts

    async def _conclude(self, base: Decision, body: MintV2, selection: Selection, hop: int,
                        policy: ResolvedPolicy | None, predecessor: str | None) -> MintAnswer:
        base = msgspec.structs.replace(base, skipped=selection.skipped)
        if selection.chosen is None:
            outcome = Outcome.REJECTED if selection.refusal == Refusal.FALLBACK_POOL_EXHAUSTED else Outcome.HELD
            return self._refuse(base, outcome, selection.refusal or Refusal.NO_ELIGIBLE_ACCOUNT)
        chosen = selection.chosen
        service = self.service
        account = service.registry.get(chosen.account_id)
        assert account is not None
        ceiling = account.lease_capacity
        if ceiling is not None and predecessor is not None and service.lease_capacity.holds(predecessor):
            ceiling += 1
        token, key_id, digest = new_token()
        if not service.lease_capacity.reserve(account.id, key_id, ceiling):
            # The advisory check passed but the reservation decides: no key outlives this.
            skipped = base.skipped + (Skipped(account_id=account.id, position=chosen.position,
                                              code=Skip.LEASE_CAPACITY_EXHAUSTED),)
            return self._refuse(msgspec.structs.replace(base, skipped=skipped), Outcome.HELD,
                                Refusal.NO_ELIGIBLE_ACCOUNT)
        ttl_s = body.ttl_seconds or service.settings.key_ttl_seconds
        lease = Lease(key_id=key_id, digest=digest, account_id=account.id,
                      expires_at_ms=now_ms() + ttl_s * 1000, principal_kind=body.principal_kind,
                      principal_id=body.principal_id, repo_slug=body.repo_slug,
                      dispatch_id=body.dispatch_id, mint_decision_id=base.mint_decision_id,
                      worker_role=body.worker_role)
        decision = msgspec.structs.replace(
            base, outcome=Outcome.SELECTED, account_id=account.id, fallback_position=chosen.position,
            hop=hop, key_id=key_id, effective_model=chosen.effective_model)
        service.decisions.record(decision)
        service.log_decision(decision)
        service.circuits.on_lease(account.id, key_id, now_ms())
        minted = await service.grant(lease, account, token, reserved=True)
        return MintAnswer(201, {
            "outcome": str(Outcome.SELECTED),
            "mint_decision_id": decision.mint_decision_id,
            "account_id": account.id,
            "fallback_position": chosen.position,
            "hop": hop,
            "token": token,
            "key_id": key_id,
            "expires_at": iso_ms(lease.expires_at_ms),
            "base_url": minted.base_url,
            "effective_model": chosen.effective_model,
            "skipped": _skips(selection.skipped),
            "policy_revision": decision.policy_revision,
        })

    def _refuse(self, base: Decision, outcome: Outcome, refusal: Refusal) -> MintAnswer:
        decision = msgspec.structs.replace(base, outcome=outcome, refusal_reason=refusal)
        self.service.decisions.record(decision)
        self.service.log_decision(decision)
        body = {"outcome": str(outcome), "refusal_reason": str(refusal),
                "mint_decision_id": decision.mint_decision_id, "skipped": _skips(decision.skipped),
                "policy_revision": decision.policy_revision}
        if outcome == Outcome.REJECTED:
            return MintAnswer(409, body)
        return MintAnswer(503, body, retry_after_s=self._retry_after(refusal, decision.skipped))

    def _retry_after(self, refusal: Refusal, skipped: tuple[Skipped, ...]) -> int:
        wait = HOLD_RETRY_S.get(refusal, 5)
        if refusal == Refusal.NO_ELIGIBLE_ACCOUNT:
            now = now_ms()
            waits = []
            for skip in skipped:
                if skip.code == Skip.CIRCUIT_OPEN:
                    circuit = self.service.circuits.get(skip.account_id, now)
                    if circuit.retry_at_ms is not None and circuit.retry_at_ms > now:
                        waits.append((circuit.retry_at_ms - now + 999) // 1000)
                    else:
                        waits.append(1)
                elif skip.code == Skip.LEASE_CAPACITY_EXHAUSTED:
                    waits.append(1)
            if waits:
                wait = min(waits)
        return max(1, int(wait))


assert all(HTTP_STATUS[r] == 503 for r in HOLD_RETRY_S)
