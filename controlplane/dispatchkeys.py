"""The dispatch keys' half of the mint desk (SPEC §17): `extend` and `hop`.

A mixin of `controlplane.mint.MintDesk` (it uses the desk's collaborators and its `gather`,
`_claim` and `_log`), kept apart so each module reads as one subject: the mint and renewal
there, the gateway-driven moves of a dispatch key here. The hop is a retry citing the key's
decision, through the same `decide_mint`; `controlplane/hops.py` decides when one runs.
"""

from __future__ import annotations

import msgspec

from controlplane.answers import MintAnswer
from controlplane.core.hop import FallbackDriver, hop_conditions
from controlplane.core.mint import MintFacts, MintVerdict, decide_mint
from controlplane.core.selection import Candidate
from controlplane.decisions import Decision
from shared.capacity import StateUnavailable
from shared.clock import iso_ms, now_ms
from shared.codes import HTTP_STATUS, Condition, ErrorCode, Outcome, Refusal
from shared.errors import GatewayError
from shared.logging import get_logger
from shared.tokens import new_ulid
from shared.wire import Lease

log = get_logger("control")


class Hop(msgspec.Struct, frozen=True, kw_only=True):
    """A dispatch key's hop, decided: the lease now behind the token (the same one when the hop
    was held or rejected) and the decision."""

    lease: Lease
    decision: Decision
    moved: bool


# A hop refused on the citation's face (no hop can ever follow it), rather than held.
REJECTIONS = frozenset(
    {
        Refusal.FALLBACK_POOL_EXHAUSTED,
        Refusal.FALLBACK_CITED_DECISION_NOT_SELECTED,
        Refusal.FALLBACK_LINEAGE_MISMATCH,
        Refusal.FALLBACK_RESPONSE_WAS_NOT_LOST,
        Refusal.MODEL_NOT_SERVED,
    }
)


def hop_on(driver: FallbackDriver, fallback_on: frozenset[Condition], hop: int, max_hops: int) -> tuple[str, ...]:
    """The conditions a lease hops on (what the data plane stops admitting on), as the wire has them."""
    return tuple(sorted(str(c) for c in hop_conditions(driver, fallback_on, hop, max_hops)))


class DispatchKeys:
    """Mixed into `MintDesk`: reads its `keys`, `decisions`, `registry`, `settings`,
    `lease_capacity` and `granter`, and calls its `gather`, `keep_facts`, `_claim`, `_log` and
    `_retry_after`."""

    async def extend(self, key_id: str, ttl_seconds: int | None) -> MintAnswer:
        """SPEC §17: a dispatch key's expiry moved to `ttl_seconds` from now (bounded as §2),
        keeping its account, position and decision — through `decide_mint`'s holds, as a renewal
        (SPEC §19): a refused extension leaves the expiry as it was and records no decision."""
        try:
            return await self._extend(key_id, ttl_seconds)
        except StateUnavailable:
            return await self._not_kept(key_id, Outcome.HELD, Refusal.FLEET_STATE_UNAVAILABLE)

    async def _extend(self, key_id: str, ttl_seconds: int | None) -> MintAnswer:
        lease = self.keys.get(key_id)
        decision = None if lease is None else await self.decisions.for_key(key_id)
        if lease is None or decision is None or decision.account_id is None:
            raise GatewayError(ErrorCode.DECISION_UNKNOWN, "no live v2 lease with this key_id")
        if decision.driver != FallbackDriver.GATEWAY:
            raise GatewayError(
                ErrorCode.NOT_A_DISPATCH_KEY,
                'only a dispatch key (fallback_driver "gateway") is extended; renew this one',
            )
        verdict = decide_mint(await self.keep_facts(lease, decision))
        if verdict.chosen is None:
            assert verdict.refusal is not None
            return await self._not_kept(key_id, verdict.outcome, verdict.refusal, verdict.retry_after_s)
        ttl_s = ttl_seconds or self.settings.key_ttl_seconds
        extended = msgspec.structs.replace(lease, expires_at_ms=now_ms() + ttl_s * 1000)
        await self.granter.rebind(extended)
        try:  # fleet: the decision and the dispatch's live set live as long as the key (their TTLs)
            await self.decisions.record(decision)
            await self.decisions.note_live(key_id, decision.lineage.repo_slug, decision.lineage.dispatch_id)
        except StateUnavailable:
            pass  # Redis away: the next extend (or re-registration after a loss) refreshes them
        return MintAnswer(
            200,
            {
                "key_id": extended.key_id,
                "account_id": extended.account_id,
                "mint_decision_id": extended.mint_decision_id,
                "expires_at": iso_ms(extended.expires_at_ms),
            },
        )

    async def _not_kept(self, key_id: str, outcome: Outcome, refusal: Refusal, wait_s: int | None = None) -> MintAnswer:
        """An extension refused: `{outcome, refusal_reason}` with the mint's status for it (409
        rejected, 503 held with `Retry-After`)."""
        log.info("extend_refused", key_id=key_id, outcome=str(outcome), refusal_reason=str(refusal))
        body = {"outcome": str(outcome), "refusal_reason": str(refusal), "key_id": key_id}
        if outcome == Outcome.REJECTED:
            return MintAnswer(HTTP_STATUS[refusal], body, no_retry=refusal == Refusal.MODEL_UNPRICED)
        return MintAnswer(503, body, retry_after_s=await self._retry_after(refusal, (), wait_s))

    async def hop(self, lease: Lease, condition: Condition) -> Hop | None:
        """SPEC §17: move a dispatch key to the next eligible sibling, as a retry citing its
        decision. The current lease is ended through the release seam first (so the citation's
        lease is released, as §8 asks); a held or rejected hop re-binds the key where it was."""
        prior = await self.decisions.for_key(lease.key_id)
        if prior is None or prior.driver != FallbackDriver.GATEWAY or prior.account_id is None:
            return None
        await self.granter.release(lease)
        lineage = prior.lineage
        model = None if prior.model_class is not None else lineage.model
        gathered = await self.gather(
            lineage, prior.worker_role, model, prior.model_class, retry_of=prior.mint_decision_id
        )
        base = Decision(
            mint_decision_id="md_" + new_ulid(),
            outcome=Outcome.HELD,
            lineage=lineage,
            at_ms=now_ms(),
            model_class=prior.model_class,
            retry_of=prior.mint_decision_id,
            worker_role=prior.worker_role,
            driver=prior.driver,
            hop_condition=condition,
            policy_revision=0 if gathered.policy is None else gathered.policy.revision,
        )
        verdict = decide_mint(gathered.facts)
        base = msgspec.structs.replace(base, skipped=verdict.skipped)
        chosen = verdict.chosen
        refusal: Refusal | None = verdict.refusal
        if chosen is not None:
            account = self.registry.get(chosen.account_id)
            assert account is not None
            claimed = await self._claim(account, lease.key_id, account.lease_capacity, lineage, None)
            if claimed is None:
                return await self._moved(lease, base, verdict, chosen, gathered.facts)
            refusal = claimed[0]
        decision = msgspec.structs.replace(
            base,
            outcome=Outcome.REJECTED if refusal in REJECTIONS else Outcome.HELD,
            refusal_reason=refusal or Refusal.NO_ELIGIBLE_ACCOUNT,
        )
        await self.decisions.record(decision)
        self._log(decision)
        await self._rebind(lease, prior)
        return Hop(lease=lease, decision=decision, moved=False)

    async def _moved(
        self, lease: Lease, base: Decision, verdict: MintVerdict, chosen: Candidate, facts: MintFacts
    ) -> Hop:
        """The hop selected a sibling: its decision recorded, the key's lease moved to it."""
        decision = msgspec.structs.replace(
            base,
            outcome=Outcome.SELECTED,
            account_id=chosen.account_id,
            fallback_position=chosen.position,
            hop=verdict.hop,
            key_id=lease.key_id,
            effective_model=chosen.effective_model,
        )
        await self.decisions.record(decision)
        self._log(decision)
        moved = msgspec.structs.replace(
            lease,
            account_id=chosen.account_id,
            mint_decision_id=decision.mint_decision_id,
            hop=verdict.hop,
            hop_on=hop_on(FallbackDriver.GATEWAY, facts.fallback_on, verdict.hop, facts.max_hops),
        )
        return Hop(lease=moved, decision=decision, moved=True)

    async def _rebind(self, lease: Lease, prior: Decision) -> None:
        """A hop that did not happen: the key keeps its account, slot and decision. The slot is
        re-taken without its ceiling (it was this key's a moment ago, and only a fleet sibling
        racing into the gap could have taken it)."""
        await self.lease_capacity.reserve(lease.account_id, lease.key_id, None)
        await self.decisions.note_live(lease.key_id, prior.lineage.repo_slug, prior.lineage.dispatch_id)
