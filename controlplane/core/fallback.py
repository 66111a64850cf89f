"""`authorise_fallback` (SPEC §8, seed 000 D4): may this dispatch take a lease further down?

Pure and total. A citation is either a retry (the cited attempt failed on the gateway's own
evidence; advance one position, spend one hop) or a supersede (the cited mint's response was
lost; same position, no hop, and no terminal evidence may exist). Every rejection is checked
before every hold, so an inadmissible citation is never first answered with a transient.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from shared.codes import Condition, Outcome, Refusal


class CitationKind(StrEnum):
    RETRY = "retry"
    SUPERSEDE = "supersede"


class Lineage(msgspec.Struct, frozen=True):
    dispatch_id: str
    repo_slug: str
    model: str  # the requested model, or "class:<name>" for a model_class mint


class CitedDecision(msgspec.Struct, frozen=True, kw_only=True):
    outcome: Outcome
    lineage: Lineage
    hop: int
    lease_released: bool  # asked of the lease capacity table
    terminal_conditions: tuple[Condition | None, ...]  # one per terminal row of its key
    position_now: int | None  # the cited account's index in today's candidate list


class FallbackVerdict(msgspec.Struct, frozen=True, kw_only=True):
    outcome: Outcome  # SELECTED here means "proceed to selection"
    refusal: Refusal | None = None
    start_position: int = 0
    hop: int = 0


def _held(refusal: Refusal) -> FallbackVerdict:
    return FallbackVerdict(outcome=Outcome.HELD, refusal=refusal)


def _rejected(refusal: Refusal) -> FallbackVerdict:
    return FallbackVerdict(outcome=Outcome.REJECTED, refusal=refusal)


def authorise_fallback(
    kind: CitationKind | None,
    cited: CitedDecision | None,
    lineage: Lineage,
    fallback_on: frozenset[Condition],
    max_hops: int,
    *,
    dispatch_live: bool = False,
) -> FallbackVerdict:
    """Both SPEC §8 rules of a v2 mint in one table: the citation (if any), and one live lease
    per dispatch. `kind` None is a fresh mint (no citation); `dispatch_live` says the dispatch
    has a live lease other than the cited one (a renewal's successor, a sibling hop)."""
    if kind is None:
        if dispatch_live:  # one live lease per dispatch: revoke, then re-mint
            return _held(Refusal.FALLBACK_LEASE_STILL_HELD)
        return FallbackVerdict(outcome=Outcome.SELECTED)
    if cited is None:
        return _held(Refusal.FALLBACK_LINEAGE_UNKNOWN)
    # ---- rejections: the citation is inadmissible on its face ----
    if cited.outcome != Outcome.SELECTED:
        return _rejected(Refusal.FALLBACK_CITED_DECISION_NOT_SELECTED)
    if cited.lineage != lineage or cited.position_now is None:
        return _rejected(Refusal.FALLBACK_LINEAGE_MISMATCH)
    if kind == CitationKind.SUPERSEDE and cited.terminal_conditions:
        return _rejected(Refusal.FALLBACK_RESPONSE_WAS_NOT_LOST)
    # ---- holds: admissible, but not yet (or not any more) ----
    if not cited.lease_released:
        return _held(Refusal.FALLBACK_LEASE_STILL_HELD)
    if kind == CitationKind.SUPERSEDE:
        verdict = FallbackVerdict(outcome=Outcome.SELECTED, start_position=cited.position_now, hop=cited.hop)
    elif not any(c is not None and c in fallback_on for c in cited.terminal_conditions):
        return _held(Refusal.FALLBACK_NOT_AUTHORISED)
    elif cited.hop + 1 > max_hops:
        return _held(Refusal.FALLBACK_BUDGET_EXHAUSTED)
    else:
        verdict = FallbackVerdict(outcome=Outcome.SELECTED, start_position=cited.position_now + 1, hop=cited.hop + 1)
    if dispatch_live:  # the cited lease is gone, but another of this dispatch is not
        return _held(Refusal.FALLBACK_LEASE_STILL_HELD)
    return verdict
