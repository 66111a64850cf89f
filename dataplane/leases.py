"""The lease replica: digest → Lease, filled by a snapshot and pushes from control.

It answers authentication with no RPC, and holds each lease's budget gate as control last
pushed it (`regate`; SPEC §18) and the price table's globs (`priced`). A dispatch key (SPEC §17)
whose attempt just ended on a condition its lease hops on is `pending`: it admits no new attempt
until control re-binds the token (a pushed lease for the same key replaces the old one and clears
the mark). It holds which accounts an operator disabled (`disabled`, SPEC §9): their sockets
lose their rights (SPEC §20). While control is unreachable it is empty and not `ready`: the data plane fails closed
(503 `control-unavailable`) until the next snapshot.
Credential values are read from this process's environment by the account's variable name.
"""

from __future__ import annotations

import os

import msgspec

from dataplane.budget import PricedModels
from shared.logging import register_secret
from shared.tokens import digest
from shared.wire import AccountRoute, Lease, LeaseGate


class LeaseReplica:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        self._env = os.environ if env is None else env
        self._by_digest: dict[bytes, Lease] = {}
        self._digest_of: dict[str, bytes] = {}
        self.pending: set[str] = set()  # dispatch keys waiting for the gateway's hop
        self.accounts: dict[str, AccountRoute] = {}
        self.credentials: dict[str, str] = {}
        self.ready = False
        self.storage_ok = True
        self.priced = PricedModels()
        self.disabled: frozenset[str] = frozenset()  # accounts administratively disabled (§9, §20)

    def load(
        self,
        leases: list[Lease],
        accounts: list[AccountRoute],
        storage_ok: bool,
        priced: list[str] | None = None,
        disabled: list[str] | None = None,
    ) -> None:
        self._by_digest = {lease.digest: lease for lease in leases}
        self._digest_of = {lease.key_id: lease.digest for lease in leases}
        self.pending = set()
        self.accounts = {a.id: a for a in accounts}
        self.credentials = {}
        for account in accounts:
            value = self._env.get(account.credential_env, "").strip()
            if value:
                register_secret(value)
                self.credentials[account.id] = value
        self.storage_ok = storage_ok
        self.priced = PricedModels(priced)
        self.disabled = frozenset(disabled or ())
        self.ready = True

    def add(self, lease: Lease) -> None:
        """A new lease, or a live key's lease replaced under its token (one assignment: a
        request sees the old lease or the new one, never a mix)."""
        self._by_digest[lease.digest] = lease
        self._digest_of[lease.key_id] = lease.digest
        self.pending.discard(lease.key_id)

    def hop_pending(self, lease: Lease, condition: str | None, refusal: str | None) -> bool:
        """An attempt on `lease` ended: mark the key pending if it starts a gateway hop (the
        rule `core.hop.starts_hop` applies on control's side). True if it did."""
        if refusal is None and condition is not None and condition in lease.hop_on:
            self.pending.add(lease.key_id)
            return True
        return False

    def lookup_by_key(self, key_id: str) -> Lease | None:
        """The lease a key id names now (not for authentication: that is by digest)."""
        found = self._digest_of.get(key_id)
        return None if found is None else self._by_digest.get(found)

    def is_moving(self, lease: Lease) -> bool:
        """A dispatch key's hop is pending, or happened since `lease` was looked up."""
        if lease.key_id in self.pending:
            return True
        current = self._by_digest.get(lease.digest)
        return current is None or (current.account_id, current.mint_decision_id) != (
            lease.account_id,
            lease.mint_decision_id,
        )

    def regate(self, gates: list[LeaseGate]) -> None:
        """New budget gates; a key not held here is ignored (a gate never adds a lease)."""
        for gate in gates:
            found = self._digest_of.get(gate.key_id)
            lease = None if found is None else self._by_digest.get(found)
            if lease is not None:
                self._by_digest[found] = msgspec.structs.replace(  # type: ignore[index]
                    lease,
                    budgeted=gate.budgeted,
                    budget_retry_at_ms=gate.budget_retry_at_ms,
                    budget_stale=gate.budget_stale,
                )

    def remove(self, key_id: str) -> None:
        self.pending.discard(key_id)
        found = self._digest_of.pop(key_id, None)
        if found is not None:
            self._by_digest.pop(found, None)

    def clear(self) -> None:
        self.pending.clear()
        self._by_digest.clear()
        self._digest_of.clear()
        self.ready = False

    def lookup(self, presented: str, now_ms: int) -> Lease | None:
        lease = self._by_digest.get(digest(presented))
        if lease is None or lease.expires_at_ms <= now_ms:
            return None
        return lease

    def __len__(self) -> int:
        return len(self._by_digest)
