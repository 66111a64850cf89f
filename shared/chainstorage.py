"""Where a hash chain's bytes live (`ChainStorage`), the file storage (`FileChainStorage`), and
the errors a storage raises. `shared.chainfile.HashChain` decides everything else.

The file storage appends with O_APPEND and fsync, truncates a failed append back to where it
was, replaces the anchor by rename, and takes `filelock` on `<chain>.lock` for the one writer.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import msgspec

from shared.private import FILE_MODE, create_private, open_append

# A writer waits this long for another writer's lock before giving up (the lock's poll is a
# blocking sleep, which is why writers run off the event loop).
LOCK_TIMEOUT_S = 10.0
# The head is read from the last TAIL_BYTES of the chain: O(1) whatever the chain's length.
# Writers bound their records far below this (a record over it only makes `head()` answer None).
TAIL_BYTES = 64 * 1024


class ChainError(Exception):
    """A commit that did not append (nothing was written)."""


class RevisionConflict(ChainError):
    def __init__(self, current: int, expected: int) -> None:
        super().__init__(f"expected revision {expected}, the chain is at {current}")
        self.current = current
        self.expected = expected


class ChainBusy(ChainError):
    """Another writer held the lock for LOCK_TIMEOUT_S."""


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
        import filelock  # at the first write, not at start: ~2 MiB of RSS a reader never needs

        lock = filelock.FileLock(self.lock_path, timeout=LOCK_TIMEOUT_S, mode=FILE_MODE)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise ChainBusy(f"{self.lock_path} held for more than {LOCK_TIMEOUT_S:g}s") from None
        try:
            yield
        finally:
            lock.release()

    def append(self, line: bytes, expected_size: int) -> None:
        fd = open_append(self.path)  # 0600 from its creation (SPEC §19)
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
        with create_private(tmp) as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.anchor_path)
        _fsync_dir(self.anchor_path)


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
    return bytes(handle.read(TAIL_BYTES))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


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
