"""The ledger: `$GATEWAY_STATE_DIR/ledger.jsonl`, one terminal attempt row per line.

Only the control daemon writes it. Rows are staged and written together (`stage`, then one
`flush` per batch of reports). A write that fails keeps the row in a bounded retry
buffer and flips `ok` to False, which the data plane turns into 503
`observation-storage-unavailable` for new requests, so nothing is served unrecorded. Rows are
deduplicated by `attempt_id`: the data plane re-sends unacknowledged rows after a reconnect.
"""

from __future__ import annotations

import os
import stat
from collections import OrderedDict

import msgspec

from shared.logging import get_logger
from shared.wire import AttemptRow

log = get_logger("ledger")

# How many attempt ids are remembered for deduplication, and how many unwritten rows are held
# while storage is failing (beyond that the data plane is already refusing new requests).
# Re-sent rows are those in flight when the link dropped (the data plane refuses new requests
# while it is down), so the window only needs to outlast one reconnect's worth of rows.
DEDUP_WINDOW = 32_768
RETRY_BUFFER = 10_000
# How much of the ledger's tail is read at startup to seed deduplication.
TAIL_BYTES = 16 * 1024 * 1024

_encode = msgspec.json.Encoder().encode


class _Id(msgspec.Struct):
    attempt_id: str


class Ledger:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._unwritten: list[bytes] = []
        self.ok = True

    def open(self) -> None:
        self._seed_seen()
        self._reopen()

    def _reopen(self) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def _seed_seen(self) -> None:
        try:
            if not stat.S_ISREG(os.stat(self.path).st_mode):
                log.error("ledger_not_a_regular_file", path=self.path)
                return
            with open(self.path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - TAIL_BYTES))
                tail = handle.read(TAIL_BYTES)
        except FileNotFoundError:
            return
        decode = msgspec.json.Decoder(_Id).decode
        for line in tail.splitlines()[1 if size > TAIL_BYTES else 0:]:
            try:
                self._remember(decode(line).attempt_id)
            except msgspec.DecodeError:
                continue

    def _remember(self, attempt_id: str) -> None:
        self._seen[attempt_id] = None
        if len(self._seen) > DEDUP_WINDOW:
            self._seen.popitem(last=False)

    def has(self, attempt_id: str) -> bool:
        return attempt_id in self._seen

    def stage(self, row: AttemptRow) -> None:
        """Queue `row` (once) for the next `flush`: rows arriving together are written together,
        with one `write`. A staged row counts as seen at once, so a re-sent copy is not queued."""
        if row.attempt_id in self._seen:
            return
        self._remember(row.attempt_id)
        if len(self._unwritten) < RETRY_BUFFER:
            self._unwritten.append(_encode(row) + b"\n")
        else:
            log.error("ledger_row_dropped", attempt_id=row.attempt_id)

    def flush(self) -> bool:
        """Write every buffered row; sets and returns `ok`."""
        if not self._unwritten:
            self.ok = True
            return True
        try:
            self._reopen()
            assert self._fd is not None
            data = b"".join(self._unwritten)
            written = os.write(self._fd, data)
            while written < len(data):
                written += os.write(self._fd, data[written:])
            self._unwritten.clear()
            self.ok = True
        except OSError as exc:
            if self.ok:
                log.error("ledger_append_failed", error=str(exc), waiting=len(self._unwritten))
            self._close_fd()
            self.ok = False
        return self.ok

    def _close_fd(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def close(self) -> None:
        self.flush()
        self._close_fd()
