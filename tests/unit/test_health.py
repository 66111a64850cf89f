"""derive_health by table (SPEC §7, seed 002 D2)."""

from __future__ import annotations

import pytest

from controlplane.core.health import EvidenceCounts, derive_health
from shared.codes import Health, HealthReason

CASES = [
    ("credential missing wins", False, EvidenceCounts(succeeded=9), Health.UNVERIFIED, HealthReason.CREDENTIAL_MISSING),
    ("no evidence", True, EvidenceCounts(), Health.UNVERIFIED, HealthReason.NO_EVIDENCE),
    ("four aborts", True, EvidenceCounts(aborted=4), Health.UNVERIFIED, HealthReason.ONLY_ABORTED_EVIDENCE),
    ("one success", True, EvidenceCounts(succeeded=1), Health.HEALTHY, HealthReason.WITHIN_THRESHOLD),
    ("two failures of two is noise", True, EvidenceCounts(failed=2), Health.HEALTHY, HealthReason.WITHIN_THRESHOLD),
    (
        "three of four degraded",
        True,
        EvidenceCounts(succeeded=1, failed=3),
        Health.DEGRADED,
        HealthReason.QUALIFYING_FAILURES,
    ),
    (
        "three of six is exactly the share",
        True,
        EvidenceCounts(succeeded=3, failed=3),
        Health.DEGRADED,
        HealthReason.QUALIFYING_FAILURES,
    ),
    (
        "three of seven is under the share",
        True,
        EvidenceCounts(succeeded=4, failed=3),
        Health.HEALTHY,
        HealthReason.WITHIN_THRESHOLD,
    ),
    (
        "aborts leave the denominator",
        True,
        EvidenceCounts(succeeded=3, failed=3, aborted=50),
        Health.DEGRADED,
        HealthReason.QUALIFYING_FAILURES,
    ),
]


@pytest.mark.parametrize("name,configured,counts,health,reason", CASES, ids=[c[0] for c in CASES])
def test_derive_health(name, configured, counts, health, reason) -> None:
    assert derive_health(configured, counts) == (health, reason)
