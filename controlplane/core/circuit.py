"""The per-account circuit breaker (SPEC §7), as pure transitions over a frozen state.

closed --(3 consecutive qualifying terminals, or one credit-exhausted)--> open
open   --(now >= retry_at)--> half-open: exactly one lease (the probe) is admitted
half-open --(probe's first terminal: qualifying)--> open for twice the previous open time
half-open --(probe's first terminal: anything else but an abort)--> closed

Open time is the cooldown, or the upstream's Retry-After when longer, capped at 15 minutes.
`retry_at` only ever moves later. Only qualifying terminals of the account move a circuit;
gateway-authored terminals and client aborts never reach these functions as evidence.
"""

from __future__ import annotations

import msgspec

from shared.codes import CircuitPhase, Condition

OPEN_THRESHOLD = 3
MAX_OPEN_MS = 15 * 60 * 1000


class Circuit(msgspec.Struct, frozen=True, kw_only=True):
    phase: CircuitPhase = CircuitPhase.CLOSED
    consecutive: int = 0
    opened_at_ms: int | None = None
    retry_at_ms: int | None = None
    opened_by: Condition | None = None
    open_ms: int = 0  # the current (or last) open duration
    probe_key: str | None = None  # the half-open probe lease, while it is out


CLOSED = Circuit()


def _open(state: Circuit, now_ms: int, condition: Condition, open_ms: int) -> Circuit:
    open_ms = min(open_ms, MAX_OPEN_MS)
    retry_at = now_ms + open_ms
    if state.retry_at_ms is not None and state.phase == CircuitPhase.OPEN:
        retry_at = max(retry_at, state.retry_at_ms)
        open_ms = max(open_ms, state.open_ms)
    return Circuit(
        phase=CircuitPhase.OPEN,
        consecutive=state.consecutive,
        opened_at_ms=state.opened_at_ms if state.phase == CircuitPhase.OPEN else now_ms,
        retry_at_ms=retry_at,
        opened_by=state.opened_by if state.phase == CircuitPhase.OPEN else condition,
        open_ms=open_ms,
    )


def current(state: Circuit, now_ms: int) -> Circuit:
    """The state as of `now_ms`: an open circuit past its retry time is half-open."""
    if state.phase == CircuitPhase.OPEN and state.retry_at_ms is not None and now_ms >= state.retry_at_ms:
        return msgspec.structs.replace(state, phase=CircuitPhase.HALF_OPEN, probe_key=None)
    return state


def admits(state: Circuit, now_ms: int) -> bool:
    """May a new lease be minted on this account now? (half-open: only the first, the probe)."""
    state = current(state, now_ms)
    if state.phase == CircuitPhase.CLOSED:
        return True
    return state.phase == CircuitPhase.HALF_OPEN and state.probe_key is None


def on_lease(state: Circuit, now_ms: int, key_id: str) -> Circuit:
    """A lease was granted on the account; in half-open it becomes the probe."""
    state = current(state, now_ms)
    if state.phase == CircuitPhase.HALF_OPEN and state.probe_key is None:
        return msgspec.structs.replace(state, probe_key=key_id)
    return state


def on_lease_ended(state: Circuit, now_ms: int, key_id: str) -> Circuit:
    """The probe lease ended without a terminal: the next mint may probe instead."""
    state = current(state, now_ms)
    if state.probe_key == key_id:
        return msgspec.structs.replace(state, probe_key=None)
    return state


def on_terminal(
    state: Circuit,
    now_ms: int,
    key_id: str,
    condition: Condition | None,
    aborted: bool,
    retry_after_s: float | None,
    cooldown_s: int,
) -> Circuit:
    """Fold one terminal row of the account (never a gateway-authored one) into its circuit."""
    state = current(state, now_ms)
    if aborted:
        return state
    wanted_ms = max(cooldown_s * 1000, int((retry_after_s or 0) * 1000))
    if state.phase == CircuitPhase.HALF_OPEN:
        if state.probe_key != key_id:
            return state  # an older lease's answer; only the probe decides
        if condition is None:
            return CLOSED
        return _open(
            msgspec.structs.replace(state, phase=CircuitPhase.CLOSED),
            now_ms,
            condition,
            max(2 * state.open_ms, wanted_ms),
        )
    if condition is None:
        return state if state.phase == CircuitPhase.OPEN else CLOSED
    if state.phase == CircuitPhase.OPEN:
        return _open(state, now_ms, condition, wanted_ms)  # only ever later
    consecutive = state.consecutive + 1
    if consecutive >= OPEN_THRESHOLD or condition == Condition.CREDIT_EXHAUSTED:
        return _open(msgspec.structs.replace(state, consecutive=consecutive), now_ms, condition, wanted_ms)
    return msgspec.structs.replace(state, consecutive=consecutive)


def on_quiet_terminals(state: Circuit, now_ms: int, answered: bool) -> Circuit:
    """Terminals that are no evidence (2xx, another 4xx, an abort) of leases that are not the
    probe, folded at once (fleet mode folds them late and together, issue 27 §4): what
    `on_terminal` makes of any sequence of them — an answer (`answered`: one was not an abort)
    resets a closed circuit's count, and nothing else changes (the state taken as of `now_ms`)."""
    state = current(state, now_ms)
    return CLOSED if answered and state.phase == CircuitPhase.CLOSED else state
