"""The circuit registry: one `Circuit` per account, fed by terminal rows, read by selection.

The pure rules live in `core/circuit.py`; where the state lives is a `CircuitStore` (in this
process here: a restart forgets circuits, the safe direction since it also forgets the
evidence). Every change is a read-modify-write through `swap`, so the rules are applied the
same way whichever store holds the state. Every transition is logged and handed to
`on_transition` (the event feed) as the one `CircuitView` read model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import msgspec

from controlplane.core import circuit as rules
from shared.capacity import StateUnavailable
from shared.clock import iso_ms
from shared.codes import AttemptStatus, CircuitPhase, Condition
from shared.logging import get_logger
from shared.wire import AttemptRow

log = get_logger("circuits")

# A read-modify-write that lost this many races in a row gives up (it never happens in one
# process; a fleet would need that many writers on one account within one round trip).
SWAP_ATTEMPTS = 16


class CircuitView(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An account's circuit as every reader sees it (SPEC §7): the accounts view's `circuit`,
    the `circuit` event (which adds `account_id`) and the metrics' phase."""

    state: str
    opened_at: str | None  # ISO 8601 UTC; null when closed
    retry_at: str | None
    opened_by: str | None  # the condition that opened it
    account_id: str | None = None


def view_of(state: rules.Circuit, account_id: str | None = None) -> CircuitView:
    closed = state.phase == CircuitPhase.CLOSED
    return CircuitView(
        state=str(state.phase),
        opened_at=None if closed or state.opened_at_ms is None else iso_ms(state.opened_at_ms),
        retry_at=None if closed or state.retry_at_ms is None else iso_ms(state.retry_at_ms),
        opened_by=None if closed or state.opened_by is None else str(state.opened_by),
        account_id=account_id,
    )


class CircuitStore(Protocol):
    """Where each account's circuit state is kept (in this process, or Redis for a fleet).

    Contract (tests/integration/test_backend_contracts.py runs it against every implementation):
    - `load(account)` answers the stored state, `core.circuit.CLOSED` for an account never
      stored.
    - `swap(account, expected, new)` stores `new` and answers True only if the stored state
      still equals `expected`; otherwise it changes nothing and answers False. Atomic: of two
      swaps from the same `expected`, at most one succeeds.
    - A method that cannot reach the store raises `StateUnavailable`.
    """

    async def load(self, account_id: str) -> rules.Circuit: ...
    async def swap(self, account_id: str, expected: rules.Circuit, new: rules.Circuit) -> bool: ...


class LocalCircuits:
    """The in-process `CircuitStore` (every method completes without suspending)."""

    def __init__(self) -> None:
        self._state: dict[str, rules.Circuit] = {}

    async def load(self, account_id: str) -> rules.Circuit:
        return self.load_now(account_id)

    async def swap(self, account_id: str, expected: rules.Circuit, new: rules.Circuit) -> bool:
        if self._state.get(account_id, rules.CLOSED) != expected:
            return False
        self._state[account_id] = new
        return True

    def load_now(self, account_id: str) -> rules.Circuit:
        """`load` without a coroutine (`CircuitRegistry.fold_now`)."""
        return self._state.get(account_id, rules.CLOSED)

    def store_now(self, account_id: str, new: rules.Circuit) -> None:
        """Store `new` at once: after a `load_now` with nothing between, the swap that cannot lose."""
        self._state[account_id] = new


# Per row: a plain str (the row's own type) compares fastest, and a member read off its enum
# class costs ~90 ns on Python 3.11 (a module global, ~7).
_CLIENT_ABORTED = str(AttemptStatus.CLIENT_ABORTED)
_CLOSED = CircuitPhase.CLOSED
_AT_REST = rules.CLOSED
NOT_PROBES_MAX = 100_000  # leases remembered as no probe; past it, forgotten (a store read each)


def _by_account(rows: list[AttemptRow]) -> dict[str, list[AttemptRow]]:
    """A settle's evidence per account, in the order it came (gateway-authored rows are none)."""
    by_account: dict[str, list[AttemptRow]] = {}
    for row in rows:
        if row.refusal_reason is None:
            by_account.setdefault(row.account_id, []).append(row)
    return by_account


class CircuitRegistry:
    def __init__(
        self, store: CircuitStore, cooldown_s: int, on_transition: Callable[[CircuitView], object] | None = None
    ) -> None:
        self.store = store
        self.cooldown_s = cooldown_s
        self.on_transition = on_transition
        self._last_views: dict[str, CircuitView] = {}  # for `view_or_last`
        # (account, key) of leases this registry admitted without making them the probe: their end
        # asks the store nothing (fleet: one Redis round trip less per revoke; issue 27)
        self._not_probes: set[tuple[str, str]] = set()

    async def get(self, account_id: str, now_ms: int) -> rules.Circuit:
        return rules.current(await self.store.load(account_id), now_ms)

    async def admits(self, account_id: str, now_ms: int) -> bool:
        return rules.admits(await self.store.load(account_id), now_ms)

    async def view(self, account_id: str, now_ms: int) -> CircuitView:
        view = view_of(await self.get(account_id, now_ms))
        self._last_views[account_id] = view
        return view

    async def view_or_last(self, account_id: str, now_ms: int) -> CircuitView:
        """`view`, or (the store unreachable: fleet mode without Redis) the last one read, or a
        closed one; the read plane says `fleet.state: unavailable` beside it."""
        try:
            return await self.view(account_id, now_ms)
        except StateUnavailable:
            return self._last_views.get(account_id) or view_of(rules.CLOSED)

    async def claim_probe(self, account_id: str, key_id: str, now_ms: int) -> bool:
        """A lease is about to be granted on the account: True if the circuit admits it (in
        half-open it becomes the probe, claimed atomically, so only one is ever out)."""
        admitted = probe = False

        def claim(state: rules.Circuit) -> rules.Circuit:
            nonlocal admitted, probe
            admitted = rules.admits(state, now_ms)
            new = rules.on_lease(state, now_ms, key_id) if admitted else state
            probe = new.probe_key == key_id
            return new

        await self._update(account_id, claim, now_ms)
        if admitted and not probe:  # never the probe: only a mint's claim makes a key the probe
            if len(self._not_probes) >= NOT_PROBES_MAX:
                self._not_probes.clear()  # forgotten: their ends ask the store, as before
            self._not_probes.add((account_id, key_id))
        elif probe:  # a key claimed again (a renewal that lost its slot) may become the probe
            self._not_probes.discard((account_id, key_id))
        return admitted

    async def on_lease_ended(self, account_id: str, key_id: str, now_ms: int) -> None:
        """The lease ended: if it is the half-open circuit's probe, the next mint may probe. A
        lease this registry admitted as no probe is known not to be one: nothing to ask."""
        if (account_id, key_id) in self._not_probes:
            self._not_probes.discard((account_id, key_id))
            return
        await self._update(
            account_id,
            lambda s: rules.on_lease_ended(s, now_ms, key_id),
            now_ms,
            only_if=lambda s: s.probe_key == key_id,
        )

    async def on_row(self, row: AttemptRow, now_ms: int) -> None:
        """Fold one terminal row; gateway-authored rows are not evidence and change nothing."""
        await self.on_rows([row], now_ms)

    async def on_rows(self, rows: list[AttemptRow], now_ms: int, quiet_first: Mapping[str, bool] | None = None) -> None:
        """Fold a settle's rows, in order: one read-modify-write per account, not per row (the
        rules fold each account's rows in the order they came). `quiet_first`: accounts whose
        quiet terminals were held back (`is_quiet`; value: one was an answer), folded before
        their rows here."""
        for account_id, evidence in _by_account(rows).items():
            quiet = None if quiet_first is None else quiet_first.get(account_id)
            await self._update(
                account_id,
                lambda s, e=evidence, q=quiet: self._fold(s, e, now_ms, q),  # type: ignore[misc]
                now_ms,
            )

    @property
    def folds_now(self) -> bool:
        """Whether `fold_now` may fold: the store is this process's (never suspends)."""
        return isinstance(self.store, LocalCircuits)

    def fold_now(self, rows: list[AttemptRow], now_ms: int) -> None:
        """`on_rows` at once (only while `folds_now`): a read and a write of this process's store,
        with nothing between them, are the swap that cannot lose."""
        store = self.store
        assert isinstance(store, LocalCircuits)
        at_rest = None  # most settles: answers and aborts on circuits closed at rest (`rules.CLOSED`
        for row in rows:  # itself), which `_fold` keeps as they are: nothing to fold, store or tell
            if row.refusal_reason is not None:
                continue
            if row.condition is not None:
                break
            if row.account_id != at_rest:
                if store.load_now(row.account_id) is not _AT_REST:
                    break
                at_rest = row.account_id
        else:
            return
        for account_id, evidence in _by_account(rows).items():
            stored = store.load_now(account_id)
            new = self._fold(stored, evidence, now_ms)
            if new != stored:
                store.store_now(account_id, new)
                self._changed(account_id, rules.current(stored, now_ms), new)

    def is_quiet(self, row: AttemptRow) -> bool:
        """Whether folding `row` can only reset a closed circuit's count (`rules.on_quiet_terminals`):
        an abort, or no evidence from a lease this registry admitted as no probe (so it cannot
        close a half-open circuit). Fleet mode folds such rows late and together."""
        if row.refusal_reason is not None:
            return False
        if row.status == AttemptStatus.CLIENT_ABORTED:
            return True
        return row.condition is None and (row.account_id, row.key_id) in self._not_probes

    async def fold_quiet(self, quiet: Mapping[str, bool], now_ms: int) -> None:
        """Quiet terminals held back, per account (value: one was an answer, not an abort)."""
        for account_id, answered in quiet.items():
            await self._update(
                account_id,
                lambda s, a=answered: rules.on_quiet_terminals(s, now_ms, a),  # type: ignore[misc]
                now_ms,
            )

    async def fold_held(self) -> None:
        """Fold what this registry holds back (nothing here; fleet mode's quiet rows: `OwedCircuits`)."""

    def _fold(
        self, state: rules.Circuit, rows: list[AttemptRow], now_ms: int, quiet_first: bool | None = None
    ) -> rules.Circuit:
        if quiet_first is not None:
            state = rules.on_quiet_terminals(state, now_ms, quiet_first)
        for row in rows:
            if row.condition is None and state.phase is _CLOSED:  # `on_terminal`'s answer, inline:
                state = state if row.status == _CLIENT_ABORTED else rules.CLOSED  # most rows, most circuits
                continue
            state = rules.on_terminal(
                state,
                now_ms,
                row.key_id,
                Condition(row.condition) if row.condition else None,
                row.status == AttemptStatus.CLIENT_ABORTED,
                row.retry_after_s,
                self.cooldown_s,
            )
        return state

    async def _update(
        self,
        account_id: str,
        change: Callable[[rules.Circuit], rules.Circuit],
        now_ms: int,
        only_if: Callable[[rules.Circuit], bool] | None = None,
    ) -> None:
        for _ in range(SWAP_ATTEMPTS):
            stored = await self.store.load(account_id)
            if only_if is not None and not only_if(rules.current(stored, now_ms)):
                return
            new = change(stored)
            if new == stored:
                return
            if await self.store.swap(account_id, stored, new):
                self._changed(account_id, rules.current(stored, now_ms), new)
                return
        raise StateUnavailable(f"the circuit of {account_id} changed under {SWAP_ATTEMPTS} writes")

    def _changed(self, account_id: str, old: rules.Circuit, new: rules.Circuit) -> None:
        if (old.phase, old.retry_at_ms) == (new.phase, new.retry_at_ms):
            return  # a count or the probe moved: no transition to tell
        log.info(
            "circuit_changed",
            account_id=account_id,
            phase=str(new.phase),
            opened_by=None if new.opened_by is None else str(new.opened_by),
            retry_at=None if new.retry_at_ms is None else iso_ms(new.retry_at_ms),
        )
        if self.on_transition is not None:
            self.on_transition(view_of(new, account_id))
