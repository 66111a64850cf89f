"""The circuit registry: one `Circuit` per account, fed by terminal rows, read by selection.

Process-local by design (seed 000: a restart forgets circuits, the safe direction since it
also forgets the evidence). Every transition is logged and handed to `on_transition` (the
event feed); the pure rules live in `core/circuit.py`.
"""

from __future__ import annotations

from collections.abc import Callable

from controlplane.core import circuit as rules
from shared.clock import iso_ms
from shared.codes import AttemptStatus, CircuitPhase, Condition
from shared.logging import get_logger
from shared.wire import AttemptRow

log = get_logger("circuits")


class CircuitRegistry:
    def __init__(self, cooldown_s: int) -> None:
        self.cooldown_s = cooldown_s
        self._state: dict[str, rules.Circuit] = {}
        self.on_transition: Callable[[str, rules.Circuit], None] | None = None

    def get(self, account_id: str, now_ms: int) -> rules.Circuit:
        return rules.current(self._state.get(account_id, rules.CLOSED), now_ms)

    def admits(self, account_id: str, now_ms: int) -> bool:
        return rules.admits(self._state.get(account_id, rules.CLOSED), now_ms)

    def _set(self, account_id: str, new: rules.Circuit, now_ms: int) -> None:
        old = self.get(account_id, now_ms)
        self._state[account_id] = new
        if (old.phase, old.retry_at_ms) != (new.phase, new.retry_at_ms) or new.phase != old.phase:
            log.info("circuit_changed", account_id=account_id, phase=str(new.phase),
                     opened_by=None if new.opened_by is None else str(new.opened_by),
                     retry_at=None if new.retry_at_ms is None else iso_ms(new.retry_at_ms))
            if self.on_transition is not None:
                self.on_transition(account_id, new)

    def on_lease(self, account_id: str, key_id: str, now_ms: int) -> None:
        current = self._state.get(account_id, rules.CLOSED)
        updated = rules.on_lease(current, now_ms, key_id)
        if updated is not current:
            self._state[account_id] = updated

    def on_lease_ended(self, account_id: str, key_id: str, now_ms: int) -> None:
        current = self._state.get(account_id)
        if current is not None:
            self._state[account_id] = rules.on_lease_ended(current, now_ms, key_id)

    def on_row(self, row: AttemptRow, now_ms: int) -> None:
        """Fold one terminal row; gateway-authored rows are not evidence and change nothing."""
        if row.refusal_reason is not None:
            return
        current = self._state.get(row.account_id, rules.CLOSED)
        condition = Condition(row.condition) if row.condition else None
        new = rules.on_terminal(current, now_ms, row.key_id, condition,
                                row.status == AttemptStatus.CLIENT_ABORTED, row.retry_after_s,
                                self.cooldown_s)
        if new != current:
            self._set(row.account_id, new, now_ms)

    def view(self, account_id: str, now_ms: int) -> dict:
        state = self.get(account_id, now_ms)
        closed = state.phase == CircuitPhase.CLOSED
        return {
            "state": str(state.phase),
            "opened_at": None if closed or state.opened_at_ms is None else iso_ms(state.opened_at_ms),
            "retry_at": None if closed or state.retry_at_ms is None else iso_ms(state.retry_at_ms),
            "opened_by": None if closed or state.opened_by is None else str(state.opened_by),
        }
