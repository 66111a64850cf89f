"""`MirroredChainStorage`: Redis is the chain's authority, this host's file is its witness (SPEC §16).

Every read reads both: the Redis chain (`RedisChainStorage`) and this host's mirror, the same
files the embedded mode keeps (`$GATEWAY_STATE_DIR/account-admin.jsonl` and its anchor). The
mirror is verified on its own; Redis's records must then begin with the mirror's bytes. If
they do, Redis's chain is answered as it is (and the mirror extended to match once it
verifies); if not, Redis's records are answered between two copies of the mirror's head
(count, hash) as the anchor, so `HashChain`'s own verification, the readers' and the
writer's alike, finds the fault and names it. No verdict is decided here:

| Redis's chain, against this host's verified mirror | verdict on this host |
|---|---|
| the mirror's records, and maybe more | verified (the mirror is extended to match) |
| shorter than the mirror | corrupt (`shorter-than-anchor`) |
| forks from the mirror | corrupt (`head-mismatch`) |
| empty, no anchor (Redis lost it), the mirror not | re-seeded from the mirror, then verified |
| anything, the mirror itself not verifying | corrupt (the mirror's own fault) |

Fleet mode (SPEC §19): `auth` (the chain's `ChainAuth`) is what `HashChain` checks every
record's MAC with; the mirror is extended only with records that verify by MAC, so a record a
Redis writer forged is never copied into it. The mirror is this host's own witness: a chain
whose records are byte for byte the mirror's, but do not all verify by MAC (an embedded chain
entering fleet mode, re-seeded from it; every record after a rotation of the secret), is
`adoptable`: `HashChain.adopt` seals it, once, with an audited `seal` record.

Re-seeding is one compare-and-set into an empty chain, so of two hosts noticing the loss one
seeds; a host whose verified mirror is longer then extends the seed, while no write has been
made since (`RedisChainStorage.extend_seed`). A new mirror (an empty file) trusts Redis and
copies it. Appends go to Redis first (the authority; its compare-and-set decides), then to the
mirror; a mirror that failed to take one catches up at the next read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from shared.capacity import StateUnavailable
from shared.chain import (
    GENESIS_HASH,
    SEAL_ACTION,
    ChainAuth,
    ChainCheck,
    Fault,
    Verdict,
    encode_anchor,
    encode_record,
    seal,
    split_lines,
    verify_chain,
    verify_chain_between,
)
from shared.chainfile import Committed, HashChain
from shared.chainstorage import ChainBytes, FileChainStorage
from shared.fleet.chains import RedisChainStorage
from shared.logging import get_logger

log = get_logger("chain")


class MirroredChainStorage:
    def __init__(self, remote: RedisChainStorage, mirror: FileChainStorage, auth: ChainAuth | None = None) -> None:
        self.remote = remote
        self.mirror = mirror
        self.auth = auth
        self._lock = threading.RLock()  # one thread syncs or writes the mirror at a time

    def read(self) -> ChainBytes:
        with self._lock:
            local = self.mirror.read()
            witness = _verify(local)
            if witness.verdict is Verdict.CORRUPT:
                log.error("chain_mirror_corrupt", chain=self.remote.name, fault=str(witness.fault))
                return local  # HashChain reads the mirror's own fault: corrupt on this host
            remote = self.remote.read()
            if witness.records and self._reseed(remote, local.data, witness):
                remote = self.remote.read()
            if not remote.data.startswith(local.data):
                # Shorter than, or forked from, what this host verified: Redis's records between
                # two copies of the mirror's head read corrupt to every check HashChain makes
                # (the readers' and the writer's alike).
                head = _anchor_of(witness)
                return ChainBytes(head, remote.data, head)
            if len(remote.data) > len(local.data):
                self._catch_up(remote, len(local.data))
            return remote

    def version(self) -> tuple[Any, ...]:
        return (self.remote.version(), self.mirror.version())

    async def version_async(self) -> tuple[Any, ...] | None:
        """`version` without a thread: Redis's part asked on the event loop (None when the remote
        storage has no asyncio client), the mirror's a stat and a tail read of a local file."""
        remote = await self.remote.version_async()
        return None if remote is None else (remote, self.mirror.version())

    def adoptable(self, read: ChainBytes) -> bool:
        """Are `read`'s records exactly this host's mirror (which verified them, or wrote them)?"""
        with self._lock:
            local = self.mirror.read()
        return bool(read.data) and read.data == local.data

    def adopt(self, chain: HashChain[Any]) -> Committed | None:
        """Seal `chain` (SPEC §19) when its records do not all verify by MAC but are exactly this
        host's mirror: an embedded chain entering fleet mode, or every record after a rotation of
        the secret. The `seal` record's MAC covers the head it adopts (its `prev_hash`, and
        `adopts_hash`). Anything else (a record this host never verified, a chain that does not
        hash) is not adopted and stays corrupt. Blocking; None when nothing was sealed."""
        try:
            return self._seal(chain)
        except StateUnavailable:
            raise
        except Exception as exc:  # busy or unwritable: the chain stays corrupt; the next read retries
            log.warning("chain_seal_failed", path=chain.path, error=type(exc).__name__)
            return None

    def _sealable(self, auth: ChainAuth) -> tuple[ChainBytes, ChainCheck] | None:
        """The read and its hash-only check when the chain is one this host may seal: its records
        hash, fail only by MAC, and are exactly this host's mirror. Anything else is None."""
        read = self.read()
        lines = split_lines(read.data)
        check = verify_chain(lines, read.anchor_after, auth)
        plain = verify_chain(lines, read.anchor_after)
        if check.fault is not Fault.MAC_MISMATCH or plain.verdict is not Verdict.VERIFIED or not self.adoptable(read):
            return None
        return read, plain

    def _seal(self, chain: HashChain[Any]) -> Committed | None:
        auth = self.auth
        if auth is None or auth.seal_fields is None:
            return None
        # Asked first without the fleet's writer lock: a chain forged in Redis is never sealable,
        # and its every read must answer `corrupt` at once, never wait on a writer (a
        # `revoke-leases` holds the lock for seconds) and leave the host without a recent view.
        if self._sealable(auth) is None:
            return None
        with self.writer():
            sealable = self._sealable(auth)
            if sealable is None:
                return None
            read, plain = sealable
            count = len(plain.records)
            fields = {
                **auth.seal_fields(),
                "action": SEAL_ACTION,
                "adopts_count": count,
                "adopts_hash": plain.head_hash,
            }
            record = seal(fields, count + 1, plain.head_hash or GENESIS_HASH)
            record["mac"] = auth.mac(record)
            self.write_anchor(encode_anchor(count, plain.head_hash))
            self.append(encode_record(record), len(read.data))
            self.write_anchor(encode_anchor(count + 1, record["hash"]))
        log.warning("chain_sealed", path=chain.path, adopts_count=count, revision=count + 1)
        return Committed(record=record, revision=count + 1, based_on_revision=count)

    def tail(self) -> bytes:
        return self.remote.tail()

    @contextmanager
    def writer(self) -> Iterator[None]:
        with self.remote.writer(), self._lock:
            yield

    def append(self, line: bytes, expected_size: int) -> None:
        self.remote.append(line, expected_size)
        try:
            self.mirror.append(line, expected_size)
        except Exception as exc:  # the authority took it; the mirror catches up at the next read
            log.error("chain_mirror_write_failed", chain=self.remote.name, error=repr(exc))

    def write_anchor(self, data: bytes) -> None:
        self.remote.write_anchor(data)
        try:
            self.mirror.write_anchor(data)
        except Exception as exc:
            log.error("chain_mirror_write_failed", chain=self.remote.name, error=repr(exc))

    # ---- the witness's two repairs ---------------------------------------------------------

    def _reseed(self, remote: ChainBytes, local_data: bytes, witness: ChainCheck) -> bool:
        """Redis lost the chain (or a seed is shorter than this mirror): write the mirror in."""
        anchor = _anchor_of(witness)
        if not remote.data and remote.anchor_after is None:
            seeded = self.remote.seed(local_data, anchor)
            if seeded:
                log.warning("chain_reseeded", chain=self.remote.name, records=len(witness.records))
            return seeded
        if len(remote.data) < len(local_data) and local_data.startswith(remote.data) and self.remote.is_seeded():
            extended = self.remote.extend_seed(local_data[len(remote.data) :], len(remote.data), anchor)
            if extended:
                log.warning("chain_reseed_extended", chain=self.remote.name, records=len(witness.records))
            return extended
        return False

    def _catch_up(self, remote: ChainBytes, mirror_size: int) -> None:
        """Copy what other hosts appended after the mirror's records, once the whole verifies."""
        check = _verify(remote, self.auth)
        if check.verdict is not Verdict.VERIFIED:
            return  # HashChain reads the same bytes and says corrupt; the mirror stays as it was
        try:
            self.mirror.append(remote.data[mirror_size:], mirror_size)
            self.mirror.write_anchor(_anchor_of(check))
        except Exception as exc:
            log.error("chain_mirror_write_failed", chain=self.remote.name, error=repr(exc))


def _verify(read: ChainBytes, auth: ChainAuth | None = None) -> ChainCheck:
    return verify_chain_between(split_lines(read.data), read.anchor_before, read.anchor_after, auth)


def _anchor_of(check: ChainCheck) -> bytes:
    return encode_anchor(len(check.records), check.head_hash)
