"""`SentEvidence`: which terminal conditions this host appended to each decision's evidence in
Redis lately, so a row that would append the same one again asks Redis nothing (issue 27 §4).

Why: a decision's evidence is read only as a set — whether any terminal exists (a supersede is
then rejected `fallback-response-was-not-lost`) and whether one qualifies (a retry is then
authorised; `core/fallback.py`). An item equal to one already in the list changes neither, yet
cost one script per row: with sequential requests on a lease, every 2xx row appended `-` again,
its exchange landing on the shared cores as the worker's next request arrived. The embedded
journal keeps distinct conditions only, for the same reason (`LeaseDecisions.add_evidence`).

Rule: a condition is noted only once Redis answered that it appended it (the decision was kept);
a note counts for `REFRESH_S`, then the next equal row appends again. That bounds every way the
list could lose what the note says it holds (Redis lost its data and this host has not
re-registered yet; a writer without the secret deleted the list; the list's lifetime, renewed
by each append, fell behind its decision's, renewed by an extend) to `REFRESH_S`, on top of what
such a loss costs without the notes. And a re-registration (after a data loss, or at start)
forgets every note at once (`forget_all`): what arrives after it is appended again. Bounded:
a decision's notes go when its key ends here, and past `MAX_DECISIONS` decisions noted, all are
forgotten (that only costs appends).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from shared.codes import Condition

REFRESH_S = 30.0  # a note counts this long; then an equal row appends again
MAX_DECISIONS = 16_384  # decisions noted at once; past it every note is forgotten


class SentEvidence:
    def __init__(
        self,
        refresh_s: float = REFRESH_S,
        max_decisions: int = MAX_DECISIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.refresh_s = refresh_s
        self.max_decisions = max_decisions
        self.clock = clock
        self._sent: dict[str, dict[Condition | None, float]] = {}  # decision -> condition -> noted at
        self.skipped = 0  # appends not sent, since start (tests and bench count them)

    def fresh(self, mint_decision_id: str, condition: Condition | None) -> bool:
        """Whether `condition` is known to be in the decision's evidence now (then it is counted
        as skipped: the caller sends nothing)."""
        noted = self._sent.get(mint_decision_id, {}).get(condition)
        if noted is None or self.clock() - noted >= self.refresh_s:
            return False
        self.skipped += 1
        return True

    def note(self, mint_decision_id: str, condition: Condition | None) -> None:
        """Redis answered that it appended `condition` to the decision's evidence."""
        if mint_decision_id not in self._sent and len(self._sent) >= self.max_decisions:
            self._sent.clear()
        self._sent.setdefault(mint_decision_id, {})[condition] = self.clock()

    def forget(self, mint_decision_id: str) -> None:
        self._sent.pop(mint_decision_id, None)

    def forget_all(self) -> None:
        self._sent.clear()
