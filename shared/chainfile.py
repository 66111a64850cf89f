"""The file shell of a hash chain (`shared.chain` is its pure core): `HashChain`.

Readers never take the writer's lock: a reader runs on the event loop (the mint reads the
account-admin overlay) and must not queue behind an operator's ten-second lock. Writers take
`filelock` on `<chain>.lock`, decide from the file rather than the cache, and fsync.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Generic, Protocol, TypeVar

import filelock
import msgspec

from shared.chain import (
    GENESIS_HASH, ChainAuth, ChainCheck, Fault, Head, Verdict, encode_anchor, encode_record, head_of_tail, seal,
    split_lines, verify_chain, verify_chain_between,
)
from shared.capacity import StateUnavailable
from shared.logging import get_logger

log = get_logger("chain")

# A writer waits this long for another writer's lock before giving up (the lock's poll is a
# blocking sleep, which is why writers run off the event loop).
LOCK_TIMEOUT_S = 10.0
# The head is read from the last TAIL_BYTES of the chain: O(1) whatever the chain's length.
# Writers bound their records far below this (a record over it only makes `head()` answer None).
TAIL_BYTES = 64 * 1024

S = TypeVar("S")


class ChainView(msgspec.Struct, Generic[S], frozen=True):
    """One read: the check and, when the chain can be believed, the state folded from it."""

    check: ChainCheck
    state: S | None


class Committed(msgspec.Struct, frozen=True, kw_only=True):
    record: dict[str, Any]
    revision: int  # the record count after this append
    based_on_revision: int  # the record count the append was decided against


class ChainError(Exception):
    """A commit that did not append (nothing was written)."""


class ChainCorrupt(ChainError):
    def __init__(self, check: ChainCheck) -> None:
        super().__init__(f"chain is corrupt ({check.fault})")
        self.check = check


class RevisionConflict(ChainError):
    def __init__(self, current: int, expected: int) -> None:
        super().__init__(f"expected revision {expected}, the chain is at {current}")
        self.current = current
        self.expected = expected


class ChainBusy(ChainError):
    """Another writer held the lock for LOCK_TIMEOUT_S."""


class ChainUnwritable(ChainError):
    """The append (or the re-anchor that must precede it) failed; the chain is as it was."""


class ChainBytes(msgspec.Struct, frozen=True):
    """One whole read of a chain: the anchor before, the records, the anchor after."""

    anchor_before: bytes | None
    data: bytes
    anchor_after: bytes | None


class ChainStorage(Protocol):
    """Where a chain's bytes live (files in the state directory here). `HashChain` decides
    everything (verification, the cache, the commit order); the storage only keeps bytes.

    Contract (tests/integration/test_backend_contracts.py runs it against every implementation):
    - `read()` answers the anchor, the records, and the anchor again (`ChainBytes`); an empty
      chain is `b""` and a missing anchor None. It raises OSError when the bytes cannot be read.
    - `version()` is cheap and changes whenever the records or the anchor change (the read
      cache's key); it raises OSError when it cannot tell.
    - `tail()` answers the last `TAIL_BYTES` of the records (b"" when empty).
    - `writer()` is the one writer's exclusive lock (a context manager); it raises `ChainBusy`
      after `LOCK_TIMEOUT_S`. `append` and `write_anchor` are called only inside it.
    - `append(line, expected_size)` appends `line` durably if the records are still
      `expected_size` bytes long; a failed append leaves the records as they were and raises
      OSError; a size that moved raises `RevisionConflict`.
    - `write_anchor(data)` replaces the anchor durably and atomically (a reader sees the old
      or the new one, never a torn one).
    - A storage that keeps the bytes elsewhere (Redis, `shared/fleet/chains.py`) raises
      `StateUnavailable` instead of OSError when it cannot reach them: unreachable is not
      corrupt, and `HashChain` lets it through to its caller (held, never a verdict).
    - A fleet storage (`shared/fleet/mirror.py`) has `auth`, a `ChainAuth` (records MAC'd and
      checked, SPEC §19), and `adopt(chain)`, which seals a chain failing only by MAC.
    """

    def read(self) -> ChainBytes: ...
    def version(self) -> tuple[Any, ...]: ...
    def tail(self) -> bytes: ...
    def writer(self) -> AbstractContextManager[Any]: ...
    def append(self, line: bytes, expected_size: int) -> None: ...
    def write_anchor(self, data: bytes) -> None: ...


class FileChainStorage:
    """A chain file and its anchor file; the writer's lock is `filelock` on `<chain>.lock`."""

    def __init__(self, path: str, anchor_path: str) -> None:
        self.path = path
        self.anchor_path = anchor_path
        self.lock_path = path + ".lock"

    def read(self) -> ChainBytes:
        before = _read_or_none(self.anchor_path)
        data = _read_or_none(self.path) or b""
        after = _read_or_none(self.anchor_path)
        return ChainBytes(before, data, after)

    def version(self) -> tuple[Any, ...]:
        anchor = _read_or_none(self.anchor_path)
        try:
            with open(self.path, "rb") as handle:
                st = os.fstat(handle.fileno())
                tail = _tail(handle)
        except FileNotFoundError:
            return (anchor,)
        return (anchor, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, tail)

    def tail(self) -> bytes:
        try:
            with open(self.path, "rb") as handle:
                return _tail(handle)
        except FileNotFoundError:
            return b""

    @contextmanager
    def writer(self) -> Iterator[None]:
        lock = filelock.FileLock(self.lock_path, timeout=LOCK_TIMEOUT_S, mode=0o600)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise ChainBusy(f"{self.lock_path} held for more than {LOCK_TIMEOUT_S:g}s") from None
        try:
            yield
        finally:
            lock.release()

    def append(self, line: bytes, expected_size: int) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size != expected_size:
                raise RevisionConflict(-1, -1)  # only another writer ignoring the lock does this
            try:
                _write_all(fd, line)
                os.fsync(fd)
            except OSError:
                try:  # never leave a torn line behind a failed write
                    os.ftruncate(fd, expected_size)
                except OSError:
                    pass
                raise
        finally:
            os.close(fd)
        if expected_size == 0:
            _fsync_dir(self.path)

    def write_anchor(self, data: bytes) -> None:
        """Temp file, fsync, rename over the anchor, fsync the directory (only the writer,
        under the lock, writes it, so one fixed temp name is enough)."""
        tmp = self.anchor_path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.anchor_path)
        _fsync_dir(self.anchor_path)


class HashChain(Generic[S]):
    """One chain file and its anchor. Thread-safe for readers; writers serialise on a file lock.

    The read cache is one tuple `(key, view)` rebound in one assignment, so a reader on the event
    loop and one in a worker thread can never pair one read's key with another read's view. The
    key is cheap (a stat, the anchor's few bytes and an O(1) tail read) and names what a change
    to the chain or its anchor would change; on a miss the whole chain is read and verified again.
    """

    def __init__(self, path: str, anchor_path: str, fold: Callable[[Sequence[dict[str, Any]]], S],
                 storage: ChainStorage | None = None, *, recent_s: float | None = None) -> None:
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
                log.error("chain_corrupt", path=self.path, fault=str(check.fault),
                          line=check.fault_line)
        state = None if check.verdict is Verdict.CORRUPT else self._fold(check.records)
        view = ChainView(check, state)
        if key is not None:
            self._cache = (key, view)
            self._validated = (time.monotonic(), view)
        return view

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

    def commit(self, build: Callable[[ChainCheck], Mapping[str, Any]],
               expected_revision: int | None = None) -> Committed:
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

    def _commit_locked(self, build: Callable[[ChainCheck], Mapping[str, Any]],
                       expected_revision: int | None) -> Committed:
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
            log.error("chain_anchor_write_failed", path=self.anchor_path, revision=count + 1,
                      error=str(exc))
        return Committed(record=record, revision=count + 1, based_on_revision=count)


# How long a reader that saw a torn final line waits before its one confirming read.
TORN_LINE_SETTLE_S = 0.005
# A chain is rare operator mutations; past this size something else is in the file.
READ_CAP_BYTES = 256 * 1024 * 1024


def _read_or_none(path: str) -> bytes | None:
    """The whole file, or None if absent; a device, a FIFO or an oversized file is an OSError
    (a symlink to /dev/full or /dev/zero would otherwise be read forever)."""
    try:
        with open(path, "rb") as handle:
            st = os.fstat(handle.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise OSError(f"{path} is not a regular file")
            data = handle.read(READ_CAP_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > READ_CAP_BYTES:
        raise OSError(f"{path} is larger than {READ_CAP_BYTES} bytes")
    return data


def _tail(handle: Any) -> bytes:
    size = os.fstat(handle.fileno()).st_size
    handle.seek(max(0, size - TAIL_BYTES))
    return handle.read(TAIL_BYTES)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
