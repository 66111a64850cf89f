"""The v2 mint and renewal (SPEC §5, §6, §8): identity and intent in, an account chosen by the
gateway.

Reading order of `mint_v2`: gather the facts (chains, policy, candidates, citation, live facts)
→ `decide_mint` (the one pure decision, which explain also calls) → reserve the lease slot and
claim the dispatch and the circuit's probe (these decide; the decision's capacity check was
advisory) → grant → record the decision. Every decision (selected, held or rejected) is
recorded with its lineage.

Fleet mode (SPEC §16): shared state that cannot answer (`StateUnavailable`) holds a mint or a
renewal `fleet-state-unavailable` (unrecorded: the table is in that Redis), undoing any claim.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec

from controlplane.answers import MintAnswer
from controlplane.circuits import CircuitRegistry
from controlplane.core.fallback import Lineage
from controlplane.core.mint import MintFacts, MintVerdict, decide_mint
from controlplane.core.selection import LiveFacts, Skipped
from controlplane.decisions import Decision, DecisionStore
from controlplane.dispatchkeys import DispatchKeys
from controlplane.dispatchkeys import hop_on as lease_hop_on
from controlplane.mintfacts import FactDesk, _none, _true
from controlplane.mintshapes import HOLD_RETRY_S, Granter, MintV2, lineage_of, refused_body, selected_body
from controlplane.overlays import AdminOverlay, BudgetFacts, HeadroomFacts, NoBudgets, NoHeadroom, PolicySource
from controlplane.registry import AccountSpec, Registry
from controlplane.stores.keys import KeyTable
from shared.bounds import retry_after_ms
from shared.capacity import CapacityStore, StateUnavailable
from shared.clock import now_ms
from shared.codes import HTTP_STATUS, ErrorCode, Outcome, Refusal, Skip
from shared.errors import GatewayError
from shared.logging import get_logger
from shared.settings import Settings
from shared.tokens import new_token, new_ulid
from shared.wire import Lease

log = get_logger("control")


class MintDesk(DispatchKeys, FactDesk):
    """The v2 mint and renewal; the dispatch keys' extension and hop are `DispatchKeys`'s."""

    def __init__(
        self,
        *,
        settings: Settings,
        registry: Registry,
        keys: KeyTable,
        decisions: DecisionStore,
        lease_capacity: CapacityStore,
        circuits: CircuitRegistry,
        admin: AdminOverlay,
        policy: PolicySource,
        granter: Granter,
        configured: Callable[[AccountSpec], bool],
        budgets: BudgetFacts | None = None,
        headroom: HeadroomFacts | None = None,
        decision_listeners: tuple[Callable[[Decision], None], ...] = (),
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.keys = keys
        self.decisions = decisions
        self.lease_capacity = lease_capacity
        self.circuits = circuits
        self.admin = admin
        self.policy = policy
        self.granter = granter
        self.configured = configured
        self.decision_listeners = decision_listeners  # each decision made, in this order
        self.budgets: BudgetFacts = NoBudgets() if budgets is None else budgets  # SPEC §18 (`BudgetGuard`)
        self.headroom: HeadroomFacts = NoHeadroom() if headroom is None else headroom  # SPEC §22

    # ---- entry points -------------------------------------------------------------------

    async def mint_v2(self, body: MintV2) -> MintAnswer:
        if (body.model is None) == (body.model_class is None):
            raise GatewayError(ErrorCode.INVALID_REQUEST, "give exactly one of model or model_class")
        if body.retry_of_mint_decision_id and body.supersedes_mint_decision_id:
            raise GatewayError(
                ErrorCode.INVALID_REQUEST,
                "retry_of_mint_decision_id and supersedes_mint_decision_id are mutually exclusive",
            )
        lineage = lineage_of(body.dispatch_id, body.repo_slug, body.model, body.model_class)
        base = Decision(
            mint_decision_id="md_" + new_ulid(),
            outcome=Outcome.HELD,
            lineage=lineage,
            at_ms=now_ms(),
            model_class=body.model_class,
            retry_of=body.retry_of_mint_decision_id,
            supersedes=body.supersedes_mint_decision_id,
            worker_role=body.worker_role,
            driver=str(body.fallback_driver),
        )
        try:
            gathered = await self.gather(
                lineage,
                body.worker_role,
                body.model,
                body.model_class,
                retry_of=body.retry_of_mint_decision_id,
                supersedes=body.supersedes_mint_decision_id,
            )
            if gathered.policy is not None:
                base = msgspec.structs.replace(base, policy_revision=gathered.policy.revision)
            return await self._conclude(base, body, decide_mint(gathered.facts), predecessor=None, facts=gathered.facts)
        except StateUnavailable as exc:
            return self._unavailable(base, exc)

    async def renew(self, key_id: str, ttl_seconds: int | None) -> MintAnswer:
        """A successor on the same account and position; no citation; the caller revokes after."""
        try:
            return await self._renew(key_id, ttl_seconds)
        except StateUnavailable as exc:
            return self._unavailable(
                Decision(
                    mint_decision_id="md_" + new_ulid(),
                    outcome=Outcome.HELD,
                    lineage=Lineage("", "", ""),
                    at_ms=now_ms(),
                ),
                exc,
            )

    async def _renew(self, key_id: str, ttl_seconds: int | None) -> MintAnswer:
        prior = await self.decisions.for_key(key_id)
        lease = self.keys.get(key_id)
        if prior is None or lease is None or prior.account_id is None:
            raise GatewayError(ErrorCode.DECISION_UNKNOWN, "no live v2 lease with this key_id")
        base = msgspec.structs.replace(
            prior,
            mint_decision_id="md_" + new_ulid(),
            at_ms=now_ms(),
            outcome=Outcome.HELD,
            key_id=None,
            skipped=(),
            retry_of=None,
            supersedes=None,
            renewal_of=prior.mint_decision_id,
        )
        facts = await self.keep_facts(lease, prior)
        verdict = decide_mint(facts)
        if verdict.chosen is not None:  # the successor keeps the predecessor's position
            verdict = msgspec.structs.replace(verdict, hop=prior.hop)
        body = MintV2(
            dispatch_id=prior.lineage.dispatch_id,
            repo_slug=lease.repo_slug,
            principal_kind=lease.principal_kind,
            principal_id=lease.principal_id,
            worker_role=lease.worker_role,
            model=prior.effective_model,
            ttl_seconds=ttl_seconds,
        )
        return await self._conclude(base, body, verdict, predecessor=key_id, hop_on=lease.hop_on, holding=facts.holding)

    # ---- the facts ----------------------------------------------------------------------

    # ---- the shell around the decision --------------------------------------------------

    async def _conclude(
        self,
        base: Decision,
        body: MintV2,
        verdict: MintVerdict,
        predecessor: str | None,
        facts: MintFacts | None = None,
        hop_on: tuple[str, ...] = (),
        holding: bool = False,
    ) -> MintAnswer:
        base = msgspec.structs.replace(base, skipped=verdict.skipped)
        if verdict.chosen is None:
            assert verdict.refusal is not None
            return await self._refuse(
                base,
                verdict.outcome,
                verdict.refusal,
                verdict.retry_after_s,
                live=facts.live if facts is not None else {},
            )
        chosen = verdict.chosen
        account = self.registry.get(chosen.account_id)
        assert account is not None
        ceiling = account.lease_capacity
        if ceiling is not None and predecessor is not None and await self.lease_capacity.holds(predecessor):
            ceiling += 1
        token, key_id, digest = new_token()
        decision = msgspec.structs.replace(
            base,
            outcome=Outcome.SELECTED,
            account_id=account.id,
            fallback_position=chosen.position,
            hop=verdict.hop,
            key_id=key_id,
            effective_model=chosen.effective_model,
        )
        refusal = await self._claim(
            account, key_id, ceiling, base.lineage, predecessor, probe=not holding, staged=decision
        )
        if refusal is not None:
            code, skip = refusal
            skipped = (
                base.skipped
                if skip is None
                else base.skipped + (Skipped(account_id=account.id, position=chosen.position, code=skip),)
            )
            return await self._refuse(msgspec.structs.replace(base, skipped=skipped), Outcome.HELD, code)
        lease = self._lease(body, base, verdict, account.id, key_id, digest, hop_on, facts)
        try:
            await self.decisions.record(decision, staged=True)  # fleet: written with the claims
        except StateUnavailable:
            await self._unclaim(account.id, key_id, decision)
            raise
        self._log(decision)
        minted = await self.granter.grant(lease, account, token)
        base_url: str = minted.base_url  # type: ignore[attr-defined]
        return MintAnswer(201, selected_body(decision, lease, token, base_url, verdict.skipped))

    def _lease(
        self,
        body: MintV2,
        base: Decision,
        verdict: MintVerdict,
        account_id: str,
        key_id: str,
        digest: bytes,
        hop_on: tuple[str, ...],
        facts: MintFacts | None,
    ) -> Lease:
        """The lease a selected mint grants: its principal, lineage, TTL and hops (SPEC §5, §8)."""
        ttl_s = body.ttl_seconds or self.settings.key_ttl_seconds
        return Lease(
            key_id=key_id,
            digest=digest,
            account_id=account_id,
            expires_at_ms=now_ms() + ttl_s * 1000,
            principal_kind=body.principal_kind,
            principal_id=body.principal_id,
            repo_slug=body.repo_slug,
            dispatch_id=body.dispatch_id,
            mint_decision_id=base.mint_decision_id,
            worker_role=body.worker_role,
            hop=verdict.hop,
            hop_on=hop_on
            if facts is None
            else lease_hop_on(body.fallback_driver, facts.fallback_on, verdict.hop, facts.max_hops),
        )

    async def _claim(
        self,
        account: AccountSpec,
        key_id: str,
        ceiling: int | None,
        lineage: Lineage,
        predecessor: str | None,
        *,
        probe: bool = True,
        staged: Decision | None = None,
    ) -> tuple[Refusal, Skip | None] | None:
        """Take what the decision only read: the lease slot, the dispatch's one live lease and
        (half-open) the circuit's one probe, each atomically (no probe for the successor of a key
        that holds its slot: the circuit does not apply to it, SPEC §19); undo the taken ones on a refusal,
        so no key outlives a refused claim. A claim that timed out is undone too: a hung Redis
        runs it when it resumes (fleet: the undo is owed until then).

        The three are independent atomic claims, taken at once (fleet: one round of Redis
        commands instead of three in turn; issue 27) and every one waited for before any undo,
        so an undo never overtakes the claim it undoes. The refusal named is the first in the
        order they were once taken: the slot, the dispatch, the probe. A key that already holds
        its slot (`probe=False`: a renewal, SPEC §19) takes no circuit probe.

        A mint's selected decision (`staged`, for the new key `key_id`) is staged with them
        (fleet: written in the same exchange, one round trip less) and unstaged with the undo:
        its id and key are answered only after every claim held, so a refused claim leaves no
        decision anyone can cite (SPEC §5). A hop stages nothing: its key's index names the
        decision the key holds now, until the hop's is recorded."""
        taken = await asyncio.gather(
            self.lease_capacity.reserve(account.id, key_id, ceiling),
            self.decisions.claim_live(key_id, lineage.repo_slug, lineage.dispatch_id, allowing=predecessor),
            self.circuits.claim_probe(account.id, key_id, now_ms()) if probe else _true(),
            _none() if staged is None else self.decisions.stage(staged),
            return_exceptions=True,
        )
        failed = next((t for t in taken if isinstance(t, BaseException)), None)
        if failed is not None:
            if isinstance(failed, StateUnavailable):
                await self._unclaim(account.id, key_id, staged)
            raise failed
        reserved, live, probed, _ = taken
        if reserved and live and probed:
            return None
        await asyncio.gather(
            self.lease_capacity.release(key_id) if reserved else _none(),
            self.decisions.end_key(key_id) if live else _none(),
            self.circuits.on_lease_ended(account.id, key_id, now_ms()) if probe and probed else _none(),
            _none() if staged is None else self.decisions.unstage(staged),
        )
        if not reserved:
            return Refusal.NO_ELIGIBLE_ACCOUNT, Skip.LEASE_CAPACITY_EXHAUSTED
        if not live:
            return Refusal.FALLBACK_LEASE_STILL_HELD, None
        return Refusal.NO_ELIGIBLE_ACCOUNT, Skip.CIRCUIT_OPEN

    async def _unclaim(self, account_id: str, key_id: str, staged: Decision | None = None) -> None:
        """Undo a claim (and the decision staged with it) the shared state failed under (fleet:
        each undo that cannot land now is kept and retried, `controlplane/fleet/owed.py`)."""
        await self.lease_capacity.release(key_id)
        await self.decisions.end_key(key_id)
        await self.circuits.on_lease_ended(account_id, key_id, now_ms())
        if staged is not None:
            await self.decisions.unstage(staged, failed=True)

    async def _refuse(
        self,
        base: Decision,
        outcome: Outcome,
        refusal: Refusal,
        wait_s: int | None = None,
        live: dict[str, LiveFacts] | None = None,
    ) -> MintAnswer:
        decision = msgspec.structs.replace(base, outcome=outcome, refusal_reason=refusal)
        await self.decisions.record(decision)
        self._log(decision)
        body = refused_body(decision)
        if outcome == Outcome.REJECTED:  # 409, or 403 `model-unpriced`, which no retry changes
            return MintAnswer(HTTP_STATUS[refusal], body, no_retry=refusal == Refusal.MODEL_UNPRICED)
        return MintAnswer(
            503, body, retry_after_s=await self._retry_after(refusal, decision.skipped, wait_s, live or {})
        )

    def _unavailable(self, base: Decision, exc: StateUnavailable) -> MintAnswer:
        """SPEC §16: the fleet's shared state did not answer: held, in the held shape."""
        decision = msgspec.structs.replace(
            base, outcome=Outcome.HELD, skipped=(), refusal_reason=Refusal.FLEET_STATE_UNAVAILABLE
        )
        log.warning("fleet_state_unavailable", mint_decision_id=decision.mint_decision_id, error=str(exc))
        self._log(decision)
        body = refused_body(decision)
        return MintAnswer(503, body, retry_after_s=HOLD_RETRY_S[Refusal.FLEET_STATE_UNAVAILABLE])

    def _log(self, decision: Decision) -> None:
        for listener in self.decision_listeners:
            listener(decision)
        log.info(
            "mint_decided",
            mint_decision_id=decision.mint_decision_id,
            outcome=str(decision.outcome),
            refusal_reason=None if decision.refusal_reason is None else str(decision.refusal_reason),
            account_id=decision.account_id,
            position=decision.fallback_position,
            hop=decision.hop,
            dispatch_id=decision.lineage.dispatch_id,
            repo_slug=decision.lineage.repo_slug,
        )

    async def _retry_after(
        self,
        refusal: Refusal,
        skipped: tuple[Skipped, ...],
        wait_s: int | None = None,
        live: dict[str, LiveFacts] | None = None,
    ) -> int:
        """Whole seconds: the decision's own wait when it knows one (`budget-exhausted`: until
        the last exhausted window resets), else the earliest a skipped candidate may return."""
        if wait_s is not None:
            return max(1, wait_s)
        wait = HOLD_RETRY_S.get(refusal, 5)
        if refusal == Refusal.NO_ELIGIBLE_ACCOUNT:
            now = now_ms()
            waits = []
            for skip in skipped:
                if skip.code == Skip.CIRCUIT_OPEN:
                    circuit = await self.circuits.get(skip.account_id, now)
                    if circuit.retry_at_ms is not None and circuit.retry_at_ms > now:
                        waits.append(retry_after_ms(circuit.retry_at_ms - now))
                    else:
                        waits.append(1)
                elif skip.code == Skip.LEASE_CAPACITY_EXHAUSTED:
                    waits.append(1)
                elif skip.code == Skip.RATE_LIMIT_HEADROOM_LOW:  # until its low kinds reset (§22)
                    lifts = (live or {}).get(skip.account_id, LiveFacts(configured=True)).headroom_lifts_at_ms
                    waits.append(1 if lifts is None or lifts <= now else retry_after_ms(lifts - now))
            if waits:
                wait = min(waits)
        return retry_after_ms(int(wait) * 1000)
