"""The decision table (SPEC §5): every v2 mint decision, its lineage and its evidence.

Process-local and bounded (`DECISION_CAP`): a citation of a decision this process no longer
holds (evicted, or from before a restart) is `fallback-lineage-unknown` — held, the safe way.
Terminal evidence arrives from attempt rows by `mint_decision_id`.
"""

from __future__ import annotations

from collections import OrderedDict

import msgspec

from controlplane.core.fallback import Lineage
from controlplane.core.selection import Skipped
from shared.codes import Condition, Outcome, Refusal
from shared.wire import AttemptRow

# A citation names a recent decision (a retry follows its failure within seconds or minutes);
# an evicted one is `fallback-lineage-unknown`, held — the safe direction.
DECISION_CAP = 50_000
# Held and rejected decisions took no lease: citing one is only ever refused
# (`fallback-cited-decision-not-selected`, checked before anything else of the citation), so
# only their outcome is kept, and fewer of them: ~150 bytes each rather than the ~1 KiB of a
# whole decision (a storm of holds otherwise grew the daemon by megabytes until the cap).
REFUSED_CAP = 4_096


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    mint_decision_id: str
    outcome: Outcome
    lineage: Lineage
    at_ms: int
    refusal_reason: Refusal | None = None
    model_class: str | None = None
    effective_model: str | None = None
    account_id: str | None = None
    fallback_position: int | None = None
    hop: int = 0
    key_id: str | None = None
    policy_revision: int = 0
    skipped: tuple[Skipped, ...] = ()
    retry_of: str | None = None
    supersedes: str | None = None
    renewal_of: str | None = None
    worker_role: str | None = None


class DecisionTable:
    def __init__(self, cap: int = DECISION_CAP, refused_cap: int = REFUSED_CAP) -> None:
        self._cap = cap
        self._refused_cap = refused_cap
        self._decisions: OrderedDict[str, Decision] = OrderedDict()
        self._refused: OrderedDict[str, Outcome] = OrderedDict()
        self._by_key: dict[str, str] = {}
        self._evidence: dict[str, list[Condition | None]] = {}
        self._live_by_dispatch: dict[tuple[str, str], set[str]] = {}
        self._dispatch_of_key: dict[str, tuple[str, str]] = {}

    def record(self, decision: Decision) -> None:
        """Keep what a later citation, renewal or evidence row needs. The skip list was
        answered and logged with the decision and is not needed again, so it is not kept."""
        if decision.key_id is None:
            self._refused[decision.mint_decision_id] = decision.outcome
            while len(self._refused) > self._refused_cap:
                self._refused.popitem(last=False)
            return
        if decision.skipped:
            decision = msgspec.structs.replace(decision, skipped=())
        self._decisions[decision.mint_decision_id] = decision
        if decision.key_id is not None:
            self._by_key[decision.key_id] = decision.mint_decision_id
            self.note_live(decision.key_id, decision.lineage.repo_slug, decision.lineage.dispatch_id)
        while len(self._decisions) > self._cap:
            _, old = self._decisions.popitem(last=False)
            self._evidence.pop(old.mint_decision_id, None)
            if old.key_id is not None:
                self._by_key.pop(old.key_id, None)

    def get(self, mint_decision_id: str) -> Decision | None:
        """A lease-bearing decision still held (None for a refused or unknown one)."""
        return self._decisions.get(mint_decision_id)

    def refused_outcome(self, mint_decision_id: str) -> Outcome | None:
        """The outcome of a held or rejected decision still remembered, else None."""
        return self._refused.get(mint_decision_id)

    def for_key(self, key_id: str) -> Decision | None:
        decision_id = self._by_key.get(key_id)
        return None if decision_id is None else self._decisions.get(decision_id)

    def on_row(self, row: AttemptRow) -> None:
        if row.mint_decision_id is not None and row.mint_decision_id in self._decisions:
            condition = Condition(row.condition) if row.condition else None
            self._evidence.setdefault(row.mint_decision_id, []).append(condition)

    def evidence(self, mint_decision_id: str) -> tuple[Condition | None, ...]:
        return tuple(self._evidence.get(mint_decision_id, ()))

    def note_live(self, key_id: str, repo_slug: str, dispatch_id: str) -> None:
        """A live lease of a dispatch (from a decision, or restored from the key journal)."""
        self._dispatch_of_key[key_id] = (repo_slug, dispatch_id)
        self._live_by_dispatch.setdefault((repo_slug, dispatch_id), set()).add(key_id)

    def on_key_ended(self, key_id: str) -> None:
        dispatch = self._dispatch_of_key.pop(key_id, None)
        if dispatch is not None:
            live = self._live_by_dispatch.get(dispatch)
            if live is not None:
                live.discard(key_id)
                if not live:
                    del self._live_by_dispatch[dispatch]

    def live_keys(self, repo_slug: str, dispatch_id: str) -> set[str]:
        return set(self._live_by_dispatch.get((repo_slug, dispatch_id), ()))
