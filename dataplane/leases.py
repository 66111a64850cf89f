"""The lease replica: digest → Lease, filled by a snapshot and pushes from control.

It answers authentication with no RPC, and holds each lease's budget gate as control last
pushed it (`regate`; SPEC §18) and the price table's globs (`priced`). While control is
unreachable it is empty and not `ready`: the data plane fails closed (503
`control-unavailable`) until the next snapshot.
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
        self.accounts: dict[str, AccountRoute] = {}
        self.credentials: dict[str, str] = {}
        self.ready = False
        self.storage_ok = True
        self.priced = PricedModels()

    def load(self, leases: list[Lease], accounts: list[AccountRoute], storage_ok: bool,
             priced: list[str] | None = None) -> None:
        self._by_digest = {lease.digest: lease for lease in leases}
        self._digest_of = {lease.key_id: lease.digest for lease in leases}
        self.accounts = {a.id: a for a in accounts}
        self.credentials = {}
        for account in accounts:
            value = self._env.get(account.credential_env, "").strip()
            if value:
                register_secret(value)
                self.credentials[account.id] = value
        self.storage_ok = storage_ok
        self.priced = PricedModels(priced)
        self.ready = True

    def add(self, lease: Lease) -> None:
        self._by_digest[lease.digest] = lease
        self._digest_of[lease.key_id] = lease.digest

    def regate(self, gates: list[LeaseGate]) -> None:
        """New budget gates; a key not held here is ignored (a gate never adds a lease)."""
        for gate in gates:
            found = self._digest_of.get(gate.key_id)
            lease = None if found is None else self._by_digest.get(found)
            if lease is not None:
                self._by_digest[found] = msgspec.structs.replace(  # type: ignore[index]
                    lease, budgeted=gate.budgeted, budget_retry_at_ms=gate.budget_retry_at_ms)

    def remove(self, key_id: str) -> None:
        found = self._digest_of.pop(key_id, None)
        if found is not None:
            self._by_digest.pop(found, None)

    def clear(self) -> None:
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
