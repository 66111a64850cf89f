"""Per-account terminal evidence over time, for health windows and the accounts view.

Each account keeps a bounded deque of `(finished_ms, kind)`; when it evicts an entry still
inside a window, that window is published as `evidence_truncated` rather than presented as
complete. Gateway-authored terminals (a refusal) are not recorded: they say nothing about the
account.
"""

from __future__ import annotations

from collections import deque

from controlplane.core.health import EvidenceCounts
from shared.codes import AttemptStatus
from shared.wire import AttemptRow

# Per account; at one terminal a second that is over an hour of evidence.
EVIDENCE_CAP = 4096
SUCCEEDED, FAILED, ABORTED = 0, 1, 2
_CLIENT_ABORTED = str(AttemptStatus.CLIENT_ABORTED)  # a plain str: the row's own type compares fastest


class EvidenceBook:
    def __init__(self, started_ms: int, cap: int = EVIDENCE_CAP) -> None:
        self.since_ms = started_ms
        self._cap = cap
        self._by_account: dict[str, deque[tuple[int, int]]] = {}
        self._evicted_ms: dict[str, int] = {}

    def record(self, row: AttemptRow, finished_ms: int) -> None:
        if row.refusal_reason is not None:  # gateway-authored: says nothing about the account
            return
        kind = ABORTED if row.status == _CLIENT_ABORTED else FAILED if row.condition is not None else SUCCEEDED
        entries = self._by_account.get(row.account_id)
        if entries is None:
            entries = self._by_account[row.account_id] = deque()
        if len(entries) >= self._cap:
            self._evicted_ms[row.account_id] = entries.popleft()[0]
        entries.append((finished_ms, kind))

    def window(self, account_id: str, since_ms: int) -> tuple[EvidenceCounts, int | None, bool]:
        """`(counts in the window, last observation ever, window truncated)`."""
        counts = [0, 0, 0]
        entries = self._by_account.get(account_id, ())
        last = entries[-1][0] if entries else None
        for finished_ms, kind in reversed(entries):
            if finished_ms < since_ms:
                break
            counts[kind] += 1
        truncated = self._evicted_ms.get(account_id, -1) >= since_ms
        return (
            EvidenceCounts(succeeded=counts[SUCCEEDED], failed=counts[FAILED], aborted=counts[ABORTED]),
            last,
            truncated,
        )
