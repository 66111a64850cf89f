"""`decide_mint`'s budget steps (SPEC §18) by table: where `model-unpriced` and
`budget-exhausted` stand among the other refusals — the chains first, every rejection before
every hold, the budget's hold before the other holds — and the wait a budget hold carries."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
import pytest

from controlplane.core.budgets import Exhausted
from controlplane.core.fallback import CitationKind, Lineage
from controlplane.core.mint import MintFacts, decide_mint
from controlplane.core.selection import Candidate, LiveFacts
from controlplane.core.windows import Window
from shared.codes import AdminState, Outcome, Refusal

LINEAGE = Lineage("d-1", "acme/app", "m-1")
CANDIDATE = Candidate(account_id="a", position=0, provider_binding="anthropic", effective_model="m-1")
OK = MintFacts(
    admin_available=True,
    policy_available=True,
    lineage=LINEAGE,
    candidates=(CANDIDATE,),
    live={"a": LiveFacts(configured=True)},
)


def exhausted(level: str, window: Window, retry_after_s: int) -> Exhausted:
    return Exhausted(level=level, window=window, usd=1.0, spent_usd=1.2, resets_at_ms=0, retry_after_s=retry_after_s)


DAY = exhausted("team:payments", Window.DAY, 3_600)
MONTH = exhausted("platform", Window.MONTH, 86_400 * 3)


def facts(**changes: Any) -> MintFacts:
    return msgspec.structs.replace(OK, **changes)


class Case(NamedTuple):
    name: str
    given: MintFacts
    expect: tuple[Outcome, Refusal | None, int | None]  # outcome, refusal, retry_after_s


CASES = [
    Case("nothing exhausted, every model priced", OK, (Outcome.SELECTED, None, None)),
    Case(
        "an exhausted budget holds, until its window resets",
        facts(exhausted=(DAY,)),
        (Outcome.HELD, Refusal.BUDGET_EXHAUSTED, 3_600),
    ),
    Case(
        "several exhausted: until the last of them resets",
        facts(exhausted=(MONTH, DAY)),
        (Outcome.HELD, Refusal.BUDGET_EXHAUSTED, 86_400 * 3),
    ),
    Case(
        "an unpriced model in a budgeted chain is rejected",
        facts(unpriced_model="m-1"),
        (Outcome.REJECTED, Refusal.MODEL_UNPRICED, None),
    ),
    Case(
        "unpriced before exhausted: a rejection before a hold",
        facts(unpriced_model="m-1", exhausted=(DAY,)),
        (Outcome.REJECTED, Refusal.MODEL_UNPRICED, None),
    ),
    Case(
        "the admin chain before the budget",
        facts(admin_available=False, exhausted=(DAY,)),
        (Outcome.HELD, Refusal.ACCOUNT_STATE_UNAVAILABLE, None),
    ),
    Case(
        "the policy chain before the budget",
        facts(policy_available=False, exhausted=(DAY,)),
        (Outcome.HELD, Refusal.POLICY_UNAVAILABLE, None),
    ),
    Case(
        "model-not-served before model-unpriced",
        facts(candidates=(), unpriced_model="m-1"),
        (Outcome.REJECTED, Refusal.MODEL_NOT_SERVED, None),
    ),
    Case(
        "an unknown citation (a hold) after the budget's hold",
        facts(citation=CitationKind.RETRY, cited=None, exhausted=(DAY,)),
        (Outcome.HELD, Refusal.BUDGET_EXHAUSTED, 3_600),
    ),
    Case(
        "the budget's hold before the dispatch's one live lease",
        facts(dispatch_live=True, exhausted=(DAY,)),
        (Outcome.HELD, Refusal.BUDGET_EXHAUSTED, 3_600),
    ),
    Case(
        "the budget's hold before selection's",
        facts(live={"a": LiveFacts(configured=True, administrative_state=AdminState.DISABLED)}, exhausted=(DAY,)),
        (Outcome.HELD, Refusal.BUDGET_EXHAUSTED, 3_600),
    ),
    Case(
        "the dispatch's live lease holds when no budget does",
        facts(dispatch_live=True),
        (Outcome.HELD, Refusal.FALLBACK_LEASE_STILL_HELD, None),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decide_mint_budget_steps(case: Case) -> None:
    verdict = decide_mint(case.given)
    assert (verdict.outcome, verdict.refusal, verdict.retry_after_s) == case.expect


def test_a_rejected_citation_is_said_before_an_exhausted_budget() -> None:
    from controlplane.core.fallback import CitedDecision

    other = CitedDecision(
        outcome=Outcome.SELECTED,
        lineage=Lineage("d-2", "acme/app", "m-1"),
        hop=0,
        lease_released=True,
        terminal_conditions=(),
        position_now=0,
    )
    verdict = decide_mint(facts(citation=CitationKind.RETRY, cited=other, exhausted=(DAY,)))
    assert (verdict.outcome, verdict.refusal) == (Outcome.REJECTED, Refusal.FALLBACK_LINEAGE_MISMATCH)


# ---- a key that holds its slot: renewal and extend (SPEC §19) ------------------------------

HOLDING = facts(holding=True)


def live(**changes: Any) -> dict[str, LiveFacts]:
    return {"a": LiveFacts(configured=True, **changes)}


KEEP_CASES = [
    Case("kept on its account", HOLDING, (Outcome.SELECTED, None, None)),
    Case(
        "disabled: rejected administrative-disabled",
        facts(holding=True, live=live(administrative_state=AdminState.DISABLED)),
        (Outcome.REJECTED, Refusal.ADMINISTRATIVE_DISABLED, None),
    ),
    Case(
        "draining: rejected administrative-draining",
        facts(holding=True, live=live(administrative_state=AdminState.DRAINING)),
        (Outcome.REJECTED, Refusal.ADMINISTRATIVE_DRAINING, None),
    ),
    Case(
        "an exhausted budget holds",
        facts(holding=True, exhausted=(DAY,)),
        (Outcome.HELD, Refusal.BUDGET_EXHAUSTED, 3_600),
    ),
    Case(
        "the budget before the operator's word",
        facts(holding=True, exhausted=(DAY,), live=live(administrative_state=AdminState.DISABLED)),
        (Outcome.HELD, Refusal.BUDGET_EXHAUSTED, 3_600),
    ),
    Case(
        "a corrupt policy chain holds",
        facts(holding=True, policy_available=False),
        (Outcome.HELD, Refusal.POLICY_UNAVAILABLE, None),
    ),
    Case(
        "a corrupt admin chain holds",
        facts(holding=True, admin_available=False),
        (Outcome.HELD, Refusal.ACCOUNT_STATE_UNAVAILABLE, None),
    ),
    Case(
        "an open circuit does not apply to a held slot",
        facts(holding=True, live=live(circuit_admits=False)),
        (Outcome.SELECTED, None, None),
    ),
    Case(
        "a full account does not apply to a held slot",
        facts(holding=True, live=live(lease_room=False)),
        (Outcome.SELECTED, None, None),
    ),
    Case(
        "a key that lost its slot is judged as a mint",
        facts(live=live(circuit_admits=False)),
        (Outcome.HELD, Refusal.NO_ELIGIBLE_ACCOUNT, None),
    ),
    Case(
        "a disabled account for a mint is a skip, not a rejection",
        facts(live=live(administrative_state=AdminState.DISABLED)),
        (Outcome.HELD, Refusal.NO_ELIGIBLE_ACCOUNT, None),
    ),
]


@pytest.mark.parametrize("case", KEEP_CASES, ids=[c.name for c in KEEP_CASES])
def test_decide_mint_for_a_key_that_holds_its_slot(case: Case) -> None:
    verdict = decide_mint(case.given)
    assert (verdict.outcome, verdict.refusal, verdict.retry_after_s) == case.expect
    assert (verdict.chosen is not None) == (case.expect[0] == Outcome.SELECTED)
