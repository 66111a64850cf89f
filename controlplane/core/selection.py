"""`select_account` (SPEC §6, seed 000 D2): the first candidate a live fact does not rule out.

Pure. Candidates (the static, ordered answer for a model) are scanned from `start_position`;
each one passed over gets the code of the FIRST filter that rules it out, in this order —
cheapest and most permanent first, so the code names what would have to change:
not-configured, administrative-disabled, administrative-draining, circuit-open,
lease-capacity-exhausted, rate-limit-headroom-low (SPEC §22: only with `min_headroom_percent`
set; the shell judges the account's observations against the floor, `core.headroom`).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from shared.codes import AdminState, Refusal, Skip


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    account_id: str
    position: int
    provider_binding: str
    effective_model: str


class LiveFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What is true of one account right now (read by the shell, judged here)."""

    configured: bool
    administrative_state: AdminState = AdminState.ENABLED
    circuit_admits: bool = True
    lease_room: bool = True
    headroom_low: bool = False  # below the policy's min_headroom_percent now (SPEC §22)
    headroom_lifts_at_ms: int | None = None  # when that skip lifts by itself (its Retry-After)


class Skipped(msgspec.Struct, frozen=True, kw_only=True):
    account_id: str
    position: int
    code: Skip


class Selection(msgspec.Struct, frozen=True, kw_only=True):
    chosen: Candidate | None
    skipped: tuple[Skipped, ...]
    refusal: Refusal | None  # None when chosen; else no-eligible-account / fallback-pool-exhausted


# SPEC §6's live filters, in order: the one table both selection (the first that hits) and
# explain (every one that hits) read.
LIVE_FILTERS: tuple[tuple[Skip, Callable[[LiveFacts], bool]], ...] = (
    (Skip.NOT_CONFIGURED, lambda f: not f.configured),
    (Skip.ADMINISTRATIVE_DISABLED, lambda f: f.administrative_state == AdminState.DISABLED),
    (Skip.ADMINISTRATIVE_DRAINING, lambda f: f.administrative_state == AdminState.DRAINING),
    (Skip.CIRCUIT_OPEN, lambda f: not f.circuit_admits),
    (Skip.LEASE_CAPACITY_EXHAUSTED, lambda f: not f.lease_room),
    (Skip.RATE_LIMIT_HEADROOM_LOW, lambda f: f.headroom_low),
)


def live_filters(facts: LiveFacts) -> tuple[Skip, ...]:
    """Every live filter that rules the account out now, in SPEC §6 order."""
    return tuple(code for code, hits in LIVE_FILTERS if hits(facts))


def rule_out(facts: LiveFacts) -> Skip | None:
    """The first live filter that rules the account out, or None."""
    return next((code for code, hits in LIVE_FILTERS if hits(facts)), None)


def select_account(candidates: tuple[Candidate, ...], live: dict[str, LiveFacts], start_position: int) -> Selection:
    if start_position >= len(candidates):
        return Selection(chosen=None, skipped=(), refusal=Refusal.FALLBACK_POOL_EXHAUSTED)
    skipped: list[Skipped] = []
    for candidate in candidates[start_position:]:
        facts = live.get(candidate.account_id, LiveFacts(configured=False))
        code = rule_out(facts)
        if code is None:
            return Selection(chosen=candidate, skipped=tuple(skipped), refusal=None)
        skipped.append(Skipped(account_id=candidate.account_id, position=candidate.position, code=code))
    return Selection(chosen=None, skipped=tuple(skipped), refusal=Refusal.NO_ELIGIBLE_ACCOUNT)
