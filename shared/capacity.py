"""Holder-keyed capacity tables (SPEC §6): the lease table at the mint, the request table at
the proxy.

Reserving a holder twice takes one slot; releasing a holder any number of times returns one
slot; releasing an unknown holder does nothing. A `None` ceiling means no ceiling. No I/O, no
clock: the table is a value the shells hold and ask.
"""

from __future__ import annotations


class CapacityTable:
    def __init__(self) -> None:
        self._holders: dict[str, set[str]] = {}   # account_id -> holders
        self._account_of: dict[str, str] = {}      # holder -> account_id

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
