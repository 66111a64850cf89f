"""authorise_fallback by table: every refusal row, dispositions, and the clause order."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from controlplane.core.fallback import CitationKind, CitedDecision, Lineage, authorise_fallback
from shared.codes import Condition, Outcome, Refusal

LINEAGE = Lineage("d-1", "acme/app", "claude-sonnet-4-6")
ALL = frozenset(Condition)
RETRY, SUPERSEDE = CitationKind.RETRY, CitationKind.SUPERSEDE


def cited(**over) -> CitedDecision:
    fields = dict(
        outcome=Outcome.SELECTED,
        lineage=LINEAGE,
        hop=0,
        lease_released=True,
        terminal_conditions=(Condition.RATE_LIMITED,),
        position_now=0,
    )
    fields.update(over)
    return CitedDecision(**fields)


class Case(NamedTuple):
    name: str
    kind: CitationKind | None
    cited: CitedDecision | None
    fallback_on: frozenset
    max_hops: int
    outcome: Outcome
    refusal: Refusal | None
    start: int = 0
    hop: int = 0
    dispatch_live: bool = False


CASES = [
    Case("retry proceeds past the failed account", RETRY, cited(), ALL, 1, Outcome.SELECTED, None, 1, 1),
    Case("lineage unknown is held", RETRY, None, ALL, 1, Outcome.HELD, Refusal.FALLBACK_LINEAGE_UNKNOWN),
    Case(
        "cited not selected is rejected",
        RETRY,
        cited(outcome=Outcome.HELD),
        ALL,
        1,
        Outcome.REJECTED,
        Refusal.FALLBACK_CITED_DECISION_NOT_SELECTED,
    ),
    Case(
        "other dispatch is rejected",
        RETRY,
        cited(lineage=Lineage("d-2", "acme/app", "claude-sonnet-4-6")),
        ALL,
        1,
        Outcome.REJECTED,
        Refusal.FALLBACK_LINEAGE_MISMATCH,
    ),
    Case(
        "other repo is rejected",
        RETRY,
        cited(lineage=Lineage("d-1", "acme/other", "claude-sonnet-4-6")),
        ALL,
        1,
        Outcome.REJECTED,
        Refusal.FALLBACK_LINEAGE_MISMATCH,
    ),
    Case(
        "other model is rejected",
        RETRY,
        cited(lineage=Lineage("d-1", "acme/app", "claude-opus-4-7")),
        ALL,
        1,
        Outcome.REJECTED,
        Refusal.FALLBACK_LINEAGE_MISMATCH,
    ),
    Case(
        "cited account left the list is rejected",
        RETRY,
        cited(position_now=None),
        ALL,
        1,
        Outcome.REJECTED,
        Refusal.FALLBACK_LINEAGE_MISMATCH,
    ),
    Case(
        "supersede with evidence is rejected",
        SUPERSEDE,
        cited(),
        ALL,
        1,
        Outcome.REJECTED,
        Refusal.FALLBACK_RESPONSE_WAS_NOT_LOST,
    ),
    Case(
        "supersede with a non-qualifying terminal is rejected too",
        SUPERSEDE,
        cited(terminal_conditions=(None,)),
        ALL,
        1,
        Outcome.REJECTED,
        Refusal.FALLBACK_RESPONSE_WAS_NOT_LOST,
    ),
    Case(
        "lease still held is held",
        RETRY,
        cited(lease_released=False),
        ALL,
        1,
        Outcome.HELD,
        Refusal.FALLBACK_LEASE_STILL_HELD,
    ),
    Case(
        "no evidence is held",
        RETRY,
        cited(terminal_conditions=()),
        ALL,
        1,
        Outcome.HELD,
        Refusal.FALLBACK_NOT_AUTHORISED,
    ),
    Case(
        "non-qualifying evidence is held",
        RETRY,
        cited(terminal_conditions=(None, None)),
        ALL,
        1,
        Outcome.HELD,
        Refusal.FALLBACK_NOT_AUTHORISED,
    ),
    Case(
        "condition outside fallback_on is held",
        RETRY,
        cited(terminal_conditions=(Condition.UPSTREAM_UNAVAILABLE,)),
        frozenset({Condition.RATE_LIMITED}),
        1,
        Outcome.HELD,
        Refusal.FALLBACK_NOT_AUTHORISED,
    ),
    Case("budget exhausted is held", RETRY, cited(hop=1), ALL, 1, Outcome.HELD, Refusal.FALLBACK_BUDGET_EXHAUSTED),
    Case("zero hops refuses every hop", RETRY, cited(), ALL, 0, Outcome.HELD, Refusal.FALLBACK_BUDGET_EXHAUSTED),
    Case(
        "supersede proceeds at the same position, no hop",
        SUPERSEDE,
        cited(terminal_conditions=(), hop=1, position_now=2),
        ALL,
        1,
        Outcome.SELECTED,
        None,
        2,
        1,
    ),
    Case(
        "supersede needs the lease released",
        SUPERSEDE,
        cited(terminal_conditions=(), lease_released=False),
        ALL,
        1,
        Outcome.HELD,
        Refusal.FALLBACK_LEASE_STILL_HELD,
    ),
    Case(
        "second hop within a budget of two", RETRY, cited(hop=1, position_now=1), ALL, 2, Outcome.SELECTED, None, 2, 2
    ),
    # clause order: an inadmissible citation is rejected even while a hold also applies
    Case(
        "mismatch beats lease-still-held",
        RETRY,
        cited(lineage=Lineage("x", "y", "z"), lease_released=False),
        ALL,
        1,
        Outcome.REJECTED,
        Refusal.FALLBACK_LINEAGE_MISMATCH,
    ),
    Case(
        "not-selected beats budget",
        RETRY,
        cited(outcome=Outcome.REJECTED, hop=5),
        ALL,
        1,
        Outcome.REJECTED,
        Refusal.FALLBACK_CITED_DECISION_NOT_SELECTED,
    ),
    Case(
        "response-not-lost beats lease-still-held",
        SUPERSEDE,
        cited(lease_released=False),
        ALL,
        1,
        Outcome.REJECTED,
        Refusal.FALLBACK_RESPONSE_WAS_NOT_LOST,
    ),
    # one live lease per dispatch (SPEC §8's second rule), in the same table
    Case("a fresh mint proceeds at the top", None, None, ALL, 1, Outcome.SELECTED, None, 0, 0),
    Case(
        "a fresh mint while the dispatch has a live lease is held",
        None,
        None,
        ALL,
        1,
        Outcome.HELD,
        Refusal.FALLBACK_LEASE_STILL_HELD,
        dispatch_live=True,
    ),
    Case(
        "an admissible retry while a sibling lease is live is held",
        RETRY,
        cited(),
        ALL,
        1,
        Outcome.HELD,
        Refusal.FALLBACK_LEASE_STILL_HELD,
        dispatch_live=True,
    ),
    Case(
        "an admissible supersede while a sibling lease is live is held",
        SUPERSEDE,
        cited(terminal_conditions=()),
        ALL,
        1,
        Outcome.HELD,
        Refusal.FALLBACK_LEASE_STILL_HELD,
        dispatch_live=True,
    ),
    Case(
        "a rejection beats a live sibling",
        RETRY,
        cited(outcome=Outcome.HELD),
        ALL,
        1,
        Outcome.REJECTED,
        Refusal.FALLBACK_CITED_DECISION_NOT_SELECTED,
        dispatch_live=True,
    ),
    Case(
        "the budget's hold is answered before a live sibling's",
        RETRY,
        cited(hop=1),
        ALL,
        1,
        Outcome.HELD,
        Refusal.FALLBACK_BUDGET_EXHAUSTED,
        dispatch_live=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_authorise_fallback(case: Case) -> None:
    verdict = authorise_fallback(
        case.kind, case.cited, LINEAGE, case.fallback_on, case.max_hops, dispatch_live=case.dispatch_live
    )
    assert (verdict.outcome, verdict.refusal) == (case.outcome, case.refusal)
    if case.refusal is None:
        assert (verdict.start_position, verdict.hop) == (case.start, case.hop)


def test_every_fallback_refusal_has_a_row() -> None:
    covered = {c.refusal for c in CASES}
    not_verdicts = {Refusal.FALLBACK_POOL_EXHAUSTED, Refusal.FALLBACK_PENDING}  # selection; the data plane
    fallback_codes = {r for r in Refusal if r.value.startswith("fallback-") and r not in not_verdicts}
    assert fallback_codes <= covered
