"""What a mint, a renewal and an extension know before they decide (SPEC §5, §6, §8, §19, §22):
the chains, the resolved policy, the candidates, a citation, and each candidate account's live
facts, read at once (fleet mode: one round of Redis commands). `MintDesk` mixes it in; the
decision itself is `core/mint.decide_mint`, the shell around it `controlplane/mint.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from controlplane.core.budgets import Exhausted, LevelBudget
from controlplane.core.candidates import build_candidates
from controlplane.core.fallback import CitationKind, CitedDecision, Lineage
from controlplane.core.mint import MintFacts
from controlplane.core.policy import ResolvedPolicy
from controlplane.core.selection import Candidate, LiveFacts
from controlplane.decisions import Decision
from controlplane.registry import AccountSpec
from shared.clock import now_ms
from shared.wire import Lease

if TYPE_CHECKING:
    from controlplane.circuits import CircuitRegistry
    from controlplane.decisions import DecisionStore
    from controlplane.overlays import AdminOverlay, BudgetFacts, HeadroomFacts, PolicySource
    from controlplane.registry import Registry
    from controlplane.stores.keys import KeyTable
    from shared.capacity import CapacityStore
    from shared.settings import Settings


class Gathered(msgspec.Struct, frozen=True, kw_only=True):
    """The facts of one mint (or explain), and the resolved policy they came from."""

    facts: MintFacts
    policy: ResolvedPolicy | None


class FactDesk:
    """The facts half of `MintDesk` (a mixin: the attributes are `MintDesk.__init__`'s)."""

    settings: Settings
    registry: Registry
    keys: KeyTable
    decisions: DecisionStore
    lease_capacity: CapacityStore
    circuits: CircuitRegistry
    admin: AdminOverlay
    policy: PolicySource
    budgets: BudgetFacts
    headroom: HeadroomFacts
    configured: Callable[[AccountSpec], bool]

    async def gather(
        self,
        lineage: Lineage,
        worker_role: str | None,
        model: str | None,
        model_class: str | None,
        *,
        retry_of: str | None = None,
        supersedes: str | None = None,
    ) -> Gathered:
        """Everything `decide_mint` reads, for a mint or for explain's dry run of one."""
        early = self._read_early(lineage, worker_role, model, model_class, retry_of or supersedes)
        # fleet: the chains as they are now, and the reads made early, awaited as one flat gather
        # (one exchange; no nested gathers' tasks and loop turns between its replies and the
        # decision; issue 27 §4)
        got = await asyncio.gather(
            self.admin.refresh(), self.policy.refresh(), *([] if early is None else early.reads), return_exceptions=True
        )
        _raise_first(got[:2])
        admin_ok = not self.admin.is_unavailable()
        policy_ok = not self.policy.is_unavailable()
        if not policy_ok:
            return Gathered(
                facts=MintFacts(admin_available=admin_ok, policy_available=False, lineage=lineage), policy=None
            )
        policy = self.policy.resolve(lineage.repo_slug, worker_role)
        candidates = build_candidates(self.registry.accounts, policy, model, model_class)
        citation = CitationKind.RETRY if retry_of else CitationKind.SUPERSEDE if supersedes else None
        cited_id = retry_of or supersedes
        # One round (fleet: the reads go to Redis at once, not one after another; issue 27), and
        # that round is the chains' own when the policy's candidates are the ones read early.
        basis = _basis(candidates, admin_ok)
        if early is not None and early.basis == basis:
            _raise_first(got[2:])  # a read that failed fails the mint, as it would now
            live_keys, cited = got[2], None
            remote = early.remote(got[3:])
            live = self._assemble(candidates, remote, floor=policy.min_headroom_percent) if basis else {}
        else:  # not read early, or on other candidates: read now (what was read early is dropped)
            live_keys, cited, live = await asyncio.gather(
                self.decisions.live_keys(lineage.repo_slug, lineage.dispatch_id),
                _none() if cited_id is None else self._cited(cited_id, candidates),
                self.live_facts(candidates, floor=policy.min_headroom_percent) if basis else _empty(),
            )
        exhausted, unpriced = self._budget_facts(policy.budgets, policy.revision, candidates)
        facts = MintFacts(
            admin_available=admin_ok,
            policy_available=True,
            lineage=lineage,
            candidates=candidates,
            citation=citation,
            cited=cited,
            dispatch_live=bool(live_keys),
            fallback_on=policy.fallback_on,
            max_hops=min(policy.max_fallback_hops, self.settings.max_fallback_hops),
            live=live,
            exhausted=exhausted,
            unpriced_model=unpriced,
        )
        return Gathered(facts=facts, policy=policy)

    async def keep_facts(self, lease: Lease, prior: Decision) -> MintFacts:
        """SPEC §19: what `decide_mint` reads to keep a key on its account (a renewal, a dispatch
        key's extension): the chains as they are now, the chain's budgets and the model's price,
        the account's operator state, and whether the key still holds its slot — asked of the
        lease table (fleet: of Redis, so one that cannot answer holds it `fleet-state-unavailable`);
        a key that lost its slot is judged by every live filter, as a mint."""
        assert prior.account_id is not None
        await asyncio.gather(self.admin.refresh(), self.policy.refresh())
        account = self.registry.get(prior.account_id)
        assert account is not None
        candidate = Candidate(
            account_id=account.id,
            position=prior.fallback_position or 0,
            provider_binding=str(account.provider_binding),
            effective_model=prior.effective_model or "",
        )
        holding = await self.lease_capacity.holds(lease.key_id)
        policy_ok = not self.policy.is_unavailable()
        exhausted, unpriced = (
            self._budget_facts(self.budgets.on_chain(lease.repo_slug, lease.worker_role), None, (candidate,))
            if policy_ok
            else ((), None)
        )
        live = (
            {
                account.id: LiveFacts(
                    configured=self.configured(account), administrative_state=self.admin.state_of(account.id)
                )
            }
            if holding
            else await self.live_facts((candidate,), renewing=lease.key_id)
        )
        return MintFacts(
            admin_available=not self.admin.is_unavailable(),
            policy_available=policy_ok,
            lineage=prior.lineage,
            candidates=(candidate,),
            live=live,
            exhausted=exhausted,
            unpriced_model=unpriced,
            holding=holding,
        )

    def _budget_facts(
        self, budgets: tuple[LevelBudget, ...], revision: int | None, candidates: tuple[Candidate, ...]
    ) -> tuple[tuple[Exhausted, ...], str | None]:
        """A chain's exhausted budgets, and a candidate's model with no price (SPEC §18: only
        where the chain holds a budget)."""
        if not budgets:
            return (), None
        unpriced = next((c.effective_model for c in candidates if not self.budgets.is_priced(c.effective_model)), None)
        return self.budgets.exhausted(budgets, revision), unpriced

    async def _cited(self, decision_id: str, candidates: tuple[Candidate, ...]) -> CitedDecision | None:
        cited = await self.decisions.get(decision_id)
        if cited is None:
            refused = await self.decisions.refused_outcome(decision_id)
            if refused is None:
                return None
            # Only the outcome of a refused decision is kept; it alone decides the verdict
            # (`fallback-cited-decision-not-selected` is checked before the rest).
            return CitedDecision(
                outcome=refused,
                lineage=Lineage("", "", ""),
                hop=0,
                lease_released=True,
                terminal_conditions=(),
                position_now=None,
            )
        position_now = next((c.position for c in candidates if c.account_id == cited.account_id), None)
        released = cited.key_id is None or not await self.lease_capacity.holds(cited.key_id)
        return CitedDecision(
            outcome=cited.outcome,
            lineage=cited.lineage,
            hop=cited.hop,
            lease_released=released,
            terminal_conditions=await self.decisions.evidence(decision_id),
            position_now=position_now,
        )

    def _read_early(
        self,
        lineage: Lineage,
        worker_role: str | None,
        model: str | None,
        model_class: str | None,
        cited_id: str | None,
    ) -> _Early | None:
        """Fleet mode: the Redis reads of a mint on the candidates of the policy as last validated,
        to be awaited beside the chains' refresh (issue 27: one round less). `gather` keeps them
        when the refreshed policy yields the same candidates, and reads again otherwise. Not for a
        citation (its reads depend on the cited decision), nor embedded (nothing to overlap)."""
        if self.settings.fleet_redis_url is None or cited_id is not None:
            return None
        try:
            admin_ok = not self.admin.is_unavailable()
            policy = self.policy.resolve(lineage.repo_slug, worker_role)
            candidates = build_candidates(self.registry.accounts, policy, model, model_class)
        except Exception:  # a chain not validated lately, or not believable: nothing early
            return None
        basis = _basis(candidates, admin_ok)
        accounts = self._accounts(candidates) if basis else []
        now = now_ms()
        reads = [self.decisions.live_keys(lineage.repo_slug, lineage.dispatch_id), *self._live_reads(accounts, now)]
        return _Early(basis, accounts, now, reads)

    async def live_facts(
        self, candidates: tuple[Candidate, ...], renewing: str | None = None, floor: int = 0
    ) -> dict[str, LiveFacts]:
        """What is true of each candidate's account now. Every read at once (fleet: one round of
        concurrent Redis commands instead of two per candidate in turn). `floor`: the resolved
        policy's `min_headroom_percent` (a renewal passes none: a running dispatch is never moved
        by headroom alone, SPEC §22)."""
        return self._assemble(candidates, await self._remote_live(candidates, renewing), floor)

    async def _remote_live(
        self, candidates: tuple[Candidate, ...], renewing: str | None = None
    ) -> tuple[bool, list[bool], list[int | None], int]:
        """The shared state's part of the live facts (fleet: Redis), read at `now`, in one gather."""
        now = now_ms()
        accounts = self._accounts(candidates)
        reads = self._live_reads(accounts, now)
        if renewing is not None:
            reads.insert(0, self.lease_capacity.holds(renewing))
        got = await asyncio.gather(*reads)
        renewing_holds = bool(got[0]) if renewing is not None else False
        return _Early((), accounts, now, []).remote(got[1:] if renewing is not None else got, renewing_holds)

    def _accounts(self, candidates: tuple[Candidate, ...]) -> list[AccountSpec]:
        return [a for a in (self.registry.get(c.account_id) for c in candidates) if a is not None]

    def _live_reads(self, accounts: list[AccountSpec], now: int) -> list[Awaitable[Any]]:
        """Each account's circuit, then each ceilinged account's lease count (no read for an
        account without a ceiling: its count is None)."""
        return [
            *(self.circuits.admits(a.id, now) for a in accounts),
            *(self.lease_capacity.count(a.id) for a in accounts if a.lease_capacity is not None),
        ]

    def _assemble(
        self, candidates: tuple[Candidate, ...], remote: tuple[bool, list[bool], list[int | None], int], floor: int
    ) -> dict[str, LiveFacts]:
        """The live facts from the shared state's part and this host's own (admin state, headroom)."""
        renewing_holds, admits, counts, now = remote
        accounts = [self.registry.get(candidate.account_id) for candidate in candidates]
        assert all(account is not None for account in accounts)
        facts: dict[str, LiveFacts] = {}
        for account, circuit_admits, count in zip(accounts, admits, counts, strict=True):
            assert account is not None
            ceiling = account.lease_capacity
            if ceiling is not None and renewing_holds:
                ceiling += 1  # the predecessor's slot is about to be returned
            facts[account.id] = LiveFacts(
                configured=self.configured(account),
                administrative_state=self.admin.state_of(account.id),
                circuit_admits=circuit_admits,
                lease_room=ceiling is None or (count is not None and count < ceiling),
                headroom_low=self.headroom.low(account.id, floor, now),
                headroom_lifts_at_ms=self.headroom.lifts_at(account.id, floor, now) if floor else None,
            )
        return facts


def _basis(candidates: tuple[Candidate, ...], admin_ok: bool) -> tuple[str, ...]:
    """What the live reads depend on: the candidates' accounts, in order (none when the admin
    chain cannot be believed: nothing is read then)."""
    return tuple(c.account_id for c in candidates) if admin_ok else ()


class _Early:
    """A mint's reads made early (`FactDesk._read_early`): on which candidates, and the awaitables
    (the dispatch's live keys, then `_live_reads`)."""

    __slots__ = ("basis", "accounts", "now", "reads")

    def __init__(
        self, basis: tuple[str, ...], accounts: list[AccountSpec], now: int, reads: list[Awaitable[Any]]
    ) -> None:
        self.basis = basis
        self.accounts = accounts
        self.now = now
        self.reads = reads

    def remote(
        self, got: Sequence[Any], renewing_holds: bool = False
    ) -> tuple[bool, list[bool], list[int | None], int]:
        """`_live_reads`' answers as `_assemble` takes them: each account's circuit and count."""
        accounts = self.accounts
        admits = [bool(a) for a in got[: len(accounts)]]
        counts = iter(got[len(accounts) :])
        return renewing_holds, admits, [None if a.lease_capacity is None else next(counts) for a in accounts], self.now


def _raise_first(got: Sequence[Any]) -> None:
    """A gather's first failure (`return_exceptions=True`), raised."""
    failed = next((r for r in got if isinstance(r, BaseException)), None)
    if failed is not None:
        raise failed


async def _none() -> None:
    return None


async def _empty() -> dict[str, LiveFacts]:
    return {}


async def _true() -> bool:
    return True
