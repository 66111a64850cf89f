"""`JournalledDecisions`: embedded mode's decision table, whose live leases' decisions outlive a
control restart (SPEC §5).

The in-process table (`LocalDecisions`) forgets everything at a restart, so a renewal, an
extension or a hop of a key the journal restored would answer 404 `decision-unknown`, and a
retry citing a live lease's decision `fallback-lineage-unknown`. Fleet mode already keeps each
host's live leases' decisions in `$GATEWAY_STATE_DIR/lease-decisions.jsonl`
(`controlplane/fleet/decisions.LeaseDecisions`); this wraps the in-process table around the same
journal: a lease-bearing decision is added when recorded, forgotten when its key ends, and at
start the journal's decisions of the leases the key table restored are put back into the table
(so evidence, citations and renewals find them) — the same `DecisionStore` interface, nothing
else changes. Only live leases' decisions are kept; their evidence starts afresh.
"""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.decisions import Decision, LocalDecisions
from controlplane.stores.leasedecisions import LeaseDecisions
from shared.wire import Lease


class JournalledDecisions(LocalDecisions):
    def __init__(self, journal: LeaseDecisions) -> None:
        super().__init__()
        self.journal = journal

    def restore(self, leases: Sequence[Lease]) -> list[str]:
        """Replay the journal for the restored `leases` and keep their decisions; answers the
        keys of the v2 leases whose decision the journal lacked."""
        missing = self.journal.load(leases)
        for decision in self.journal.by_id().values():
            self.keep(decision)
        return missing

    async def record(self, decision: Decision) -> None:
        self.keep(decision)
        if decision.key_id is not None:  # no await before the grant: the key table agrees
            self.journal.add(decision)

    async def get(self, mint_decision_id: str) -> Decision | None:
        return await LocalDecisions.get(self, mint_decision_id) or self.journal.get(mint_decision_id)

    async def for_key(self, key_id: str) -> Decision | None:
        return await LocalDecisions.for_key(self, key_id) or self.journal.of_key(key_id)

    async def end_key(self, key_id: str) -> None:
        self.journal.forget(key_id)
        await LocalDecisions.end_key(self, key_id)

    def close(self) -> None:
        self.journal.close()
