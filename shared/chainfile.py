"""The shell of a hash chain (`shared.chain` is its pure core, `shared.chainstorage` keeps its
bytes): `HashChain`.

Readers never take the writer's lock: a reader runs on the event loop (the mint reads the
account-admin overlay) and must not queue behind an operator's ten-second lock. Writers take
`filelock` on `<chain>.lock`, decide from the file rather than the cache, and fsync.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import msgspec

from shared.capacity import StateUnavailable
from shared.chain import (
    GENESIS_HASH,
    ChainAuth,
    ChainCheck,
    Fault,
    Head,
    Verdict,
    encode_anchor,
    encode_record,
    head_of_tail,
    seal,
    split_lines,
    verify_chain,
    verify_chain_between,
)
from shared.chainstorage import ChainError, ChainStorage, FileChainStorage, RevisionConflict
from shared.logging import get_logger

log = get_logger("chain")

S = TypeVar("S")


class ChainView(msgspec.Struct, Generic[S], frozen=True):
    """One read: the check and, when the chain can be believed, the state folded from it."""

    check: ChainCheck
    state: S | None


class Committed(msgspec.Struct, frozen=True, kw_only=True):
    record: dict[str, Any]
    revision: int  # the record count after this append
    based_on_revision: int  # the record count the append was decided against


class ChainCorrupt(ChainError):
    def __init__(self, check: ChainCheck) -> None:
        super().__init__(f"chain is corrupt ({check.fault})")
        self.check = check


class ChainUnwritable(ChainError):
    """The append (or the re-anchor that must precede it) failed; the chain is as it was."""


class HashChain(Generic[S]):
    """One chain file and its anchor. Thread-safe for readers; writers serialise on a file lock.

    The read cache is one tuple `(key, view)` rebound in one assignment, so a reader on the event
    loop and one in a worker thread can never pair one read's key with another read's view. The
    key is cheap (a stat, the anchor's few bytes and an O(1) tail read) and names what a change
    to the chain or its anchor would change; on a miss the whole chain is read and verified again.
    """

    def __init__(
        self,
        path: str,
        anchor_path: str,
        fold: Callable[[Sequence[dict[str, Any]]], S],
        storage: ChainStorage | None = None,
        *,
        recent_s: float | None = None,
    ) -> None:
        self.path = path
        self.anchor_path = anchor_path
        self.lock_path = path + ".lock"
        self.storage: ChainStorage = storage or FileChainStorage(path, anchor_path)
        self.auth: ChainAuth | None = getattr(self.storage, "auth", None)  # fleet mode (SPEC §19)
        self._fold = fold
        self._cache: tuple[tuple[Any, ...], ChainView[S]] | None = None
        self.full_reads = 0  # how many whole-chain reads were made (tests prove the retry count)
        # `read_recent` (below): None asks the storage at every read, as `read` does; a number
        # answers the view some `read` validated within that many seconds, without asking.
        self.recent_s = recent_s
        self._validated: tuple[float, ChainView[S]] | None = None

    # ---- reads (never take the lock) ----------------------------------------------------

    def read(self) -> ChainView[S]:
        """The verified view, from cache while the files are unchanged.

        A corrupt read is confirmed by exactly one second read: a read landing mid-append can
        see a torn final line, which a second look resolves, while real damage reads the same
        twice. No more than one retry, so a broken chain holds on the very next attempt.
        """
        return self._read(adopt=True)

    def _read(self, *, adopt: bool) -> ChainView[S]:
        try:
            key = self._key()
        except OSError:
            key = None
        cached = self._cache
        if key is not None and cached is not None and cached[0] == key:
            self._validated = (time.monotonic(), cached[1])
            return cached[1]
        check = self._snapshot()
        if check.verdict is Verdict.CORRUPT:
            if check.fault is Fault.TORN_LINE:
                # The signature of a read that overlapped an append crossing a page boundary:
                # give the writer a moment to finish before the one confirming read.
                time.sleep(TORN_LINE_SETTLE_S)
            check = self._snapshot()
            sealer = getattr(self.storage, "adopt", None) if adopt else None  # fleet mode: `mirror.py`
            if sealer is not None and check.fault is Fault.MAC_MISMATCH and sealer(self) is not None:
                check = self._snapshot()
            if check.verdict is Verdict.CORRUPT:  # logged once per change: the verdict is cached
                log.error("chain_corrupt", path=self.path, fault=str(check.fault), line=check.fault_line)
        state = None if check.verdict is Verdict.CORRUPT else self._fold(check.records)
        view = ChainView(check, state)
        if key is not None:
            self._cache = (key, view)
            self._validated = (time.monotonic(), view)
        return view

    async def refresh(self) -> ChainView[S]:
        """`read()` for a caller on the event loop (a mint: the chain as it is now). When the
        storage can tell its version without blocking (fleet: one async Redis call, the mirror's
        stat) and it is the cached view's, that view is validated now, with no worker thread;
        otherwise `read()` runs in one."""
        version_async = getattr(self.storage, "version_async", None)
        cached = self._cache
        if version_async is not None and cached is not None:
            key = await version_async()
            if key is not None and key == cached[0] and self._cache is cached:
                self._validated = (time.monotonic(), cached[1])
                return cached[1]
        return await asyncio.to_thread(self.read)

    def last_validated(self) -> ChainView[S] | None:
        """The last view a `read()` validated, however old (a read model that must answer while
        the storage does not, saying so; never a mint)."""
        validated = self._validated
        return None if validated is None else validated[1]

    def read_recent(self) -> ChainView[S]:
        """The view for a reader on the event loop, which must never wait on a remote storage.

        Without `recent_s` this is `read()` (a local file: a stat). With it (the fleet's Redis
        chains, read with a blocking client) it answers the view a `read()` validated within
        `recent_s` seconds — `read()` runs in worker threads: before each mint, after each
        commit, and on a short poll — and raises `StateUnavailable` past that: a chain nobody
        could validate lately is unavailable, never guessed from an old read.
        """
        if self.recent_s is None:
            return self.read()
        validated = self._validated
        if validated is None or time.monotonic() - validated[0] > self.recent_s:
            raise StateUnavailable(f"chain {self.path} was not validated within {self.recent_s:g}s")
        return validated[1]

    def head(self) -> Head | None:
        """The last record's `(seq, hash)` by an O(1) tail read (unverified; None if none)."""
        tail = self.storage.tail()
        return head_of_tail(tail) if tail else None

    def _key(self) -> tuple[Any, ...]:
        return self.storage.version()

    def _snapshot(self) -> ChainCheck:
        """One whole read: anchor, chain, anchor again (see `verify_chain_between`)."""
        self.full_reads += 1
        try:
            read = self.storage.read()
        except OSError as exc:
            log.error("chain_read_failed", path=self.path, error=str(exc))
            return ChainCheck(verdict=Verdict.CORRUPT, fault=Fault.UNREADABLE)
        return verify_chain_between(split_lines(read.data), read.anchor_before, read.anchor_after, self.auth)

    # ---- the one write ------------------------------------------------------------------

    def commit(
        self, build: Callable[[ChainCheck], Mapping[str, Any]], expected_revision: int | None = None
    ) -> Committed:
        """Append one record, deciding from the file under the writer's lock. Blocking.

        Order: lock → read and verify the file (never the cache) → refuse if corrupt → check
        `expected_revision` → (re-)anchor what is there if the anchor lags (seed or crash
        window) → `build(check)` returns the record's fields, and may do the mutation's side
        effect, or raise to abort → append + fsync → anchor. An anchor write failing after the
        append is logged, not raised: the append committed, and the next commit re-anchors.
        """
        with self.storage.writer():
            self._cache = None
            try:
                return self._commit_locked(build, expected_revision)
            finally:
                self._cache = None
                self._validated = None
                if self.recent_s is not None:
                    self._revalidate()

    def _revalidate(self) -> None:
        """After a commit, in its thread: the loop's readers (`read_recent`) see it at once."""
        try:
            self._read(adopt=False)  # the writer's lock is still held: no seal from here
        except Exception as exc:  # unreachable now: the next read (a mint's, the poll's) retries
            log.warning("chain_revalidation_failed", path=self.path, error=type(exc).__name__)

    def _commit_locked(
        self, build: Callable[[ChainCheck], Mapping[str, Any]], expected_revision: int | None
    ) -> Committed:
        try:
            read = self.storage.read()
        except OSError as exc:
            raise ChainCorrupt(ChainCheck(verdict=Verdict.CORRUPT, fault=Fault.UNREADABLE)) from exc
        anchor, data = read.anchor_after, read.data
        check = verify_chain(split_lines(data), anchor, self.auth)
        if check.verdict is Verdict.CORRUPT:
            raise ChainCorrupt(check)
        count = len(check.records)
        if expected_revision is not None and expected_revision != count:
            raise RevisionConflict(count, expected_revision)
        current = encode_anchor(count, check.head_hash)
        if anchor != current:
            try:
                self.storage.write_anchor(current)
            except OSError as exc:
                raise ChainUnwritable(f"cannot anchor {self.anchor_path}: {exc}") from exc
        record = seal(build(check), count + 1, check.head_hash or GENESIS_HASH)
        if self.auth is not None:
            record["mac"] = self.auth.mac(record)
        try:
            self.storage.append(encode_record(record), len(data))
        except OSError as exc:
            raise ChainUnwritable(f"cannot append to {self.path}: {exc}") from exc
        try:
            self.storage.write_anchor(encode_anchor(count + 1, record["hash"]))
        except OSError as exc:
            log.error("chain_anchor_write_failed", path=self.anchor_path, revision=count + 1, error=str(exc))
        return Committed(record=record, revision=count + 1, based_on_revision=count)


# How long a reader that saw a torn final line waits before its one confirming read.
TORN_LINE_SETTLE_S = 0.005
