"""The decision table: refused decisions are remembered apart from a lease's, each side bounded."""

from __future__ import annotations

from controlplane.core.fallback import Lineage
from controlplane.decisions import Decision, LocalDecisions
from shared.codes import Outcome, Refusal


async def test_refused_decisions_are_kept_apart_and_bounded() -> None:
    table = LocalDecisions(cap=4, refused_cap=2)
    lineage = Lineage("d", "r", "m")
    chosen = Decision(mint_decision_id="md_sel", outcome=Outcome.SELECTED, lineage=lineage, at_ms=0,
                      key_id="K", account_id="a", fallback_position=0)
    await table.record(chosen)
    for n in range(5):
        await table.record(Decision(mint_decision_id=f"md_held{n}", outcome=Outcome.HELD, lineage=lineage, at_ms=n,
                              refusal_reason=Refusal.NO_ELIGIBLE_ACCOUNT))
    assert await table.get("md_sel") == chosen and await table.for_key("K") == chosen  # refusals never evict a lease's decision
    assert await table.refused_outcome("md_held4") == await table.refused_outcome("md_held3") == Outcome.HELD
    assert await table.refused_outcome("md_held0") is None and await table.get("md_held4") is None
