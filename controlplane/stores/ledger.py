"""The ledger: `$GATEWAY_STATE_DIR/ledger.jsonl`, one terminal attempt row per line.

Only the control daemon writes it. Rows are staged and written together (`stage`, then one
`flush` per batch of reports). A write that fails keeps the row in a bounded retry
buffer and flips `ok` to False, which the data plane turns into 503
`observation-storage-unavailable` for new requests, so nothing is served unrecorded. Rows are
deduplicated by `attempt_id`: the data plane re-sends unacknowledged rows after a reconnect.

It rotates daily (SPEC §18): the first write of a new UTC day — or `rotate_if_due`, on a timer —
renames the day's file to `ledger-YYYYMMDD.jsonl.part` (one rename: every row is either in it or
in the fresh `ledger.jsonl`), and a worker thread compresses it into `ledger-YYYYMMDD.jsonl.gz`
with its spend summary (`stores/segments.py`, which also says how a crash at any step is
finished at the next `open`). A live file's day is the UTC day of its last write (its mtime):
every row in it was written that day, since a write on a later day rotates it first. Rotated
files older than `GATEWAY_LEDGER_RETENTION_DAYS` are removed. Deduplication survives a rotation
and a restart: `open` seeds it from the newest segment's tail ids, then the live file's tail.
"""

from __future__ import annotations

import math
import os
import stat
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import msgspec

from controlplane.stores import segments
from shared.clock import now_ms
from shared.logging import get_logger
from shared.private import open_append
from shared.wire import AttemptRow

log = get_logger("ledger")

# How many attempt ids are remembered for deduplication, and how many unwritten rows are held
# while storage is failing (beyond that the data plane is already refusing new requests).
# Re-sent rows are those in flight when the link dropped (the data plane refuses new requests
# while it is down), so the window only needs to outlast one reconnect's worth of rows.
DEDUP_WINDOW = segments.TAIL_IDS
RETRY_BUFFER = 10_000
# How much of the ledger's tail is read at startup to seed deduplication.
TAIL_BYTES = 16 * 1024 * 1024
DAY_MS = 86_400_000
RETRY_ROTATION_MS = 60_000
LINE_KEPT = 64 * 1024  # the one-line scratch buffer keeps its memory up to this (`stage`)

_encoder = msgspec.json.Encoder()
_encode_into = _encoder.encode_into


class _Id(msgspec.Struct):
    attempt_id: str


class Ledger:
    def __init__(
        self,
        path: str,
        *,
        retention_days: int = 90,
        clock: Callable[[], int] = now_ms,
        on_step: segments.OnStep | None = None,
    ) -> None:
        self.path = path
        self.retention_days = retention_days
        self.clock = clock  # the ledger's notion of now: its rotation, and the spend book's windows
        self._on_step = on_step or (lambda _step: None)
        self._fd: int | None = None
        # The deduplication window: the ids, and their order (oldest first). A dict and a deque, not an
        # OrderedDict: ~1.1k instructions less per row once the window is full (issue 27).
        self._seen: dict[str, None] = {}
        self._seen_order: deque[str] = deque()
        # Staged rows' lines, encoded straight into one buffer (no bytes object per row, no join).
        self._unwritten = bytearray()
        self._waiting = 0  # rows in `_unwritten`
        # One row's line, encoded here then copied to `_unwritten`: msgspec grows a buffer in small
        # steps, so encoding into a fresh `_unwritten` (one per write) reallocated it ~a dozen times
        # per line; this one keeps its size from row to row (issue 27: ~2.4k instructions a row at
        # one row per write).
        self._line = bytearray()
        self._day: str | None = None  # YYYYMMDD of the live file's rows, None while empty
        self._rotate_at_ms: float = math.inf  # the first instant of the day after `_day`
        self._worker: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self.ok = True

    @property
    def state_dir(self) -> str:
        return os.path.dirname(os.path.abspath(self.path))

    def open(self) -> None:
        """Finish interrupted rotations (here: their ids must seed deduplication), seed it, and
        rotate a file of an earlier day (its rename here, its compression on the worker)."""
        try:
            segments.recover(self.state_dir, self._on_step)
        except OSError as exc:  # the .part stays the authority; the next open tries again
            log.error("ledger_rotation_recovery_failed", error=str(exc))
        self._seed_seen()
        self._end_torn_line()
        self._set_day(self._live_day())
        self.rotate_if_due()  # the rename now; compressing a day of rows must not delay the start
        self._sweep()
        self._reopen()

    def _reopen(self) -> None:
        if self._fd is None:
            self._fd = open_append(self.path)  # 0600 from its creation (SPEC §19)

    def _live_stat(self) -> os.stat_result | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            log.error("ledger_not_a_regular_file", path=self.path)
            return None
        return st

    def _seed_seen(self) -> None:
        names = segments.segment_names(self.state_dir)
        if names:
            for attempt_id in segments.read_tail_ids(segments.summary_path(self.state_dir, names[-1])):
                self._remember(attempt_id)
        st = self._live_stat()
        if st is None:
            return
        with open(self.path, "rb") as handle:
            handle.seek(max(0, st.st_size - TAIL_BYTES))
            tail = handle.read(TAIL_BYTES)
        decode = msgspec.json.Decoder(_Id).decode
        for line in tail.splitlines()[1 if st.st_size > TAIL_BYTES else 0 :]:
            try:
                self._remember(decode(line).attempt_id)
            except msgspec.DecodeError:
                continue

    def _end_torn_line(self) -> None:
        """A crash mid-write can leave a last line without its newline: end it, so the next row
        is not glued to it (the torn line stays as it is and decodes as nothing)."""
        st = self._live_stat()
        if st is None or st.st_size == 0:
            return
        with open(self.path, "rb+") as handle:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                handle.write(b"\n")
                log.warning("ledger_torn_line_ended", path=self.path)

    def _live_day(self) -> str | None:
        """The UTC day of the live file's last write (never after today: a clock set back)."""
        st = self._live_stat()
        if st is None or st.st_size == 0:
            return None
        return min(segments.utc_day(int(st.st_mtime * 1000)), segments.utc_day(self.clock()))

    def _set_day(self, day: str | None) -> None:
        self._day = day
        if day is None:
            self._rotate_at_ms = math.inf
        else:
            start = segments.day_start_ms(day)
            self._rotate_at_ms = start + DAY_MS

    def _remember(self, attempt_id: str) -> None:
        if attempt_id not in self._seen:  # one id once in the order: the window holds distinct ids
            self._seen[attempt_id] = None
            self._seen_order.append(attempt_id)
            if len(self._seen_order) > DEDUP_WINDOW:
                del self._seen[self._seen_order.popleft()]

    def has(self, attempt_id: str) -> bool:
        return attempt_id in self._seen

    def stage(self, row: AttemptRow) -> bool:
        """Queue `row` (once) for the next `flush`: rows arriving together are written together,
        with one `write`. A staged row counts as seen at once, so a re-sent copy is not queued.
        Answers whether the row was new (not seen before), queued or not (`ledger_row_dropped`)."""
        attempt_id, seen = row.attempt_id, self._seen
        if attempt_id in seen:
            return False
        seen[attempt_id] = None  # `_remember`, inline: this runs per row
        order = self._seen_order
        order.append(attempt_id)
        if len(order) > DEDUP_WINDOW:
            del seen[order.popleft()]
        if self._waiting < RETRY_BUFFER:
            line, buffer = self._line, self._unwritten
            _encode_into(row, line, 0)
            line.append(10)  # the newline
            buffer += line
            if len(line) > LINE_KEPT:  # a rare huge row's memory is not held
                self._line = bytearray()
            self._waiting += 1
        else:
            log.error("ledger_row_dropped", attempt_id=attempt_id)
        return True

    def flush(self) -> bool:
        """Write every buffered row; sets and returns `ok`."""
        if not self._unwritten:
            self.ok = True
            return True
        now = self.clock()
        if now >= self._rotate_at_ms:
            self.rotate_if_due(now)
        try:
            if self._fd is None:  # `_reopen`'s test first: no call per write
                self._reopen()
            assert self._fd is not None
            data = self._unwritten
            written = os.write(self._fd, data)
            while written < len(data):
                written += os.write(self._fd, data[written:])
            self._unwritten = bytearray()
            self._waiting = 0
            self.ok = True
            if self._day is None:
                self._set_day(segments.utc_day(now))
        except OSError as exc:
            if self.ok:
                log.error("ledger_append_failed", error=str(exc), waiting=self._waiting)
            self._close_fd()
            self.ok = False
        return self.ok

    # ---- rotation -----------------------------------------------------------------------

    def rotate_if_due(self, now: int | None = None, *, background: bool = True) -> bool:
        """Rotate the live file if its day is over (the timer's call, and each write's)."""
        now = self.clock() if now is None else now
        if self._day is None or segments.utc_day(now) <= self._day:
            return False
        day = self._day
        if self._live_day() is None:  # nothing was written (or it is not a file): nothing to rotate
            self._set_day(None)
            return False
        name = segments.free_name(self.state_dir, day)
        self._close_fd()
        try:
            os.rename(self.path, segments.part_path(self.state_dir, name))
            segments.fsync_dir(self.state_dir)
        except OSError as exc:
            log.error("ledger_rotation_failed", segment=name, error=str(exc))
            self._rotate_at_ms = now + RETRY_ROTATION_MS  # not again at every write meanwhile
            return False
        self._set_day(None)
        self._on_step("renamed")
        if background:
            self.submit(self._finish, name)
        else:
            self._finish(name)
        return True

    def _finish(self, name: str) -> None:
        segments.finish_rotation(self.state_dir, name, self._on_step)
        self._sweep()

    def _sweep(self) -> None:
        try:
            segments.sweep(self.state_dir, segments.utc_day(self.clock()), self.retention_days)
        except OSError as exc:
            log.error("ledger_sweep_failed", error=str(exc))

    def submit(self, work: Callable[..., object], *args: object) -> Future:
        """Run `work` on the ledger's one worker thread, after the work queued before it."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger")
        future = self._worker.submit(work, *args)
        future.add_done_callback(self._done)
        self._pending.append(future)
        return future

    def _done(self, future: Future) -> None:
        if future in self._pending:
            self._pending.remove(future)
        exc = future.exception()
        if exc is not None:  # its .part stays the authority: the next tick or open finishes it
            log.error("ledger_rotation_unfinished", error=f"{type(exc).__name__}: {exc}")

    def resume_rotations(self) -> None:
        """Retry a rotation a failure left unfinished (the timer's call; a no-op when none is)."""
        # a future that has ended may still be listed: its done-callback runs on the worker
        # thread after `wait_idle` has already returned, so only one still running defers this
        if not any(not f.done() for f in list(self._pending)) and segments.has_parts(self.state_dir):
            self.submit(lambda: segments.recover(self.state_dir, self._on_step))

    def wait_idle(self, timeout_s: float | None = None) -> None:
        """Until every background rotation has ended (tests, and `close`)."""
        for future in list(self._pending):
            future.exception(timeout_s)  # a failure is logged by `_done`; its .part stays

    # ---- closing ------------------------------------------------------------------------

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
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
