"""`decide_mint` (SPEC §5, §6, §8, §18): the one decision of a v2 mint, renewal or explain.

Pure and total. The shell gathers the facts (`MintFacts`: the chains' verdicts, the resolved
policy's fallback rules, the candidate list, the citation, the live facts of each candidate and
the budgets of the chain) and this function decides, in this order, each step stopping at its
first refusal:

1. the admin overlay's chain can be believed, else held `account-state-unavailable`;
2. the policy chain can be believed, else held `policy-unavailable`;
3. some candidate serves the model, else rejected `model-not-served`;
4. no candidate's effective model lacks a price where the chain holds a budget, else rejected
   `model-unpriced` (SPEC §18: unpriced is never free);
5. the citation and the one-live-lease-per-dispatch rule (`authorise_fallback`) — its
   rejections here;
6. no budget of the chain is exhausted, else held `budget-exhausted`, with `retry_after_s` until
   the *last* of the exhausted windows resets (a mint can proceed only once all of them have);
7. `authorise_fallback`'s holds;
8. the first candidate no live filter rules out (`select_account`) — or, for a key that already
   holds its slot (`holding`: a renewal or a dispatch key's extension, SPEC §19), its own account
   unless it is disabled or draining (rejected `administrative-disabled` /
   `administrative-draining`): the circuit and capacity filters do not apply to a slot already
   held.

Why this order: the chains first, because without them no other fact can be believed; then
every rejection before every hold, since a rejection is final and a hold says "come back", and
telling a worker to come back only to reject it then wastes its wait; among the holds the
budget's first, because its wait (until a window resets) is the longest and binds every other
— a worker told "retry in 1 s" by a fallback hold would only be held again.

The mint, renewal, a dispatch key's `extend` and `GET /control/v2/policy/explain` all call this,
so what explain says a mint would do is what the mint does, and a key's life never outlasts a
hold the mint would apply (SPEC §19). The verdict is advisory about capacity: the shell's
reservation (and the circuit's probe claim) still decides, after it.
"""

from __future__ import annotations

import msgspec

from controlplane.core.budgets import Exhausted, retry_after_s
from controlplane.core.fallback import CitationKind, CitedDecision, Lineage, authorise_fallback
from controlplane.core.selection import Candidate, LiveFacts, Skipped, select_account
from shared.codes import AdminState, Condition, Outcome, Refusal


class MintFacts(msgspec.Struct, frozen=True, kw_only=True):
    admin_available: bool
    policy_available: bool
    lineage: Lineage
    candidates: tuple[Candidate, ...] = ()
    citation: CitationKind | None = None  # None: a fresh mint (or a renewal)
    cited: CitedDecision | None = None  # None with a citation: lineage unknown
    dispatch_live: bool = False  # another live lease of this dispatch exists
    fallback_on: frozenset[Condition] = frozenset(Condition)
    max_hops: int = 1  # min(policy, platform)
    live: dict[str, LiveFacts] = {}
    exhausted: tuple[Exhausted, ...] = ()  # budgets of the chain exhausted now (§18)
    unpriced_model: str | None = None  # a candidate's model without a price, in a budgeted chain
    holding: bool = False  # renewal / extend of a key holding its slot (one candidate)


class MintVerdict(msgspec.Struct, frozen=True, kw_only=True):
    outcome: Outcome  # SELECTED: reserve `chosen`
    refusal: Refusal | None = None
    chosen: Candidate | None = None
    skipped: tuple[Skipped, ...] = ()
    hop: int = 0
    retry_after_s: int | None = None  # `budget-exhausted`: until the last window resets


def _refused(outcome: Outcome, refusal: Refusal, skipped: tuple[Skipped, ...] = ()) -> MintVerdict:
    return MintVerdict(outcome=outcome, refusal=refusal, skipped=skipped)


def decide_mint(facts: MintFacts) -> MintVerdict:
    if not facts.admin_available:
        return _refused(Outcome.HELD, Refusal.ACCOUNT_STATE_UNAVAILABLE)
    if not facts.policy_available:
        return _refused(Outcome.HELD, Refusal.POLICY_UNAVAILABLE)
    if not facts.candidates:
        return _refused(Outcome.REJECTED, Refusal.MODEL_NOT_SERVED)
    if facts.unpriced_model is not None:
        return _refused(Outcome.REJECTED, Refusal.MODEL_UNPRICED)
    verdict = authorise_fallback(
        facts.citation, facts.cited, facts.lineage, facts.fallback_on, facts.max_hops, dispatch_live=facts.dispatch_live
    )
    if verdict.refusal is not None and verdict.outcome == Outcome.REJECTED:
        return _refused(verdict.outcome, verdict.refusal)
    if facts.exhausted:
        return MintVerdict(
            outcome=Outcome.HELD, refusal=Refusal.BUDGET_EXHAUSTED, retry_after_s=retry_after_s(facts.exhausted)
        )
    if verdict.refusal is not None:
        return _refused(verdict.outcome, verdict.refusal)
    if facts.holding:
        return _kept(facts.candidates[0], facts.live.get(facts.candidates[0].account_id))
    selection = select_account(facts.candidates, facts.live, verdict.start_position)
    if selection.chosen is None:
        refusal = selection.refusal or Refusal.NO_ELIGIBLE_ACCOUNT
        outcome = Outcome.REJECTED if refusal == Refusal.FALLBACK_POOL_EXHAUSTED else Outcome.HELD
        return _refused(outcome, refusal, selection.skipped)
    return MintVerdict(outcome=Outcome.SELECTED, chosen=selection.chosen, skipped=selection.skipped, hop=verdict.hop)


# SPEC §19: what still refuses a key that holds its slot (renewal, extend): the operator's word.
KEEP_REFUSALS: dict[AdminState, Refusal] = {
    AdminState.DISABLED: Refusal.ADMINISTRATIVE_DISABLED,
    AdminState.DRAINING: Refusal.ADMINISTRATIVE_DRAINING,
}


def _kept(candidate: Candidate, live: LiveFacts | None) -> MintVerdict:
    """The held key's own account, unless the operator disabled or is draining it."""
    refusal = None if live is None else KEEP_REFUSALS.get(live.administrative_state)
    if refusal is not None:
        return _refused(Outcome.REJECTED, refusal)
    return MintVerdict(outcome=Outcome.SELECTED, chosen=candidate)
