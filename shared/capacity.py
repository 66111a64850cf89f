"""Holder-keyed capacity tables (SPEC §6): the lease table at the mint, the request table at
the proxy.

Reserving a holder twice takes one slot; releasing a holder any number of times returns one
slot; releasing an unknown holder does nothing. A `None` ceiling means no ceiling. No I/O, no
clock: the table is a value the shells hold and ask.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol


class CapacityTable:
    def __init__(self) -> None:
        self._holders: dict[str, set[str]] = {}  # account_id -> holders
        self._account_of: dict[str, str] = {}  # holder -> account_id

    def reserve(self, account_id: str, holder: str, ceiling: int | None) -> bool:
        """Take a slot for `holder` on `account_id`; False when the ceiling is reached.

        A holder holds at most one slot anywhere: reserving it again on the same account is a
        no-op that succeeds; on another account it is refused (it would leak the first slot).
        """
        owner = self._account_of.get(holder)
        if owner is not None:
            return owner == account_id
        held = self._holders.setdefault(account_id, set())
        if ceiling is not None and len(held) >= ceiling:
            return False
        held.add(holder)
        self._account_of[holder] = account_id
        return True

    def release(self, holder: str) -> bool:
        """Return `holder`'s slot; True if it held one."""
        account_id = self._account_of.pop(holder, None)
        if account_id is None:
            return False
        self._holders[account_id].discard(holder)
        return True

    def holds(self, holder: str) -> bool:
        return holder in self._account_of

    def count(self, account_id: str) -> int:
        return len(self._holders.get(account_id, ()))

    def has_room(self, account_id: str, ceiling: int | None) -> bool:
        return ceiling is None or self.count(account_id) < ceiling

    def clear(self) -> None:
        self._holders.clear()
        self._account_of.clear()


class CapacityStore(Protocol):
    """A ceiling's holder registry, wherever it lives (in this process, or Redis for a fleet).

    Contract (tests/integration/test_backend_contracts.py runs it against every implementation):
    - `reserve(account, holder, ceiling)` takes one slot for `holder` and answers True, or answers
      False, taking nothing, when `ceiling` holders already hold the account. Atomic: under any
      interleaving of callers, no more than `ceiling` holders hold an account. A `None` ceiling
      is no ceiling.
    - Reserving a holder it already holds on the same account is a no-op answering True; on
      another account it is refused (False): a holder holds at most one slot anywhere.
    - `release(holder)` returns the holder's slot and answers True; releasing it again, or
      releasing an unknown holder, changes nothing and answers False.
    - `holds(holder)` and `count(account)` read the registry as it is now.
    - A method that cannot reach the registry raises `StateUnavailable`; it never answers from
      a guess.
    """

    # Awaitables, not necessarily coroutines: a fleet backend queues its command at the call
    # and hands back a future (`shared/fleet/batching.soon`; issue 27 §4)
    def reserve(self, account_id: str, holder: str, ceiling: int | None) -> Awaitable[bool]: ...
    def release(self, holder: str) -> Awaitable[bool]: ...
    async def holds(self, holder: str) -> bool: ...
    def count(self, account_id: str) -> Awaitable[int]: ...


class StateUnavailable(Exception):
    """A shared-state backend could not answer (fleet mode: Redis unreachable or erroring)."""


class LocalCapacity:
    """The in-process `CapacityStore`: a `CapacityTable` owned by this event loop (every method
    completes without suspending, so each call is atomic)."""

    def __init__(self) -> None:
        self.table = CapacityTable()

    async def reserve(self, account_id: str, holder: str, ceiling: int | None) -> bool:
        return self.table.reserve(account_id, holder, ceiling)

    async def release(self, holder: str) -> bool:
        return self.table.release(holder)

    async def holds(self, holder: str) -> bool:
        return self.table.holds(holder)

    async def count(self, account_id: str) -> int:
        return self.table.count(account_id)
