"""The decision table (SPEC §5): every v2 mint decision, its lineage and its evidence.

Behind the `DecisionStore` interface (in-process here). Bounded (`DECISION_CAP`): a citation
of a decision the table no longer holds (evicted, or from before a restart) is
`fallback-lineage-unknown`, held: the safe way. Terminal evidence arrives from attempt rows by
`mint_decision_id`.

In fleet mode the table is Redis's (`controlplane/fleet/decisions.py`), and each host also keeps
the decisions of its own live leases (`LeaseDecisions` there), to re-register them when Redis
lost its data; `lease_decisions` and `live_groups` below are what that re-registration decides.
Embedded mode keeps the same journal (`controlplane/stores/decisions.py`, `JournalledDecisions`),
so the decisions of live leases outlive a control restart there too (SPEC §5).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Iterable, Mapping
from typing import Protocol

import msgspec

from controlplane.core.fallback import Lineage
from controlplane.core.selection import Skipped
from shared.codes import Condition, Outcome, Refusal
from shared.wire import AttemptRow, Lease

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
    driver: str = "caller"  # `fallback_driver` (SPEC §17)
    hop_condition: Condition | None = None  # a gateway hop: the condition that started it


class DecisionStore(Protocol):
    """The v2 decision table, wherever it lives (in this process, or Redis for a fleet).

    Contract (tests/integration/test_backend_contracts.py runs it against every implementation):
    - `record(d)` keeps a lease-bearing decision (`key_id` set) whole but for its skip list,
      findable by `get(id)` and `for_key(key_id)`; of a held or rejected one (no key) only its
      outcome is kept, answered by `refused_outcome(id)` (and `get` answers None). Bounded: the
      oldest are forgotten first, and a forgotten decision answers None everywhere.
    - `add_evidence(decision_id, condition)` appends one terminal's condition (None for a
      non-qualifying terminal) to a kept decision's evidence; for an unknown decision it does
      nothing. `evidence(id)` answers them in arrival order.
    - `claim_live(key, repo, dispatch, allowing=k)` makes `key` a live lease of the dispatch
      and answers True only if no other key is live for it but `allowing` (a renewal's
      predecessor); otherwise it changes nothing and answers False. Atomic, so one live lease
      per dispatch holds under any interleaving of callers. `note_live` adds unconditionally
      (a restart restoring the key journal). `end_key` forgets a key (idempotent);
      `live_keys` reads the set.
    - `stage(d)` may write a lease-bearing decision ahead of its claims, where a write costs a
      round trip (fleet: it rides in the claims' exchange); `record(d, staged=True)` then
      completes it, answering as `record(d)` does; `unstage(d)` (a claim refused, or failed:
      `failed=True`, the shared state just did not answer) forgets it: `get`, `for_key` and
      `evidence` answer nothing of it. Its id and key were never answered before then, so
      nothing can have cited a staged decision (SPEC §5).
    - A method that cannot reach the table raises `StateUnavailable`.
    """

    # The mint's and the revoke's calls are awaitables, not necessarily coroutines: a fleet
    # backend queues its command at the call and hands back a future (`batching.soon`; issue 27 §4)
    async def record(self, decision: Decision, *, staged: bool = False) -> None: ...
    def stage(self, decision: Decision) -> Awaitable[None]: ...
    async def unstage(self, decision: Decision, *, failed: bool = False) -> None: ...
    async def get(self, mint_decision_id: str) -> Decision | None: ...
    async def refused_outcome(self, mint_decision_id: str) -> Outcome | None: ...
    async def for_key(self, key_id: str) -> Decision | None: ...
    async def add_evidence(self, mint_decision_id: str, condition: Condition | None) -> None: ...
    async def evidence(self, mint_decision_id: str) -> tuple[Condition | None, ...]: ...
    def claim_live(
        self, key_id: str, repo_slug: str, dispatch_id: str, *, allowing: str | None = None
    ) -> Awaitable[bool]: ...
    async def note_live(self, key_id: str, repo_slug: str, dispatch_id: str) -> None: ...
    def end_key(self, key_id: str) -> Awaitable[None]: ...
    def live_keys(self, repo_slug: str, dispatch_id: str) -> Awaitable[set[str]]: ...


def evidence_of(row: AttemptRow) -> tuple[str, Condition | None] | None:
    """The (decision, condition) a terminal row adds to the decision table, if any."""
    if row.mint_decision_id is None:
        return None
    return row.mint_decision_id, Condition(row.condition) if row.condition else None


class LiveGroup(msgspec.Struct, frozen=True, kw_only=True):
    """One dispatch's live leases on one host: one, or a renewal's successor and predecessor."""

    repo_slug: str
    dispatch_id: str
    key_ids: tuple[str, ...]


def live_groups(leases: Iterable[Lease]) -> list[LiveGroup]:
    """A host's live v2 leases by dispatch (v1 leases have none), each group's keys oldest first
    (key ids are ULIDs), the groups in the order of their oldest key: what re-registers the
    dispatches' live sets."""
    groups: dict[tuple[str, str], list[str]] = {}
    for lease in sorted(leases, key=lambda lease: lease.key_id):
        if lease.dispatch_id is not None:
            groups.setdefault((lease.repo_slug, lease.dispatch_id), []).append(lease.key_id)
    return [
        LiveGroup(repo_slug=repo, dispatch_id=dispatch, key_ids=tuple(keys))
        for (repo, dispatch), keys in groups.items()
    ]


def lease_decisions(leases: Iterable[Lease], known: Mapping[str, Decision]) -> tuple[dict[str, Decision], list[str]]:
    """Of each live v2 lease, the decision it holds now (the one it was granted, or re-bound to
    by a hop: `Lease.mint_decision_id`), looked up in `known` by decision id and kept only when
    it names that lease's key: key id → decision. Also answers, sorted, the keys of the v2
    leases whose decision `known` lacks (v1 leases have none and are in neither)."""
    kept: dict[str, Decision] = {}
    missing: list[str] = []
    for lease in leases:
        if lease.mint_decision_id is None:
            continue
        decision = known.get(lease.mint_decision_id)
        if decision is not None and decision.key_id == lease.key_id:
            kept[lease.key_id] = decision
        else:
            missing.append(lease.key_id)
    return kept, sorted(missing)


class LocalDecisions:
    """The in-process `DecisionStore` (every method completes without suspending)."""

    def __init__(self, cap: int = DECISION_CAP, refused_cap: int = REFUSED_CAP) -> None:
        self._cap = cap
        self._refused_cap = refused_cap
        self._decisions: OrderedDict[str, Decision] = OrderedDict()
        self._refused: OrderedDict[str, Outcome] = OrderedDict()
        self._by_key: dict[str, str] = {}
        self._evidence: dict[str, list[Condition | None]] = {}
        self._live_by_dispatch: dict[tuple[str, str], set[str]] = {}
        self._dispatch_of_key: dict[str, tuple[str, str]] = {}

    async def record(self, decision: Decision, *, staged: bool = False) -> None:
        self.keep(decision)

    async def stage(self, decision: Decision) -> None:
        """Nothing ahead of the claims: a record here costs no round trip."""

    async def unstage(self, decision: Decision, *, failed: bool = False) -> None:
        """Nothing was staged."""

    def keep(self, decision: Decision) -> None:
        """Keep what a later citation, renewal or evidence row needs. The skip list was
        answered and logged with the decision and is not needed again, so it is not kept."""
        if decision.key_id is None:
            self._refused[decision.mint_decision_id] = decision.outcome
            while len(self._refused) > self._refused_cap:
                self._refused.popitem(last=False)
            return
        key_id = decision.key_id
        if decision.skipped:
            decision = msgspec.structs.replace(decision, skipped=())
        self._decisions[decision.mint_decision_id] = decision
        self._by_key[key_id] = decision.mint_decision_id
        while len(self._decisions) > self._cap:
            _, old = self._decisions.popitem(last=False)
            self._evidence.pop(old.mint_decision_id, None)
            if old.key_id is not None:
                self._by_key.pop(old.key_id, None)

    async def get(self, mint_decision_id: str) -> Decision | None:
        return self._decisions.get(mint_decision_id)

    async def refused_outcome(self, mint_decision_id: str) -> Outcome | None:
        return self._refused.get(mint_decision_id)

    async def for_key(self, key_id: str) -> Decision | None:
        decision_id = self._by_key.get(key_id)
        return None if decision_id is None else self._decisions.get(decision_id)

    async def add_evidence(self, mint_decision_id: str, condition: Condition | None) -> None:
        if mint_decision_id in self._decisions:
            self._evidence.setdefault(mint_decision_id, []).append(condition)

    async def evidence(self, mint_decision_id: str) -> tuple[Condition | None, ...]:
        return tuple(self._evidence.get(mint_decision_id, ()))

    async def claim_live(self, key_id: str, repo_slug: str, dispatch_id: str, *, allowing: str | None = None) -> bool:
        live = self._live_by_dispatch.get((repo_slug, dispatch_id), set())
        if live - {key_id, allowing}:
            return False
        await self.note_live(key_id, repo_slug, dispatch_id)
        return True

    async def note_live(self, key_id: str, repo_slug: str, dispatch_id: str) -> None:
        self._dispatch_of_key[key_id] = (repo_slug, dispatch_id)
        self._live_by_dispatch.setdefault((repo_slug, dispatch_id), set()).add(key_id)

    async def end_key(self, key_id: str) -> None:
        dispatch = self._dispatch_of_key.pop(key_id, None)
        if dispatch is not None:
            live = self._live_by_dispatch.get(dispatch)
            if live is not None:
                live.discard(key_id)
                if not live:
                    del self._live_by_dispatch[dispatch]

    async def live_keys(self, repo_slug: str, dispatch_id: str) -> set[str]:
        return set(self._live_by_dispatch.get((repo_slug, dispatch_id), ()))
