"""`derive_health` (SPEC §7, seed 002 D2): an account's health from its terminal evidence.

Pure. Client aborts count as observed but leave the denominator; gateway-authored terminals
are not evidence at all (they never reach this function). Degraded needs both a floor
(`DEGRADED_MIN_FAILURES`) and a share (`DEGRADED_SHARE`); an account with no non-aborted
evidence is `unverified` — never `healthy`.
"""

from __future__ import annotations

import msgspec

from shared.codes import Health, HealthReason

DEGRADED_MIN_FAILURES = 3
DEGRADED_SHARE = 0.5


class EvidenceCounts(msgspec.Struct, frozen=True, kw_only=True):
    """Terminal rows of one account inside the window, by kind."""

    succeeded: int = 0  # no qualifying condition, not aborted (2xx, ordinary 4xx)
    failed: int = 0  # a qualifying condition (SPEC §7 table)
    aborted: int = 0  # client aborts: observed, never evidence

    @property
    def observed(self) -> int:
        return self.succeeded + self.failed + self.aborted


def derive_health(configured: bool, counts: EvidenceCounts) -> tuple[Health, HealthReason]:
    if not configured:
        return Health.UNVERIFIED, HealthReason.CREDENTIAL_MISSING
    denominator = counts.succeeded + counts.failed
    if denominator == 0:
        if counts.aborted:
            return Health.UNVERIFIED, HealthReason.ONLY_ABORTED_EVIDENCE
        return Health.UNVERIFIED, HealthReason.NO_EVIDENCE
    if counts.failed >= DEGRADED_MIN_FAILURES and counts.failed / denominator >= DEGRADED_SHARE:
        return Health.DEGRADED, HealthReason.QUALIFYING_FAILURES
    return Health.HEALTHY, HealthReason.WITHIN_THRESHOLD
