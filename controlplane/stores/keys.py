"""The key table: live leases by key id, stored as sha256 digests only.

The table survives a control restart through an append-only journal
(`$GATEWAY_STATE_DIR/keys.jsonl`, one `{"op": "add"|"remove", ...}` line per change), compacted
on load: a restart for an upgrade does not revoke every worker's lease. No token and no secret
half is ever written; the digest cannot be presented as a key.
"""

from __future__ import annotations

import os

import msgspec

from controlplane.stores.journal import replay
from shared.logging import get_logger
from shared.private import create_private, open_append
from shared.wire import Lease

log = get_logger("keys")


class _Entry(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    op: str
    lease: Lease | None = None
    key_id: str | None = None


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(_Entry).decode


class KeyTable:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self._leases: dict[str, Lease] = {}
        self._fd: int | None = None
        # the leases `load` found expired (key id -> expiry): they ended while control was down,
        # and the decision journal keeps their decisions an hour from then (SPEC §5)
        self.expired_at_load: dict[str, int] = {}

    def load(self, now_ms: int) -> None:
        """Replay the journal, drop expired leases, rewrite it compacted."""
        if self.path is None:
            return
        for entry in replay(self.path, _decode, "key_journal_line_skipped"):
            if entry.op == "add" and entry.lease is not None:
                self._leases[entry.lease.key_id] = entry.lease
            elif entry.op == "remove" and entry.key_id:
                self._leases.pop(entry.key_id, None)
        self.expired_at_load = {k: v.expires_at_ms for k, v in self._leases.items() if v.expires_at_ms <= now_ms}
        self._leases = {k: v for k, v in self._leases.items() if v.expires_at_ms > now_ms}
        tmp = self.path + ".tmp"
        with create_private(tmp) as handle:  # 0600 from its creation (SPEC §19)
            for lease in self._leases.values():
                handle.write(_encode(_Entry(op="add", lease=lease)) + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)
        self._fd = open_append(self.path)

    def _journal(self, entry: _Entry) -> None:
        if self._fd is not None:
            os.write(self._fd, _encode(entry) + b"\n")

    def add(self, lease: Lease) -> None:
        self._journal(_Entry(op="add", lease=lease))
        self._leases[lease.key_id] = lease

    def remove(self, key_id: str) -> Lease | None:
        lease = self._leases.pop(key_id, None)
        if lease is not None:
            try:
                self._journal(_Entry(op="remove", key_id=key_id))
            except OSError as exc:
                log.error("key_journal_write_failed", error=str(exc))
        return lease

    def get(self, key_id: str) -> Lease | None:
        return self._leases.get(key_id)

    def expired(self, now_ms: int) -> list[str]:
        return [k for k, v in self._leases.items() if v.expires_at_ms <= now_ms]

    def all(self) -> list[Lease]:
        return list(self._leases.values())

    def count_by_account(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for lease in self._leases.values():
            counts[lease.account_id] = counts.get(lease.account_id, 0) + 1
        return counts

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
