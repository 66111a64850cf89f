"""`JournalledDecisions`: embedded mode's decision table, whose decisions of live leases and of
leases ended within the last hour outlive a control restart (SPEC §5).

The in-process table (`LocalDecisions`) forgets everything at a restart, so a renewal, an
extension or a hop of a key the journal restored would answer 404 `decision-unknown`, and a
retry citing a lease released just before the restart `fallback-lineage-unknown`. Fleet mode
already keeps each host's lease-bearing decisions in `$GATEWAY_STATE_DIR/lease-decisions.jsonl`
(`controlplane/stores/leasedecisions.LeaseDecisions`); this wraps the in-process table around
the same journal: a lease-bearing decision is added when recorded, a terminal row's evidence
when it arrives, a key's end when it ends, and at start the journal's decisions (those of the
leases the key table restored, and of the keys ended within the hour) and their evidence are
put back into the table, so a citation, a renewal or a hop finds exactly what it found before
the restart — the same `DecisionStore` interface, nothing else changes. (A held or rejected
decision took no lease and is not journalled: citing one after a restart is
`fallback-lineage-unknown`, held, the safe direction.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controlplane.decisions import Decision, LocalDecisions
from controlplane.stores.leasedecisions import LeaseDecisions
from shared.codes import Condition
from shared.wire import Lease


class JournalledDecisions(LocalDecisions):
    def __init__(self, journal: LeaseDecisions) -> None:
        super().__init__()
        self.journal = journal

    def restore(self, leases: Sequence[Lease], ended: Mapping[str, int] | None = None) -> list[str]:
        """Replay the journal for the restored `leases` (and `ended`: the keys the key table
        found expired, by expiry) and keep its decisions and their evidence; answers the keys
        of the v2 leases whose decision the journal lacked."""
        missing = self.journal.load(leases, ended)
        for decision in self.journal.by_id().values():  # in the order recorded: a key's last wins
            self.keep(decision)
        for decision in self.journal.current().values():  # a live key's: the one its lease holds
            self.keep(decision)
        for decision_id, conditions in self.journal.evidence().items():
            if decision_id in self._decisions:
                self._evidence[decision_id] = list(conditions)
        return missing

    async def record(self, decision: Decision, *, staged: bool = False) -> None:
        self.keep(decision)
        if decision.key_id is not None:  # no await before the grant: the key table agrees
            self.journal.add(decision)

    async def get(self, mint_decision_id: str) -> Decision | None:
        return await LocalDecisions.get(self, mint_decision_id) or self.journal.get(mint_decision_id)

    async def for_key(self, key_id: str) -> Decision | None:
        return await LocalDecisions.for_key(self, key_id) or self.journal.of_key(key_id)

    async def add_evidence(self, mint_decision_id: str, condition: Condition | None) -> None:
        await LocalDecisions.add_evidence(self, mint_decision_id, condition)
        self.journal.add_evidence(mint_decision_id, condition)

    async def end_key(self, key_id: str) -> None:
        self.journal.forget(key_id)
        await LocalDecisions.end_key(self, key_id)

    def close(self) -> None:
        self.journal.close()
